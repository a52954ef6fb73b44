"""Cron fields as sorted sets, and the next wall time they select.

The grammar is cronsim's (Debian cron's, plus seconds and ``L``, ``LW``,
``nL``, ``n#k``): an expression pysched stored before keeps its meaning.
Wall times here are seconds on a local clock that never changes offset
("naive" seconds since 1970-01-01 00:00); pysched.cron maps them to instants.
"""

from __future__ import annotations

import calendar
from bisect import bisect_left
from dataclasses import dataclass, field
from datetime import date

DAY_S = 86_400
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()

FIELD_NAMES = ("second", "minute", "hour", "day-of-month", "month", "day-of-week")
# Each field's values; day-of-week 7 is Sunday again, as in cron.
_BOUNDS = ((0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
# A step may be at most the number of distinct values of its field.
_SPAN = (60, 60, 24, 31, 12, 7)
_NAMES: tuple[dict[str, int], ...] = (
    {},
    {},
    {},
    {},
    {
        m: i + 1
        for i, m in enumerate(["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"])
    },
    {d: i for i, d in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])},
)
MAX_NUMBER_DIGITS = 4
LAST = -1  # day-of-month "L": the month's last day
LAST_WEEKDAY = -2  # day-of-month "LW": the month's last Monday-to-Friday day


class ExprError(ValueError):
    """A field that does not parse; the message names the field."""


def _bad(f: int, why: str = "") -> ExprError:
    return ExprError(f"Bad {FIELD_NAMES[f]}" + (f": {why}" if why else ""))


def _int(f: int, text: str) -> int:
    upper = text.upper()
    if upper in _NAMES[f]:
        return _NAMES[f][upper]
    if not text.isascii() or not text.isdigit():
        raise _bad(f, f"{text[:20]!r} is not a number")
    # Leading zeros are a number's own (cronsim read 00001 as 1); past
    # them, more digits than any field's bound needs is refused unparsed.
    digits = text.lstrip("0") or "0"
    if len(digits) > MAX_NUMBER_DIGITS:
        lo, hi = _BOUNDS[f]
        raise _bad(f, f"a number of {len(digits)} digits is outside {lo}-{hi}")
    value = int(digits)
    lo, hi = _BOUNDS[f]
    if not lo <= value <= hi:
        raise _bad(f, f"{value} is outside {lo}-{hi}")
    return value


def _term(f: int, text: str) -> set[int] | set[tuple[int, int]]:
    upper = text.upper()
    if f == 5 and upper.endswith("L") and len(upper) > 1:
        return {(_int(f, text[:-1]) % 7, 0)}  # (weekday, 0): the month's last such day
    if f == 5 and "#" in text:
        day, nth = text.split("#", 1)
        k = _int(f, day)
        if not nth.isdigit() or not 1 <= int(nth[:2]) <= 5 or len(nth) > 1:
            raise _bad(f, f"#{nth[:8]}: the week of the month is 1 to 5")
        return {(k % 7, int(nth))}
    if f == 3 and upper in ("L", "LW"):
        return {LAST if upper == "L" else LAST_WEEKDAY}
    step, stepped = 1, "/" in text
    if stepped:
        text, step_text = text.split("/", 1)
        if not step_text.isascii() or not step_text.isdigit() or len(step_text.lstrip("0")) > MAX_NUMBER_DIGITS:
            raise _bad(f, f"step {step_text[:8]!r} is not a number")
        step = int(step_text)
        if not 1 <= step <= _SPAN[f]:
            raise _bad(f, f"step {step} is outside 1-{_SPAN[f]}")
        if f == 3 and text.upper() in ("L", "LW"):
            return {LAST if text.upper() == "L" else LAST_WEEKDAY}
    lo, hi = _BOUNDS[f]
    if text == "*":
        start, end = lo, hi
    elif "-" in text:
        a, b = text.split("-", 1)
        start, end = _int(f, a), _int(f, b)
        if end < start:
            raise _bad(f, f"range {start}-{end} runs backwards")
    else:
        # "a/k" runs from a to the field's top: in day-of-week, to 7 (Sunday).
        start = _int(f, text)
        end = hi if stepped else start
    return set(range(start, end + 1, step))


def parse_field(f: int, text: str) -> tuple[frozenset[int], frozenset[tuple[int, int]]]:
    """(plain values, day-of-week (weekday, n) pairs: n in 1-5 the n-th, 0 the last)."""
    if not text:
        raise _bad(f)
    plain: set[int] = set()
    special: set[tuple[int, int]] = set()
    for part in text.split(","):
        for item in _term(f, part):
            if isinstance(item, tuple):
                special.add(item)
            else:
                plain.add(item)
    if f == 5:
        plain = {d % 7 for d in plain}
    return frozenset(plain), frozenset(special)


def _split_dom(values: frozenset[int]) -> tuple[frozenset[int], bool, bool]:
    return frozenset(v for v in values if v > 0), LAST in values, LAST_WEEKDAY in values


