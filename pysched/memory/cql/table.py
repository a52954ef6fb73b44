"""One table in memory, kept as Cassandra keeps it: cells, not rows.

A partition holds rows by clustering key (in the table's clustering
order); a row is its marker (written by INSERT) and its cells, each a value
with the writer's timestamp and, for a TTL, its expiry. A row exists while
its marker or any non-key cell is live. Deletions are tombstones by
timestamp (a partition's, a row's, a clustering range's): a write older
than a tombstone over it is never seen, a newer one is. Between two writes
of one cell the later timestamp wins; on a tie a tombstone beats a value,
and of two values the greater one (as Cassandra compares their bytes).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# A cell: (value or None for a tombstone, write timestamp in microseconds,
# expiry in server milliseconds or None).
Cell = tuple[Any, int, int | None]
NO_TOMBSTONE = -(2**63)


class CqlError(ValueError):
    """A statement the subset reads but Cassandra would refuse (an unknown
    table or column, a key not given, a value of the wrong type)."""


def _value_bytes(kind: str, value: Any) -> bytes:
    """A value as Cassandra serializes it: how it breaks a tie of two
    writes with one timestamp (the greater bytes win)."""
    if kind == "text":
        return bytes(str(value), "utf-8")
    if kind == "int":
        return int(value).to_bytes(4, "big", signed=True)
    return int(value).to_bytes(8, "big", signed=True)


class _Descending:
    """A clustering value sorted in reverse (CLUSTERING ORDER ... DESC)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __lt__(self, other: _Descending) -> bool:
        return bool(other.value < self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)


@dataclass(slots=True)
class Row:
    key: tuple[Any, ...]  # the clustering values
    marker: tuple[int, int | None] | None = None  # (timestamp, expiry)
    cells: dict[str, Cell] = field(default_factory=dict)
    maps: dict[str, dict[Any, Cell]] = field(default_factory=dict)
    deleted: int = NO_TOMBSTONE


@dataclass(slots=True)
class Partition:
    rows: dict[tuple[Any, ...], Row] = field(default_factory=dict)
    order: list[tuple[Any, ...]] = field(default_factory=list)  # sort keys, in clustering order
    deleted: int = NO_TOMBSTONE
    # Range tombstones: (does a clustering key fall in it, timestamp).
    ranges: list[tuple[Callable[[tuple[Any, ...]], bool], int]] = field(default_factory=list)
    paxos: int = NO_TOMBSTONE  # the last lightweight transaction's timestamp


