"""Cassandra's tables in memory, run by the statements the cluster store sends.

``CqlCluster`` holds the tables; each client (a node) talks to it through
its own ``MemoryTables``, which has the same calls as the driver's tables
(pysched.stores.cql_tables.CqlTables) and stamps its writes with its own
clock, so nodes whose clocks are apart write as they would on Cassandra:
the last write by timestamp wins, not the last to arrive. TTLs expire by
the cluster's clock. Statements of different clients interleave statement
by statement; lightweight transactions are linearizable among themselves
(one lock, and a partition's Paxos timestamps only grow).

A fault hook, if set, is called at every table call: before its effect,
after it (a raise then is a timeout whose write applied), and between the
statements of an unlogged batch or the calls of an ``execute_many``. It
may raise what the driver raises (a timeout, no host available).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pysched.clock import Clock
from pysched.memory.cql.parser import (
    AlterAdd,
    CreateKeyspace,
    CreateTable,
    Delete,
    Insert,
    Relation,
    Select,
    Statement,
    Term,
    Update,
    parse_counted,
)
from pysched.memory.cql.relations import (
    checked_key,
    clustering_filter,
    holds,
    is_conditional,
    key_values,
    value_of,
)
from pysched.memory.cql.rows import NO_ROWS, MemoryRows, answer
from pysched.memory.cql.table import CqlError, Partition, Row, Table

APPLIED = "[applied]"


@dataclass(frozen=True, slots=True)
class TableCall:
    """Where a fault hook is called: which client, which point of its call
    (``before``, ``after``, ``between``), the statement there and its place
    in its batch or list of calls."""

    client: str
    phase: str
    cql: str
    index: int = 0


FaultHook = Callable[[TableCall], None]


@dataclass(frozen=True, slots=True)
class RowWritten:
    """A write that landed on a watched column (CqlCluster.watch_writes):
    which client made it, its statement's kind (``INSERT``, ``UPDATE``), the
    row's key columns and values as they now read, and the value written."""

    client: str
    kind: str
    key: dict[str, Any]
    now: dict[str, Any]
    written: Any


WriteWatch = Callable[[RowWritten], None]


@dataclass(frozen=True, slots=True)
class PreparedCql:
    cql: str
    statement: Statement
    markers: int  # the values it binds

    def bind(self, params: Sequence[Any] | None) -> tuple[Any, ...]:
        values = tuple(params or ())
        if len(values) != self.markers:
            # As the driver refuses it: a statement and its values out of step.
            raise CqlError(f"{len(values)} values for {self.markers} markers in: {self.cql}")
        return values


