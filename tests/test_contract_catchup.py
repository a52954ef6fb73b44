"""Contract tests of catch-up after downtime and of missed runs: every
engine alike."""

from __future__ import annotations

import pytest

import tests.test_contract as contract
from pysched.catchup import count_missed
from pysched.leader.recording import record_sent
from pysched.model import Job
from pysched.protocols import JobNotActive, MissedRuns, PlannedRun
from pysched.records import DispatchRecord
from tests.test_contract import Backend, _fresh_t0, backend, every, once_job, record

__all__ = ["_fresh_t0", "backend"]  # the shared fixtures, used by name

MINUTE = 60_000


def minutely(policy: str, max_delay_s: float | None = None) -> Job:
    spec = {
        "id": f"m-{policy}",
        "schedule": {"kind": "cron", "expr": "* * * * *"},
        "target": {"kind": "shell", "command": "true"},
        "jitter_window_s": 0,
        "catch_up": policy,
    }
    if max_delay_s is not None:
        spec["max_delay_s"] = max_delay_s
    return Job.model_validate(spec)


def _down_ten_minutes(backend: Backend, job: Job) -> int:
    """``job`` registered at T0 with its first run at T0 + 1 min; no leader
    until T0 + 10 min 30 s, when the overdue run is handed on. Returns that
    time."""
    t0 = contract.T0
    store = backend.store
    store.add_job(job, 0, 0, PlannedRun(t0 + MINUTE, t0 + MINUTE), t0)
    back = t0 + 10 * MINUTE + 30_000
    (overdue,) = store.due_runs(every(1), back + 60_000, back)
    assert overdue.run_at_ms == t0 + MINUTE
    record_sent(store, [overdue], every(1), {}, back)
    return back


@pytest.mark.parametrize(
    ("policy", "max_delay_s", "next_at", "missed"),
    [
        # One run (the overdue one), the eight times after it skipped.
        ("run_once", None, 11, ("skipped", 2, 11, 9)),
        # The same plan: the overdue run itself is the worker's to skip.
        ("skip", None, 11, ("skipped", 2, 11, 9)),
        # Every time replays, one after the other.
        ("run_all", None, 2, None),
        # The times within 3 min of now (7.5 min and later) replay.
        ("deadline", 180, 8, ("past_deadline", 2, 8, 6)),
    ],
)
def test_after_downtime_each_policy_plans_its_next_run_and_records_what_it_passed_over(
    backend: Backend, policy: str, max_delay_s: float | None, next_at: int, missed: tuple[str, int, int, int] | None
) -> None:
    t0 = contract.T0
    job = minutely(policy, max_delay_s)
    _down_ten_minutes(backend, job)
    assert backend.store.get_job(job.id).next_run == PlannedRun(t0 + next_at * MINUTE, t0 + next_at * MINUTE)
    spans = backend.store.missed_runs([job.id]).get(job.id, [])
    if missed is None:
        assert spans == []
        return
    reason, first, end, count = missed
    assert spans == [MissedRuns(job.id, t0 + first * MINUTE, t0 + end * MINUTE, reason)]
    assert count_missed(job, spans[0]) == count


def _sent_late(backend: Backend, job_id: str) -> DispatchRecord:
    """A one-shot (catch-up skip) due at T0 + 100 ms, handed on ten minutes
    late."""
    t0 = contract.T0
    store = backend.store
    job = once_job(job_id, t0 + 100).model_copy(update={"catch_up": "skip"})
    store.add_job(job, 0, 0, PlannedRun(t0 + 100, t0 + 100), t0)
    (late,) = [r for r in store.due_runs(every(1), t0 + 11 * MINUTE, t0 + 10 * MINUTE) if r.job_id == job_id]
    record_sent(store, [late], every(1), {}, t0 + 10 * MINUTE)
    return record(late, 1)


