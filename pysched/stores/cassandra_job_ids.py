"""Job ids on Cassandra: which registration holds each one.

An id is held by one job at a time (protocols.JobExists; a cancelled job's is taken
over by _take_cancelled), so registering a job first claims
its id with a lightweight transaction. A transaction per id made bulk
registration a Paxos round per job (about 600 jobs/s on the development
machine); here the ids live in a table of ``ID_BUCKETS`` Cassandra
partitions, and the ids of one bucket are claimed together by one
conditional batch, up to ``IDS_PER_ROUND`` a round. A batch refused because
some of its ids are taken names them in its answer; it is sent again
without them.

A claim row carries its registration's owner token and time. A
registration that died after claiming (before its job row was written)
holds the id for ``REGISTERING_GRACE_MS``; after that another may take it
over, by a transaction on the row as it was read.
"""

from __future__ import annotations

import logging
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cassandra import OperationTimedOut, WriteTimeout

from pysched.clock import Clock, SystemClock
from pysched.stores.cassandra_rows import applied
from pysched.stores.cql_tables import Batch, CqlTables, raise_failed

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS {ks}.job_ids (bucket int, job_id text, owner text, claimed_at_ms bigint,"
    " PRIMARY KEY ((bucket), job_id))",
]
ID_BUCKETS = 16
# Ids one conditional batch claims: one Paxos round for all of them, the
# batch kept well under Cassandra's 5 KiB warning size.
IDS_PER_ROUND = 64
# A registration that died half-way holds its id this long.
REGISTERING_GRACE_MS = 60_000
# A round that timed out may or may not have applied: tried this many times
# in all, and a row found with this registration's own owner is its claim.
CAS_ATTEMPTS = 5
AMBIGUOUS = (WriteTimeout, OperationTimedOut)
# Rounds in flight at once.
_CONCURRENCY = 32
# The marker in the keyspace's meta table once the ids of jobs registered
# before this table existed are in it.
_BACKFILLED = "job_ids_backfilled"

log = logging.getLogger(__name__)


def bucket_of(job_id: str) -> int:
    return zlib.crc32(job_id.encode()) % ID_BUCKETS


@dataclass(frozen=True)
class HeldId:
    """An id another registration holds: its owner token and claim time."""

    job_id: str
    owner: str
    claimed_at_ms: int


def backfill(tables: CqlTables, keyspace: str) -> None:
    """Claim rows for the jobs of a keyspace made before ids were claimed
    here, once: without them an id already used would look free. Their
    claim time is the job row's last update, so a registration that died
    half-way then is taken over after the grace, as before."""
    done = tables.execute(f"SELECT value FROM {keyspace}.meta WHERE name = %s", (_BACKFILLED,)).one()
    if done is not None:
        return
    insert = tables.prepare(
        f"INSERT INTO {keyspace}.job_ids (bucket, job_id, owner, claimed_at_ms) VALUES (?, ?, 'before-job-ids', ?)"
        " IF NOT EXISTS"
    )
    rows = [
        (bucket_of(row.job_id), row.job_id, row.updated_at_ms or 0)
        for row in tables.execute(f"SELECT job_id, updated_at_ms FROM {keyspace}.jobs")
    ]
    raise_failed(tables.execute_many([(insert, row) for row in rows], concurrency=_CONCURRENCY))
    tables.execute(f"INSERT INTO {keyspace}.meta (name, value) VALUES (%s, 1)", (_BACKFILLED,))


class JobIdClaims:
    def __init__(self, tables: CqlTables, keyspace: str, clock: Clock | None = None) -> None:
        self.tables = tables
        # Waits between rounds that timed out: the injected clock's, so a
        # simulated node waits in simulated time.
        self.clock: Clock = clock or SystemClock()
        p = tables.prepare
        self._claim = p(
            f"INSERT INTO {keyspace}.job_ids (bucket, job_id, owner, claimed_at_ms) VALUES (?, ?, ?, ?) IF NOT EXISTS"
        )
        self._take_over = p(
            f"UPDATE {keyspace}.job_ids SET owner = ?, claimed_at_ms = ? WHERE bucket = ? AND job_id = ?"
            " IF owner = ? AND claimed_at_ms = ?"
        )

    @staticmethod
    def new_owner() -> str:
        return uuid.uuid4().hex

    def claim(self, job_ids: Sequence[str], owner: str, now_ms: int) -> dict[str, HeldId]:
        """Claim each of ``job_ids`` (distinct) for ``owner``; returns those
        another registration holds, by id. The rest are ``owner``'s."""
        by_bucket: dict[int, list[str]] = {}
        for job_id in job_ids:
            by_bucket.setdefault(bucket_of(job_id), []).append(job_id)
        rounds = [
            (bucket, ids[k : k + IDS_PER_ROUND])
            for bucket, ids in by_bucket.items()
            for k in range(0, len(ids), IDS_PER_ROUND)
        ]
        held: dict[str, HeldId] = {}
        timeouts = 0
        while rounds:
            results = self.tables.execute_many(
                [self._round(bucket, ids, owner, now_ms) for bucket, ids in rounds],
                concurrency=_CONCURRENCY,
                raise_on_first_error=False,
            )
            again: list[tuple[int, list[str]]] = []
            timed_out = False
            for (bucket, ids), (ok, result) in zip(rounds, results, strict=True):
                if not ok:
                    if isinstance(result, AMBIGUOUS) and timeouts + 1 < CAS_ATTEMPTS:
                        again.append((bucket, ids))
                        timed_out = True
                        continue
                    raise result
                if applied(result):
                    continue
                taken = _taken(result.current_rows)
                if not taken:
                    raise RuntimeError(f"cassandra refused a claim of job ids {ids[:3]} without naming one taken")
                held.update((job_id, row) for job_id, row in taken.items() if row.owner != owner)
                # A row of this owner: a round that timed out had applied.
                rest = [job_id for job_id in ids if job_id not in taken]
                if rest:
                    again.append((bucket, rest))
            if timed_out:
                timeouts += 1
                log.warning("claiming job ids again after a timed-out lightweight transaction")
                self.clock.sleep(0.2 * 2**timeouts)
            rounds = again
        return held

    def take_over(self, held: HeldId, owner: str, now_ms: int) -> bool:
        """Take an id from a registration that died half-way; False if its
        row changed since it was read (another took it first)."""
        for attempt in range(CAS_ATTEMPTS):
            try:
                res = self.tables.execute(
                    self._take_over,
                    (owner, now_ms, bucket_of(held.job_id), held.job_id, held.owner, held.claimed_at_ms),
                )
            except AMBIGUOUS:
                if attempt + 1 == CAS_ATTEMPTS:
                    raise
                continue
            if applied(res):
                return True
            row = res.one()
            # Our own take-over, applied by a try that timed out.
            return bool(row is not None and row.owner == owner and row.claimed_at_ms == now_ms)
        raise AssertionError("unreachable: the last attempt raises")

    def _round(self, bucket: int, job_ids: Sequence[str], owner: str, now_ms: int) -> Batch:
        # One partition: a conditional batch, one Paxos round for all.
        return Batch([(self._claim, (bucket, job_id, owner, now_ms)) for job_id in job_ids], logged=False)


def _taken(rows: Sequence[Any]) -> dict[str, HeldId]:
    """The rows a refused conditional batch answers with: those of its ids
    already claimed."""
    return {
        row.job_id: HeldId(row.job_id, row.owner, int(row.claimed_at_ms or 0))
        for row in rows
        if getattr(row, "job_id", None) is not None
    }
