"""The overlap policy's running slots on Cassandra (see pysched/overlap.py).

One row per job, changed only by lightweight transactions on its version
(INSERT IF NOT EXISTS for the first write, DELETE IF version for a
release): of two workers deciding for the same job at once, one write
wins and the other reads again and decides again, so across the cluster
one run holds a job's slot at a time. A read that is behind only costs a
lost transaction, never a wrong decision.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from pysched import overlap
from pysched.model import Overlap
from pysched.overlap import RunningSlot, SlotHold, SlotTake
from pysched.records import DispatchRecord
from pysched.stores.cassandra_rows import applied
from pysched.stores.cql_tables import CqlTables

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS {ks}.running_slots (job_id text PRIMARY KEY, idem_key text, holder text,"
    " lease_expires_ms bigint, waiting text, version int)",
]

_COLUMNS = "job_id, idem_key, holder, lease_expires_ms, waiting, version"
# Transactions lost to another writer before giving up: each loss means
# another run's decision went through, so a handful is plenty.
_TRIES = 8


class SlotContention(ConnectionError):
    """Every try lost to another writer: the caller's attempt is repeated."""


class CassandraSlots:
    def __init__(self, tables: CqlTables, keyspace: str, wake: Callable[[DispatchRecord, int], None]) -> None:
        self.tables = tables
        # Makes a run waiting for a slot due at once, if it is still parked.
        self._wake = wake
        p = tables.prepare
        self._get = p(f"SELECT {_COLUMNS} FROM {keyspace}.running_slots WHERE job_id = ?")
        self._insert = p(f"INSERT INTO {keyspace}.running_slots ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) IF NOT EXISTS")
        self._update = p(
            f"UPDATE {keyspace}.running_slots SET idem_key = ?, holder = ?, lease_expires_ms = ?, waiting = ?,"
            " version = ? WHERE job_id = ? IF version = ?"
        )
        self._delete = p(f"DELETE FROM {keyspace}.running_slots WHERE job_id = ? IF version = ?")

    def running_slot(self, job_id: str) -> RunningSlot | None:
        row = self.tables.execute(self._get, (job_id,)).one()
        return None if row is None else _slot(row)

    def take_slot(
        self, record: DispatchRecord, holder: str, policy: Overlap | str, now_ms: int, lease_ms: int
    ) -> SlotTake:
        for _ in range(_TRIES):
            slot = self.running_slot(record.job_id)
            take, write = overlap.decide(slot, record, holder, policy, now_ms, lease_ms)
            if write is None or self._swap(slot, write):
                return take
        raise SlotContention(f"the running slot of {record.job_id} kept changing")

    def extend_slots(self, holds: Sequence[SlotHold], now_ms: int, lease_ms: int) -> list[SlotHold]:
        lost = []
        for hold in holds:
            for _ in range(_TRIES):
                slot = self.running_slot(hold.job_id)
                write = overlap.extended(slot, hold, now_ms, lease_ms)
                if write is None:
                    lost.append(hold)
                    break
                if self._swap(slot, write):
                    break
        return lost

    def release_slot(self, hold: SlotHold, now_ms: int) -> None:
        for _ in range(_TRIES):
            slot = self.running_slot(hold.job_id)
            if slot is None or not overlap.released(slot, hold):
                return
            if applied(self.tables.execute(self._delete, (hold.job_id, slot.version))):
                if slot.waiting is not None:
                    self._wake(slot.waiting, now_ms)
                return
        raise SlotContention(f"the running slot of {hold.job_id} kept changing")

    def _swap(self, read: RunningSlot | None, write: RunningSlot) -> bool:
        waiting = None if write.waiting is None else json.dumps(list(write.waiting))
        values = (write.key, write.holder, write.lease_expires_ms, waiting)
        if read is None:
            result = self.tables.execute(self._insert, (write.job_id, *values, write.version))
        else:
            result = self.tables.execute(self._update, (*values, write.version, write.job_id, read.version))
        return applied(result)


def _slot(r: Any) -> RunningSlot:
    waiting = None if r.waiting is None else DispatchRecord(*json.loads(r.waiting))
    return RunningSlot(r.job_id, r.idem_key, r.holder, int(r.lease_expires_ms), waiting, int(r.version or 0))
