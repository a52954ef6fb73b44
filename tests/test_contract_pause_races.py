"""Contract: a pause that lands between a leader's send of a run and its
record of it. The job still names that run as its next (the record moves
it on), but the run is handed on: it is not the pause's to hold. Its
worker runs it, or, finding the job paused, records it missed; the resume
plans from the schedule's time after it. On every engine."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pysched import registry
from pysched.leader.recording import record_sent
from pysched.protocols import MissedRuns, PlannedRun, Run
from tests import test_contract
from tests.test_contract import Backend, _fresh_t0, backend, cron_job, dispatch, every, read_through, record
from tests.test_contract_stale_plans import _between_plan_and_record

# The engines' fixture and the fresh "now" of each test, shared with the
# contract tests.
__all__ = ["_fresh_t0", "backend"]

JOB = "every-10s"
PAUSED = "missed: the job was paused"


def _send_then(backend: Backend, monkeypatch: pytest.MonkeyPatch, now: int, meanwhile: Callable[[Run], None]) -> Run:
    """The job's run due by ``now`` handed on; ``meanwhile`` (given that
    run) happens before the leader records it; then the record."""
    store = backend.store
    (sent,) = [r for r in store.due_runs(every(1), now + 1, now) if r.due_ms <= now]
    _between_plan_and_record(monkeypatch, store, lambda: meanwhile(sent))
    record_sent(store, [sent], every(1), read_through(now), now)
    return sent


def test_a_run_sent_before_a_pause_is_missed_by_its_worker_and_the_resume_plans_the_time_after_it(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    t0, store = test_contract.T0, backend.store
    store.add_job(cron_job(), 0, 0, PlannedRun(t0 + 10_000, t0 + 10_000), t0)
    sent = _send_then(backend, monkeypatch, t0 + 10_000, lambda _: store.pause_job(JOB, t0 + 10_001))
    # Its worker finds the job paused: the run is recorded missed, once.
    span = MissedRuns(JOB, t0 + 10_000, t0 + 10_001, "paused")
    store.run_missed(record(sent, 1), span, PAUSED, t0 + 10_002)
    assert store.get_run(JOB, t0 + 10_000).state == "missed"
    # Resumed before the schedule's next time: that time is the next run,
    # and the run handed on is neither held nor owed again.
    resumed = registry.resume(store, JOB, t0 + 15_000)
    assert (resumed.state, resumed.next_run) == ("active", PlannedRun(t0 + 20_000, t0 + 20_000))
    assert store.get_run(JOB, t0 + 10_000).state == "missed"
    assert store.missed_runs([JOB]) == {JOB: [span]}
    sent_next, planned = dispatch(backend, t0 + 20_001, 1, t0 + 20_000)
    assert [r.run_at_ms for r in sent_next if r.run_at_ms != t0 + 10_000] == [t0 + 20_000]
    assert [r.run_at_ms for r in planned] == [t0 + 30_000]


def test_a_run_that_ran_before_a_pause_keeps_its_outcome_and_the_resume_counts_only_the_times_after_it(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    t0, store = test_contract.T0, backend.store
    store.add_job(cron_job(), 0, 0, PlannedRun(t0 + 10_000, t0 + 10_000), t0)

    def runs_then_pause(sent: Run) -> None:
        assert store.run_started(record(sent, 1), "w1", t0 + 10_010) == 1
        store.run_finished(record(sent, 1), "succeeded", None, "done", t0 + 10_020)
        store.pause_job(JOB, t0 + 10_030)

    _send_then(backend, monkeypatch, t0 + 10_000, runs_then_pause)
    assert store.get_run(JOB, t0 + 10_000).state == "succeeded"
    # Resumed with two times passed while paused (catch-up run_once): the
    # later runs (due now, on a store that keeps no due time in the past),
    # the earlier is missed; the run that ran is neither.
    resumed = registry.resume(store, JOB, t0 + 35_000)
    assert resumed.next_run is not None and resumed.next_run.run_at_ms == t0 + 30_000
    ran = store.get_run(JOB, t0 + 10_000)
    assert (ran.state, ran.result) == ("succeeded", "done")
    assert store.missed_runs([JOB]) == {JOB: [MissedRuns(JOB, t0 + 20_000, t0 + 30_000, "paused")]}
    sent_next, _ = dispatch(backend, t0 + 35_001, 1, t0 + 35_000)
    assert [r.run_at_ms for r in sent_next if r.run_at_ms != t0 + 10_000] == [t0 + 30_000]


def test_a_run_held_by_a_pause_before_it_was_sent_is_still_held(backend: Backend) -> None:
    # The pause holds what it finds waiting, as before: resumed late, the
    # held run is the first time counted missed.
    t0, store = test_contract.T0, backend.store
    store.add_job(cron_job(), 0, 0, PlannedRun(t0 + 10_000, t0 + 10_000), t0)
    paused = store.pause_job(JOB, t0 + 5_000)
    assert paused.next_run == PlannedRun(t0 + 10_000, t0 + 10_000)
    resumed = registry.resume(store, JOB, t0 + 25_000)
    assert resumed.next_run is not None and resumed.next_run.run_at_ms == t0 + 20_000
    held = store.get_run(JOB, t0 + 10_000)
    assert (held.state, held.error) == ("missed", PAUSED)
    assert store.missed_runs([JOB]) == {JOB: [MissedRuns(JOB, t0 + 10_000, t0 + 20_000, "paused")]}
