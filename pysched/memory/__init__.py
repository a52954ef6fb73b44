"""In-memory backends that model the cluster (Cassandra, Redis, Kafka, etcd)
on an injected clock, for contract tests and a deterministic simulator.

The shared state of each role (ScheduleTables, ClaimTables, Broker,
Election) stands for the servers; each node gets its own clients of them,
as a cluster node has its own connections. ``open_memory`` builds the
servers and one node's clients, wired as node.open_cluster wires them;
``MemoryCluster.node`` gives another node its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from pysched.clock import Clock
from pysched.memory.claims import ClaimTables, MemoryClaims
from pysched.memory.coordinator import Election, MemoryCoordinator
from pysched.memory.dispatcher import Broker, MemoryDispatcher
from pysched.memory.faults import FaultHook
from pysched.memory.store import MemoryScheduleStore, ScheduleTables


@dataclass(frozen=True)
class MemoryNode:
    """One node's clients."""

    store: MemoryScheduleStore
    claims: MemoryClaims
    coordinator: MemoryCoordinator
    dispatcher: MemoryDispatcher


@dataclass(frozen=True)
class MemoryCluster:
    """The servers' state."""

    partitions: int
    lease_ttl_ms: int
    schedule: ScheduleTables
    claims: ClaimTables
    broker: Broker
    election: Election

    def node(self, faults: FaultHook | None = None) -> MemoryNode:
        store = MemoryScheduleStore(self.schedule, faults)
        claims = MemoryClaims(self.claims, faults)

        def publish_fence(partition: int, fence: int) -> None:
            # The store first, as node.open_cluster: a worker rejecting an
            # older leader's run implies the store refuses its watermark move.
            store.raise_fence(partition, fence)
            claims.raise_fence(partition, fence)

        coordinator = MemoryCoordinator(self.election, self.partitions, self.lease_ttl_ms, publish_fence, faults)
        return MemoryNode(store, claims, coordinator, MemoryDispatcher(self.broker, faults))


def open_memory(
    partitions: int, clock: Clock, dispatcher_partitions: int = 2, lease_ttl_ms: int = 10_000
) -> MemoryCluster:
    claims = ClaimTables()
    return MemoryCluster(
        partitions,
        lease_ttl_ms,
        ScheduleTables(partitions, clock, claims),
        claims,
        Broker(dispatcher_partitions, clock),
        Election(clock),
    )
