"""A delivery worker's step on the memory engine and a manual clock: a failed
attempt waits out its backoff and is tried again before anything is
acknowledged, a run held elsewhere is looked at again later, and a stop
acknowledges nothing unfinished. Nothing here sleeps or reads real time."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from pysched import native
from pysched.clock import ManualClock
from pysched.leader.recording import record_sent
from pysched.memory import MemoryCluster, MemoryNode, open_memory
from pysched.memory.faults import FaultInjector, FaultPoint, Phase, ScriptedFault
from pysched.model import Job
from pysched.protocols import ClaimOutcome
from pysched.records import DispatchRecord
from pysched.registry import register
from pysched.targets import RunContext
from pysched.worker import DeliveryWorker, Executor, WorkerConfig
from pysched.worker.calls import Capacity, ThreadedCalls

T0 = 1_700_000_040_000
CONFIG = WorkerConfig(lease_ms=30_000, retry_base_s=0.2, retry_max_s=10.0, busy_wait_ms=5_000)

# The idempotency key and attempt of each start of the target below, in
# order, and what a test has it do while it runs.
_runs: list[str] = []
_attempts: list[int] = []
_while_running: list[Callable[[], None]] = []


def count_run(ctx: RunContext) -> None:
    _runs.append(ctx.idempotency_key)
    _attempts.append(ctx.attempt)
    if ctx.job_id.startswith("held"):
        _release.wait(30)
    while _while_running:
        _while_running.pop(0)()
    if ctx.job_id.startswith("stops") and ctx.cancelled.is_set():
        raise RuntimeError("stopped: ctx.cancelled was set")


# What a run of a job named held* waits for before it returns.
_release = threading.Event()


@pytest.fixture(autouse=True)
def _no_runs_yet() -> Iterator[None]:
    _release.clear()
    _runs.clear()
    _attempts.clear()
    _while_running.clear()
    yield
    _runs.clear()
    _attempts.clear()
    _while_running.clear()


def _job(job_id: str) -> Job:
    return Job.model_validate(
        {
            "id": job_id,
            "schedule": {"kind": "once", "run_at_ms": T0 + 1_000},
            "target": {"kind": "python", "ref": f"{__name__}:count_run"},
        }
    )


class World:
    """One broker partition, so that what the worker acknowledged is one
    committed offset; a leader's node without faults, a worker's node with
    the faults scripted."""

    def __init__(self, *faults: ScriptedFault) -> None:
        self.clock = ManualClock(T0)
        self.cluster: MemoryCluster = open_memory(4, self.clock, dispatcher_partitions=1)
        self.leader: MemoryNode = self.cluster.node()
        self.faults = FaultInjector(script=faults)
        self.node: MemoryNode = self.cluster.node(self.faults)
        self.executor = Executor(self.node.claims, self.node.store, self.clock, "node-1", CONFIG)
        self.worker = self.new_worker()

    def new_worker(self) -> DeliveryWorker:
        return DeliveryWorker(self.node.dispatcher.consumer(), self.executor, random.Random(5))

    def dispatch(self, *job_ids: str) -> list[DispatchRecord]:
        """Register one-shots and hand their runs on, in this order, as a
        leader does; the records the worker receives."""
        now = self.clock.now_ms()
        store = self.leader.store
        for job_id in job_ids:
            register(store, _job(job_id), now)
        fences = self.leader.coordinator.poll("leader", now)
        rows = store.due_runs(fences, now + 60_000, now)
        record_sent(store, rows, fences, {}, now)
        rows.sort(key=lambda row: job_ids.index(row.job_id))
        payloads = [native.encode_batch([row], fences[row.partition], now)[0] for row in rows]
        self.leader.dispatcher.publish([row.partition for row in rows], payloads)
        return [native.decode(p) for p in payloads]

    def acked(self) -> int:
        """How many deliveries the group has committed."""
        return self.cluster.broker.group_view().committed.get(0, 0)

    def step(self) -> bool:
        return self.worker.step(self.clock.now_ms())

    def advance_to(self, at_ms: int) -> None:
        self.clock.advance(at_ms - self.clock.now_ms())

    def states(self, job_id: str) -> list[str]:
        return [r.state for r in self.leader.store.history(job_id)]


def fault(role: str, op: str, phase: Phase = "before") -> ScriptedFault:
    """Fail the first call of ``role.op`` at ``phase``: before it took
    effect, or after."""
    return ScriptedFault(FaultPoint(role, op, phase))


def test_a_failed_claim_is_tried_again_after_its_backoff_and_nothing_is_acknowledged_before() -> None:
    w = World(fault("claims", "claim"))
    first, second = w.dispatch("first", "second")
    assert w.step()
    assert w.faults.injected == [FaultPoint("claims", "claim", "before")]
    retry_at = w.worker.retry_at_ms
    assert retry_at is not None
    # Full jitter up to the first cap; this seed draws a wait of some length.
    assert T0 < retry_at <= T0 + 200
    assert w.clock.now_ms() == T0, "the step must not sleep on the clock"
    # Backing off: it neither retries nor moves on to the second record.
    w.advance_to(retry_at - 1)
    assert not w.step()
    assert (w.acked(), _runs) == (0, [])
    w.advance_to(retry_at)
    assert w.step()
    assert (w.acked(), _runs) == (1, [first.idempotency_key])
    assert w.step()
    assert (w.acked(), _runs) == (2, [first.idempotency_key, second.idempotency_key])
    assert w.states("first") == w.states("second") == ["succeeded"]
    assert w.worker.retry_at_ms is None
    assert not w.step()
    assert w.executor.counts["errors"] == 1


def test_an_outcome_whose_store_write_failed_is_recorded_again_and_the_run_not_repeated() -> None:
    # Failed after it took effect: the claim and the history have it, and
    # the retry must not run it again.
    w = World(fault("store", "run_finished", "after"))
    (record,) = w.dispatch("job")
    assert w.step()
    assert (w.acked(), _runs) == (0, [record.idempotency_key])
    assert w.cluster.claims.claim_rows()[record.idempotency_key].state == "succeeded"
    retry_at = w.worker.retry_at_ms
    assert retry_at is not None
    w.advance_to(retry_at)
    assert w.step()
    assert (w.acked(), _runs) == (1, [record.idempotency_key])
    assert w.cluster.claims.claim_rows()[record.idempotency_key].state == "succeeded"
    assert w.states("job") == ["succeeded"]


def test_an_end_whose_write_was_refused_is_unrecorded_and_refused_until_written_again() -> None:
    # What a death of the node would leave to run again, and why: the run
    # ended, and the write of its end was refused (its claim still running).
    w = World(fault("claims", "complete"))
    (record,) = w.dispatch("job")
    assert w.step()
    (waiting,) = w.executor.ends_unrecorded()
    assert (waiting.record, waiting.end_refused, _runs) == (record, True, [record.idempotency_key])
    assert w.cluster.claims.running_holder(record.idempotency_key) == waiting.holder
    retry_at = w.worker.retry_at_ms
    assert retry_at is not None
    w.advance_to(retry_at)
    assert w.step()
    assert (w.executor.ends_unrecorded(), w.acked(), _runs) == ([], 1, [record.idempotency_key])
    assert w.cluster.claims.running_holder(record.idempotency_key) is None


def test_the_backoff_doubles_with_each_failure_up_to_its_cap() -> None:
    assert [CONFIG.retry_cap_ms(n) for n in (1, 2, 3, 6, 7, 50, 5_000)] == [
        200,
        400,
        800,
        6_400,
        10_000,
        10_000,
        10_000,
    ]


def test_a_run_held_elsewhere_is_looked_at_again_later_and_taken_over_as_its_lease_dies() -> None:
    w = World()
    (record,) = w.dispatch("job")
    elsewhere = w.cluster.node().claims
    assert elsewhere.claim(record, "node-2/1", T0, 12_000).outcome is ClaimOutcome.CLAIMED
    looks = []
    while not w.acked():
        looks.append(w.clock.now_ms())
        assert w.step()
        assert w.clock.now_ms() == looks[-1], "the step must not sleep on the clock"
        retry_at = w.worker.retry_at_ms
        if retry_at is None:
            break
        w.advance_to(retry_at - 1)
        assert not w.step()
        w.advance_to(retry_at)
    # Looked at every 5 s, and when the 12 s lease ended: run then, not at
    # the next 5 s look.
    assert looks == [T0, T0 + 5_000, T0 + 10_000, T0 + 12_000]
    assert _runs == [record.idempotency_key]
    assert (w.executor.counts["busy"], w.executor.counts["taken_over"]) == (3, 1)
    assert w.acked() == 1


def test_a_run_that_succeeded_elsewhere_while_waiting_is_skipped_and_acknowledged() -> None:
    w = World()
    (record,) = w.dispatch("job")
    elsewhere = w.cluster.node().claims
    elsewhere.claim(record, "node-2/1", T0, 30_000)
    assert w.step()
    assert (w.acked(), w.worker.retry_at_ms) == (0, T0 + 5_000)
    elsewhere.complete(record.idempotency_key, "node-2/1", True, None, T0 + 1_000)
    w.advance_to(T0 + 5_000)
    assert w.step()
    assert (w.acked(), _runs) == (1, [])
    assert w.executor.counts["succeeded"] == 1


def test_a_delivery_after_the_stop_is_not_taken_nor_acknowledged_and_reaches_another_worker() -> None:
    w = World()
    (record,) = w.dispatch("job")
    w.worker.stop()
    assert w.worker.finished
    assert not w.step()
    assert (w.acked(), _runs) == (0, [])
    # Its consumer leaves the group: another one is given the record.
    w.worker.consumer.close()
    other = w.new_worker()
    assert other.step(T0)
    assert (w.acked(), _runs) == (1, [record.idempotency_key])


def test_a_stop_lets_go_of_a_delivery_backing_off_before_it_ran_unacknowledged() -> None:
    w = World(fault("store", "get_job"))
    (record,) = w.dispatch("job")
    assert w.step()
    key = record.idempotency_key
    # Claimed, then failed: the claim is the execution's until it ends.
    assert w.executor.running() == 1
    w.worker.stop()
    assert w.worker.finished
    assert w.executor.running() == 0, "a claim let go of is no longer extended"
    retry_at = T0 + CONFIG.retry_cap_ms(1)
    w.advance_to(retry_at)
    assert not w.step()
    assert (w.acked(), _runs) == (0, [])
    assert w.cluster.claims.claim_rows()[key].state == "running"


def test_after_the_stop_a_run_that_ended_is_still_recorded_then_acknowledged() -> None:
    w = World(fault("claims", "complete"))
    (record,) = w.dispatch("job")
    assert w.step()
    assert _runs == [record.idempotency_key]
    w.worker.stop()
    assert not w.worker.finished
    retry_at = w.worker.retry_at_ms
    assert retry_at is not None
    w.advance_to(retry_at)
    assert w.step()
    assert w.worker.finished
    assert (w.acked(), _runs) == (1, [record.idempotency_key])
    assert w.cluster.claims.claim_rows()[record.idempotency_key].state == "succeeded"


def test_once_abandoned_a_run_that_ended_is_neither_recorded_nor_acknowledged() -> None:
    w = World(fault("claims", "complete"))
    (record,) = w.dispatch("job")
    assert w.step()
    w.worker.stop()
    w.executor.abandoned.set()
    assert w.worker.finished
    retry_at = T0 + CONFIG.retry_cap_ms(1)
    w.advance_to(retry_at)
    assert not w.step()
    assert w.acked() == 0
    assert w.cluster.claims.claim_rows()[record.idempotency_key].state == "running"


def test_the_heartbeat_step_extends_the_claims_of_executions_in_flight_only() -> None:
    w = World(fault("store", "run_started"))
    (record,) = w.dispatch("job")
    assert w.step()
    key = record.idempotency_key
    assert w.cluster.claims.claim_rows()[key].lease_expires_ms == T0 + CONFIG.lease_ms
    w.advance_to(T0 + 10_000)
    assert w.executor.heartbeat_step(w.clock.now_ms()) == 1
    assert w.cluster.claims.claim_rows()[key].lease_expires_ms == T0 + 10_000 + CONFIG.lease_ms
    assert w.step()
    assert w.acked() == 1
    assert w.executor.heartbeat_step(w.clock.now_ms()) == 0


def test_a_heartbeat_that_fails_is_left_to_the_next_beat() -> None:
    w = World(fault("store", "run_started"), fault("claims", "heartbeat"))
    (record,) = w.dispatch("job")
    assert w.step()
    assert w.executor.heartbeat_step(T0 + 10_000) == 0
    assert w.executor.heartbeat_step(T0 + 20_000) == 1
    assert w.cluster.claims.claim_rows()[record.idempotency_key].lease_expires_ms == T0 + 20_000 + CONFIG.lease_ms


def test_a_lease_that_cannot_be_renewed_before_the_next_beat_is_given_up_at_this_one() -> None:
    # Two beats fail: the third would come when the lease has run out, and
    # another worker may be taking the run over then. Stopped at the second,
    # the target is killed (kill_after_s) while the claim is still its own.
    w = World(
        fault("store", "run_started"),
        fault("claims", "heartbeat"),
        ScriptedFault(FaultPoint("claims", "heartbeat", "before"), occurrence=2),
    )
    w.dispatch("job")
    assert w.step()
    assert w.executor.heartbeat_step(T0 + 10_000) == 0
    assert w.executor.counts["lease_lost"] == 0, "one failed beat leaves time for the next"
    assert w.executor.heartbeat_step(T0 + 20_000) == 0
    beat_ms, kill_ms = CONFIG.heartbeat_ms, int(CONFIG.kill_after_s * 1000)
    assert T0 + 20_000 + beat_ms + kill_ms >= T0 + CONFIG.lease_ms
    assert w.executor.counts["lease_lost"] == 1


def test_a_stale_leaders_record_is_handed_back_and_acknowledged() -> None:
    w = World()
    (record,) = w.dispatch("job")
    w.node.claims.raise_fence(record.partition, record.fence + 1)
    w.node.store.raise_fence(record.partition, record.fence + 1)
    w.advance_to(record.due_ms)
    assert w.step()
    assert (w.acked(), _runs) == (1, [])
    assert w.executor.counts["fenced"] == 1
    # Owed to the new leader: scheduled again, after now.
    rows = w.cluster.schedule.schedule_rows(record.partition)
    assert [(r.run_id, r.due_ms > record.due_ms) for r in rows] == [(record.run_id, False), (record.run_id, True)]


def _started_elsewhere(w: World, record: DispatchRecord, holder: str, lease_ms: int) -> None:
    """Another worker claimed the run and recorded it started, then the
    partition's leader changed: the record is stale from here."""
    other = w.cluster.node()
    assert other.claims.claim(record, holder, w.clock.now_ms(), lease_ms).outcome is ClaimOutcome.CLAIMED
    other.store.run_started(record, holder.split("/")[0], w.clock.now_ms())
    w.node.claims.raise_fence(record.partition, record.fence + 1)
    w.node.store.raise_fence(record.partition, record.fence + 1)


