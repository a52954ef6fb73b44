"""The times of a recurring schedule, a cron expression or an interval:
one place that knows both, so that planning, catch-up, previews and pages
ask the schedule for its times and never its kind."""

from __future__ import annotations

from typing_extensions import TypeIs

from pysched import cron, durations
from pysched.model import CronSchedule, IntervalSchedule, OnceSchedule

Recurring = CronSchedule | IntervalSchedule


def is_recurring(schedule: CronSchedule | IntervalSchedule | OnceSchedule) -> TypeIs[Recurring]:
    return not isinstance(schedule, OnceSchedule)


def next_after(schedule: Recurring, after_ms: int) -> int | None:
    """The schedule's first time strictly after ``after_ms`` (epoch ms), or
    None when it has no more."""
    if isinstance(schedule, CronSchedule):
        return cron.next_after(schedule.expr, schedule.tz, after_ms)
    every, start = schedule.every_ms, schedule.start_ms
    if start is not None and after_ms < start:
        return start
    anchor = 0 if start is None else start
    return anchor + ((after_ms - anchor) // every + 1) * every


def period_ms(schedule: Recurring) -> int | None:
    """The shortest gap between two of its times (cron.nominal_period_ms)."""
    if isinstance(schedule, CronSchedule):
        return cron.nominal_period_ms(schedule.expr)
    return schedule.every_ms


def dst_note(schedule: Recurring, fire_ms: int) -> str | None:
    """Why daylight saving moved this time, or None: an interval counts
    elapsed time, which no clock change moves."""
    if isinstance(schedule, CronSchedule):
        return cron.dst_note(schedule.expr, schedule.tz, fire_ms)
    return None


def describe(schedule: Recurring, clock: str | None = None) -> str:
    """``cron */5 * * * * (UTC)``, ``every 5m`` or ``every 1h from <clock>``
    (``clock``: the start, shown by the caller's own format)."""
    if isinstance(schedule, CronSchedule):
        return f"cron {schedule.expr} ({schedule.tz})"
    shown = f"every {durations.format_seconds(schedule.every_s)}"
    return shown if clock is None else f"{shown} from {clock}"
