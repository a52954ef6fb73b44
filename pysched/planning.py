"""From a job's schedule to its runs: run_at, jitter, due time, partition."""

from __future__ import annotations

from pysched import cron, native
from pysched.model import CronSchedule, Job, OnceSchedule
from pysched.protocols import PlannedRun


def partition_for(job_id: str, partitions: int) -> int:
    """The job's partition; ``partitions`` is the store's count, never a
    client's own (see ScheduleStore.partitions)."""
    return int(native.shard_for(job_id, partitions))


def jitter_for(job: Job, now_ms: int) -> int:
    """The job's fixed offset within its jitter window (0 without one)."""
    period = None
    if isinstance(job.schedule, CronSchedule):
        period = cron.first_interval_ms(job.schedule.expr, job.schedule.tz, now_ms)
    window = job.jitter_window_ms(period)
    return int(native.jitter_offset(job.id, window)) if window > 0 else 0


def first_run(job: Job, jitter_ms: int, now_ms: int) -> PlannedRun | None:
    """The first run of a newly registered (or rescheduled) job."""
    match job.schedule:
        case OnceSchedule(run_at_ms=run_at_ms):
            return PlannedRun(run_at_ms, run_at_ms + jitter_ms)
        case CronSchedule(expr=expr, tz=tz):
            nxt = cron.next_after(expr, tz, now_ms)
            return None if nxt is None else PlannedRun(nxt, nxt + jitter_ms)
    raise AssertionError(f"unknown schedule {job.schedule!r}")


def next_run(job: Job, jitter_ms: int, run_at_ms: int, now_ms: int) -> PlannedRun | None:
    """The run after the one at ``run_at_ms`` was dispatched.

    The first schedule time after that run whose due time (with the job's
    jitter) has not passed: after downtime the one overdue run fires, then the
    schedule resumes from now instead of replaying every missed time (the
    ``run_once`` catch-up). Due times, not schedule times, decide: a run
    jittered to 59.99 s past its minute fires after the next minute began,
    and the next minute's run is still ahead, not missed.
    """
    if not isinstance(job.schedule, CronSchedule):
        return None
    nxt = cron.next_after(job.schedule.expr, job.schedule.tz, max(run_at_ms, now_ms - jitter_ms - 1))
    return None if nxt is None else PlannedRun(nxt, nxt + jitter_ms)
