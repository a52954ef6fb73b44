"""Contract: the recorder plans a job's next run from a read, and records
it in a later write; what it planned applies only to the job as it was
read. A job rescheduled, or planned by another leader, in between keeps
what that change planned, on every engine."""

from __future__ import annotations

from collections.abc import Callable, Collection

import pytest

from pysched.leader.recording import record_sent
from pysched.protocols import JobPlanState, PlannedRun, Run, ScheduleStore
from tests import test_contract
from tests.test_contract import Backend, _fresh_t0, backend, cron_job, dispatch, every, once_job, read_through, record

# The engines' fixture and the fresh "now" of each test, shared with the
# contract tests.
__all__ = ["_fresh_t0", "backend"]


def _between_plan_and_record(
    monkeypatch: pytest.MonkeyPatch, store: ScheduleStore, meanwhile: Callable[[], None]
) -> None:
    """The next recording reads its planning state, then ``meanwhile``
    runs, then it writes what it planned from that read."""
    planning_state = store.planning_state

    def read_then_change(job_ids: Collection[str]) -> dict[str, JobPlanState]:
        state = planning_state(job_ids)
        monkeypatch.setattr(store, "planning_state", planning_state)
        meanwhile()
        return state

    monkeypatch.setattr(store, "planning_state", read_then_change)


def _send(backend: Backend, fence: int, now: int, after: int) -> tuple[list[Run], list[Run]]:
    """One step of a leader that has not raised the partitions' fence
    floors (nor moved their watermarks, which carry them on a cluster):
    the runs of schedule times after ``after`` due by ``now`` handed on and
    recorded. A store lists again what was sent behind its watermark,
    which a leader skips."""
    rows = backend.store.due_runs(every(fence), now + 1, now)
    sent = [r for r in rows if r.due_ms <= now and r.run_at_ms > after]
    return sent, record_sent(backend.store, sent, every(fence), {}, now)


