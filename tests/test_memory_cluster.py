"""etcd's run leases as the in-memory cluster keeps them: a key per held run
under its process's lease, gone when the lease runs out unrenewed; and the
store over the in-memory tables waiting on its injected clock."""

from __future__ import annotations

from cassandra import WriteTimeout, WriteType

from pysched.clock import ManualClock
from pysched.coord.run_leases import Holding
from pysched.memory.cql import TableCall
from pysched.memory_cluster import MemoryRunLeases, RunLeaseServer, open_memory_cluster
from pysched.model import Job
from pysched.registry import register_many


def test_a_run_key_is_held_while_its_lease_lives_and_free_once_it_ran_out() -> None:
    clock = ManualClock(0)
    server = RunLeaseServer(clock)
    one, other = MemoryRunLeases(server), MemoryRunLeases(server)
    assert one.take("k", "w1", ttl_s=10)
    assert not other.take("k", "w2", ttl_s=10)
    assert other.held_for_ms("k") == 10_000
    clock.advance(6_000)
    one.renew(10)  # the heartbeat keeps it
    clock.advance(6_000)
    assert one.holding("k", "w1") is Holding.HELD and not other.take("k", "w2", ttl_s=10)
    clock.advance(10_001)  # no heartbeat for a whole TTL
    assert one.holding("k", "w1") is Holding.LOST
    assert other.held_for_ms("k") == 0 and other.take("k", "w2", ttl_s=10)
    one.renew(10)  # a new lease: the key stays lost
    assert one.holding("k", "w1") is Holding.LOST


def test_letting_go_and_revoking_free_the_keys() -> None:
    clock = ManualClock(0)
    server = RunLeaseServer(clock)
    leases = MemoryRunLeases(server)
    for key in ("a", "b", "c"):
        assert leases.take(key, "w", ttl_s=10)
    leases.let_go(["a"])
    clock.advance(1)
    leases.renew(10)
    leases.let_go_all_but({"b"})  # taken before the beat, not kept: c goes
    assert [leases.held_for_ms(k) == 0 for k in ("a", "b", "c")] == [True, False, True]
    leases.revoke()
    assert leases.held_for_ms("b") == 0 and leases.holding("b", "w") is Holding.NOT_YET


def test_a_registration_whose_id_claim_timed_out_waits_on_the_store_s_clock() -> None:
    clock = ManualClock(1_800_000_000_000)
    servers = open_memory_cluster(partitions=2, clock=clock)
    store = servers.node(clock).store
    timed_out: list[TableCall] = []

    def time_out_the_first_claim(call: TableCall) -> None:
        # The id claim's conditional batch applies, and its answer is lost.
        if call.phase == "after" and "job_ids" in call.cql and "IF NOT EXISTS" in call.cql and not timed_out:
            timed_out.append(call)
            raise WriteTimeout("timed out", write_type=WriteType.CAS)

    servers.tables.fault_hook = time_out_the_first_claim
    job = Job.model_validate(
        {
            "id": "j",
            "schedule": {"kind": "once", "run_at_ms": 4_000_000_000_000},
            "target": {"kind": "shell", "command": "true"},
        }
    )
    before = clock.now_ms()
    assert register_many(store, [job], before) == []
    assert timed_out, "the claim should have timed out once"
    # One wait (0.2 s doubled once) before the round is tried again, on the
    # injected clock: a simulated node must not sleep in real time.
    assert clock.now_ms() - before == 400
    assert store.get_job("j").state == "active"
