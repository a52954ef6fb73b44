"""Cron expressions, evaluated in the job's time zone.

Expressions have five fields (minute hour day month weekday) or six with a
leading seconds field (second minute hour day month weekday), or one of the
macros ``@yearly @annually @monthly @weekly @daily @midnight @hourly``.
Fields take ``*``, numbers, ranges ``a-b``, lists ``a,b``, steps ``*/k``,
``a-b/k`` and ``a/k`` (from a to the field's top), month and weekday names,
``L`` and ``LW`` (last day, last weekday of the month) in the day field, and
``nL`` (last n-day) and ``n#k`` (k-th n-day) in the weekday field.

- ``5-5/20`` is {5}: a step walks its range and keeps the start.
- Weekdays run 0-7, both Sunday; a step walks 0-7, so ``1/2`` is 1,3,5,7
  (Monday, Wednesday, Friday, Sunday) and ``*/2`` is 0,2,4,6.
- Day of month and day of week: when both are restricted (neither starts
  with ``*``) a day matching either fires; otherwise a day must match both.

**Daylight saving time**, the rule pysched follows (and tests against a
brute-force oracle). Let H be the set of hours the expression allows.

- H is all 24 hours (``*``, ``*/1``, ``0-23``, ``@hourly`` or finer): the job
  keeps its real-time rhythm. A wall time that does not exist (clocks jump
  forward) is not fired; a wall time that occurs twice (clocks fall back)
  fires at both instants.
- Otherwise (fixed hours), whatever the minute and second fields are: a wall
  time that occurs twice fires once, at its first occurrence; all the wall
  times of one gap that the expression selects fire once together, at the
  first instant after the gap (02:00 and 02:30 in a 02:00-03:00 gap: one run
  at 03:00), which is also the run of the gap's end if the expression
  selects it. No existing wall time it selects is ever lost: 30-minute
  changes (Australia/Lord_Howe), changes at midnight (America/Santiago) and a
  skipped day (Pacific/Apia, 2011-12-30) follow the same rule.

This module is the only place the rule lives. Every evaluation is bounded:
it looks at most ``HORIZON_YEARS`` ahead and takes at most ``STEP_BUDGET``
steps between offset changes, then answers "no further run".
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pysched import zones
from pysched.cronexpr import Expr, ExprError, parse

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# Zone names whose meaning is the machine's own configuration.
MACHINE_ZONES = frozenset({"localtime", "posixrules", "Factory"})
MAX_EXPR_CHARS = 1_000
HORIZON_YEARS = 100
HORIZON_S = HORIZON_YEARS * 366 * 86_400
STEP_BUDGET = 1_000
# How far back an offset change still decides which wall times repeat: more
# than the largest change in the tz database (a day).
_REPEAT_WINDOW_S = 2 * 86_400


class CronError(ValueError):
    """An expression or time zone that cannot be evaluated."""


def expand(expr: str) -> str:
    text = " ".join(expr.split())
    if text.startswith("@"):
        try:
            return MACROS[text.lower()]
        except KeyError:
            raise CronError(f"unknown macro {text!r}; known: {', '.join(MACROS)}") from None
    return text


@lru_cache(maxsize=4096)
def compile_expr(expr: str) -> Expr:
    """The parsed expression, cached: the scheduler evaluates the same few
    expressions over and over."""
    if len(expr) > MAX_EXPR_CHARS:
        raise CronError(f"longer than {MAX_EXPR_CHARS:,} characters ({len(expr):,})")
    try:
        return parse(expand(expr))
    except ExprError as exc:
        shown = expr if len(expr) <= 80 else expr[:77] + "..."
        raise CronError(f"{exc} in {shown!r}") from None


@lru_cache(maxsize=1)
def _portable_zones() -> frozenset[str]:
    """The IANA names the tzdata package ships: the same zones on every node."""
    names = resources.files("tzdata").joinpath("zones").read_text().split()
    return frozenset(names) - MACHINE_ZONES


@lru_cache(maxsize=512)
def _table(name: str) -> zones.ZoneTable:
    if name in MACHINE_ZONES or name.startswith(("posix/", "right/")):
        raise CronError(
            f"time zone {name!r} depends on the machine it is read on; name a zone such as"
            " Europe/Paris, which means the same on every node"
        )
    if name not in _portable_zones():
        if name and _is_region(name):
            raise CronError(f"unknown time zone {name!r}: a region, not a zone (for example {name}/...)")
        raise CronError(f"unknown time zone {name[:64]!r}")
    try:
        return zones.ZoneTable(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise CronError(f"unknown time zone {name!r}") from None


def _is_region(name: str) -> bool:
    """Whether ``name`` is a folder of zones (Europe); a name no file can
    have (too long, a NUL) is none."""
    try:
        return (resources.files("tzdata") / "zoneinfo" / name).is_dir()
    except (OSError, ValueError):
        return False


def zone(name: str) -> ZoneInfo:
    """The zone called ``name``, or CronError."""
    return _table(name).zone


def validate(expr: str, tz: str = "UTC") -> None:
    """Raise CronError naming what is wrong, or return when both are usable."""
    if not compile_expr(expr).ever_fires():
        raise CronError(f"{expr!r} never fires: no date matches its day, month and weekday fields")
    _table(tz)


def _next_fire(ex: Expr, z: zones.ZoneTable, after: int) -> int | None:
    """The first fire, in UTC seconds, strictly after ``after``."""
    until = after + HORIZON_S
    lo = after + 1  # the earliest instant still to consider
    for _ in range(STEP_BUDGET):
        off = z.offset_at(lo)
        lo_wall = lo + off
        if not ex.all_hours:
            change = z.last_change(lo, _REPEAT_WINDOW_S)
            if change is not None:
                at, before = change
                if before > off:
                    # Fall back at `at`: walls up to at + before already ran, at
                    # their first occurrence.
                    lo_wall = max(lo_wall, at + before)
                elif before < off and at == lo:
                    # Spring forward at `lo`: the gap's walls run now, together.
                    w = ex.next_wall(at + before, at + off - 1)
                    if w is not None:
                        return lo
        w = ex.next_wall(lo_wall, until + off)
        if w is None:
            return None
        fire = w - off
        change_at = z.next_change(lo, fire)
        if change_at is None:
            return fire
        # The offset changes before that wall time comes: start again there.
        lo = change_at
    return None


def next_after(expr: str, tz: str, after_ms: int) -> int | None:
    """The first fire time strictly after ``after_ms`` (epoch ms), or None when
    the expression fires no more within HORIZON_YEARS."""
    after = after_ms // 1000
    try:
        year = zones.year_of(after)
    except (ValueError, OverflowError):
        return None  # before year 1 or after 9999: no calendar to evaluate
    if not zones.MIN_YEAR < year < zones.MAX_YEAR - HORIZON_YEARS:
        return None
    fire = _next_fire(compile_expr(expr), _table(tz), after)
    return None if fire is None else fire * 1000


# Any fixed instant would do (2001-01-01T00:00Z, a Monday): what matters is
# that it is the same for every job and every day of registration.
_REFERENCE_MS = 978_307_200_000
_PERIOD_SAMPLES = 64
_PERIOD_SPAN_MS = 400 * 86_400_000


@lru_cache(maxsize=4096)
def nominal_period_ms(expr: str) -> int | None:
    """The shortest gap between consecutive fires on a clock without offset
    changes (UTC), among the first fires within about a year of a fixed
    instant (None with fewer than two): a job's period from its expression
    alone, not from the day it is asked."""
    first = at = next_after(expr, "UTC", _REFERENCE_MS)
    shortest = None
    for _ in range(_PERIOD_SAMPLES):
        if at is None or first is None or at - first > _PERIOD_SPAN_MS:
            break
        nxt = next_after(expr, "UTC", at)
        if nxt is not None and nxt - first <= _PERIOD_SPAN_MS and (shortest is None or nxt - at < shortest):
            shortest = nxt - at
        at = nxt
    return shortest


def dst_note(expr: str, tz: str, fire_ms: int) -> str | None:
    """Why the DST rule put a fire where it is, or None for an ordinary one:
    wall times of a gap moved (and merged) to its end, or a repeated wall time."""
    ex, table = compile_expr(expr), _table(tz)
    at = fire_ms // 1000
    off = table.offset_at(at)
    change = table.last_change(at, _REPEAT_WINDOW_S)
    if change is not None:
        when, before = change
        if before < off and when == at and not ex.all_hours:
            gap = _walls(ex, at + before, at + off - 1)
            if gap:
                merged = len(gap) > 1 or ex.next_wall(at + off, at + off) is not None
                shown = ", ".join(_clock(w) for w in gap[:3]) + (", ..." if len(gap) > 3 else "")
                verb = "merged" if merged else "moved"
                return f"{verb}: {shown} did not exist (clocks jumped forward); run at the gap's end"
        if before > off and at < when + (before - off):
            return "repeated wall time: its second occurrence"
    nxt = table.next_change(at, at + _REPEAT_WINDOW_S)
    if nxt is not None:
        after = table.offset_at(nxt)
        if after < off and at >= nxt - (off - after):
            if ex.all_hours:
                return "repeated wall time: its first occurrence"
            return "repeated wall time: runs once, at its first occurrence"
    return None


def _walls(ex: Expr, lo: int, hi: int) -> list[int]:
    """Up to four selected wall times in [lo, hi]."""
    out: list[int] = []
    w = ex.next_wall(lo, hi)
    while w is not None and len(out) < 4:
        out.append(w)
        w = ex.next_wall(w + 1, hi)
    return out


def _clock(wall: int) -> str:
    h, rem = divmod(wall % 86_400, 3600)
    m, s = divmod(rem, 60)
    return f"{h:02d}:{m:02d}" + (f":{s:02d}" if s else "")
