"""The leader's sweep's tables on Cassandra (ScheduleStore.sweep_owed).

- ``sweep_looks``: each run handed on, written in the same request as its
  hand-over's marks, to be looked at once SWEEP_LOOK_AFTER_MS have passed;
  one Cassandra partition per (schedule partition, SWEEP_BUCKET_MS of the
  look's time). A sweep reads the buckets come due, a partition read each,
  and deletes each whole once read: one partition tombstone, never a
  tombstone per run for a later read to skip. A look that finds the run
  held alive is written again into a later bucket.
- ``sweep_cursors``: per schedule partition, the last bucket read, so a new
  leader goes on where its predecessor stopped.

And the claims as the sweep sees them, with the one conditional write that
makes the sweep owe a run once: the dead claim let go of, and taken from
its holder, only if it is still as read (claims/redis_cassandra writes
this table with lightweight transactions alone)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pysched.protocols import ABANDONED, ClaimSeen, SweepLook, look_bucket
from pysched.stores.cassandra_rows import applied
from pysched.stores.cql_tables import Bound, CqlTables, raise_failed

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS {ks}.sweep_looks (partition int, bucket bigint, job_id text, run_at_ms bigint,"
    " attempt_group int, run_id bigint, due_ms bigint, delivery int,"
    " PRIMARY KEY ((partition, bucket), job_id, run_at_ms, attempt_group))",
    "CREATE TABLE IF NOT EXISTS {ks}.sweep_cursors (partition int PRIMARY KEY, swept_through bigint)",
]


class CassandraSweep:
    def __init__(self, tables: CqlTables, keyspace: str, run_held: Callable[[str], int | None] | None) -> None:
        self.tables = tables
        # How long etcd still holds a run's key (0: free; None: etcd could
        # not say): a run still going at a heartbeat is held there, not on
        # its claim row. None when the store was opened without it (a
        # client that only reads or registers): no running claim is then
        # taken for dead.
        self._run_held = run_held
        self._cursors: dict[int, int | None] = {}  # read once, then kept by this client
        ks = keyspace
        p = tables.prepare
        self.insert_look = p(
            f"INSERT INTO {ks}.sweep_looks (partition, bucket, job_id, run_at_ms, attempt_group, run_id, due_ms,"
            " delivery) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self._looks = p(
            f"SELECT job_id, run_at_ms, attempt_group, run_id, due_ms, delivery FROM {ks}.sweep_looks"
            " WHERE partition = ? AND bucket = ?"
        )
        self._drop_bucket = p(f"DELETE FROM {ks}.sweep_looks WHERE partition = ? AND bucket = ?")
        self._cursor = p(f"SELECT swept_through FROM {ks}.sweep_cursors WHERE partition = ?")
        self._set_cursor = p(f"UPDATE {ks}.sweep_cursors SET swept_through = ? WHERE partition = ?")
        self._claim = p(
            f"SELECT state, holder, lease_expires_ms, updated_at_ms, delivery, result FROM {ks}.claims"
            " WHERE idem_key = ?"
        )
        self._let_go = p(
            f"UPDATE {ks}.claims SET state = ?, holder = ?, updated_at_ms = ? WHERE idem_key = ?"
            " IF state = ? AND holder = ? AND updated_at_ms = ?"
        )

    def add_look(self, batch: list[Bound], look: SweepLook, at_ms: int) -> None:
        batch.append((self.insert_look, _look_row(look, at_ms)))

    def swept_through(self, partition: int) -> int | None:
        if partition not in self._cursors:
            row = self.tables.execute(self._cursor, (partition,)).one()
            self._cursors[partition] = None if row is None or row.swept_through is None else int(row.swept_through)
        return self._cursors[partition]

    def looks(self, partition: int, bucket: int) -> list[SweepLook]:
        return [
            SweepLook(partition, r.job_id, r.run_at_ms, r.attempt_group, r.run_id, r.due_ms, r.delivery)
            for r in self.tables.execute(self._looks, (partition, bucket))
        ]

    def look_again(self, looks: Sequence[SweepLook], at_ms: int) -> None:
        raise_failed(self.tables.execute_many([(self.insert_look, _look_row(look, at_ms)) for look in looks], 64))

    def done(self, partition: int, bucket: int, read_any: bool) -> None:
        """``bucket`` read and acted on: gone, and the cursor past it."""
        if read_any:
            self.tables.execute(self._drop_bucket, (partition, bucket))
        self.tables.execute(self._set_cursor, (bucket, partition))
        self._cursors[partition] = bucket

    def claims_seen(self, looks: Sequence[SweepLook], now_ms: int) -> list[tuple[ClaimSeen, str] | None]:
        """Each look's claim (None: never claimed), with its holder."""
        keys = [(look.record().idempotency_key,) for look in looks]
        out: list[tuple[ClaimSeen, str] | None] = []
        read = raise_failed(self.tables.execute_many([(self._claim, k) for k in keys], 64)) if keys else []
        for (key,), rows in zip(keys, read, strict=True):
            row = rows.one()
            if row is None or row.state is None:
                out.append(None)
                continue
            alive_until = int(row.lease_expires_ms or 0)
            if row.state == "running" and alive_until <= now_ms:
                # Past the lease its claim began with: etcd says whether a
                # live worker still holds the run (claims/redis_cassandra).
                left = None if self._run_held is None else self._run_held(key)
                alive_until = now_ms if left is None else (now_ms + left if left > 0 else alive_until)
            # A failed claim's result is the failure it keeps.
            failure = str(row.result) if row.state == "failed" and row.result is not None else None
            seen = ClaimSeen(str(row.state), int(row.updated_at_ms or 0), int(row.delivery or 0), alive_until, failure)
            out.append((seen, str(row.holder)))
        return out

    def let_go(self, look: SweepLook, seen: ClaimSeen, holder: str, now_ms: int) -> bool:
        """Let go of the run's dead claim, and take it from its holder, if it
        is still as read: of two sweeps, or a sweep and the worker's own
        hand-back (which ends its claim first), one wins. A worker only cut
        off finds its claim no longer its own, and writes nothing after."""
        state = "released" if seen.state == "running" else seen.state
        key = look.record().idempotency_key
        result = self.tables.execute(
            self._let_go, (state, ABANDONED, now_ms, key, seen.state, holder, seen.updated_at_ms)
        )
        return applied(result)


def _look_row(look: SweepLook, at_ms: int) -> tuple[Any, ...]:
    return (
        look.partition,
        look_bucket(at_ms),
        look.job_id,
        look.run_at_ms,
        look.attempt_group,
        look.run_id,
        look.due_ms,
        look.delivery,
    )
