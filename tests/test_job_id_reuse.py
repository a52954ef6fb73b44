"""A cancelled job's id taken by a new job, end to end on the embedded
engine: what the old job's worker still does (a run queued, a run under
way) is never the new job's, and the new job's runs are its own."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from pysched import Client, native
from pysched.clock import ManualClock, SystemClock
from pysched.dispatch.inprocess import InProcessDispatcher
from pysched.leader.recording import record_sent
from pysched.model import Job
from pysched.node import Backends
from pysched.planning import partition_for
from pysched.protocols import PlannedRun
from pysched.registry import register
from pysched.targets import RunContext
from pysched.worker import DeliveryWorker, Executor, WorkerConfig

CONFIG = WorkerConfig(concurrency=1, batch=4, retry_base_s=0.01, retry_max_s=0.05)

_calls: list[str] = []
# Run by the target while it runs: the job is replaced under it.
_while_running: list[Backends] = []


def call(ctx: RunContext) -> str:
    _calls.append(ctx.idempotency_key)
    while _while_running:
        _replace(_while_running.pop())
    return "done"


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    _calls.clear()
    _while_running.clear()
    yield
    _calls.clear()
    _while_running.clear()


def _job(at_ms: int) -> Job:
    return Job.model_validate(
        {
            "id": "nightly",
            "schedule": {"kind": "once", "run_at_ms": at_ms},
            "target": {"kind": "python", "ref": f"{__name__}:call"},
        }
    )


def _replace(backends: Backends) -> None:
    """Cancel the job, as a prune does, and declare it again: a new job at
    the id, first running a minute from now."""
    now = SystemClock().now_ms()
    backends.store.cancel_job("nightly", now)
    register(backends.store, _job(now + 60_000), now)


def _queue_old_run(backends: Backends, dispatcher: InProcessDispatcher) -> str:
    """Register the job with a run due now, hand it on as a leader does and
    queue it; its idempotency key."""
    now = SystemClock().now_ms()
    job = _job(now - 1_000)
    partition = partition_for(job.id, backends.store.partitions)
    backends.store.add_job(job, partition, 0, PlannedRun(now - 1_000, now - 1_000), now - 1_000)
    fences = backends.coordinator.poll("leader", now)
    (row,) = backends.store.due_runs(fences, now + 1_000, now)
    record_sent(backends.store, [row], fences, {}, now)
    payload = native.encode_batch([row], fences[row.partition], now)[0]
    dispatcher.publish([row.partition], [payload])
    return native.decode(payload).idempotency_key


def _step(backends: Backends, dispatcher: InProcessDispatcher) -> None:
    executor = Executor(backends.claims, backends.store, SystemClock(), "node-1", CONFIG)
    worker = DeliveryWorker(dispatcher.consumer(), executor, random.Random(3), CONFIG.batch)
    assert worker.step(SystemClock().now_ms())


def test_a_queued_run_of_a_replaced_job_never_runs_as_the_new_one(backends: Backends) -> None:
    dispatcher = InProcessDispatcher()
    _queue_old_run(backends, dispatcher)
    _replace(backends)
    _step(backends, dispatcher)
    assert _calls == []
    assert backends.store.history("nightly") == []
    assert backends.store.get_job("nightly").state == "active"


def test_a_late_outcome_of_a_replaced_jobs_run_lands_not_in_the_new_jobs_history(backends: Backends) -> None:
    dispatcher = InProcessDispatcher()
    old_key = _queue_old_run(backends, dispatcher)
    # Replaced while its run is under way: the run ends after.
    _while_running.append(backends)
    _step(backends, dispatcher)
    assert _calls == [old_key]
    job = backends.store.get_job("nightly")
    assert job.state == "active" and job.next_run is not None
    assert backends.store.history("nightly") == [] and backends.store.dead_letters() == []
    # The new job's run has a key of its own, unclaimed.
    assert job.next_run.run_at_ms > int(old_key.split(":")[1])


def test_a_trigger_from_a_clock_behind_is_never_taken_for_the_replaced_jobs_run(tmp_path: Path) -> None:
    ahead, behind = SystemClock(), ManualClock(SystemClock().now_ms() - 60_000)
    with Client(tmp_path / "t.db", clock=ahead) as client:
        client.add(_job(ahead.now_ms() + 3_600_000))
        client.cancel("nightly")
        again = client.add(_job(ahead.now_ms() + 3_600_000))
    with Client(tmp_path / "t.db", clock=behind) as late:
        run = late.trigger("nightly")
        # Of the new job: a worker cancels a record from before its time.
        assert run.run_at_ms >= again.runs_since_ms


@pytest.mark.parametrize("old_schedule", [{"kind": "every", "every_s": 10}, {"kind": "once", "run_at_ms": 0}])
def test_a_run_sent_just_before_its_job_was_replaced_plans_nothing_for_the_new_job(
    backends: Backends, monkeypatch: pytest.MonkeyPatch, old_schedule: dict[str, object]
) -> None:
    """The leader plans the sent run's successor from a read; the job is
    cancelled and its id taken by a new job before the plan is written: the
    old schedule's next run (or completion) is not the new job's."""
    store, t0 = backends.store, 1_800_000_000_000
    spec = {"id": "R", "jitter_window_s": 0, "target": {"kind": "shell", "command": "echo"}}
    schedule = {**old_schedule, "run_at_ms": t0 + 5_000} if old_schedule["kind"] == "once" else old_schedule
    old = register(store, Job.model_validate({**spec, "schedule": schedule}), t0)
    assert old.next_run is not None
    now = old.next_run.due_ms
    store.raise_fence(old.partition, 1)
    rows = store.due_runs({old.partition: 1}, now + 1, now)
    hourly = {"kind": "every", "every_s": 3600, "start_ms": now + 3_600_000}
    planning_state = store.planning_state

    def replaced_meanwhile(job_ids: list[str]) -> object:
        state = planning_state(job_ids)
        store.cancel_job("R", now)
        register(store, Job.model_validate({**spec, "schedule": hourly}), now + 1)
        return state

    monkeypatch.setattr(store, "planning_state", replaced_meanwhile)
    record_sent(store, rows, {old.partition: 1}, {}, now)
    new = store.get_job("R")
    assert new.state == "active"
    assert new.next_run is not None and new.next_run.run_at_ms == now + 3_600_000
