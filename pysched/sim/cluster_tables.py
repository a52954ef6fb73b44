"""A world on the cluster's own store (``--store tables``): the real
CassandraScheduleStore and RedisCassandraClaims over Cassandra's tables in
memory (pysched.memory.cql), Redis in memory (fakeredis) and etcd's run
leases in memory (pysched.memory_cluster), one set per world, each node
process a client of them with its own clock: its skew reaches the cells'
write timestamps, and last write wins by them.

The world's faults reach the real code where the cluster's would: a node's
store and claims calls fail at the tables (before a statement's effect, as
an unreachable cluster; after it, as a timeout whose write applied, an LWT
included; between the statements of an unlogged batch or of a list of
calls, leaving the first landed), raising what the driver raises; Redis
goes down and comes back empty, and its keys expire by the world's clock
(redis_clock.py). The named outages refuse whole store calls,
as the model does, and a watcher of the store (SimClusterStore) keeps each
retry granted for the judge. Elections and Kafka stay the model's.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import fakeredis
from cassandra import ReadTimeout, WriteTimeout, WriteType
from cassandra.cluster import NoHostAvailable

from pysched.clock import Clock
from pysched.config import ClusterConfig
from pysched.memory.cql import MemoryTables, TableCall
from pysched.memory.dispatcher import Broker, MemoryDispatcher
from pysched.memory.store import RunRow
from pysched.memory_cluster import RunHeld, open_memory_cluster
from pysched.protocols import FailedAttempt, Fences, JobPlanState, MissedRuns, NextRuns, Run
from pysched.records import DispatchRecord
from pysched.sim.faults import NodeFaults
from pysched.sim.fence_tables import FencesAtTables
from pysched.sim.invariants import Violation
from pysched.sim.redis_clock import RedisOnWorldTime
from pysched.sim.servers import NodeClients, StoreRows
from pysched.stores.cassandra import CassandraScheduleStore

# How long Redis stays down when it restarts (a ``redis`` fault), at most:
# it comes back empty, and no later than the world's quiet time.
REDIS_DOWN_MS = 40_000

# Each retry granted: (job id, run_at, attempt group) -> failed attempt -> due.
RetriesDue = dict[tuple[str, int, int], dict[int, int]]
# Rows the sweep found behind their watermark: (job, run_at, group) -> due time.
FoundBehind = dict[tuple[str, int, int], int]


class TableFaults:
    """The tables' fault hook: each call of a node's store or claims fails
    as that node's faults say, with the exception the driver would raise."""

    def __init__(self) -> None:
        # client name -> (role, its node's faults)
        self._clients: dict[str, tuple[str, NodeFaults]] = {}

    def attach(self, client: str, role: str, faults: NodeFaults) -> None:
        self._clients[client] = (role, faults)

    def __call__(self, call: TableCall) -> None:
        found = self._clients.get(call.client)
        if found is None:
            return  # a client of no node (the judge's reader)
        role, faults = found
        if faults.fails(role):
            faults.injected += 1
            raise driver_failure(call)


def driver_failure(call: TableCall) -> Exception:
    """What the driver raises for a call failing at ``call``'s point: before
    its effect, no host took it; after it (or between two statements, the
    first landed), a timeout whose write applied, for an LWT one of type
    CAS, which the store reads as "may or may not have applied"."""
    what = f"injected fault: {call.client} {call.phase} {call.cql[:80]}"
    failure: Exception
    cql = call.cql.lstrip().upper()
    if call.phase == "before":
        failure = NoHostAvailable(what, {})
    elif cql.startswith("SELECT"):
        failure = ReadTimeout(what)
    elif " IF " in cql:
        failure = WriteTimeout(what, write_type=WriteType.CAS)
    elif call.phase == "between":
        failure = WriteTimeout(what, write_type=WriteType.UNLOGGED_BATCH)
    else:
        failure = WriteTimeout(what, write_type=WriteType.SIMPLE)
    return failure


