"""Catch-up after downtime: which of a job's missed schedule times its runs
replay, and whether a run handed on late still runs.

A run is late when it is handed on more than the job's ``max_delay`` after
its due time: its leader was down, its partition moved, the job was
paused. Each policy, for a recurring job:

- ``run_once`` (the default): the late run runs, and the schedule times it
  passed over are skipped; the next run is the first still ahead.
- ``skip``: the late run does not run either; the schedule resumes at the
  next time still ahead.
- ``run_all``: every missed time runs, one after the other, through the
  leader's catch-up lane.
- ``deadline``: the missed times within ``max_delay`` of now run; older
  ones are missed, past their deadline, and so is a run started later than
  that.

A one-shot that is late runs unless its policy is skip or deadline.
Whatever is not run is counted by reason (protocols.MissedRuns).

A job resumed after a pause follows its policy the same way, the times it
passed over while paused counted as ``paused`` (on_resume)."""

from __future__ import annotations

from dataclasses import dataclass

from pysched import recurrence
from pysched.model import Job
from pysched.protocols import MissedRuns, PlannedRun

# Counting a missed span time by time stops here; the rest is estimated
# from the times counted: a year of a minutely job is not walked at read.
_COUNT_EXACTLY = 10_000


def next_run(job: Job, jitter_ms: int, run_at_ms: int, now_ms: int) -> tuple[PlannedRun | None, MissedRuns | None]:
    """The run after the one at ``run_at_ms`` was handed on at ``now_ms``,
    and the schedule times passed over to reach it, by the job's policy.
    Due times, not schedule times, decide what has passed: a run jittered
    to 59.99 s past its minute fires after the next minute began, and the
    next minute's run is still ahead, not missed."""
    sched = job.schedule
    if not recurrence.is_recurring(sched):
        return None, None
    if job.catch_up == "run_all":
        after = run_at_ms
    elif job.catch_up == "deadline":
        after = max(run_at_ms, now_ms - jitter_ms - job.max_delay_ms - 1)
    else:
        after = max(run_at_ms, now_ms - jitter_ms - 1)
    nxt = recurrence.next_after(sched, after)
    planned = None if nxt is None else PlannedRun(nxt, nxt + jitter_ms)
    if after == run_at_ms:
        return planned, None
    first = recurrence.next_after(sched, run_at_ms)
    if first is None or first > after:
        return planned, None
    reason = "past_deadline" if job.catch_up == "deadline" else "skipped"
    # Up to the next run; when the schedule ends, up to what has passed.
    return planned, MissedRuns(job.id, first, after + 1 if nxt is None else nxt, reason)


def held_after_sent(job: Job, jitter_ms: int, sent_run_at_ms: int) -> PlannedRun | None:
    """What a pause holds of a job whose next run, at ``sent_run_at_ms``,
    was handed on before the pause reached it: the schedule's time after
    that run, as its leader's record would have planned it (None: the
    schedule has none). Never the run handed on: it runs, or its worker
    records it missed, once."""
    if not recurrence.is_recurring(job.schedule):
        return None
    nxt = recurrence.next_after(job.schedule, sent_run_at_ms)
    return None if nxt is None else PlannedRun(nxt, nxt + jitter_ms)


def on_resume(
    job: Job, jitter_ms: int, held: PlannedRun | None, now_ms: int
) -> tuple[PlannedRun | None, MissedRuns | None]:
    """The run a job resumed at ``now_ms`` fires next, in place of the run
    it held while paused (None: it held none, and the first run from now
    is the next), and the schedule times passed over for the pause."""
    sched = job.schedule
    if held is None:
        if recurrence.is_recurring(sched):
            nxt = recurrence.next_after(sched, now_ms)
            return (None if nxt is None else PlannedRun(nxt, nxt + jitter_ms)), None
        return None, None
    if held.due_ms > now_ms or not recurrence.is_recurring(sched) or job.catch_up == "run_all":
        # Not due yet; a one-shot is the worker's to judge late; run_all
        # replays every time from the held one on.
        return held, None
    if job.catch_up == "run_once":
        # The latest time already due runs, once.
        nxt = held.run_at_ms
        while (after := recurrence.next_after(sched, nxt)) is not None and after + jitter_ms <= now_ms:
            nxt = after
    elif job.catch_up == "deadline":
        nxt = recurrence.next_after(sched, max(held.run_at_ms - 1, now_ms - jitter_ms - job.max_delay_ms - 1))
    else:
        nxt = recurrence.next_after(sched, now_ms - jitter_ms - 1)
    planned = None if nxt is None else PlannedRun(nxt, nxt + jitter_ms)
    if planned is not None and planned.run_at_ms == held.run_at_ms:
        return held, None
    end = now_ms + 1 if planned is None else planned.run_at_ms
    return planned, MissedRuns(job.id, held.run_at_ms, end, "paused")


@dataclass(frozen=True)
class Replay:
    """What a leader starting now would make of a job's overdue run: how
    many runs it hands on, and how many schedule times it passes over."""

    runs: int
    missed: int
    reason: str | None  # why those are missed (a MissedRuns reason)


def replay(job: Job, jitter_ms: int, overdue: PlannedRun, now_ms: int) -> Replay:
    """For ``pysched catch-up --dry-run``: the policy applied to a job whose
    next run, ``overdue``, is due before ``now_ms``."""
    sched = job.schedule
    if not recurrence.is_recurring(sched):
        late = late_reason(job, overdue.due_ms, now_ms)
        return Replay(0, 1, late) if late else Replay(1, 0, None)
    due_by_now = _span(job, overdue.run_at_ms, now_ms - jitter_ms + 1)
    if job.catch_up == "run_all":
        return Replay(due_by_now, 0, None)
    _, passed = next_run(job, jitter_ms, overdue.run_at_ms, now_ms)
    passed_over = 0 if passed is None else count_missed(job, passed)
    first_runs = late_reason(job, overdue.due_ms, now_ms) is None
    if job.catch_up == "deadline":
        # The times within max_delay run, the overdue one too if it is.
        runs = due_by_now - passed_over - (0 if first_runs else 1)
        return Replay(runs, due_by_now - runs, "past_deadline")
    return Replay(int(first_runs), passed_over + (0 if first_runs else 1), "skipped")


def _span(job: Job, first_ms: int, end_ms: int) -> int:
    return count_missed(job, MissedRuns(job.id, first_ms, end_ms, "")) if end_ms > first_ms else 0


def late_reason(job: Job, due_ms: int, now_ms: int) -> str | None:
    """Why a run due at ``due_ms``, handed on first at ``now_ms``, does not
    run (a MissedRuns reason), or None: it runs."""
    if now_ms - due_ms <= job.max_delay_ms:
        return None
    if job.catch_up == "skip":
        return "skipped"
    if job.catch_up == "deadline":
        return "past_deadline"
    return None


def count_missed(job: Job, missed: MissedRuns) -> int:
    """How many schedule times ``missed`` spans."""
    sched = job.schedule
    if not recurrence.is_recurring(sched):
        return 1
    count, t = 0, missed.first_ms - 1
    while count < _COUNT_EXACTLY:
        nxt = recurrence.next_after(sched, t)
        if nxt is None or nxt >= missed.end_ms:
            return count
        count, t = count + 1, nxt
    # The times so far set the pace of the rest.
    spacing = (t - missed.first_ms) / (count - 1)
    return count + int((missed.end_ms - 1 - t) // spacing)
