"""The servers a world runs on, as its nodes and its judge see them: either
the hand-written model of the cluster store (pysched.memory, the default)
or the cluster's own store and claims over in-memory tables
(cluster_tables.py, ``--store tables``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from pysched.clock import Clock
from pysched.memory import MemoryCluster
from pysched.memory.coordinator import Election, MemoryCoordinator
from pysched.memory.dispatcher import Broker, MemoryDispatcher
from pysched.memory.store import RunRow
from pysched.protocols import IdempotencyClaims, MissedRuns, ScheduleStore
from pysched.sim.faults import NodeFaults
from pysched.sim.invariants import Violation

# Which store a world's nodes run: the model, or the cluster's own over tables.
StoreKind = Literal["model", "tables"]
STORE_KINDS: tuple[StoreKind, ...] = ("model", "tables")

# A job's runs by (run_at_ms, attempt_group).
JobRuns = Mapping[tuple[int, int], RunRow]


@dataclass(frozen=True)
class NodeClients:
    """One node process's clients of the servers."""

    store: ScheduleStore
    claims: IdempotencyClaims
    coordinator: MemoryCoordinator
    dispatcher: MemoryDispatcher


@dataclass(frozen=True)
class StoreRows:
    """What the store holds at a world's end, for its judge: every run's
    row by job, the dead letters ((job, run_at, group) -> when it failed
    for good), the missed spans ((job, first_ms) -> span), and each retry
    granted ((job, run_at, group) -> failed attempt -> when its retry was
    due)."""

    runs: Mapping[str, JobRuns]
    dead_letters: Mapping[tuple[str, int, int], int]
    missed: Mapping[tuple[str, int], MissedRuns]
    retries_due: Mapping[tuple[str, int, int], Mapping[int, int]]
    # Rows the leaders' sweep found behind their watermark, still owing
    # their runs: (job, run_at, group) -> the row's due time.
    found_behind: Mapping[tuple[str, int, int], int]


class SimServers(Protocol):
    broker: Broker
    election: Election

    def node(self, faults: NodeFaults, clock: Clock, name: str) -> NodeClients:
        """A new process's clients, its calls failing as ``faults`` says and
        its writes stamped by ``clock``."""
        ...

    def lose_fast_path(self, now_ms: int, back_by_ms: int) -> None:
        """Redis loses what it held (a restart without persistence), down
        for a while if the servers model that, back by ``back_by_ms``."""
        ...

    def round(self, now_ms: int) -> None:
        """What the servers do on their own at ``now_ms`` (a restart ends)."""
        ...

    def rows(self) -> StoreRows: ...

    def running_holder(self, key: str) -> str | None:
        """Who holds the claim of ``key`` running, as stored, if anyone."""
        ...

    def run_state(self, job_id: str, run_at_ms: int, attempt_group: int) -> str | None:
        """The run's state as stored (None: no row), read past every node's faults."""
        ...

    def close(self) -> None:
        """The world is over: give back what it borrowed."""
        ...

    def fence_violation(self) -> Violation | None:
        """The first write seen at the tables under a superseded fence, or
        lowering a stored one (fence_tables.py); None where the store is
        the model, whose calls are not table writes."""
        ...


class ModelServers:
    """The hand-written model (pysched.memory): each call atomic."""

    def __init__(self, memory: MemoryCluster) -> None:
        self.memory = memory
        self.broker = memory.broker
        self.election = memory.election

    def node(self, faults: NodeFaults, clock: Clock, name: str) -> NodeClients:
        node = self.memory.node(faults)
        return NodeClients(node.store, node.claims, node.coordinator, node.dispatcher)

    def lose_fast_path(self, now_ms: int, back_by_ms: int) -> None:
        self.memory.claims.forget_fast_path()

    def round(self, now_ms: int) -> None:
        pass

    def close(self) -> None:
        pass

    def fence_violation(self) -> Violation | None:
        return None

    def running_holder(self, key: str) -> str | None:
        return self.memory.claims.running_holder(key)

    def run_state(self, job_id: str, run_at_ms: int, attempt_group: int) -> str | None:
        row = self.memory.schedule.runs.get(job_id, {}).get((run_at_ms, attempt_group))
        return None if row is None else row.state

    def rows(self) -> StoreRows:
        tables = self.memory.schedule
        return StoreRows(tables.runs, tables.dead_letters, tables.missed, tables.retries_due, tables.found_behind)
