"""A brute-force reading of pysched's DST rule, to hold pysched.cron against.

It shares nothing with pysched's evaluator: cronsim parses the fields and
matches days, zoneinfo converts instants, and time is walked minute by minute
in UTC (each selected second of a matching minute is then a fire). Whole
days or hours the expression cannot select are skipped only when the offset
is the same at both ends, so no change of offset is ever stepped over.
Assumes offsets change on whole minutes, as every zone has since 1980.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from functools import lru_cache
from importlib import resources
from zoneinfo import ZoneInfo

from cronsim import CronSim

from pysched.cron import MACROS


def _six(expr: str) -> str:
    text = MACROS.get(expr.strip().lower(), expr)
    parts = text.split()
    return " ".join(["0", *parts] if len(parts) == 5 else parts)


def package_zone(tz: str) -> ZoneInfo:
    """The zone as the tzdata package has it: the data pysched reads, not
    the machine's own copy, which may be older or newer."""
    with resources.files("tzdata").joinpath("zoneinfo", *tz.split("/")).open("rb") as data:
        return ZoneInfo.from_file(data, key=tz)


class Oracle:
    def __init__(self, expr: str, tz: str) -> None:
        self.cs = CronSim(_six(expr), datetime(2000, 1, 1))
        self.zone = package_zone(tz)
        self.all_hours = set(self.cs.hours) == set(range(24))
        self.seconds = sorted(self.cs.seconds)

    def off(self, t: int) -> int:
        o = datetime.fromtimestamp(t, UTC).astimezone(self.zone).utcoffset()
        assert o is not None
        return int(o.total_seconds())

    @lru_cache(maxsize=4096)  # noqa: B019 - one oracle per example
    def day_ok(self, d: date) -> bool:
        if d.month not in self.cs.months:
            return False
        dom, dow = self.cs.match_dom(d), self.cs.match_dow(d)
        return (dom and dow) if self.cs.day_and else (dom or dow)

    def minute_ok(self, wall: datetime) -> bool:
        return self.day_ok(wall.date()) and wall.hour in self.cs.hours and wall.minute in self.cs.minutes

    def first_occurrence(self, wall: datetime, t: int) -> bool:
        return int(wall.replace(tzinfo=self.zone, fold=0).timestamp()) == t

    def fires(self, after_s: int, n: int, window_s: int) -> list[int]:
        out: list[int] = []
        m = after_s - after_s % 60
        end = after_s + window_s
        while len(out) < n and m <= end:
            o = self.off(m)
            wall = datetime.fromtimestamp(m + o, UTC).replace(tzinfo=None)
            sod = wall.hour * 3600 + wall.minute * 60
            skip = 0
            if not self.day_ok(wall.date()):
                skip = 86_400 - sod
            elif wall.hour not in self.cs.hours:
                skip = 3600 - wall.minute * 60
            if skip > 60 and self.off(m + skip - 60) == o and self.off(m - 60) == o:
                m += skip - 60  # the last minute before the boundary is still walked
                continue
            here: set[int] = set()
            if self.minute_ok(wall) and (self.all_hours or self.first_occurrence(wall, m)):
                here.update(m + s for s in self.seconds)
            before = self.off(m - 60)
            if not self.all_hours and before < o:
                # Clocks jumped forward at m: the gap's selected walls run at m.
                for g in range(m + before, m + o, 60):
                    if self.minute_ok(datetime.fromtimestamp(g, UTC).replace(tzinfo=None)):
                        here.add(m)
                        break
            out.extend(sorted(t for t in here if t > after_s))
            m += 60
        return out[:n]
