"""Contract: a run triggered now, once, beside a job's schedule, on every
engine. It has an idempotency key of its own, is handed on at once, and
moves nothing of the schedule: the next planned run stays where it was, and
a one-shot's trigger does not complete it."""

from __future__ import annotations

import pytest

from pysched import registry
from pysched.leader.recording import record_sent
from pysched.planning import plan_after_dispatch
from pysched.protocols import JobNotActive, JobNotFound, JobPlanState, PlannedRun, Run
from tests import test_contract
from tests.test_contract import Backend, _fresh_t0, backend, cron_job, dispatch, due, every, once_job, read_through

# The engines' fixture and the fresh "now" of each test, shared with the
# contract tests.
__all__ = ["_fresh_t0", "backend"]


def test_a_triggered_run_is_handed_on_once_and_moves_nothing_of_the_schedule(backend: Backend) -> None:
    t0 = test_contract.T0
    backend.store.add_job(cron_job("hourly", "0 0 * * * *"), 1, 0, PlannedRun(t0 + 3_600_000, t0 + 3_600_000), t0)
    before = backend.store.get_job("hourly").next_run
    first = backend.store.trigger("hourly", t0 + 1_000)
    again = backend.store.trigger("hourly", t0 + 1_000)
    assert (first.run_at_ms, first.attempt_group, first.state) == (t0 + 1_000, 1, "scheduled")
    assert (again.run_at_ms, again.attempt_group) == (t0 + 1_000, 2)
    assert first.idempotency_key == f"hourly:{t0 + 1_000}:1"
    sent, planned = dispatch(backend, t0 + 10_000, 1, t0 + 5_000)
    assert sorted((r.job_id, r.run_at_ms, r.attempt_group) for r in sent) == [
        ("hourly", t0 + 1_000, 1),
        ("hourly", t0 + 1_000, 2),
    ]
    assert planned == []
    assert backend.store.get_job("hourly").next_run == before
    # Never handed out again once the leader read past them.
    record_sent(backend.store, [], every(1), read_through(t0 + 75_000), t0 + 75_000)
    assert due(backend, t0 + 80_000, 1, t0 + 75_000) == []


def test_a_completed_one_shot_runs_again_but_a_paused_or_cancelled_job_does_not(backend: Backend) -> None:
    t0 = test_contract.T0
    backend.store.add_job(once_job("once", t0 + 1_000), 0, 0, PlannedRun(t0 + 1_000, t0 + 1_000), t0)
    dispatch(backend, t0 + 10_000, 1, t0 + 2_000)
    assert backend.store.get_job("once").state == "completed"
    again = backend.store.trigger("once", t0 + 3_000)
    sent, _ = dispatch(backend, t0 + 10_000, 1, t0 + 6_000)
    # (The one-shot's own run may be read again within the settle window.)
    assert [(r.run_at_ms, r.attempt_group) for r in sent if r.attempt_group] == [(again.run_at_ms, 1)]
    assert backend.store.get_job("once").state == "completed"
    backend.store.add_job(cron_job("held"), 2, 0, PlannedRun(t0 + 10_000, t0 + 10_000), t0)
    backend.store.pause_job("held", t0 + 1)
    with pytest.raises(JobNotActive, match="resume it first"):
        backend.store.trigger("held", t0 + 2)
    backend.store.cancel_job("held", t0 + 3)
    with pytest.raises(JobNotActive, match="cancelled"):
        backend.store.trigger("held", t0 + 4)
    with pytest.raises(JobNotFound):
        backend.store.trigger("nobody", t0 + 5)


def test_a_run_triggered_before_a_pause_still_runs(backend: Backend) -> None:
    # A one-off, no part of the schedule the pause holds (as a Job made from
    # a CronJob runs whatever the CronJob's suspend says).
    t0 = test_contract.T0
    backend.store.add_job(cron_job("daily", "0 0 0 * * *"), 3, 0, PlannedRun(t0 + 86_400_000, t0 + 86_400_000), t0)
    backend.store.trigger("daily", t0 + 1_000)
    backend.store.pause_job("daily", t0 + 1_500)
    sent, _ = dispatch(backend, t0 + 10_000, 1, t0 + 5_000)
    assert [(r.run_at_ms, r.attempt_group) for r in sent] == [(t0 + 1_000, 1)]


def test_a_trigger_then_a_pause_and_a_resume_run_it_once_and_keep_the_schedule(backend: Backend) -> None:
    # The triggered run is no part of the schedule: resuming took it for the
    # job's next run, planned a second run at its time (run twice) and
    # recorded the schedule's own next run missed (lost).
    t0 = test_contract.T0
    nxt = PlannedRun(t0 + 300_000, t0 + 300_000)
    backend.store.add_job(cron_job("five", "0 */5 * * * *"), 3, 0, nxt, t0)
    backend.store.trigger("five", t0 + 1_000)
    assert backend.store.get_job("five").next_run == nxt
    backend.store.pause_job("five", t0 + 1_500)
    resumed = registry.resume(backend.store, "five", t0 + 2_000)
    assert (resumed.state, resumed.next_run) == ("active", nxt)
    sent, _ = dispatch(backend, t0 + 10_000, 1, t0 + 5_000)
    assert [(r.run_at_ms, r.attempt_group) for r in sent] == [(t0 + 1_000, 1)]
    # Nothing recorded missed.
    assert [(r.run_at_ms, r.state) for r in backend.store.history("five")] == [(t0 + 1_000, "dispatched")]
    sent, _ = dispatch(backend, t0 + 400_000, 1, t0 + 300_000)
    # (The triggered run may be read again within the settle window.)
    assert [(r.run_at_ms, r.attempt_group) for r in sent if not r.attempt_group] == [(t0 + 300_000, 0)]


def test_a_triggered_run_plans_nothing() -> None:
    # The rule every engine's leader follows. Without it, a trigger of a
    # one-shot whose own run is overdue (its leader was down) completed the
    # job, and of a cron job planned a schedule time after the trigger's.
    one_shot = JobPlanState(once_job("late", 1_000), 0, 0, 1_000)
    cron = JobPlanState(cron_job("tick"), 0, 0, 1_000)
    triggered = [Run(1, "late", 5_000, 5_000, 0, 1, 1), Run(2, "tick", 5_000, 5_000, 0, 1, 1)]
    planned = plan_after_dispatch(triggered, {"late": one_shot, "tick": cron}, 5_000)
    assert (planned.runs, planned.completed) == ([], [])