class CqlCluster:
    """The tables of one Cassandra cluster, in memory. ``clock``: the
    servers' own (TTL expiry)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.keyspaces: set[str] = set()
        self.tables: dict[str, Table] = {}
        self.fault_hook: FaultHook | None = None
        self.lock = threading.RLock()
        self._parsed: dict[str, PreparedCql] = {}
        self._names = itertools.count()
        # table -> (column, watcher): who is told of each write to it.
        self.watches: dict[str, tuple[str, WriteWatch]] = {}

    def watch_writes(self, table: str, column: str, watch: WriteWatch) -> None:
        """Tell ``watch`` of every write that sets ``column`` of ``table``
        (keyspace.table), once it has landed: a checker's eye on the
        tables, which the clients do not see."""
        self.watches[table] = (column, watch)

    def client(self, clock: Clock, name: str | None = None, keyspace: str | None = None) -> MemoryTables:
        """A client writing with timestamps from ``clock`` (its node's)."""
        return MemoryTables(self, clock, name or f"client-{next(self._names)}", keyspace)

    def parsed(self, cql: str) -> PreparedCql:
        found = self._parsed.get(cql)
        if found is None:
            found = self._parsed[cql] = PreparedCql(cql, *parse_counted(cql))
        return found


class MemoryTables:
    def __init__(self, cluster: CqlCluster, clock: Clock, name: str, keyspace: str | None) -> None:
        self.cluster = cluster
        self.clock = clock
        self.name = name
        self.keyspace = keyspace
        self._last_ts = 0

    # -- the calls of cql_tables.CqlTables ----------------------------------------

    def prepare(self, cql: str) -> PreparedCql:
        return self.cluster.parsed(cql)

    def execute(self, statement: Any, params: Sequence[Any] | None = None, timeout: float | None = None) -> MemoryRows:
        prepared = statement if isinstance(statement, PreparedCql) else self.cluster.parsed(statement)
        self._hook("before", prepared.cql)
        with self.cluster.lock:
            out = self._run(prepared.statement, prepared.bind(params), self._timestamp())
        self._hook("after", prepared.cql)
        return out

    def execute_many(
        self, calls: Sequence[Any], concurrency: int = 100, raise_on_first_error: bool = True
    ) -> list[tuple[bool, Any]]:
        out: list[tuple[bool, Any]] = []
        for i, call in enumerate(calls):
            try:
                if i:
                    self._hook("between", _cql_of(call), i)
                # A batch (cql_tables.Batch: read by its shape, the memory
                # package imports no store module), or (statement, params).
                if hasattr(call, "logged"):
                    result = self.batch(call.statements, call.logged)
                else:
                    result = self.execute(call[0], call[1])
                out.append((True, result))
            except Exception as exc:
                if raise_on_first_error:
                    raise
                out.append((False, exc))
        return out

    def batch(self, statements: Sequence[tuple[Any, Any]], logged: bool) -> MemoryRows:
        bound = [(s if isinstance(s, PreparedCql) else self.cluster.parsed(s), tuple(p or ())) for s, p in statements]
        for prepared, _ in bound:
            _write_of(prepared)
        first = bound[0][0].cql if bound else ""
        self._hook("before", first)
        ts = self._timestamp()  # one timestamp for the whole batch, as Cassandra's
        out = MemoryRows(None, [], True)
        if any(is_conditional(p.statement) for p, _ in bound):
            with self.cluster.lock:
                out = self._conditional_batch(bound, ts)
        elif logged:
            # Logged: the batchlog lands all of it or none.
            with self.cluster.lock:
                for prepared, params in bound:
                    self._write(_write_of(prepared), params, ts)
        else:
            # Unlogged: each statement lands on its own, and a fault between
            # two leaves the first landed and the rest not.
            for i, (prepared, params) in enumerate(bound):
                if i:
                    self._hook("between", prepared.cql, i)
                with self.cluster.lock:
                    self._write(_write_of(prepared), params, ts)
        self._hook("after", first)
        return out

    def agree_on_schema(self) -> None:
        """One node's memory is always agreed."""

    # -- running one statement ------------------------------------------------------

    def _hook(self, phase: str, cql: str, index: int = 0) -> None:
        hook = self.cluster.fault_hook
        if hook is not None:
            hook(TableCall(self.name, phase, cql, index))

    def _timestamp(self) -> int:
        # The driver's: microseconds of the client's clock, never repeated.
        self._last_ts = max(self.clock.now_ms() * 1000, self._last_ts + 1)
        return self._last_ts

    def _table(self, name: str) -> Table:
        if "." not in name and self.keyspace is not None:
            name = f"{self.keyspace}.{name}"
        table = self.cluster.tables.get(name)
        if table is None:
            raise CqlError(f"unconfigured table {name}")
        return table

    def _run(self, st: Statement, params: tuple[Any, ...], ts: int) -> MemoryRows:
        if isinstance(st, Select):
            return self._select(st, params)
        if isinstance(st, Insert | Update | Delete):
            if is_conditional(st):
                return self._transaction(st, params, ts)
            self._write(st, params, ts)
            return NO_ROWS
        self._schema(st)
        return NO_ROWS

    def _schema(self, st: Statement) -> None:
        cluster = self.cluster
        if isinstance(st, CreateKeyspace):
            cluster.keyspaces.add(st.name)
        elif isinstance(st, CreateTable):
            if st.table.split(".")[0] not in cluster.keyspaces:
                raise CqlError(f"no keyspace for table {st.table}")
            if st.table not in cluster.tables:
                cluster.tables[st.table] = Table(
                    st.table, dict(st.columns), st.partition_key, st.clustering, st.descending, st.default_ttl
                )
        elif isinstance(st, AlterAdd):
            table = self._table(st.table)
            for column, kind in st.columns:
                table.columns.setdefault(column, kind)

    def _keys(self, table: Table, where: Sequence[Relation], params: tuple[Any, ...]) -> tuple[Any, ...]:
        """The full primary key a write names (every key column by ``=``)."""
        given = {r.column: value_of(r.term, params) for r in where if r.op == "="}
        if len(given) != len(where) or set(given) != {*table.partition_key, *table.clustering}:
            raise CqlError(f"a write to {table.name} names its whole primary key by '=': {where}")
        return checked_key(table, table.partition_key, given), checked_key(table, table.clustering, given)

    def _expiry(self, table: Table, ttl: Term | None, params: tuple[Any, ...]) -> int | None:
        seconds = table.default_ttl if ttl is None else value_of(ttl, params)
        return None if not seconds else self.cluster.clock.now_ms() + int(seconds) * 1000

    def _write(self, st: Insert | Update | Delete, params: tuple[Any, ...], ts: int) -> None:
        table = self._table(st.table)
        if st.using.timestamp is not None:
            ts = int(value_of(st.using.timestamp, params))
        if isinstance(st, Delete):
            self._delete(table, st, params, ts)
            return
        if isinstance(st, Insert):
            values = {c: value_of(t, params) for c, t in zip(st.columns, st.values, strict=True)}
            pk = checked_key(table, table.partition_key, values)
            ck = checked_key(table, table.clustering, values)
            for column in (*table.partition_key, *table.clustering):
                del values[column]
            if table.is_counter:
                raise CqlError(f"INSERT into the counter table {table.name}")
            expires = self._expiry(table, st.using.ttl, params)
            part = table.partition(pk)
            row = table.row(part, ck)
            table.write_marker(part, row, ts, expires)
            for column, value in values.items():
                table.check(column, value)
                table.write_cell(part, row, column, (value, ts, expires))
            self._tell(table, "INSERT", part, row, pk, values)
            return
        pk, ck = self._keys(table, st.where, params)
        expires = self._expiry(table, st.using.ttl, params)
        part = table.partition(pk)
        row = table.row(part, ck)
        for a in st.assignments:
            value = value_of(a.term, params)
            if a.add:
                table.add_counter(part, row, a.column, int(value), ts)
            elif a.key is not None:
                table.write_cell(part, row, a.column, (value, ts, expires), value_of(a.key, params))
            else:
                table.check(a.column, value)
                table.write_cell(part, row, a.column, (value, ts, expires))
        if table.name in self.cluster.watches:
            self._tell(table, "UPDATE", part, row, pk, {a.column: value_of(a.term, params) for a in st.assignments})

    def _tell(
        self, table: Table, kind: str, part: Partition, row: Row, pk: tuple[Any, ...], set_: dict[str, Any]
    ) -> None:
        """The table's watcher, if it watches a column this write set."""
        watched = self.cluster.watches.get(table.name)
        if watched is None or watched[0] not in set_:
            return
        column, watch = watched
        now = table.live_values(part, row, self.cluster.clock.now_ms()) or {}
        watch(RowWritten(self.name, kind, key_values(table, pk, row.key), now, set_[column]))

    def _delete(self, table: Table, st: Delete, params: tuple[Any, ...], ts: int) -> None:
        pk_values = {r.column: value_of(r.term, params) for r in st.where if r.column in table.partition_key}
        if set(pk_values) != set(table.partition_key) or any(
            r.op != "=" for r in st.where if r.column in table.partition_key
        ):
            raise CqlError(f"a DELETE from {table.name} names its partition key by '=': {st.where}")
        pk = tuple(pk_values[c] for c in table.partition_key)
        ranges = [r for r in st.where if r.column not in table.partition_key]
        if not ranges:
            table.delete_partition(pk, ts)
            return
        equal = {r.column: value_of(r.term, params) for r in ranges if r.op == "="}
        if set(equal) == set(table.clustering) and len(equal) == len(ranges):
            table.delete_row(pk, tuple(equal[c] for c in table.clustering), ts)
            return
        table.delete_range(pk, clustering_filter(table, ranges, params), ts)

    # -- lightweight transactions -------------------------------------------------

    def _current(self, table: Table, part: Partition, ck: tuple[Any, ...]) -> dict[str, Any] | None:
        row = table.get(part, ck)
        return None if row is None else table.live_values(part, row, self.cluster.clock.now_ms())

    def _paxos(self, part: Partition, ts: int) -> int:
        # A partition's ballots only grow, whatever the proposer's clock says.
        part.paxos = max(ts, part.paxos + 1)
        return part.paxos

    def _transaction(self, st: Insert | Update | Delete, params: tuple[Any, ...], ts: int) -> MemoryRows:
        table = self._table(st.table)
        pk, ck = self._lwt_keys(table, st, params)
        part = table.partition(pk)
        current = self._current(table, part, ck)
        if holds(st, current, params):
            self._write(st, params, self._paxos(part, ts))
            return answer([APPLIED], [(True,)])
        if current is None:
            return answer([APPLIED], [(False,)])
        full = key_values(table, pk, ck) | current
        if isinstance(st, Insert):
            columns = table.all_columns()
        else:
            named = {r.column for r in st.conditions}
            columns = [c for c in table.all_columns() if c in named]
        return answer([APPLIED, *columns], [(False, *(full.get(c) for c in columns))])

    def _lwt_keys(
        self, table: Table, st: Insert | Update | Delete, params: tuple[Any, ...]
    ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        if isinstance(st, Insert):
            values = {c: value_of(t, params) for c, t in zip(st.columns, st.values, strict=True)}
            return checked_key(table, table.partition_key, values), checked_key(table, table.clustering, values)
        return self._keys(table, st.where, params)

    def _conditional_batch(self, bound: list[tuple[PreparedCql, tuple[Any, ...]]], ts: int) -> MemoryRows:
        """All of it if every condition holds, else none of it, and the rows
        that stood in the way (as Cassandra answers: the rows found)."""
        found: list[tuple[Table, dict[str, Any]]] = []
        all_hold = True
        partitions: set[tuple[str, tuple[Any, ...]]] = set()
        for prepared, params in bound:
            st = _write_of(prepared)
            table = self._table(st.table)
            pk, ck = self._lwt_keys(table, st, params)
            partitions.add((table.name, pk))
            if is_conditional(st):
                current = self._current(table, table.partition(pk), ck)
                if not holds(st, current, params):
                    all_hold = False
                if current is not None:
                    found.append((table, key_values(table, pk, ck) | current))
        if len(partitions) != 1:
            raise CqlError("a conditional batch writes one partition")
        table_name, pk = partitions.pop()
        if all_hold:
            ts = self._paxos(self.cluster.tables[table_name].partition(pk), ts)
            for prepared, params in bound:
                self._write(_write_of(prepared), params, ts)
            return answer([APPLIED], [(True,)], True)
        if not found:
            return answer([APPLIED], [(False,)], True)
        columns = found[0][0].all_columns()
        return answer([APPLIED, *columns], [(False, *(v.get(c) for c in columns)) for _, v in found], True)

    # -- reading ----------------------------------------------------------------

    def _select(self, st: Select, params: tuple[Any, ...]) -> MemoryRows:
        table = self._table(st.table)
        columns = table.all_columns() if st.columns is None else list(st.columns)
        for c in columns:
            table.kind(c)
        pk_relations = [r for r in st.where if r.column in table.partition_key]
        ck_relations = [r for r in st.where if r.column in table.clustering]
        if len(pk_relations) + len(ck_relations) != len(st.where):
            raise CqlError(f"a SELECT of {table.name} filters on key columns only (no ALLOW FILTERING): {st.where}")
        if pk_relations:
            options: dict[str, list[Any]] = {}
            for r in pk_relations:
                if r.op == "=":
                    options[r.column] = [value_of(r.term, params)]
                elif r.op == "IN":
                    options[r.column] = [value_of(t, params) for t in r.terms]
                else:
                    raise CqlError(f"the partition key of {table.name} is given by = or IN: {r}")
            if set(options) != set(table.partition_key):
                raise CqlError(f"a SELECT of {table.name} names its whole partition key: {st.where}")
            keys = list(itertools.product(*(options[c] for c in table.partition_key)))
        elif ck_relations:
            raise CqlError(f"a SELECT of {table.name} by clustering columns alone needs ALLOW FILTERING")
        else:
            keys = list(table.partitions)
        matches = clustering_filter(table, ck_relations, params) if ck_relations else None
        limit = None if st.limit is None else int(value_of(st.limit, params))
        reverse = False
        if st.order_by is not None:
            column, descending = st.order_by
            if not table.clustering or column != table.clustering[0]:
                raise CqlError(f"ORDER BY {column}: only the first clustering column of {table.name} orders")
            # The whole clustering order, reversed when the first column's is.
            reverse = descending != table.is_descending(column)
        now = self.cluster.clock.now_ms()
        out: list[tuple[Any, ...]] = []
        for pk in keys:
            part = table.partitions.get(pk)
            if part is None:
                continue
            rows: Any = self._candidates(table, part, ck_relations, params)
            if reverse:
                rows = reversed(list(rows))
            for row in rows:
                if matches is not None and not matches(row.key):
                    continue
                live = table.live_values(part, row, now)
                if live is None:
                    continue
                full = key_values(table, pk, row.key) | live
                out.append(tuple(full.get(c) for c in columns))
                if limit is not None and len(out) >= limit:
                    return answer(columns, out)
        return answer(columns, out)

    @staticmethod
    def _candidates(
        table: Table, part: Partition, ck_relations: list[Relation], params: tuple[Any, ...]
    ) -> Sequence[Row] | Iterator[Row]:
        """The rows a read looks at: one, when the whole clustering key is given."""
        equal = {r.column: r for r in ck_relations if r.op == "="}
        if table.clustering and set(equal) == set(table.clustering) and len(ck_relations) == len(equal):
            row = part.rows.get(tuple(value_of(equal[c].term, params) for c in table.clustering))
            return [] if row is None else [row]
        return table.rows_in_order(part)


def _write_of(prepared: PreparedCql) -> Insert | Update | Delete:
    st = prepared.statement
    if not isinstance(st, Insert | Update | Delete):
        raise CqlError(f"only writes go in a batch: {prepared.cql}")
    return st


def _cql_of(call: Any) -> str:
    statements = call.statements if hasattr(call, "statements") else [call]
    first = statements[0][0] if statements else ""
    return first.cql if isinstance(first, PreparedCql) else str(first)
