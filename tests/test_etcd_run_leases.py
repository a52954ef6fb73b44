"""Running runs' leases in etcd, on the real servers: one etcd lease per
worker process, one key per run it carried past its first heartbeat.

Each ``open_cluster`` below is one worker process: its own etcd lease. A
process's death is its lease revoked (what its TTL does some seconds later),
or, in one test, the TTL itself running out."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pysched.claims.redis_cassandra import RedisCassandraClaims
from pysched.node import open_cluster
from pysched.protocols import ClaimOutcome
from pysched.records import DispatchRecord
from tests.conftest import cluster_config_for

pytestmark = pytest.mark.cluster

LEASE = 2_000  # ms: etcd's shortest TTL


def run(run_id: int) -> DispatchRecord:
    return DispatchRecord(run_id, "job", 1_000 * run_id, 1_000 * run_id, 1, 1, 0, 1, 0)


@pytest.fixture
def workers(services: dict[str, Any], keyspace: str) -> Iterator[Callable[[], RedisCassandraClaims]]:
    """Worker processes on one keyspace, opened on demand."""
    opened = []

    def open_worker() -> RedisCassandraClaims:
        backends = open_cluster(cluster_config_for(services, keyspace, partitions=4), coordinator=False)
        opened.append(backends)
        claims = backends.claims
        assert isinstance(claims, RedisCassandraClaims)
        return claims

    yield open_worker
    for backends in opened:
        backends.close()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def updated_at(claims: RedisCassandraClaims, key: str) -> int:
    keyspace = claims.prefix.split(":", 1)[1]
    row = claims.tables.execute(f"SELECT updated_at_ms FROM {keyspace}.claims WHERE idem_key = %s", (key,))
    return int(row.one().updated_at_ms)


def expire(claims: RedisCassandraClaims) -> None:
    """The process's etcd lease runs out while the process knows nothing of
    it (paused, or cut off from etcd)."""
    leases = claims.run_leases
    assert leases._lease is not None
    leases._etcd.call(leases._client.revoke_lease(leases._lease.id))


def test_a_run_past_its_first_lease_is_held_by_its_workers_etcd_lease(workers: Any) -> None:
    a, b = workers(), workers()
    rec, t = run(1), now_ms()
    assert a.claim(rec, "a/1", t, LEASE).outcome is ClaimOutcome.CLAIMED
    assert a.heartbeat([rec.idempotency_key], ["a/1"], t + 1_000, LEASE) == []
    # Hours later by the claim row's lease: the etcd key says a runs it.
    assert b.claim(rec, "b/1", t + 3_600_000, LEASE).outcome is ClaimOutcome.BUSY
    a.run_leases.revoke()  # a dies
    assert b.claim(rec, "b/1", t + 3_600_001, LEASE).outcome is ClaimOutcome.TAKEN_OVER


def test_a_heartbeat_writes_a_run_into_etcd_once_and_its_row_never_again(workers: Any) -> None:
    a = workers()
    rec, t = run(2), now_ms()
    a.claim(rec, "a/1", t, LEASE)
    assert a.heartbeat([rec.idempotency_key], ["a/1"], t + 1_000, LEASE) == []
    assert updated_at(a, rec.idempotency_key) == t + 1_000
    for beat in range(2, 6):
        assert a.heartbeat([rec.idempotency_key], ["a/1"], t + beat * 1_000, LEASE) == []
    assert updated_at(a, rec.idempotency_key) == t + 1_000


def test_a_dead_workers_lease_runs_out_in_etcd_and_its_run_is_taken_over(workers: Any) -> None:
    a, b = workers(), workers()
    rec, t = run(3), now_ms()
    a.claim(rec, "a/1", t, LEASE)
    assert a.heartbeat([rec.idempotency_key], ["a/1"], t + 1, 5_000) == []
    busy = b.claim(rec, "b/1", t + 3_600_000, LEASE)
    assert busy.outcome is ClaimOutcome.BUSY
    # It says when a's etcd lease ends unless renewed: within its 5 s TTL
    # (etcd counts whole seconds), so b looks again then, not a beat later.
    assert busy.busy_until_ms is not None and 0 <= busy.busy_until_ms - (t + 3_600_000) <= 5_000
    # a stops beating: no revoke, the TTL alone (5 s) frees the run.
    deadline = time.monotonic() + 60
    while b.claim(rec, "b/1", t + 3_600_000, LEASE).outcome is ClaimOutcome.BUSY:
        assert time.monotonic() < deadline, "the run was not freed 60 s after a 5 s etcd lease stopped being kept"
        time.sleep(0.2)


def test_a_worker_whose_etcd_lease_expired_finds_its_runs_lost(workers: Any) -> None:
    a, b = workers(), workers()
    taken, untouched, t = run(4), run(5), now_ms()
    keys = [taken.idempotency_key, untouched.idempotency_key]
    a.claim(taken, "a/1", t, LEASE)
    a.claim(untouched, "a/2", t, LEASE)
    assert a.heartbeat(keys, ["a/1", "a/2"], t + 1_000, LEASE) == []
    expire(a)
    assert b.claim(taken, "b/1", t + 10_000, LEASE).outcome is ClaimOutcome.TAKEN_OVER
    # Both are lost to a: under its expired lease either may have been taken.
    assert a.heartbeat(keys, ["a/1", "a/2"], t + 11_000, LEASE) == [0, 1]
    assert not a.save_checkpoint(taken.idempotency_key, "a/1", "{}", t + 11_000)
    # b holds its run, by its own lease, past the row's lease.
    assert b.heartbeat([taken.idempotency_key], ["b/1"], t + 12_000, LEASE) == []
    assert a.claim(taken, "a/3", t + 3_600_000, LEASE).outcome is ClaimOutcome.BUSY


def test_a_run_whose_execution_ended_without_an_outcome_is_let_go(workers: Any) -> None:
    a, b = workers(), workers()
    going, abandoned, t = run(6), run(7), now_ms()
    a.claim(going, "a/1", t, LEASE)
    a.claim(abandoned, "a/2", t, LEASE)
    both = [going.idempotency_key, abandoned.idempotency_key]
    assert a.heartbeat(both, ["a/1", "a/2"], t + 1_000, LEASE) == []
    # The next heartbeat names only the run still going.
    assert a.heartbeat([going.idempotency_key], ["a/1"], t + 2_000, LEASE) == []
    assert b.claim(abandoned, "b/1", t + 10_000, LEASE).outcome is ClaimOutcome.TAKEN_OVER
    assert b.claim(going, "b/2", t + 10_000, LEASE).outcome is ClaimOutcome.BUSY


def test_a_failed_run_lets_go_of_its_key_for_its_retry(workers: Any) -> None:
    a, b = workers(), workers()
    rec, t = run(8), now_ms()
    a.claim(rec, "a/1", t, LEASE)
    assert a.heartbeat([rec.idempotency_key], ["a/1"], t + 1_000, LEASE) == []
    a.complete(rec.idempotency_key, "a/1", False, None, t + 1_500)
    assert b.claim(rec, "b/1", t + 1_600, LEASE).outcome is ClaimOutcome.TAKEN_OVER


def test_a_stalled_worker_whose_run_was_taken_over_before_its_first_heartbeat_loses_it(workers: Any) -> None:
    a, b = workers(), workers()
    rec, t = run(9), now_ms()
    a.claim(rec, "a/1", t, LEASE)
    # a stalls past its first lease; b takes the run over and finishes it.
    assert b.claim(rec, "b/1", t + 5_000, LEASE).outcome is ClaimOutcome.TAKEN_OVER
    b.complete(rec.idempotency_key, "b/1", False, None, t + 6_000)
    # a's first heartbeat: the key is free again, but the row is not a's.
    assert a.heartbeat([rec.idempotency_key], ["a/1"], t + 7_000, LEASE) == [0]
    assert b.claim(rec, "b/2", t + 7_100, LEASE).outcome is ClaimOutcome.TAKEN_OVER