def test_a_run_missed_never_starts_and_counts_once(backend: Backend) -> None:
    t0 = contract.T0
    store = backend.store
    late = _sent_late(backend, "late")
    span = MissedRuns("late", late.run_at_ms, late.run_at_ms + 1, "skipped")
    store.run_missed(late, span, "missed: too late", t0 + 10 * MINUTE + 10)
    # Repeated after a timeout, or by a redelivery: the same one time.
    store.run_missed(late, span, "missed: too late", t0 + 10 * MINUTE + 20)
    (run,) = store.history("late")
    assert (run.state, run.error) == ("missed", "missed: too late")
    assert store.missed_runs(["late", "other"]) == {"late": [span]}
    # A redelivery of it, whatever its attempt, finds it missed: not run.
    assert store.run_started(late._replace(attempt=2), "w2", t0 + 10 * MINUTE + 30) is None
    assert store.history("late")[0].state == "missed"


def test_a_run_that_started_is_not_missed_after_the_fact(backend: Backend) -> None:
    t0 = contract.T0
    store = backend.store
    started = _sent_late(backend, "started")
    assert store.run_started(started, "w1", t0 + 10 * MINUTE + 5) == 1
    span = MissedRuns("started", started.run_at_ms, started.run_at_ms + 1, "skipped")
    store.run_missed(started, span, "missed: too late", t0 + 10 * MINUTE + 10)
    assert store.history("started")[0].state == "running"
    assert store.missed_runs(["started"]) == {}


def test_a_paused_job_holds_its_run_until_resumed_as_it_was(backend: Backend) -> None:
    t0 = contract.T0
    store = backend.store
    job = minutely("run_once")
    store.add_job(job, 0, 0, PlannedRun(t0 + MINUTE, t0 + MINUTE), t0)
    paused = store.pause_job(job.id, t0 + 10)
    assert (paused.state, paused.next_run) == ("paused", PlannedRun(t0 + MINUTE, t0 + MINUTE))
    # Out of every leader's reads, and not planned after.
    assert store.due_runs(every(1), t0 + 10 * MINUTE, t0 + 20) == []
    assert store.planning_state({job.id}) == {}
    with pytest.raises(JobNotActive):
        store.pause_job(job.id, t0 + 30)
    resumed = store.resume_job(job.id, PlannedRun(t0 + MINUTE, t0 + MINUTE), None, t0 + 40)
    assert (resumed.state, resumed.next_run) == ("active", PlannedRun(t0 + MINUTE, t0 + MINUTE))
    assert [r.run_at_ms for r in store.due_runs(every(1), t0 + 10 * MINUTE, t0 + 50)] == [t0 + MINUTE]
    with pytest.raises(JobNotActive):
        store.resume_job(job.id, None, None, t0 + 60)


def test_a_job_resumed_later_records_its_held_run_missed_and_fires_the_next(backend: Backend) -> None:
    t0 = contract.T0
    store = backend.store
    job = minutely("skip")
    store.add_job(job, 0, 0, PlannedRun(t0 + MINUTE, t0 + MINUTE), t0)
    store.pause_job(job.id, t0 + 10)
    back = t0 + 10 * MINUTE + 30_000
    span = MissedRuns(job.id, t0 + MINUTE, t0 + 11 * MINUTE, "paused")
    resumed = store.resume_job(job.id, PlannedRun(t0 + 11 * MINUTE, t0 + 11 * MINUTE), span, back)
    assert resumed.next_run == PlannedRun(t0 + 11 * MINUTE, t0 + 11 * MINUTE)
    (held,) = store.history(job.id)
    assert (held.run_at_ms, held.state, held.error) == (t0 + MINUTE, "missed", "missed: the job was paused")
    assert [r.run_at_ms for r in store.due_runs(every(1), back + MINUTE, back)] == [t0 + 11 * MINUTE]
    assert store.missed_runs([job.id]) == {job.id: [span]}
    assert count_missed(job, span) == 10


def test_a_missed_span_written_twice_keeps_the_later_end(backend: Backend) -> None:
    t0 = contract.T0
    store = backend.store
    late = _sent_late(backend, "late")
    whole = MissedRuns("late", late.run_at_ms, late.run_at_ms + 5 * MINUTE, "paused")
    store.run_missed(late, whole, "missed: the job was paused", t0 + 10 * MINUTE)
    store.run_missed(late, MissedRuns("late", late.run_at_ms, late.run_at_ms + 1, "paused"), "x", t0 + 10 * MINUTE)
    assert store.missed_runs(["late"]) == {"late": [whole]}
