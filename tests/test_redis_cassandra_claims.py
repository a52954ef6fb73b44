"""The cluster's claims on the real servers: a Redis fence floor seeded
from Cassandra after Redis lost it must not fall behind a raise that lands
while the seeding is under way (see claims/redis_cassandra's docstring);
with Redis down, claims, heartbeats and outcomes go on through Cassandra
and etcd, and with it back empty nothing runs twice."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pysched.claims.redis_cassandra import RedisCassandraClaims
from pysched.node import Backends, open_cluster
from pysched.protocols import ClaimOutcome
from pysched.records import DispatchRecord
from tests.conftest import cluster_config_for

pytestmark = pytest.mark.cluster

PARTITION = 2


class AfterFloorRead:
    """The claims' Cassandra tables, running ``then`` once, right after
    the first read of a durable floor has been answered."""

    def __init__(self, claims: RedisCassandraClaims, then: Callable[[], None]) -> None:
        self._tables = claims.tables
        self._read_floor = claims._read_floor
        self._then: Callable[[], None] | None = then

    def execute(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        result = self._tables.execute(statement, *args, **kwargs)
        if statement is self._read_floor and self._then is not None:
            then, self._then = self._then, None
            then()
        return result


@pytest.fixture
def cluster(services: dict[str, Any], keyspace: str) -> Iterator[Backends]:
    backends = open_cluster(cluster_config_for(services, keyspace, partitions=4), coordinator=False)
    yield backends
    backends.close()


def run(run_id: int, fence: int) -> DispatchRecord:
    return DispatchRecord(run_id, "job", 1_000 * run_id, 1_000 * run_id, PARTITION, 1, 0, fence, 0)


def forget_fast_path(claims: RedisCassandraClaims) -> None:
    # Only this keyspace's keys: the Redis database is shared with other runs.
    for key in claims.redis.scan_iter(match=f"{claims.prefix}:*", count=1_000):
        claims.redis.delete(key)


def test_a_raise_between_the_durable_read_and_the_seeding_is_kept(cluster: Backends) -> None:
    claims: Any = cluster.claims
    claims.raise_fence(PARTITION, 5)
    forget_fast_path(claims)
    # A claim under fence 5 reads the durable floor (5); before it seeds
    # Redis with that, a new leader raises 6.
    claims.tables = AfterFloorRead(claims, lambda: claims.raise_fence(PARTITION, 6))
    assert claims.claim(run(1, 5), "w1", 0, 30_000).outcome is ClaimOutcome.CLAIMED
    stale = claims.claim(run(2, 5), "w1", 0, 30_000)
    assert (stale.outcome, stale.fence_floor) == (ClaimOutcome.FENCED, 6)


def test_a_seeding_that_outlived_another_loss_is_refused(cluster: Backends) -> None:
    claims: Any = cluster.claims
    claims.raise_fence(PARTITION, 5)
    forget_fast_path(claims)

    def raise_then_lose() -> None:
        # The raise reaches the marker the claim left, then Redis loses
        # it: only a read made after this may seed the floor.
        claims.raise_fence(PARTITION, 6)
        forget_fast_path(claims)

    claims.tables = AfterFloorRead(claims, raise_then_lose)
    assert claims.claim(run(1, 5), "w1", 0, 30_000).outcome is ClaimOutcome.CLAIMED
    stale = claims.claim(run(2, 5), "w1", 0, 30_000)
    assert (stale.outcome, stale.fence_floor) == (ClaimOutcome.FENCED, 6)


class OwnRedis:
    """A redis-server of this test's own, on a free port, that the test
    stops and starts again (empty): the shared one is never touched."""

    def __init__(self, binary: str, home: Path) -> None:
        self._binary = binary
        self._home = home
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self._home)]
        args += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        self._process = subprocess.Popen([self._binary, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith(b"+PONG"):
                    return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server binary")
    server = OwnRedis(binary, tmp_path)
    server.start()
    yield server
    server.kill()


@pytest.fixture
def cluster_on_own_redis(services: dict[str, Any], keyspace: str, own_redis: OwnRedis) -> Iterator[Backends]:
    config = cluster_config_for({**services, "redis": {"url": own_redis.url}}, keyspace, partitions=4)
    backends = open_cluster(config, coordinator=False)
    yield backends
    backends.close()


LEASE_MS = 30_000


def test_with_redis_down_a_run_is_claimed_and_held_through_cassandra_and_etcd(
    cluster_on_own_redis: Backends, own_redis: OwnRedis
) -> None:
    claims: Any = cluster_on_own_redis.claims
    claims.raise_fence(PARTITION, 5)
    own_redis.kill()
    key = run(1, 5).idempotency_key
    assert claims.claim(run(1, 5), "w1", 0, LEASE_MS).outcome is ClaimOutcome.CLAIMED
    # Still the authoritative claim: a second worker waits, a stale
    # leader's record is fenced.
    assert claims.claim(run(1, 5), "w2", 1_000, LEASE_MS).outcome is ClaimOutcome.BUSY
    assert claims.claim(run(2, 4), "w2", 1_000, LEASE_MS).outcome is ClaimOutcome.FENCED
    # The heartbeat extends the run (into etcd), Redis or not: past its
    # first lease, a taker finds it held.
    assert claims.heartbeat([key], ["w1"], 10_000, LEASE_MS) == []
    assert claims.claim(run(1, 5), "w2", 2 * LEASE_MS, LEASE_MS).outcome is ClaimOutcome.BUSY
    # Back, and empty: nothing runs twice.
    own_redis.start()
    assert claims.heartbeat([key], ["w1"], 2 * LEASE_MS, LEASE_MS) == []
    assert claims.claim(run(1, 5), "w2", 3 * LEASE_MS, LEASE_MS).outcome is ClaimOutcome.BUSY
    claims.complete(key, "w1", True, "ok", 3 * LEASE_MS)
    done = claims.claim(run(1, 5), "w2", 3 * LEASE_MS, LEASE_MS)
    assert (done.outcome, done.result) == (ClaimOutcome.SUCCEEDED, "ok")


def test_with_redis_down_an_outcome_is_recorded(cluster_on_own_redis: Backends, own_redis: OwnRedis) -> None:
    claims: Any = cluster_on_own_redis.claims
    claims.raise_fence(PARTITION, 5)
    assert claims.claim(run(1, 5), "w1", 0, LEASE_MS).outcome is ClaimOutcome.CLAIMED
    assert claims.claim(run(2, 5), "w1", 0, LEASE_MS).outcome is ClaimOutcome.CLAIMED
    own_redis.kill()
    claims.complete(run(1, 5).idempotency_key, "w1", True, "ok", 1_000)
    claims.complete(run(2, 5).idempotency_key, "w1", False, None, 1_000)
    done = claims.claim(run(1, 5), "w2", 2_000, LEASE_MS)
    assert (done.outcome, done.result) == (ClaimOutcome.SUCCEEDED, "ok")
    assert claims.claim(run(2, 5), "w2", 2_000, LEASE_MS).outcome is ClaimOutcome.TAKEN_OVER


def test_complete_says_whether_the_claim_was_still_the_holders(cluster: Backends) -> None:
    claims: Any = cluster.claims
    claims.raise_fence(PARTITION, 5)
    key = run(1, 5).idempotency_key
    assert claims.claim(run(1, 5), "w1", 0, LEASE_MS).outcome is ClaimOutcome.CLAIMED
    # Its first lease over and never moved into etcd: another takes it over.
    assert claims.claim(run(1, 5), "w2", 2 * LEASE_MS, LEASE_MS).outcome is ClaimOutcome.TAKEN_OVER
    assert not claims.complete(key, "w1", True, "late", 2 * LEASE_MS)
    assert claims.complete(key, "w2", False, None, 2 * LEASE_MS)
    # Repeated (an attempt whose answer was lost): still its own.
    assert claims.complete(key, "w2", False, None, 2 * LEASE_MS)
    assert not claims.complete(run(9, 5).idempotency_key, "w1", True, None, 2 * LEASE_MS)