def _handed_back(w: World, record: DispatchRecord) -> bool:
    rows = w.cluster.schedule.schedule_rows(record.partition)
    return any(r.run_id == record.run_id and r.due_ms > record.due_ms for r in rows)


def test_a_stale_record_of_a_run_started_by_a_worker_since_dead_is_handed_back_once_its_lease_ends() -> None:
    # The worker died before it ran the target; its record, delivered here,
    # is the only one left: acknowledged unhanded, the run would be lost.
    w = World()
    (record,) = w.dispatch("job")
    _started_elsewhere(w, record, "node-2/1", 12_000)
    w.advance_to(record.due_ms)
    looks = []
    while not w.acked():
        looks.append(w.clock.now_ms())
        assert w.step()
        if (retry_at := w.worker.retry_at_ms) is not None:
            w.advance_to(retry_at)
    # Looked at again while its lease may yet be renewed, and handed back
    # when it ended.
    assert looks == [T0 + 1_000, T0 + 6_000, T0 + 11_000, T0 + 12_000]
    assert (_runs, _handed_back(w, record)) == ([], True)


def test_a_stale_record_of_a_run_held_alive_under_the_current_fence_is_acknowledged_at_once() -> None:
    # Another copy: the run's holder claimed it from the new leader's send,
    # and if it dies its own record is delivered again. Waiting here would
    # hold this consumer for as long as the run runs.
    w = World()
    (record,) = w.dispatch("job")
    w.node.claims.raise_fence(record.partition, record.fence + 1)
    w.node.store.raise_fence(record.partition, record.fence + 1)
    current = record._replace(fence=record.fence + 1, attempt=2)
    other = w.cluster.node()
    assert other.claims.claim(current, "node-2/1", T0, 30_000).outcome is ClaimOutcome.CLAIMED
    other.store.run_started(current, "node-2", T0)
    w.advance_to(record.due_ms)
    assert w.step()
    assert (w.acked(), _runs, _handed_back(w, record)) == (1, [], False)


