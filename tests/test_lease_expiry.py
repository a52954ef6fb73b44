"""The embedded leader hands a dead worker's run on again when the run's
lease runs out, not at its next periodic read (up to 30 s later): the real
leader on the SQLite engine, on a simulated clock."""

from __future__ import annotations

from pathlib import Path

from pysched import native
from pysched.clock import ManualClock
from pysched.leader import LeaderConfig, PartitionLeader, RunDispatched, SyncDriver
from pysched.model import Job
from pysched.node import open_embedded
from pysched.protocols import ClaimOutcome
from pysched.registry import register

T0 = 1_700_000_040_000
LEASE_MS = 5_000


def test_a_dead_workers_run_is_handed_on_again_when_its_lease_runs_out(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    backends = open_embedded(tmp_path / "pysched.db", partitions=4, clock=clock)
    job = Job.model_validate(
        {
            "id": "long",
            "schedule": {"kind": "once", "run_at_ms": T0 + 1_000},
            "target": {"kind": "shell", "command": "true"},
        }
    )
    register(backends.store, job, T0)
    fired: list[RunDispatched] = []
    leader = PartitionLeader(
        backends.store, backends.coordinator, backends.dispatcher, clock, "leader", LeaderConfig(), fired.append
    )
    driver = SyncDriver(leader)

    def run_until(end_ms: int) -> None:
        while (now := clock.now_ms()) < end_ms:
            driver.round(now)
            clock.advance(10)

    run_until(T0 + 1_500)
    assert [e.attempt for e in fired] == [1]
    # A worker takes the run, starts it, and dies: nothing renews its lease.
    delivery = backends.dispatcher.take(0)
    assert delivery is not None
    record = native.decode(delivery.payload)
    started = clock.now_ms()
    backends.claims.claim(record, "worker/1", started, LEASE_MS)
    assert backends.store.run_started(record, "worker", started) == 1
    run_until(started + 20_000)
    # Handed on again as its next delivery once the lease ran out: within
    # the leader's lease check (1 s) of it, though the next periodic read is
    # 30 s after the last; and once only.
    assert [e.attempt for e in fired] == [1, 2]
    assert started + LEASE_MS < fired[1].dispatched_at_ms <= started + LEASE_MS + 1_010
    # Taken over, it is the same attempt: the dead worker's ended none.
    redelivered = backends.dispatcher.take(0)
    assert redelivered is not None
    again = native.decode(redelivered.payload)
    assert again.attempt == 2
    claim = backends.claims.claim(again, "worker/2", clock.now_ms(), LEASE_MS)
    assert claim.outcome is ClaimOutcome.TAKEN_OVER
    assert backends.store.run_started(again, "worker", clock.now_ms()) == 1
    backends.close()