def test_a_one_shot_rescheduled_to_a_cron_before_its_completion_is_recorded_keeps_running(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    t0, store = test_contract.T0, backend.store
    store.add_job(once_job("o", t0 + 100), 0, 0, PlannedRun(t0 + 100, t0 + 100), t0)
    cron = cron_job("o")
    _between_plan_and_record(
        monkeypatch, store, lambda: store.reschedule(cron, 0, PlannedRun(t0 + 10_000, t0 + 10_000), t0 + 101)
    )
    # Planned from the one-shot: "completed", which is the old job's end.
    dispatch(backend, t0 + 1_000, 1, t0 + 100)
    job = store.get_job("o")
    assert (job.state, job.job, job.next_run) == ("active", cron, PlannedRun(t0 + 10_000, t0 + 10_000))
    # The cron's first run fires, and its runs go on being planned.
    sent, planned = _send(backend, 1, t0 + 10_000, t0 + 100)
    assert [r.run_at_ms for r in sent] == [t0 + 10_000]
    assert [r.run_at_ms for r in planned] == [t0 + 20_000]
    sent, planned = _send(backend, 1, t0 + 20_000, t0 + 10_000)
    assert ([r.run_at_ms for r in sent], [r.run_at_ms for r in planned]) == ([t0 + 20_000], [t0 + 30_000])


def test_no_run_of_the_old_schedule_fires_after_a_reschedule_between_plan_and_record(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    t0, store = test_contract.T0, backend.store
    store.add_job(cron_job(), 0, 0, PlannedRun(t0 + 10_000, t0 + 10_000), t0)
    minutely = cron_job(expr="0 * * * * *")
    _between_plan_and_record(
        monkeypatch, store, lambda: store.reschedule(minutely, 0, PlannedRun(t0 + 60_000, t0 + 60_000), t0 + 10_001)
    )
    # Planned from the old spec: its next time, t0 + 20 s.
    sent, planned = dispatch(backend, t0 + 20_000, 1, t0 + 10_000)
    assert [r.run_at_ms for r in sent] == [t0 + 10_000] and planned == []
    assert store.get_job("every-10s").next_run == PlannedRun(t0 + 60_000, t0 + 60_000)
    # Only the new schedule's runs fire from here.
    for now in (t0 + 20_000, t0 + 30_000, t0 + 40_000, t0 + 50_000):
        sent, _ = dispatch(backend, now + 10_000, 1, now)
        assert [r.run_at_ms for r in sent] == [], now
    sent, planned = dispatch(backend, t0 + 70_000, 1, t0 + 60_000)
    assert [r.run_at_ms for r in sent] == [t0 + 60_000]
    assert [r.run_at_ms for r in planned] == [t0 + 120_000]
    assert t0 + 20_000 not in {r.run_at_ms for r in store.history("every-10s") if r.state != "cancelled"}


def test_a_stale_leaders_plan_leaves_the_next_run_that_already_ran_as_it_ended(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Leader 1 plans after its run, then stalls past its fence check (no
    # fence floor is raised here: its check read them before leader 2
    # took over). Leader 2 sends the run again, records it, and the next
    # run is handed on and succeeds. Leader 1's write lands last.
    if backend.name == "sqlite":
        pytest.skip("the embedded store checks the fence in the write's own transaction")
    t0, store = test_contract.T0, backend.store
    store.add_job(cron_job(), 0, 0, PlannedRun(t0 + 10_000, t0 + 10_000), t0)

    def leader_2_goes_on() -> None:
        _, (second,) = _send(backend, 2, t0 + 10_500, t0)
        sent, (third,) = _send(backend, 2, t0 + 20_000, t0 + 10_000)
        assert [r.run_at_ms for r in sent] == [second.run_at_ms] == [t0 + 20_000]
        assert store.run_started(record(sent[0], 2), "w1", t0 + 20_010) == 1
        store.run_finished(record(sent[0], 2), "succeeded", None, "done", t0 + 20_020)
        assert third.run_at_ms == t0 + 30_000

    _between_plan_and_record(monkeypatch, store, leader_2_goes_on)
    sent = [r for r in store.due_runs(every(1), t0 + 20_000, t0 + 10_000) if r.due_ms <= t0 + 10_000]
    assert [r.run_at_ms for r in sent] == [t0 + 10_000]
    record_sent(store, sent, every(1), read_through(t0 + 10_000), t0 + 10_000)
    second = store.get_run("every-10s", t0 + 20_000)
    assert (second.state, second.result) == ("succeeded", "done")
    assert store.get_job("every-10s").next_run == PlannedRun(t0 + 30_000, t0 + 30_000)
    # Nothing of it is owed again: leader 2 next sends the run after it.
    sent, planned = _send(backend, 2, t0 + 30_000, t0 + 20_000)
    assert [r.run_at_ms for r in sent] == [t0 + 30_000]
    assert [r.run_at_ms for r in planned] == [t0 + 40_000]


def test_a_time_the_old_schedule_dropped_is_run_when_the_new_one_plans_it(backend: Backend) -> None:
    # Every 20 s, rescheduled to every 10 s before its next run: the dropped
    # run's time is the new schedule's second, which its first run plans.
    t0, store = test_contract.T0, backend.store
    store.add_job(cron_job(expr="*/20 * * * * *"), 0, 0, PlannedRun(t0 + 20_000, t0 + 20_000), t0)
    store.reschedule(cron_job(), 0, PlannedRun(t0 + 10_000, t0 + 10_000), t0 + 1_000)
    sent, planned = _send(backend, 1, t0 + 10_000, t0)
    assert ([r.run_at_ms for r in sent], [r.run_at_ms for r in planned]) == ([t0 + 10_000], [t0 + 20_000])
    sent, planned = _send(backend, 1, t0 + 20_000, t0 + 10_000)
    assert ([r.run_at_ms for r in sent], [r.run_at_ms for r in planned]) == ([t0 + 20_000], [t0 + 30_000])
