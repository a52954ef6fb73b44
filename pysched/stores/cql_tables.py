"""The tables the cluster store speaks to: CQL statements behind a small seam.

The Cassandra store, its helpers and the authoritative claims say what they
do in CQL and hand it to a ``CqlTables``; they never hold a driver session.
``DriverTables`` runs the statements on Cassandra through the driver,
exactly as the store did before (the session's QUORUM / SERIAL profile, the
driver's own exceptions); in-memory tables (pysched.memory.cql) run the same
statements with Cassandra's semantics, so the store is written once and a
statement wrong in it is wrong on both.

Every call that can take many statements does (``execute_many``, a list of
batches): the run path can grow batch-native without another seam.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cassandra.cluster import ResultSet, Session
from cassandra.concurrent import execute_concurrent
from cassandra.query import BatchStatement, BatchType

# A statement's parameters, positional (``?`` of a prepared statement, or
# ``%s`` of a plain one); None for a statement that takes none.
Params = Sequence[Any] | None


class Prepared(Protocol):
    """A statement parsed once by the tables that will run it; opaque to
    its callers."""


# A statement (prepared, or plain CQL text with ``%s`` markers) and its values.
Bound = tuple[Prepared | str, Params]


@dataclass(frozen=True)
class Batch:
    """Statements that go as one CQL BATCH: a logged one lands whole or not
    at all; an unlogged one across partitions may land in part."""

    statements: Sequence[Bound]
    logged: bool


class Rows(Protocol):
    """A statement's answer: its rows (attribute rows, columns by name)."""

    @property
    def column_names(self) -> Sequence[str] | None: ...

    @property
    def current_rows(self) -> Sequence[Any]: ...

    @property
    def from_batch(self) -> bool:
        """Whether a batch gave it (a conditional batch answers with a row
        per statement that did not apply, a statement with one)."""
        ...

    def one(self) -> Any:
        """The first row, or None."""
        ...

    def __iter__(self) -> Iterator[Any]: ...


# One call's end in ``execute_many``: (True, its rows) or (False, what it raised).
Outcome = tuple[bool, Any]


class CqlTables(Protocol):
    def prepare(self, cql: str) -> Prepared: ...

    def execute(self, statement: Prepared | str, params: Params = None, timeout: float | None = None) -> Rows:
        """One statement; ``timeout`` (seconds) overrides the tables' own."""
        ...

    def execute_many(
        self, calls: Sequence[Bound | Batch], concurrency: int = 100, raise_on_first_error: bool = True
    ) -> list[Outcome]:
        """Many statements or batches, up to ``concurrency`` in flight, their
        outcomes in order. The first failure raises unless
        ``raise_on_first_error`` is False (then it is an outcome)."""
        ...

    def batch(self, statements: Sequence[Bound], logged: bool) -> Rows:
        """One batch of statements (see Batch)."""
        ...

    def agree_on_schema(self) -> None:
        """Wait until every node knows the schema changes made so far."""
        ...


def raise_failed(outcomes: Sequence[Outcome]) -> list[Rows]:
    """Each call's rows, or the first failure raised."""
    out: list[Rows] = []
    for ok, result in outcomes:
        if not ok:
            raise result
        out.append(result)
    return out


class DriverRows:
    """A driver ResultSet seen as Rows."""

    __slots__ = ("_result",)

    def __init__(self, result: ResultSet) -> None:
        self._result = result

    @property
    def column_names(self) -> Sequence[str] | None:
        names: Sequence[str] | None = self._result.column_names
        return names

    @property
    def current_rows(self) -> Sequence[Any]:
        rows: Sequence[Any] = self._result.current_rows
        return rows

    @property
    def from_batch(self) -> bool:
        return isinstance(self._result.response_future.query, BatchStatement)

    def one(self) -> Any:
        return self._result.one()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._result)


class DriverTables:
    """CqlTables over a cassandra-driver session (pysched.stores.cassandra.connect)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def prepare(self, cql: str) -> Prepared:
        prepared: Prepared = self.session.prepare(cql)
        return prepared

    def execute(self, statement: Prepared | str, params: Params = None, timeout: float | None = None) -> Rows:
        # The profile's timeout unless one is given: the driver reads None
        # as "wait for ever".
        if timeout is None:
            return DriverRows(self.session.execute(statement, params))
        return DriverRows(self.session.execute(statement, params, timeout=timeout))

    def execute_many(
        self, calls: Sequence[Bound | Batch], concurrency: int = 100, raise_on_first_error: bool = True
    ) -> list[Outcome]:
        statements = [(_batch_statement(call), None) if isinstance(call, Batch) else call for call in calls]
        results = execute_concurrent(
            self.session, statements, concurrency=concurrency, raise_on_first_error=raise_on_first_error
        )
        return [(ok, DriverRows(result) if ok else result) for ok, result in results]

    def batch(self, statements: Sequence[Bound], logged: bool) -> Rows:
        return DriverRows(self.session.execute(_batch_statement(Batch(statements, logged))))

    def agree_on_schema(self) -> None:
        self.session.cluster.control_connection.wait_for_schema_agreement(wait_time=30)

    def shutdown(self) -> None:
        self.session.cluster.shutdown()


def _batch_statement(batch: Batch) -> BatchStatement:
    out = BatchStatement(batch_type=BatchType.LOGGED if batch.logged else BatchType.UNLOGGED)
    for statement, params in batch.statements:
        out.add(statement, params)
    return out
