"""What the contract tests leave out of the in-memory backends: Kafka's commit
and rebalance semantics, etcd's lease expiry and fences, the fault hook."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from pysched.clock import ManualClock
from pysched.leader import LeaderConfig, PartitionLeader, RunDispatched, SyncDriver
from pysched.leader.leases import LeaseKeeper
from pysched.leader.recording import record_sent
from pysched.memory import open_memory
from pysched.memory.claims import MemoryClaims
from pysched.memory.coordinator import Election, MemoryCoordinator
from pysched.memory.dispatcher import Broker, MemoryConsumer, MemoryDispatcher
from pysched.memory.faults import FaultInjector, FaultPoint, ScriptedFault, SimulatedFault
from pysched.memory.store import MemoryScheduleStore, ScheduleTables
from pysched.model import Job
from pysched.protocols import AHEAD_OF_WATERMARK_MS, NEAR_MS, SETTLE_MS, ClaimOutcome, PlannedRun
from pysched.records import DispatchRecord
from pysched.registry import register
from pysched.worker import WorkerPool
from tests.test_leader import job

T0 = 1_700_000_040_000


def payloads(consumer: MemoryConsumer) -> list[bytes]:
    """Everything the consumer is given now, unacknowledged."""
    out = []
    while (d := consumer.next(0)) is not None:
        out.append(d.payload)
    return out


def once_job(job_id: str, at: int) -> Job:
    return Job.model_validate(
        {"id": job_id, "schedule": {"kind": "once", "run_at_ms": at}, "target": {"kind": "shell", "command": "true"}}
    )


# -- dispatcher: Kafka's logs, commits and rebalances ----------------------------


def test_records_land_on_their_partitions_log_stamped_by_the_clock() -> None:
    clock = ManualClock(T0)
    broker = Broker(2, clock)
    dispatcher = MemoryDispatcher(broker)
    dispatcher.publish([0, 1, 2, 3], [b"a", b"b", b"c", b"d"])
    clock.advance(5)
    dispatcher.publish([5], [b"e"])
    assert [(r.offset, r.payload, r.schedule_partition) for r in broker.log(0)] == [(0, b"a", 0), (1, b"c", 2)]
    assert [(r.offset, r.payload, r.appended_at_ms) for r in broker.log(1)] == [
        (0, b"b", T0),
        (1, b"d", T0),
        (2, b"e", T0 + 5),
    ]
    delivered = {}
    consumer = dispatcher.consumer()
    while (d := consumer.next(0)) is not None:
        delivered[d.payload] = d.appended_at_ms
    assert delivered == {b"a": T0, b"b": T0, b"c": T0, b"d": T0, b"e": T0 + 5}
    dispatcher.close()
    with pytest.raises(RuntimeError):
        dispatcher.publish([0], [b"f"])


def test_acknowledging_a_later_record_commits_past_an_earlier_one() -> None:
    # Kafka's semantics, kept so that a simulator finds a worker that skips
    # an acknowledgement: the earlier record is never delivered again.
    broker = Broker(1, ManualClock(T0))
    dispatcher = MemoryDispatcher(broker)
    dispatcher.publish([0, 0], [b"first", b"second"])
    c1 = dispatcher.consumer()
    assert c1.next(0) is not None  # first: taken, never acknowledged
    second = c1.next(0)
    assert second is not None and second.payload == b"second"
    c1.ack(second)
    assert broker.group_view().committed == {0: 2}
    c1.close()
    assert payloads(dispatcher.consumer()) == []


def test_what_was_taken_and_not_committed_is_delivered_again_after_a_rebalance() -> None:
    broker = Broker(2, ManualClock(T0))
    dispatcher = MemoryDispatcher(broker)
    c1 = dispatcher.consumer()
    dispatcher.publish([0, 1], [b"p0", b"p1"])
    assert sorted(payloads(c1)) == [b"p0", b"p1"]
    # A second member joins: each partition is read again from its commit.
    c2 = dispatcher.consumer()
    assert broker.group_view().assignment == {0: c1.name, 1: c2.name}
    assert payloads(c1) == [b"p0"]
    assert payloads(c2) == [b"p1"]
    # The first leaves without acknowledging: its partition goes to c2, from
    # the committed offset.
    c1.close()
    assert broker.group_view().assignment == {0: c2.name, 1: c2.name}
    assert sorted(payloads(c2)) == [b"p0", b"p1"]


def test_an_acknowledgement_after_the_partition_moved_commits_nothing() -> None:
    broker = Broker(2, ManualClock(T0))
    dispatcher = MemoryDispatcher(broker)
    c1 = dispatcher.consumer()
    dispatcher.publish([1], [b"x"])
    taken = c1.next(0)
    assert taken is not None
    c2 = dispatcher.consumer()  # partition 1 moves to c2
    c1.ack(taken)
    assert broker.group_view().committed == {}
    delivered = c2.next(0)
    assert delivered is not None and delivered.payload == b"x"
    c2.ack(delivered)
    assert broker.group_view().committed == {1: 1}


def test_a_crashed_consumer_holds_its_partitions_until_the_session_timeout() -> None:
    clock = ManualClock(T0)
    broker = Broker(2, clock, session_timeout_ms=10_000)
    dispatcher = MemoryDispatcher(broker)
    c1 = dispatcher.consumer()
    c2 = dispatcher.consumer()
    dispatcher.publish([0], [b"x"])
    assert payloads(c1) == [b"x"]
    c1.crash()
    clock.advance(9_999)
    assert payloads(c2) == []  # partition 0 still belongs to the dead member
    clock.advance(1)
    assert payloads(c2) == [b"x"]
    assert broker.group_view().members == (c2.name,)


# -- coordinator: etcd's leases and fences ---------------------------------------


class Published:
    def __init__(self) -> None:
        self.fences: list[tuple[int, int]] = []

    def __call__(self, partition: int, fence: int) -> None:
        self.fences.append((partition, fence))


def test_a_partition_won_by_a_failed_poll_and_no_longer_its_own_is_handed_over() -> None:
    # As the etcd client's test of the same name: the key was left held by
    # a lease that lived on, and nobody led its partition.
    clock = ManualClock(T0)
    election = Election(clock)
    failures = {"left": 1}

    def publish(partition: int, fence: int) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise TimeoutError("publishing the fence timed out")

    late = MemoryCoordinator(election, 2, publish_fence=publish)
    joining = MemoryCoordinator(election, 2, publish_fence=Published())
    with pytest.raises(TimeoutError):
        late.poll("node-2", clock.now_ms())
    assert joining.poll("node-1", clock.now_ms()) == {}
    assert sorted(late.poll("node-2", clock.now_ms())) == [1]
    assert sorted(joining.poll("node-1", clock.now_ms())) == [0]


def test_a_partition_moves_only_once_its_leaders_lease_expired() -> None:
    clock = ManualClock(T0)
    election = Election(clock)
    pub_a, pub_b = Published(), Published()
    a = MemoryCoordinator(election, 4, ttl_ms=10_000, publish_fence=pub_a)
    b = MemoryCoordinator(election, 4, ttl_ms=10_000, publish_fence=pub_b)
    first = a.poll("a", clock.now_ms())
    assert set(first) == {0, 1, 2, 3} and sorted(pub_a.fences) == sorted(first.items())
    clock.advance(9_999)
    assert b.poll("b", clock.now_ms()) == {}  # a's lease still lives
    clock.advance(1)
    # a never polled again: its lease ran out, its keys with it.
    taken = b.poll("b", clock.now_ms())
    assert set(taken) == {0, 1, 2, 3} and all(taken[p] > first[p] for p in first)
    assert sorted(pub_b.fences) == sorted(taken.items())
    # a comes back with a new lease: b hands over a's share, a takes it.
    assert a.poll("a", clock.now_ms()) == {}
    assert set(b.poll("b", clock.now_ms())) == {1, 3}
    again = a.poll("a", clock.now_ms())
    assert set(again) == {0, 2} and all(again[p] > taken[p] for p in again)
    by_partition: dict[int, list[int]] = {}
    for grant in election.grants():
        by_partition.setdefault(grant.partition, []).append(grant.fence)
    assert all(fences == sorted(set(fences)) for fences in by_partition.values())
    assert {p: lease.holder for p, lease in b.leaders().items()} == {0: "a", 1: "b", 2: "a", 3: "b"}


def test_a_leader_that_keeps_polling_keeps_its_partitions_past_the_ttl() -> None:
    clock = ManualClock(T0)
    election = Election(clock)
    a = MemoryCoordinator(election, 2, ttl_ms=10_000)
    b = MemoryCoordinator(election, 2, ttl_ms=10_000)
    first = a.poll("a", clock.now_ms())
    for _ in range(5):  # 5 x answer_valid_ms: well past the TTL
        clock.advance(a.answer_valid_ms)
        assert a.poll("a", clock.now_ms()) == first
    # b joins: a hands over b's share on its next poll, keeping its own.
    assert b.poll("b", clock.now_ms()) == {}
    assert a.poll("a", clock.now_ms()) == {0: first[0]}
    taken = b.poll("b", clock.now_ms())
    assert set(taken) == {1} and taken[1] > first[1]


def test_a_poll_that_failed_after_winning_publishes_again_and_leads() -> None:
    clock = ManualClock(T0)
    faults = FaultInjector(script=[ScriptedFault(FaultPoint("coordinator", "poll", "after"))])
    published = Published()
    co = MemoryCoordinator(Election(clock), 2, publish_fence=published, faults=faults)
    with pytest.raises(SimulatedFault):
        co.poll("a", clock.now_ms())
    won = dict(published.fences)
    assert co.poll("a", clock.now_ms()) == won  # the same fences, not new ones
    # The failed poll kept what it won, as the etcd client does: published once.
    assert published.fences == list(won.items())


def test_a_poll_that_handed_over_and_then_failed_stops_its_leader_at_once() -> None:
    # Its answer lost, the leader would lead on its previous one (for up to
    # answer_valid_ms) beside the partition's new leader.
    clock = ManualClock(T0)
    election = Election(clock)
    faults = FaultInjector(script=[ScriptedFault(FaultPoint("coordinator", "poll", "after"), 2)])
    a = MemoryCoordinator(election, 2, faults=faults)
    b = MemoryCoordinator(election, 2)
    leases = LeaseKeeper(a, "a")
    assert leases.step(clock.now_ms())
    first = leases.granted(clock.now_ms())
    assert set(first) == {0, 1}
    assert b.poll("b", clock.now_ms()) == {}  # b joins: a is to hand over 1
    assert not leases.step(clock.now_ms())  # handed over, then failed
    assert leases.granted(clock.now_ms()) == {0: first[0]}
    assert set(b.poll("b", clock.now_ms())) == {1}


def test_a_hand_over_whose_delete_failed_is_led_again_when_granted_again() -> None:
    clock = ManualClock(T0)
    election = Election(clock)
    a = MemoryCoordinator(election, 2)
    b = MemoryCoordinator(election, 2)
    leases = LeaseKeeper(a, "a")
    assert leases.step(clock.now_ms())
    first = leases.granted(clock.now_ms())
    b.poll("b", clock.now_ms())
    delete = election.delete_leader_key

    def timed_out(partition: int, holder: str) -> None:
        raise TimeoutError("the delete timed out, not applied")

    election.delete_leader_key = timed_out  # type: ignore[method-assign]
    assert not leases.step(clock.now_ms())
    election.delete_leader_key = delete  # type: ignore[method-assign]
    assert leases.granted(clock.now_ms()) == {0: first[0]}
    b.release("b")  # b leaves before taking partition 1: a leads it again
    assert leases.step(clock.now_ms())
    assert leases.granted(clock.now_ms()) == first


# -- the fault hook ---------------------------------------------------------------


def test_a_fault_before_leaves_nothing_and_a_fault_after_leaves_the_effect() -> None:
    clock = ManualClock(T0)
    faults = FaultInjector(
        script=[
            ScriptedFault(FaultPoint("store", "add_job", "before"), 1),
            # Counted per point: the first call never reached its "after".
            ScriptedFault(FaultPoint("store", "add_job", "after"), 1),
        ]
    )
    store = MemoryScheduleStore(ScheduleTables(4, clock), faults)
    run = PlannedRun(T0 + 1_000, T0 + 1_000)
    with pytest.raises(ConnectionError):
        store.add_job(once_job("before", T0 + 1_000), 0, 0, run, T0)
    assert store.list_jobs() == []
    with pytest.raises(TimeoutError):
        store.add_job(once_job("after", T0 + 1_000), 0, 0, run, T0)
    assert [j.job.id for j in store.list_jobs()] == ["after"]
    assert faults.injected == [FaultPoint("store", "add_job", "before"), FaultPoint("store", "add_job", "after")]


def test_a_fault_midway_through_recording_leaves_the_marks_and_a_retry_finishes_it() -> None:
    # On Cassandra a record is several requests (the runs' marks, the next
    # runs, the watermarks): a leader that fails between them has written
    # some. Its retry of the same batch must finish the job, not repeat it.
    clock = ManualClock(T0)
    faults = FaultInjector(script=[ScriptedFault(FaultPoint("store", "finish_dispatch", "midway"), 1)])
    store = MemoryScheduleStore(ScheduleTables(4, clock), faults)
    expr = {"kind": "cron", "expr": "* * * * *"}
    cron = Job.model_validate({"id": "c", "schedule": expr, "target": {"kind": "shell", "command": "true"}})
    store.add_job(cron, 0, 0, PlannedRun(T0 + 60_000, T0 + 60_000), T0)
    fences = dict.fromkeys(range(4), 1)
    (run,) = store.due_runs(fences, T0 + 90_000, T0 + 60_000)
    with pytest.raises(ConnectionError):
        record_sent(store, [run], fences, {}, T0 + 60_000)
    assert [r.attempt for r in store.history("c")] == [1], "the mark was written before the fault"
    assert store.get_job("c").next_run == PlannedRun(T0 + 60_000, T0 + 60_000), "the next run was not"
    (planned,) = record_sent(store, [run], fences, {}, T0 + 60_000)
    assert planned.run_at_ms == T0 + 120_000
    assert store.get_job("c").next_run == PlannedRun(T0 + 120_000, T0 + 120_000)


def test_random_faults_replay_with_their_seed() -> None:
    def injected(seed: int) -> list[tuple[int, FaultPoint]]:
        faults = FaultInjector(random.Random(seed), {("claims", "*"): 0.3, ("store", "due_runs"): 0.5})
        out = []
        for i in range(200):
            for role, op in (("claims", "claim"), ("store", "due_runs"), ("store", "add_job")):
                try:
                    faults.check(role, op, "before" if i % 2 else "after")
                except SimulatedFault:
                    out.append((i, FaultPoint(role, op, "before" if i % 2 else "after")))
        return out

    run = injected(7)
    assert run == injected(7)
    assert run != injected(8)
    assert {p.op for _, p in run} == {"claim", "due_runs"}  # add_job has no rate
    with pytest.raises(ValueError):
        FaultInjector(rates={("claims", "*"): 0.1})


# -- store and claims: the cluster's semantics ------------------------------------


def test_only_a_registration_due_soon_bumps_its_partitions_change_version() -> None:
    clock = ManualClock(T0)
    store = MemoryScheduleStore(ScheduleTables(4, clock))
    far = T0 + NEAR_MS + 1
    store.add_job(once_job("far", far), 1, 0, PlannedRun(far, far), T0)
    assert store.change_versions() == {}
    store.add_job(once_job("near", T0 + NEAR_MS), 1, 0, PlannedRun(T0 + NEAR_MS, T0 + NEAR_MS), T0)
    assert store.change_versions() == {1: 1}


def test_a_past_due_time_is_raised_to_the_callers_now_and_ahead_of_the_watermark() -> None:
    # Time comes from the caller's injected clock, as on the Cassandra
    # store, which read the wall clock here; the watermark catches a
    # caller whose clock is behind.
    clock = ManualClock(T0)
    store = MemoryScheduleStore(ScheduleTables(4, clock))  # watermarks at T0 - SETTLE_MS
    past = T0 - 5_000
    assert store.add_job(once_job("past", past), 0, 0, PlannedRun(past, past), T0).next_run == PlannedRun(past, T0)
    late = T0 - 120_000
    rec = store.add_job(once_job("late", late), 0, 0, PlannedRun(late, late), late)
    assert rec.next_run == PlannedRun(late, T0 - SETTLE_MS + AHEAD_OF_WATERMARK_MS)


def test_a_hand_back_adds_a_second_schedule_row_and_bumps_the_partition() -> None:
    clock = ManualClock(T0)
    cluster = open_memory(4, clock)
    node = cluster.node()
    node.store.add_job(once_job("o", T0 + 100), 2, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    ((run_id, job_id, run_at, due_ms, partition, attempt, group),) = node.store.due_runs({2: 1}, T0 + 60_000, T0)
    rec = DispatchRecord(run_id, job_id, run_at, due_ms, partition, attempt, group, 1, T0 + 100)
    versions = node.store.change_versions()
    assert node.store.hand_back(rec, T0 + 500)
    assert [(r.due_ms, r.run_id) for r in cluster.schedule.schedule_rows(2)] == [
        (T0 + 100, run_id),
        (T0 + 1_500, run_id),
    ]
    assert node.store.change_versions()[2] == versions.get(2, 0) + 1


def test_a_holder_claiming_its_own_live_claim_again_takes_it_over() -> None:
    # The cluster's conditional take-over (the embedded engine answers BUSY).
    claims = MemoryClaims()
    rec = DispatchRecord(1, "job", T0, T0, 0, 1, 0, 1, T0)
    assert claims.claim(rec, "w1", T0, 30_000).outcome is ClaimOutcome.CLAIMED
    assert claims.claim(rec, "w1", T0 + 1, 30_000).outcome is ClaimOutcome.TAKEN_OVER
    assert claims.tables.claim_rows()[rec.idempotency_key].lease_expires_ms == T0 + 30_001


# -- the real leader and worker on the memory engine -------------------------------


def test_the_leader_and_a_worker_run_every_run_once_on_the_memory_engine() -> None:
    end = T0 + 180_005
    clock = ManualClock(T0)
    cluster = open_memory(64, clock)
    node = cluster.node()
    every_10s = {"id": "every-10s", "schedule": {"kind": "cron", "expr": "*/10 * * * * *"}, "critical": True}
    register(node.store, job(every_10s), T0)
    register(node.store, job({"id": "once", "schedule": {"kind": "once", "run_at_ms": T0 + 95_005}}), T0)
    events: list[RunDispatched] = []
    config = LeaderConfig(reload_every_ms=1_000)
    leader = PartitionLeader(node.store, node.coordinator, node.dispatcher, clock, "a", config, events.append)
    SyncDriver(leader).run_until(end)
    assert Counter(e.job_id for e in events) == {"every-10s": 18, "once": 1}
    assert all(0 <= e.dispatched_at_ms - e.due_ms < config.tick_ms for e in events)
    # Every record reached the broker once; a worker runs each once.
    assert len(cluster.broker.records()) == 19
    pool = WorkerPool(node.dispatcher, node.claims, node.store, clock, "w")
    consumer = node.dispatcher.consumer()
    outcomes = []
    while (delivery := consumer.next(0)) is not None:
        outcomes.append(pool.handle(delivery.payload))
        consumer.ack(delivery)
    assert outcomes == [ClaimOutcome.CLAIMED] * 19
    assert Counter(r.state for r in cluster.schedule.all_run_rows()) == {"succeeded": 19, "scheduled": 1}


def test_a_run_registered_behind_the_leaders_watermark_fires_ahead_of_it() -> None:
    # The registrant's clock is ten minutes behind the leader's: the run it
    # registers for five minutes from its now is behind the watermark.
    clock = ManualClock(T0)
    cluster = open_memory(4, clock)
    node = cluster.node()
    events: list[RunDispatched] = []
    leader = PartitionLeader(node.store, node.coordinator, node.dispatcher, clock, "a", LeaderConfig(), events.append)
    driver = SyncDriver(leader)

    def run_until(end: int) -> None:
        while (now := clock.now_ms()) < end:
            driver.round(now)
            clock.advance(leader.config.tick_ms)

    # Just after one of the leader's reloads: the watermark stored trails
    # the one it records next by the most.
    run_until(T0 + 60_100)
    registered_at = clock.now_ms()
    behind = registered_at - 600_000
    rec = register(node.store, once_job("late", behind + 300_000), behind)
    assert rec.next_run is not None and rec.next_run.run_at_ms == behind + 300_000
    assert rec.next_run.due_ms > node.store.watermarks()[rec.partition]
    run_until(T0 + 180_000)
    (event,) = [e for e in events if e.job_id == "late"]
    assert (event.run_at_ms, event.due_ms) == (behind + 300_000, rec.next_run.due_ms)
    assert 0 <= event.dispatched_at_ms - event.due_ms < leader.config.tick_ms
    # Due within NEAR_MS to the leader, whatever the registrant's clock said.
    assert event.dispatched_at_ms - registered_at <= AHEAD_OF_WATERMARK_MS - SETTLE_MS