def test_an_undecodable_record_is_passed_over_and_acknowledged() -> None:
    w = World()
    w.leader.dispatcher.publish([0], [b"not a dispatch record"])
    (record,) = w.dispatch("job")
    assert w.step()
    assert (w.acked(), w.executor.counts["errors"]) == (1, 1)
    assert w.step()
    assert (w.acked(), _runs) == (2, [record.idempotency_key])


@pytest.mark.parametrize("phase", ["before", "after"])
def test_a_crash_between_recording_the_outcome_and_completing_the_claim_is_recovered(phase: Phase) -> None:
    """The node dies right after the first of the two writes that end a run
    (its history and its claim), here the claims call failing before or
    after it took effect: the run's redelivery, on another node once the
    lease ran out, must not run a run whose history says it succeeded, and
    must leave the history with the outcome."""
    w = World(fault("claims", "complete", phase))
    (record,) = w.dispatch("once")
    with pytest.raises(ConnectionError):
        w.executor.attempt([w.executor.new_execution(record)])
    assert _runs == [record.idempotency_key]
    claim_at_crash = w.cluster.claims.claim_rows()[record.idempotency_key].state
    ended_at_crash = w.states("once") == ["succeeded"] or claim_at_crash == "succeeded"
    w.advance_to(T0 + CONFIG.lease_ms + 1)
    survivor = Executor(w.leader.claims, w.leader.store, w.clock, "node-2", CONFIG)
    survivor.attempt([survivor.new_execution(record._replace(attempt=record.attempt + 1))])
    if not ended_at_crash:
        # Nothing said it had ended: that attempt is lost, and the run is
        # tried again as its next attempt, a delivery of its own.
        assert (w.states("once"), len(_runs)) == (["retrying"], 1)
        survivor.attempt([survivor.new_execution(record._replace(attempt=record.attempt + 2))])
    # Run again only as a known new attempt, when nothing said it had ended.
    assert len(_runs) == (1 if ended_at_crash else 2)
    assert _attempts == ([1] if ended_at_crash else [1, 2])
    assert w.states("once") == ["succeeded"]
    rerun = survivor.claims.claim(record, "node-3", w.clock.now_ms(), CONFIG.lease_ms)
    assert rerun.outcome is ClaimOutcome.SUCCEEDED


