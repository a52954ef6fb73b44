"""The leader's sweep, driven as a leader runs it: on the in-memory model of
the cluster, whose watermark passes a run once it is handed on."""

from __future__ import annotations

from pysched.clock import ManualClock
from pysched.leader import LeaderConfig, PartitionLeader, RunDispatched, SyncDriver
from pysched.leader.sweeping import Sweeper
from pysched.memory import open_memory
from pysched.memory.faults import FaultInjector, FaultPoint, ScriptedFault
from pysched.model import Job
from pysched.protocols import DEAD_CLAIM_AFTER_MS, SWEEP_LOOK_AFTER_MS, ClaimOutcome, PlannedRun
from pysched.records import DispatchRecord

T0 = 1_800_000_000_000  # on a whole minute
LEASE_MS = 30_000


def test_the_leader_hands_on_again_a_run_whose_worker_died_unheard() -> None:
    # Hole C1, the part left: the worker died after its hand-back failed;
    # its record's offset was committed past (a later record acknowledged),
    # so no consumer is given it again. The leader's sweep is all that is left.
    clock = ManualClock(T0)
    node = open_memory(partitions=4, clock=clock).node()
    job = Job.model_validate(
        {
            "id": "o",
            "schedule": {"kind": "once", "run_at_ms": T0 + 5_000},
            "target": {"kind": "shell", "command": "true"},
        }
    )
    node.store.add_job(job, 0, 0, PlannedRun(T0 + 5_000, T0 + 5_000), T0)
    sent: list[RunDispatched] = []
    leader = PartitionLeader(node.store, node.coordinator, node.dispatcher, clock, "n1", LeaderConfig(), sent.append)
    driver = SyncDriver(leader)
    while not sent:
        driver.round(clock.now_ms())
        clock.advance(10)
    (first,) = sent
    delivered = DispatchRecord(
        first.run_id, "o", first.run_at_ms, first.due_ms, 0, first.attempt, 0, first.fence, first.dispatched_at_ms
    )
    now = clock.now_ms()
    assert node.claims.claim(delivered, "w1/1", now, LEASE_MS).outcome is ClaimOutcome.CLAIMED
    assert node.store.run_started(delivered, "w1", now) == 1
    # Nothing more from w1: no heartbeat, no outcome, no hand-back.
    end = now + SWEEP_LOOK_AFTER_MS + LEASE_MS + DEAD_CLAIM_AFTER_MS + 30_000
    while clock.now_ms() < end:
        driver.round(clock.now_ms())
        clock.advance(10)
    assert [(e.job_id, e.attempt) for e in sent] == [("o", 1), ("o", 2)]
    assert leader.sweeper.owed_again == 1


def test_a_sweep_the_store_refused_is_tried_again_a_second_later_not_at_every_step() -> None:
    clock = ManualClock(T0)
    point = FaultPoint("store", "sweep_owed", "before")
    faults = FaultInjector(script=[ScriptedFault(point, 1), ScriptedFault(point, 2)])
    node = open_memory(partitions=4, clock=clock).node(faults)
    sweeper = Sweeper(node.store, LeaderConfig(), lambda: {0: 1})
    assert not sweeper.step(T0)
    assert not sweeper.step(T0 + 10)
    assert faults.injected == [point]
    assert not sweeper.step(T0 + 1_000)
    assert faults.injected == [point, point]
