"""Cron expressions, evaluated in the job's time zone.

Expressions have five fields (minute hour day month weekday) or six with a
leading seconds field (second minute hour day month weekday), or one of the
macros ``@yearly @annually @monthly @weekly @daily @midnight @hourly``.
Evaluation is cronsim's, which follows Debian cron.

**Daylight saving time**, the rule pysched follows (and tests):

- *Gap* (clocks jump forward, e.g. 02:00 -> 03:00): a run whose wall time
  falls in the skipped hour fires once, at the first instant after the gap
  (03:00 local). It is never skipped.
- *Repeat* (clocks fall back, e.g. 02:00 -> 01:00): a job whose hour field
  names specific hours fires once, at the first occurrence of the repeated
  wall time. A job that runs every hour or more often (hour field ``*``)
  keeps firing in real time through both copies of the hour.
"""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


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


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise CronError(f"unknown time zone {name!r}") from None


def validate(expr: str, tz: str = "UTC") -> None:
    """Raise CronError naming what is wrong, or return when both are usable."""
    text = expand(expr)
    if len(text.split()) not in (5, 6):
        raise CronError(f"expected 5 fields, or 6 with seconds first, got {len(text.split())} in {expr!r}")
    try:
        # Any start instant will do to check the fields: not the wall clock.
        CronSim(text, datetime(2000, 1, 1, tzinfo=zone(tz)))
    except CronSimError as exc:
        raise CronError(f"{exc} in {expr!r}") from None


def next_after(expr: str, tz: str, after_ms: int) -> int | None:
    """The first fire time strictly after ``after_ms`` (epoch ms), or None when
    the expression never fires again (cronsim looks 50 years ahead)."""
    start = datetime.fromtimestamp(after_ms / 1000, UTC).astimezone(zone(tz))
    # cronsim works in whole seconds and yields times strictly after start's second.
    start = start.replace(microsecond=0)
    try:
        for fire in CronSim(expand(expr), start):
            fire_ms = int(fire.timestamp()) * 1000
            if fire_ms > after_ms:
                return fire_ms
    except CronSimError as exc:
        raise CronError(str(exc)) from None
    return None


def first_interval_ms(expr: str, tz: str, after_ms: int) -> int | None:
    """The gap between the next two fire times: the job's period, roughly."""
    first = next_after(expr, tz, after_ms)
    if first is None:
        return None
    second = next_after(expr, tz, first)
    return None if second is None else second - first
