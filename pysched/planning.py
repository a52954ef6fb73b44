"""From a job's schedule to its runs: run_at, jitter, due time, partition."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from pysched import catchup, native, recurrence
from pysched.model import Job, OnceSchedule
from pysched.protocols import JobPlanState, NextRun, NextRuns, PlannedRun, Run


def partition_for(job_id: str, partitions: int) -> int:
    """The job's partition; ``partitions`` is the store's count, never a
    client's own (see ScheduleStore.partitions)."""
    return int(native.shard_for(job_id, partitions))


def jitter_for(job: Job) -> int:
    """The job's fixed offset within its jitter window (0 without one): a
    function of its id and spec alone, so the same job gets the same offset
    whichever day, DST night or not, it is registered on."""
    period = recurrence.period_ms(job.schedule) if recurrence.is_recurring(job.schedule) else None
    window = job.jitter_window_ms(period)
    return int(native.jitter_offset(job.id, window)) if window > 0 else 0


def first_run(job: Job, jitter_ms: int, now_ms: int) -> PlannedRun | None:
    """The first run of a newly registered (or rescheduled) job."""
    schedule = job.schedule
    if isinstance(schedule, OnceSchedule):
        return PlannedRun(schedule.run_at_ms, schedule.run_at_ms + jitter_ms)
    nxt = recurrence.next_after(schedule, now_ms)
    return None if nxt is None else PlannedRun(nxt, nxt + jitter_ms)


def is_resend(state: JobPlanState, run_at_ms: int) -> bool:
    """Whether the run at ``run_at_ms`` was handed on before (by a leader
    that died, or to a worker that did): the job's next run is already
    later, planned when it was first handed on."""
    return state.next_run_at_ms is not None and state.next_run_at_ms > run_at_ms


def plan_after_dispatch(rows: Sequence[Run], jobs: Mapping[str, JobPlanState], now_ms: int) -> NextRuns:
    """What follows the runs of a batch handed on, in the order sent: for
    each, nothing if its job is not active (absent from ``jobs``) or it is a
    re-send (``is_resend``); else the job's next run, or its completion when
    no run is to come (a one-shot, a finished schedule). A job with several
    runs in the batch is judged by what its earlier runs planned. Each plan
    names the next run it was made from (NextRuns.planned_from)."""
    states = dict(jobs)
    planned: dict[str, NextRun] = {}
    completed: dict[str, None] = {}
    # What each plan was made from, as read: its write applies only to that.
    planned_from: dict[str, int | None] = {}
    for row in rows:
        state = states.get(row.job_id)
        # A run triggered beside the schedule (attempt group above 0)
        # follows no schedule time: the schedule's own runs plan it.
        if state is None or row.attempt_group != 0 or is_resend(state, row.run_at_ms):
            continue
        planned_from.setdefault(row.job_id, jobs[row.job_id].next_run_at_ms)
        nxt, missed = catchup.next_run(state.job, state.jitter_ms, row.run_at_ms, now_ms)
        if nxt is None:
            completed[row.job_id] = None
            planned.pop(row.job_id, None)
            del states[row.job_id]
            continue
        planned[row.job_id] = NextRun(row.job_id, state.partition, nxt, missed)
        states[row.job_id] = replace(state, next_run_at_ms=nxt.run_at_ms)
    return NextRuns(list(planned.values()), list(completed), planned_from=planned_from)


def planned_before(rows: Sequence[Run], jobs: Mapping[str, JobPlanState]) -> list[NextRun]:
    """The next runs already stored for the re-sent runs of a batch (those
    ``plan_after_dispatch`` plans nothing for), where the store says when
    they are due. An earlier recording of this very batch may have stored
    them and then failed (its answer lost): the leader must hold its
    watermark below them and take them into its wheel as if just planned,
    or one due already, read by no load, would be passed and never sent."""
    out: dict[str, NextRun] = {}
    for row in rows:
        state = jobs.get(row.job_id)
        if state is None or row.attempt_group != 0 or state.next_run_at_ms is None or state.next_due_ms is None:
            continue
        if not is_resend(state, row.run_at_ms):
            continue
        out[row.job_id] = NextRun(
            row.job_id, state.partition, PlannedRun(state.next_run_at_ms, state.next_due_ms), None
        )
    return list(out.values())
