"""The cluster's own store and claims code over servers kept in memory.

``open_memory_cluster`` wires a node as node.open_cluster does (the store
first, then the claims, fences published to both), with Cassandra's
tables in memory (pysched.memory.cql), Redis in memory (fakeredis, Lua
scripts included) and etcd's run leases in memory (MemoryRunLeases), all on
an injected clock. Elections are the in-memory coordinator's. Nothing of
the store or the claims is restated: what runs is
pysched.stores.cassandra and pysched.claims.redis_cassandra.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import fakeredis

from pysched.claims.redis_cassandra import RedisCassandraClaims
from pysched.clock import Clock
from pysched.config import ClusterConfig
from pysched.coord.run_leases import Holding
from pysched.memory.coordinator import Election, MemoryCoordinator
from pysched.memory.cql import CqlCluster, MemoryTables
from pysched.memory.faults import FaultHook
from pysched.stores.cassandra import CassandraScheduleStore, ensure_schema

# Makes a node's store from its tables, the configuration and its clock.
# How long etcd still holds a run's key (EtcdRunLeases.held_for_ms).
RunHeld = Callable[[str], int | None]
StoreFactory = Callable[[MemoryTables, ClusterConfig, Clock, RunHeld], CassandraScheduleStore]


@dataclass
class RunLeaseServer:
    """etcd's keys and leases for held runs: key -> (holder, lease id);
    lease id -> expiry (the server's clock)."""

    clock: Clock
    keys: dict[str, tuple[str, int]] = field(default_factory=dict)
    leases: dict[int, int] = field(default_factory=dict)
    next_lease: int = 1

    def alive(self, lease: int) -> bool:
        return self.leases.get(lease, -1) > self.clock.now_ms()

    def holder_of(self, key: str) -> tuple[str, int] | None:
        held = self.keys.get(key)
        if held is not None and not self.alive(held[1]):
            del self.keys[key]  # the lessor revoked it: its keys go
            return None
        return held


class MemoryRunLeases:
    """One process's run leases (coord.run_leases.EtcdRunLeases) on a
    RunLeaseServer: a lease per process, a key per held run under it."""

    def __init__(self, server: RunLeaseServer) -> None:
        self.server = server
        self._lease: int | None = None
        # key -> (holder, lease id, when taken)
        self._taken: dict[str, tuple[str, int, int]] = {}
        self._beat_began = 0

    def _live_lease(self, ttl_s: int) -> int:
        server = self.server
        if self._lease is None or not server.alive(self._lease):
            self._lease = server.next_lease
            server.next_lease += 1
        server.leases[self._lease] = server.clock.now_ms() + ttl_s * 1000
        return self._lease

    def renew(self, ttl_s: int) -> None:
        self._beat_began = self.server.clock.now_ms()
        self._live_lease(ttl_s)

    def holding(self, key: str, holder: str) -> Holding:
        taken = self._taken.get(key)
        if taken is None or taken[0] != holder:
            return Holding.NOT_YET
        alive = taken[1] == self._lease and self.server.alive(taken[1])
        return Holding.HELD if alive else Holding.LOST

    def take(self, key: str, holder: str, ttl_s: int) -> bool:
        lease = self._live_lease(ttl_s)
        current = self.server.holder_of(key)
        if current is not None and current[0] != holder:
            return False
        self.server.keys[key] = (holder, lease)
        self._taken[key] = (holder, lease, self.server.clock.now_ms())
        return True

    def held_for_ms(self, key: str) -> int | None:
        current = self.server.holder_of(key)
        if current is None:
            return 0
        return max(0, self.server.leases[current[1]] - self.server.clock.now_ms())

    def let_go(self, keys: Collection[str]) -> None:
        for key in keys:
            taken = self._taken.pop(key, None)
            current = self.server.keys.get(key)
            if taken is not None and current is not None and current[0] == taken[0]:
                del self.server.keys[key]

    def let_go_all_but(self, keep: Collection[str]) -> None:
        stale = [k for k, t in self._taken.items() if k not in keep and t[2] < self._beat_began]
        self.let_go(stale)

    def revoke(self) -> None:
        if self._lease is not None:
            self.server.leases.pop(self._lease, None)
            self.server.keys = {k: v for k, v in self.server.keys.items() if v[1] != self._lease}
        self._lease = None
        self._taken.clear()


@dataclass(frozen=True)
class MemoryClusterNode:
    """One node's clients of the in-memory servers: its store and its
    claims each speak to the tables as a client of their own (named
    ``<node>/store`` and ``<node>/claims``, so that a fault hook can tell
    them apart), both stamping writes with the node's clock."""

    store: CassandraScheduleStore
    claims: RedisCassandraClaims
    coordinator: MemoryCoordinator
    tables: MemoryTables
    claims_tables: MemoryTables


@dataclass
class MemoryClusterServers:
    """The servers' state: Cassandra's tables, Redis, etcd."""

    config: ClusterConfig
    clock: Clock
    tables: CqlCluster
    redis: fakeredis.FakeServer
    run_leases: RunLeaseServer
    election: Election
    lease_ttl_ms: int
    # Names for nodes that were given none.
    _names: itertools.count[int] = field(default_factory=itertools.count, init=False, repr=False)

    def node(
        self,
        clock: Clock | None = None,
        coordinator_faults: FaultHook | None = None,
        name: str | None = None,
        store_type: StoreFactory = CassandraScheduleStore,
    ) -> MemoryClusterNode:
        """A node whose writes carry ``clock``'s time (the servers' by
        default); ``coordinator_faults``: its elections' fault hook (the
        tables have theirs, CqlCluster.fault_hook); ``store_type``: the
        cluster store, or one that watches it (a simulator's)."""
        node_clock = clock or self.clock
        prefix = name or f"node-{next(self._names)}"
        tables = self.tables.client(node_clock, f"{prefix}/store")
        claims_tables = self.tables.client(node_clock, f"{prefix}/claims")
        run_leases = MemoryRunLeases(self.run_leases)
        # The leader's sweep asks etcd whether a running run's worker lives, as node.open_cluster.
        store = store_type(tables, self.config, node_clock, run_leases.held_for_ms)
        redis_client = fakeredis.FakeRedis(server=self.redis)
        claims = RedisCassandraClaims(redis_client, claims_tables, self.config, run_leases)

        def publish_fence(partition: int, fence: int) -> None:
            # The store first, as node.open_cluster.
            store.raise_fence(partition, fence)
            claims.raise_fence(partition, fence)

        coordinator = MemoryCoordinator(
            self.election, store.partitions, self.lease_ttl_ms, publish_fence, coordinator_faults
        )
        return MemoryClusterNode(store, claims, coordinator, tables, claims_tables)


def open_memory_cluster(
    partitions: int, clock: Clock, keyspace: str = "pysched", lease_ttl_ms: int = 10_000
) -> MemoryClusterServers:
    # The addresses name no server: nothing here connects to one.
    config = ClusterConfig(
        etcd="memory", cassandra="memory", kafka="memory", redis="memory://", keyspace=keyspace, partitions=partitions
    )
    tables = CqlCluster(clock)
    ensure_schema(tables.client(clock), config, clock.now_ms())
    return MemoryClusterServers(
        config, clock, tables, fakeredis.FakeServer(), RunLeaseServer(clock), Election(clock), lease_ttl_ms
    )