def test_a_run_interrupted_while_it_runs_is_delivered_again_at_once_as_its_next_attempt() -> None:
    # What a node's pool does when the grace period runs out, here while
    # the target runs: mark, (stop the shell commands,) record, stop.
    w = World()
    (record,) = w.dispatch("job")

    def grace_ran_out() -> None:
        w.executor.record_interrupted(w.executor.interrupt(), "the node stopped")
        w.executor.abandoned.set()

    _while_running.append(grace_ran_out)
    assert w.step()
    assert w.worker.finished
    assert (w.acked(), _attempts) == (0, [1])
    assert [(r.state, r.attempt) for r in w.leader.store.history("job")] == [("interrupted", 1)]
    # Let go of with no outcome, not failed: the very record, delivered
    # again, takes it over.
    assert w.cluster.claims.claim_rows()[record.idempotency_key].state == "released"
    assert (w.executor.counts["interrupted"], w.executor.counts["succeeded"]) == (1, 0)
    # The node's consumer leaves the group with it: another node is given
    # the record, and runs it at once, within the lease the first held.
    w.worker.consumer.close()
    other = Executor(w.leader.claims, w.leader.store, w.clock, "node-2", CONFIG)
    assert DeliveryWorker(w.node.dispatcher.consumer(), other, random.Random(7)).step(w.clock.now_ms())
    assert (w.acked(), _attempts) == (1, [1, 2])
    assert [(r.state, r.attempt) for r in w.leader.store.history("job")] == [("succeeded", 2)]


