"""The cluster's claims on the real servers: a Redis fence floor seeded
from Cassandra after Redis lost it must not fall behind a raise that lands
while the seeding is under way (see claims/redis_cassandra's docstring)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
    """The claims' Cassandra session, running ``then`` once, right after
    the first read of a durable floor has been answered."""

    def __init__(self, claims: RedisCassandraClaims, then: Callable[[], None]) -> None:
        self._session = claims.session
        self._read_floor = claims._read_floor
        self._then: Callable[[], None] | None = then

    def execute(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        result = self._session.execute(statement, *args, **kwargs)
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
    claims.session = AfterFloorRead(claims, lambda: claims.raise_fence(PARTITION, 6))
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

    claims.session = AfterFloorRead(claims, raise_then_lose)
    assert claims.claim(run(1, 5), "w1", 0, 30_000).outcome is ClaimOutcome.CLAIMED
    stale = claims.claim(run(2, 5), "w1", 0, 30_000)
    assert (stale.outcome, stale.fence_floor) == (ClaimOutcome.FENCED, 6)