@dataclass
class Expr:
    """A parsed expression: sorted field values and cached day lists."""

    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: frozenset[int]
    days: frozenset[int]
    last_day: bool
    last_weekday: bool
    weekdays: frozenset[int]  # 0 Sunday .. 6 Saturday
    nth_weekdays: frozenset[tuple[int, int]]
    days_or: bool  # both day fields restricted: either may match
    all_hours: bool
    _month_days: dict[tuple[int, int, int], tuple[int, ...]] = field(default_factory=dict)

    def month_days(self, year: int, month: int) -> tuple[int, ...]:
        """The days of this month the expression selects (any time of day)."""
        first_weekday, length = calendar.monthrange(year, month)
        key = (month, first_weekday, length)
        got = self._month_days.get(key)
        if got is None:
            got = self._month_days[key] = self._days(month, (first_weekday + 1) % 7, length)
        return got

    def _days(self, month: int, first_sunday0: int, length: int) -> tuple[int, ...]:
        if month not in self.months:
            return ()
        last_wd = length
        while (first_sunday0 + last_wd - 1) % 7 in (0, 6):
            last_wd -= 1
        out = []
        for d in range(1, length + 1):
            wd = (first_sunday0 + d - 1) % 7
            dom = d in self.days or (self.last_day and d == length) or (self.last_weekday and d == last_wd)
            dow = (
                wd in self.weekdays
                or (wd, (d + 6) // 7) in self.nth_weekdays
                or (d + 7 > length and (wd, 0) in self.nth_weekdays)
            )
            if (dom or dow) if self.days_or else (dom and dow):
                out.append(d)
        return tuple(out)

    def ever_fires(self) -> bool:
        """Whether some day of some year matches: a month's days depend only
        on its length and the weekday of its 1st, and every pair occurs."""
        for month in self.months:
            lengths = (28, 29) if month == 2 else (calendar.monthrange(2001, month)[1],)
            for length in lengths:
                for first in range(7):
                    if self._days(month, first, length):
                        return True
        return False

    def time_at_or_after(self, sod: int) -> int | None:
        """The first selected second of the day at or after ``sod``."""
        h, rem = divmod(sod, 3600)
        m, s = divmod(rem, 60)
        hs, ms, ss = self.hours, self.minutes, self.seconds
        i = bisect_left(hs, h)
        if i < len(hs) and hs[i] == h:
            j = bisect_left(ms, m)
            if j < len(ms) and ms[j] == m:
                k = bisect_left(ss, s)
                if k < len(ss):
                    return h * 3600 + m * 60 + ss[k]
                j += 1
            if j < len(ms):
                return h * 3600 + ms[j] * 60 + ss[0]
            i += 1
        if i < len(hs):
            return hs[i] * 3600 + ms[0] * 60 + ss[0]
        return None

    def next_wall(self, wall: int, until: int) -> int | None:
        """The first selected wall time at or after ``wall``, if not after ``until``."""
        days, sod = divmod(wall, DAY_S)
        d = date.fromordinal(_EPOCH_ORDINAL + days)
        year, month, day = d.year, d.month, d.day
        while True:
            picked = self.month_days(year, month)
            i = bisect_left(picked, day)
            while i < len(picked):
                ordinal = date(year, month, picked[i]).toordinal() - _EPOCH_ORDINAL
                if ordinal * DAY_S > until:
                    return None
                tod = self.time_at_or_after(sod if picked[i] == day else 0)
                if tod is not None:
                    found = ordinal * DAY_S + tod
                    return found if found <= until else None
                i += 1
            year, month = (year + 1, 1) if month == 12 else (year, month + 1)
            day, sod = 1, 0
            if (date(year, month, 1).toordinal() - _EPOCH_ORDINAL) * DAY_S > until:
                return None


def parse(text: str) -> Expr:
    """Five fields, or six with seconds first; raises ExprError."""
    parts = text.split()
    if len(parts) == 5:
        parts.insert(0, "0")
    if len(parts) != 6:
        raise ExprError(f"expected 5 fields, or 6 with seconds first, got {len(text.split())}")
    fields = [parse_field(f, p) for f, p in enumerate(parts)]
    for f in range(5):
        if fields[f][1]:
            raise _bad(f)
    days, last_day, last_wd = _split_dom(fields[3][0])
    hours = tuple(sorted(fields[2][0]))
    return Expr(
        seconds=tuple(sorted(fields[0][0])),
        minutes=tuple(sorted(fields[1][0])),
        hours=hours,
        months=fields[4][0],
        days=days,
        last_day=last_day,
        last_weekday=last_wd,
        weekdays=fields[5][0],
        nth_weekdays=fields[5][1],
        days_or=not (parts[3].startswith("*") or parts[5].startswith("*")),
        all_hours=len(hours) == 24,
    )