def test_a_write_that_fails_while_a_run_of_its_batch_runs_never_has_that_run_called_again() -> None:
    # The short run's end fails to record while the held one still runs:
    # the attempt waits for it before giving up, and its repetition records
    # both rather than call the held one a second time beside the first.
    w = World(fault("claims", "complete"))
    executor = Executor(
        w.node.claims, w.node.store, w.clock, "node-1", CONFIG, calls=ThreadedCalls(), capacity=Capacity(4)
    )
    short, held = w.dispatch("short", "held")
    executions = [executor.new_execution(short), executor.new_execution(held)]
    failed: list[BaseException] = []

    def attempt() -> None:
        try:
            executor.attempt(executions)
        except ConnectionError as exc:
            failed.append(exc)

    first = threading.Thread(target=attempt)
    first.start()
    deadline = time.monotonic() + 30
    while not w.faults.injected and time.monotonic() < deadline:
        time.sleep(0.01)
    assert w.faults.injected, "the end write was not tried"
    _release.set()
    first.join(30)
    assert failed and not first.is_alive()
    executor.attempt(executions)
    assert sorted(_runs) == sorted([short.idempotency_key, held.idempotency_key])
    assert (w.states("short"), w.states("held")) == (["succeeded"], ["succeeded"])


def heartbeats_until_the_lease_runs_out(w: World) -> Callable[[], None]:
    """While the target runs: heartbeats at 10, 20 and 30 s, the last a
    whole lease after the claim."""

    def beat() -> None:
        for at_ms in (T0 + 10_000, T0 + 20_000, T0 + CONFIG.lease_ms):
            w.advance_to(at_ms)
            w.executor.heartbeat_step(at_ms)

    return beat