class SimClusterStore(CassandraScheduleStore):
    """The cluster store, unchanged, with what a world does around it: its
    named outages refuse whole calls (faults.py), a racing change lands
    between a leader's read of its plans and its write, and each retry a
    ``run_failed`` grants is kept for the judge (the run's row keeps only
    the last)."""

    def __init__(
        self,
        tables: MemoryTables,
        config: ClusterConfig,
        clock: Clock,
        run_held: RunHeld,
        *,
        faults: NodeFaults,
        retries_due: RetriesDue,
        behind: FoundBehind,
    ) -> None:
        super().__init__(tables, config, clock, run_held)
        self._faults = faults
        self._retries_due = retries_due
        self._behind = behind

    def found_behind(self, job_id: str, run_at_ms: int, attempt_group: int, due_ms: int) -> None:
        self._behind.setdefault((job_id, run_at_ms, attempt_group), due_ms)

    def planning_state(self, job_ids: Collection[str]) -> dict[str, JobPlanState]:
        out = super().planning_state(job_ids)
        self._faults.planned()
        return out

    def finish_dispatch(
        self, rows: Sequence[Run], fences: Fences, marks: Mapping[int, int], now_ms: int, next_runs: NextRuns
    ) -> list[Run]:
        self._faults.refuse("store", "finish_dispatch", "before")
        return super().finish_dispatch(rows, fences, marks, now_ms, next_runs)

    def run_finished(
        self, record: DispatchRecord, state: str, error: str | None, result: str | None, now_ms: int
    ) -> None:
        self._faults.refuse("store", "run_finished", "before")
        super().run_finished(record, state, error, result, now_ms)

    def run_missed(self, record: DispatchRecord, missed: MissedRuns, error: str, now_ms: int) -> None:
        self._faults.refuse("store", "run_missed", "before")
        super().run_missed(record, missed, error, now_ms)

    def run_failed(self, record: DispatchRecord, failure: FailedAttempt, retry_due_ms: int | None) -> None:
        self._faults.refuse("store", "run_failed", "before")
        super().run_failed(record, failure, retry_due_ms)
        if retry_due_ms is not None:
            run = (record.job_id, record.run_at_ms, record.attempt_group)
            self._retries_due.setdefault(run, {})[failure.attempt] = retry_due_ms

    def run_parked(self, record: DispatchRecord, due_ms: int, reason: str, now_ms: int) -> None:
        self._faults.refuse("store", "run_parked", "before")
        super().run_parked(record, due_ms, reason, now_ms)


