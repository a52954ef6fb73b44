"""etcd's run leases as the in-memory cluster keeps them: a key per held run
under its process's lease, gone when the lease runs out unrenewed."""

from __future__ import annotations

from pysched.clock import ManualClock
from pysched.coord.run_leases import Holding
from pysched.memory_cluster import MemoryRunLeases, RunLeaseServer


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