def failing_heartbeats(count: int) -> list[ScriptedFault]:
    return [ScriptedFault(FaultPoint("claims", "heartbeat", "before"), n) for n in range(1, count + 1)]


def test_a_success_whose_recording_waited_past_a_lease_of_failed_heartbeats_is_recorded_and_acknowledged() -> None:
    # The target succeeded; recording it failed (the store, or the claims,
    # down a while) and so did every heartbeat for a whole lease. Nobody
    # took the run over: the success is recorded, not dropped.
    w = World(fault("claims", "complete"), *failing_heartbeats(3))
    (record,) = w.dispatch("job")
    assert w.step()
    assert (w.states("job"), _runs) == (["running"], [record.idempotency_key])
    for at_ms in (T0 + 10_000, T0 + 20_000, T0 + CONFIG.lease_ms):
        w.advance_to(at_ms)
        w.executor.heartbeat_step(at_ms)
    assert w.executor.counts["lease_lost"] == 1
    retry_at = w.worker.retry_at_ms
    assert retry_at is not None
    w.advance_to(retry_at)
    assert w.step()
    assert (w.states("job"), w.acked(), _runs) == (["succeeded"], 1, [record.idempotency_key])
    assert w.cluster.claims.claim_rows()[record.idempotency_key].state == "succeeded"