class Table:
    def __init__(
        self,
        name: str,
        columns: dict[str, str],
        partition_key: tuple[str, ...],
        clustering: tuple[str, ...],
        descending: frozenset[str],
        default_ttl: int | None,
    ) -> None:
        self.name = name
        self.columns = dict(columns)
        self.partition_key = partition_key
        self.clustering = clustering
        self._descending = tuple(c in descending for c in clustering)
        self._any_descending = any(self._descending)
        # The Python type of each column's values, as the driver binds them.
        self._python_types: dict[str, type] = {}
        self.default_ttl = default_ttl
        self.partitions: dict[tuple[Any, ...], Partition] = {}

    def is_descending(self, column: str) -> bool:
        return self._descending[self.clustering.index(column)]

    @property
    def is_counter(self) -> bool:
        return "counter" in self.columns.values()

    def all_columns(self) -> list[str]:
        """As SELECT * lists them: the keys, then the other columns by name."""
        keys = [*self.partition_key, *self.clustering]
        return keys + sorted(c for c in self.columns if c not in keys)

    def kind(self, column: str) -> str:
        try:
            return self.columns[column]
        except KeyError:
            raise CqlError(f"table {self.name} has no column {column!r}") from None

    def check(self, column: str, value: Any) -> None:
        if value is None:
            return
        wanted = self._python_types.get(column)
        if wanted is None:
            wanted = self._python_types[column] = _python_type(self.kind(column))
        if type(value) is not wanted:
            raise CqlError(f"{self.name}.{column} is {self.kind(column)}, not {type(value).__name__} ({value!r})")

    def _sort_key(self, key: tuple[Any, ...]) -> tuple[Any, ...]:
        if not self._any_descending:
            return key
        return tuple(_Descending(v) if d else v for v, d in zip(key, self._descending, strict=True))

    # -- writing ----------------------------------------------------------------

    def partition(self, pk: tuple[Any, ...]) -> Partition:
        part = self.partitions.get(pk)
        if part is None:
            part = self.partitions[pk] = Partition()
        return part

    def row(self, part: Partition, key: tuple[Any, ...]) -> Row:
        row = part.rows.get(key)
        if row is None:
            row = part.rows[key] = Row(key)
            bisect.insort(part.order, self._sort_key(key))
        return row

    def shadow(self, part: Partition, row: Row) -> int:
        """The newest tombstone over ``row``: a write at or before it is gone."""
        out = max(part.deleted, row.deleted)
        for covers, ts in part.ranges:
            if ts > out and covers(row.key):
                out = ts
        return out

    def write_marker(self, part: Partition, row: Row, ts: int, expires: int | None) -> None:
        if ts > self.shadow(part, row) and (row.marker is None or ts >= row.marker[0]):
            row.marker = (ts, expires)

    def write_cell(self, part: Partition, row: Row, column: str, cell: Cell, map_key: Any = None) -> None:
        if cell[1] <= self.shadow(part, row):
            return
        kind = self.kind(column)
        if kind.startswith("map"):
            cells = row.maps.setdefault(column, {})
            if map_key is None:
                raise CqlError(f"{self.name}.{column} is a map: write its elements, column[key] = value")
            old = cells.get(map_key)
            if old is None or _wins(kind.split(",")[1][:-1], cell, old):
                cells[map_key] = cell
            return
        old = row.cells.get(column)
        if old is None or _wins(kind, cell, old):
            row.cells[column] = cell

    def add_counter(self, part: Partition, row: Row, column: str, amount: int, ts: int) -> None:
        old = row.cells.get(column)
        row.cells[column] = ((0 if old is None else old[0]) + amount, ts, None)

    def delete_partition(self, pk: tuple[Any, ...], ts: int) -> None:
        part = self.partition(pk)
        part.deleted = max(part.deleted, ts)
        self._purge(part, lambda _key: True, ts)

    def delete_row(self, pk: tuple[Any, ...], key: tuple[Any, ...], ts: int) -> None:
        part = self.partition(pk)
        row = self.row(part, key)
        row.deleted = max(row.deleted, ts)
        self._purge(part, lambda k: k == key, ts, keep_rows=True)

    def delete_range(self, pk: tuple[Any, ...], covers: Callable[[tuple[Any, ...]], bool], ts: int) -> None:
        part = self.partition(pk)
        part.ranges.append((covers, ts))
        self._purge(part, covers, ts)

    def _purge(
        self, part: Partition, covers: Callable[[tuple[Any, ...]], bool], ts: int, keep_rows: bool = False
    ) -> None:
        """Drop what a tombstone at ``ts`` hides (it would never be read
        again); a row left with nothing goes unless its own tombstone is
        what hides a late write."""
        for key in [k for k in part.rows if covers(k)]:
            row = part.rows[key]
            if row.marker is not None and row.marker[0] <= ts:
                row.marker = None
            row.cells = {c: cell for c, cell in row.cells.items() if cell[1] > ts}
            row.maps = {c: {k: v for k, v in m.items() if v[1] > ts} for c, m in row.maps.items()}
            if not keep_rows and row.marker is None and not row.cells and not any(row.maps.values()):
                del part.rows[key]
                part.order.pop(bisect.bisect_left(part.order, self._sort_key(key)))

    # -- reading ----------------------------------------------------------------

    def rows_in_order(self, part: Partition) -> Iterator[Row]:
        clustering = self._descending
        if not self._any_descending:
            for key in part.order:
                yield part.rows[key]
            return
        for sort_key in part.order:
            yield part.rows[tuple(v.value if d else v for v, d in zip(sort_key, clustering, strict=True))]

    def get(self, part: Partition, key: tuple[Any, ...]) -> Row | None:
        return part.rows.get(key)

    def live_values(self, part: Partition, row: Row, now_ms: int) -> dict[str, Any] | None:
        """The row's live columns (non-key ones; a dead cell reads None),
        or None if the row does not exist now."""
        gone = self.shadow(part, row)
        exists = row.marker is not None and row.marker[0] > gone and _alive(row.marker[1], now_ms)
        out: dict[str, Any] = {}
        for column, (value, ts, expires) in row.cells.items():
            if value is not None and ts > gone and _alive(expires, now_ms):
                out[column] = value
                exists = True
        for column, cells in row.maps.items():
            live = {
                k: c[0] for k, c in sorted(cells.items()) if c[0] is not None and c[1] > gone and _alive(c[2], now_ms)
            }
            if live:
                out[column] = live
                exists = True
        return out if exists else None


def _python_type(kind: str) -> type:
    return str if kind == "text" else dict if kind.startswith("map") else int


def _alive(expires: int | None, now_ms: int) -> bool:
    return expires is None or expires > now_ms


def _wins(kind: str, new: Cell, old: Cell) -> bool:
    """Whether ``new`` replaces ``old`` as Cassandra reconciles two cells."""
    if new[1] != old[1]:
        return new[1] > old[1]
    if (new[0] is None) != (old[0] is None):
        return new[0] is None
    if new[0] is None or old[0] is None:
        return False
    return _value_bytes(kind, new[0]) > _value_bytes(kind, old[0])
