"""Circuit breakers and the retry budget's counts on Cassandra.

- ``breakers``: one row per downstream, changed only by lightweight
  transactions on its version (INSERT IF NOT EXISTS for the first write):
  of two workers moving a breaker at once, one wins, so a half-open
  breaker lets exactly one probe through across the cluster.
- ``attempt_counts``: per downstream (one Cassandra partition each),
  bucket and node, the node's calls and granted retries: plain writes of a
  node's own totals (no counters, no Paxos), expiring after ten minutes.
"""

from __future__ import annotations

from typing import Any

from pysched.protocols import AttemptCount, BreakerRow
from pysched.stores.cassandra_rows import applied
from pysched.stores.cql_tables import CqlTables

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS {ks}.breakers (downstream text PRIMARY KEY, version int, state text, failures int,"
    " opened_at_ms bigint, reopens_at_ms bigint, probe_until_ms bigint)",
    "CREATE TABLE IF NOT EXISTS {ks}.attempt_counts (downstream text, bucket_ms bigint, holder text, calls int,"
    " retries int, PRIMARY KEY ((downstream), bucket_ms, holder)) WITH default_time_to_live = 600",
]

_COLUMNS = "downstream, version, state, failures, opened_at_ms, reopens_at_ms, probe_until_ms"


class CassandraBreakers:
    def __init__(self, tables: CqlTables, keyspace: str) -> None:
        self.tables = tables
        p = tables.prepare
        self._get = p(f"SELECT {_COLUMNS} FROM {keyspace}.breakers WHERE downstream = ?")
        self._all = p(f"SELECT {_COLUMNS} FROM {keyspace}.breakers")
        self._insert = p(f"INSERT INTO {keyspace}.breakers ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS")
        self._update = p(
            f"UPDATE {keyspace}.breakers SET version = ?, state = ?, failures = ?, opened_at_ms = ?,"
            " reopens_at_ms = ?, probe_until_ms = ? WHERE downstream = ? IF version = ?"
        )
        self._put_count = p(
            f"INSERT INTO {keyspace}.attempt_counts (downstream, bucket_ms, holder, calls, retries)"
            " VALUES (?, ?, ?, ?, ?)"
        )
        self._counts = p(
            f"SELECT downstream, holder, bucket_ms, calls, retries FROM {keyspace}.attempt_counts"
            " WHERE downstream = ? AND bucket_ms >= ?"
        )

    def breaker(self, downstream: str) -> BreakerRow:
        row = self.tables.execute(self._get, (downstream,)).one()
        return BreakerRow(downstream) if row is None else _breaker(row)

    def breakers(self) -> list[BreakerRow]:
        return sorted((_breaker(r) for r in self.tables.execute(self._all)), key=lambda b: b.downstream)

    def swap_breaker(self, expected_version: int, row: BreakerRow) -> bool:
        # A transaction that timed out may have applied: it raises, and the
        # caller (who treats the breaker as advice) reads the row again.
        values = (row.state, row.failures, row.opened_at_ms, row.reopens_at_ms, row.probe_until_ms)
        if expected_version == 0:
            result = self.tables.execute(self._insert, (row.downstream, 1, *values))
        else:
            args = (expected_version + 1, *values, row.downstream, expected_version)
            result = self.tables.execute(self._update, args)
        return applied(result)

    def record_attempts(self, count: AttemptCount) -> None:
        self.tables.execute(
            self._put_count, (count.downstream, count.bucket_ms, count.holder, count.calls, count.retries)
        )

    def attempt_counts(self, downstream: str, since_ms: int) -> list[AttemptCount]:
        return [
            AttemptCount(r.downstream, r.holder, int(r.bucket_ms), int(r.calls or 0), int(r.retries or 0))
            for r in self.tables.execute(self._counts, (downstream, since_ms))
        ]


def _breaker(r: Any) -> BreakerRow:
    return BreakerRow(
        r.downstream,
        int(r.version or 0),
        r.state or "closed",
        int(r.failures or 0),
        r.opened_at_ms,
        r.reopens_at_ms,
        r.probe_until_ms,
    )