@pytest.mark.parametrize("job_id", ["stops", "returns"])
def test_a_run_stopped_as_its_heartbeats_failed_is_recorded_as_its_target_ended_while_its_claim_is_its_own(
    job_id: str,
) -> None:
    # The heartbeats failed for a whole lease (Redis, etcd or Cassandra down
    # a while): the run is stopped, and its target returns after the stop,
    # raising (stops) or not (returns: it ignored ctx.cancelled, and its
    # effect is done). Nobody took the run over, so its claim's completion
    # is still its own: the run is recorded as it ended, a success as one,
    # a failure with its retry. Handed back instead, a run that returned
    # would run a second time, its effect done twice.
    w = World(*failing_heartbeats(3))
    (record,) = w.dispatch(job_id)
    _while_running.append(heartbeats_until_the_lease_runs_out(w))
    assert w.step()
    assert w.executor.counts["lease_lost"] == 1
    # Its delivery acknowledged either way (on Kafka an offset left
    # unacknowledged holds back its partition's commits).
    assert w.acked() == 1
    run = w.leader.store.get_run(job_id, record.run_at_ms)
    claim = w.cluster.claims.claim_rows()[record.idempotency_key]
    if job_id == "returns":
        assert (run.state, run.attempt, claim.state, _attempts) == ("succeeded", 1, "succeeded", [1])
        # A leader that reads its row again (its lease ran out meanwhile)
        # hands it on again; the claim replays the success.
        now = w.clock.now_ms()
        fences = w.leader.coordinator.poll("leader", now)
        for owed in w.leader.store.due_runs(fences, now + 60_000, now):
            record_sent(w.leader.store, [owed], fences, {}, now)
            payload = native.encode_batch([owed], fences[owed.partition], now)[0]
            w.leader.dispatcher.publish([owed.partition], [payload])
            assert w.step()
        assert [(r.state, r.attempt) for r in w.leader.store.history(job_id)] == [("succeeded", 1)]
        assert _attempts == [1]
        return
    assert (run.state, run.attempt, [f.attempt for f in run.failures], claim.state) == ("retrying", 1, [1], "failed")
    # Its retry, after its backoff, as the next attempt.
    w.advance_to(run.due_ms)
    now = w.clock.now_ms()
    fences = w.leader.coordinator.poll("leader", now)
    (owed,) = w.leader.store.due_runs(fences, now + 60_000, now)
    assert owed.job_id == job_id and owed.attempt > record.attempt and owed.due_ms == run.due_ms
    record_sent(w.leader.store, [owed], fences, {}, now)
    w.leader.dispatcher.publish([owed.partition], [native.encode_batch([owed], fences[owed.partition], now)[0]])
    assert w.step()
    assert [(r.state, r.attempt) for r in w.leader.store.history(job_id)] == [("succeeded", 2)]
    assert (w.acked(), _attempts) == (2, [1, 2])


@pytest.mark.parametrize("job_id", ["stops", "returns"])
def test_a_run_taken_over_and_ended_by_its_taker_keeps_the_takers_outcome_when_its_target_returns(
    job_id: str,
) -> None:
    # Its heartbeats failed for a whole lease, and another node took the
    # run over and recorded it (the attempt lost with the worker it took it
    # from, to retry) before the stopped target returned: that return,
    # whatever it says, is not the run's second outcome.
    w = World(*failing_heartbeats(3))
    (record,) = w.dispatch(job_id)
    beat = heartbeats_until_the_lease_runs_out(w)
    taker = Executor(w.leader.claims, w.leader.store, w.clock, "node-2", CONFIG)

    def taken_over_and_ended_meanwhile() -> None:
        beat()
        assert taker.attempt([taker.new_execution(record)]) == [ClaimOutcome.TAKEN_OVER]

    _while_running.append(taken_over_and_ended_meanwhile)
    assert w.step()
    assert w.acked() == 1
    run = w.leader.store.get_run(job_id, record.run_at_ms)
    assert (run.state, [(f.attempt, f.kind) for f in run.failures]) == ("retrying", [(1, "lost")])
    row = w.cluster.claims.claim_rows()[record.idempotency_key]
    assert (row.holder, row.state) == ("node-2/1", "failed")
    assert (taker.counts["failed"], w.executor.counts["succeeded"], w.executor.counts["failed"]) == (1, 0, 0)
    assert _attempts == [1]


def test_a_run_taken_over_after_its_lease_ran_out_is_recorded_by_its_taker_only() -> None:
    w = World(*failing_heartbeats(3))
    (record,) = w.dispatch("job")
    beat = heartbeats_until_the_lease_runs_out(w)

    def taken_over_meanwhile() -> None:
        beat()
        claim = w.leader.claims.claim(record, "node-2/1", w.clock.now_ms(), CONFIG.lease_ms)
        assert claim.outcome is ClaimOutcome.TAKEN_OVER

    _while_running.append(taken_over_meanwhile)
    assert w.step()
    # The run is the taker's to record; this delivery is dealt with.
    assert (w.states("job"), w.acked()) == (["running"], 1)
    row = w.cluster.claims.claim_rows()[record.idempotency_key]
    assert (row.holder, row.state) == ("node-2/1", "running")