class TableServers:
    """One world's servers (SimServers): the tables, Redis and etcd's run
    leases the nodes' real store and claims use; the model's elections and
    Kafka broker."""

    def __init__(self, partitions: int, clock: Clock, dispatch_partitions: int, lease_ttl_ms: int = 10_000) -> None:
        self.servers = open_memory_cluster(partitions, clock, lease_ttl_ms=lease_ttl_ms)
        self.broker = Broker(dispatch_partitions, clock)
        self.election = self.servers.election
        self.faults = TableFaults()
        self.servers.tables.fault_hook = self.faults
        self.fences = FencesAtTables(self.servers.tables, self.servers.config.keyspace, self.election)
        self.retries_due: RetriesDue = {}
        self.found_behind: FoundBehind = {}
        self._redis_back_at_ms: int | None = None
        self._redis_time = RedisOnWorldTime(clock)
        # The judge's reader: a client of no node, so no fault reaches it.
        self._reader = self.servers.tables.client(clock, "judge", self.servers.config.keyspace)

    def node(self, faults: NodeFaults, clock: Clock, name: str) -> NodeClients:
        store_type = functools.partial(
            SimClusterStore, faults=faults, retries_due=self.retries_due, behind=self.found_behind
        )
        node = self.servers.node(clock, faults, name, store_type)
        # Attached once built: a process starting under a fault still starts.
        self.faults.attach(node.tables.name, "store", faults)
        self.faults.attach(node.claims_tables.name, "claims", faults)
        return NodeClients(node.store, node.claims, node.coordinator, MemoryDispatcher(self.broker, faults))

    def lose_fast_path(self, now_ms: int, back_by_ms: int) -> None:
        """Redis goes down (every client's calls fail) and comes back empty."""
        self.servers.redis.connected = False
        self._redis_back_at_ms = max(now_ms, min(now_ms + REDIS_DOWN_MS, back_by_ms))

    def round(self, now_ms: int) -> None:
        if self._redis_back_at_ms is not None and now_ms >= self._redis_back_at_ms:
            self._redis_back_at_ms = None
            self.servers.redis.connected = True
            # Restarted without persistence: everything it held is gone.
            fakeredis.FakeRedis(server=self.servers.redis).flushall()

    def close(self) -> None:
        self._redis_time.restore()

    def fence_violation(self) -> Violation | None:
        return self.fences.violations[0] if self.fences.violations else None

    def running_holder(self, key: str) -> str | None:
        row = self._reader.execute("SELECT state, holder FROM claims WHERE idem_key = %s", (key,)).one()
        return row.holder if row is not None and row.state == "running" else None

    def run_state(self, job_id: str, run_at_ms: int, attempt_group: int) -> str | None:
        query = "SELECT state FROM runs WHERE job_id = %s AND run_at_ms = %s AND attempt_group = %s"
        row = self._reader.execute(query, (job_id, run_at_ms, attempt_group)).one()
        return None if row is None else row.state

    def rows(self) -> StoreRows:
        read = self._reader.execute
        runs: dict[str, dict[tuple[int, int], RunRow]] = {}
        for row in read(f"SELECT {', '.join(_RUN_COLUMNS)} FROM runs"):
            runs.setdefault(row.job_id, {})[(int(row.run_at_ms), int(row.attempt_group))] = _run_row(row)
        dead = {
            (row.job_id, int(row.run_at_ms), int(row.attempt_group)): int(row.failed_at_ms)
            for row in read("SELECT job_id, run_at_ms, attempt_group, failed_at_ms FROM dead_letters")
        }
        missed = {
            (row.job_id, int(row.first_ms)): MissedRuns(row.job_id, int(row.first_ms), int(row.end_ms), row.reason)
            for row in read("SELECT job_id, first_ms, end_ms, reason FROM missed_runs")
        }
        return StoreRows(runs, dead, missed, self.retries_due, self.found_behind)


_RUN_COLUMNS = (
    "job_id",
    "run_at_ms",
    "attempt_group",
    "run_id",
    "due_ms",
    "partition",
    "state",
    "attempt",
    "fence",
    "dispatched_at_ms",
    "started_at_ms",
    "ended_at_ms",
    "worker",
    "error",
    "result",
    "delivery",
    "ended_attempt",
    "failures",
)


def _run_row(row: Any) -> RunRow:
    """A runs row as the judge reads the model's (failures by attempt)."""
    failures = tuple(
        sorted((int(attempt), FailedAttempt.from_json(text)) for attempt, text in (row.failures or {}).items())
    )
    return RunRow(
        job_id=row.job_id,
        run_at_ms=int(row.run_at_ms),
        attempt_group=int(row.attempt_group),
        run_id=int(row.run_id or 0),
        due_ms=int(row.due_ms or 0),
        partition=int(row.partition or 0),
        state=row.state or "scheduled",
        attempt=int(row.attempt or 0),
        fence=row.fence,
        dispatched_at_ms=row.dispatched_at_ms,
        started_at_ms=row.started_at_ms,
        ended_at_ms=row.ended_at_ms,
        worker=row.worker,
        error=row.error,
        result=row.result,
        delivery=int(row.delivery or 0),
        ended_attempt=int(row.ended_attempt or 0),
        failures=failures,
    )
