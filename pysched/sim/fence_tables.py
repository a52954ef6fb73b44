"""Fences checked where they take effect: at the cluster's tables.

A leader's writes carry the fence etcd issued it for a partition: the
watermark row's (its fence raised when a partition is won, moved with the
watermark), the runs it hands on (``runs.fence``) and their schedule rows
(``schedule.fence``). Watching those writes as they land, against the
fences the world's etcd has issued so far, checks what the store's fence
checks are for, whatever they read or skip:

- ``fence-superseded``: a write under a fence lower than one already issued
  for its partition took effect (a superseded leader wrote over its
  successor);
- ``fence-lowered``: a partition's stored fence went down.

A schedule row inserted with a fence (a run owed again keeps the fence it
was handed on under) is a worker's write, not a leader's: not checked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pysched.memory.coordinator import Election
from pysched.memory.cql import CqlCluster, RowWritten
from pysched.sim.invariants import Violation

# The table and the column naming the partition of each fenced write; a
# runs row names it in a column, not in its key.
_PARTITION_OF: dict[str, Callable[[RowWritten], Any]] = {
    "watermarks": lambda w: w.key["partition"],
    "schedule": lambda w: w.key["shard"],
    "runs": lambda w: w.now.get("partition"),
}


class FencesAtTables:
    """Watches the fenced writes of one world's tables (its etcd:
    ``election``) and keeps the first violation found."""

    def __init__(self, tables: CqlCluster, keyspace: str, election: Election) -> None:
        self._election = election
        self._granted_seen = 0
        self._issued: dict[int, int] = {}  # partition -> highest fence etcd issued
        self._stored: dict[int, int] = {}  # partition -> its watermark row's fence, as last written
        self.violations: list[Violation] = []
        for table in _PARTITION_OF:
            tables.watch_writes(f"{keyspace}.{table}", "fence", self._make_check(table))

    def _make_check(self, table: str) -> Callable[[RowWritten], None]:
        def check(write: RowWritten) -> None:
            self._check(table, write)

        return check

    def _highest_issued(self, partition: int) -> int:
        grants = self._election.granted
        for grant in grants[self._granted_seen :]:
            if grant.fence > self._issued.get(grant.partition, -1):
                self._issued[grant.partition] = grant.fence
        self._granted_seen = len(grants)
        return self._issued.get(partition, 0)

    def _check(self, table: str, write: RowWritten) -> None:
        if write.kind != "UPDATE" or write.written is None:
            return
        raw = _PARTITION_OF[table](write)
        if raw is None:
            return
        partition, fence = int(raw), int(write.written)
        at_ms = self._election.clock.now_ms()
        issued = self._highest_issued(partition)
        if fence < issued:
            detail = (
                f"{write.client} wrote {table} {write.key} under fence {fence} of partition {partition},"
                f" after etcd had issued fence {issued}"
            )
            self.violations.append(Violation("fence-superseded", detail, at_ms))
        if table == "watermarks":
            stored = int(write.now.get("fence") or 0)
            before = self._stored.get(partition, 0)
            if stored < before:
                detail = (
                    f"{write.client} moved the stored fence of partition {partition} from {before} down to {stored}"
                )
                self.violations.append(Violation("fence-lowered", detail, at_ms))
            self._stored[partition] = stored
