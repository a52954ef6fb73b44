"""In-memory idempotency claims, modelled on claims/redis_cassandra.py.

Each fence floor is kept twice, as on the cluster: in Redis, the fast path
(raised by a new leader, checked and raised by every claim), and durably in
Cassandra (raised by a new leader only). Redis can forget
(``ClaimTables.forget_fast_path``: a restart without persistence, a
FLUSHALL); a claim for a partition the fast path knows nothing of is judged
by the durable floor, which then seeds the fast path again. The claim rows
are Cassandra's authoritative table, with the three outcomes of the design
plus FENCED. Leases are judged by the ``now_ms`` the caller passes, as on
the cluster.

Each call here is atomic, so the cluster's guard against a seed racing a
raise (an unverified floor, see claims/redis_cassandra) has nothing to
guard against: a raise into a forgotten fast path leaves it forgotten, and
the next claim seeds it from the durable floor, which the raise already
holds.

Not modelled: Redis's own copy of each claim (a "held" or "done" marker). On
the cluster it only answers what the table would, except when Redis lost or
outlived state (a "done" marker outlives the row pruning deletes by a week).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pysched.memory.faults import FaultHook, Guard
from pysched.memory.rows import replace_row
from pysched.protocols import PRUNED_STATE, Claim, ClaimHolder, ClaimOutcome, FailedClaim, completed_state
from pysched.records import DispatchRecord

ROLE = "claims"


@dataclass(frozen=True, slots=True)
class ClaimRow:
    run_id: int
    state: str  # running | succeeded | failed | released (let go of, no outcome) | pruned
    holder: str
    fence: int
    lease_expires_ms: int
    result: str | None
    updated_at_ms: int
    checkpoint: str | None = None  # the last state saved under the claim
    # The latest delivery it was taken for (DispatchRecord.attempt): a
    # failed claim refuses it and every earlier one.
    delivery: int = 0


class ClaimTables:
    """The claims' state, shared by every node's MemoryClaims."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        # Redis's floors: what the fast path knows, possibly nothing.
        self.floors: dict[int, int] = {}
        # Cassandra's floors: never lowered, never forgotten.
        self.durable_floors: dict[int, int] = {}
        self.rows: dict[str, ClaimRow] = {}

    # -- read back by a simulator's checker ------------------------------------

    def claim_rows(self) -> dict[str, ClaimRow]:
        with self.lock:
            return dict(self.rows)

    def running_holder(self, key: str) -> str | None:
        """Who holds the claim of ``key`` running, if anyone does: while it
        does, nothing durable says how the run ended."""
        with self.lock:
            row = self.rows.get(key)
            return row.holder if row is not None and row.state == "running" else None

    def fence_floors(self) -> dict[int, int]:
        """The floor each partition's dispatches are held to: the higher of
        the two copies (the fast path's may be ahead, raised by a claim)."""
        with self.lock:
            partitions = self.floors.keys() | self.durable_floors.keys()
            return {p: max(self.floors.get(p, 0), self.durable_floors.get(p, 0)) for p in partitions}

    def forget_fast_path(self) -> None:
        """Lose Redis's state, as a restart without persistence or a
        FLUSHALL does. The durable floors and claim rows stay."""
        with self.lock:
            self.floors.clear()

    def forget(self, keys: Iterable[str]) -> None:
        """Delete claims (of a cancelled job whose id a new job takes)."""
        with self.lock:
            for key in keys:
                self.rows.pop(key, None)

    def bury(self, runs: Iterable[tuple[str, int]], now_ms: int) -> None:
        """Make the claims of pruned runs (key, run id) tombstones, as the
        cluster's pruning does: nothing of the claim kept but its state,
        made where the run was never claimed (retention.py)."""
        with self.lock:
            for key, run_id in runs:
                self.rows[key] = ClaimRow(run_id, PRUNED_STATE, "", 0, 0, None, now_ms)

    def drop_buried(self, before_ms: int) -> None:
        """Delete the tombstones made before ``before_ms``, as the
        cluster's expire by their TTL."""
        with self.lock:
            gone = [k for k, row in self.rows.items() if row.state == PRUNED_STATE and row.updated_at_ms < before_ms]
            for key in gone:
                del self.rows[key]


class MemoryClaims:
    def __init__(self, tables: ClaimTables | None = None, faults: FaultHook | None = None) -> None:
        self.tables = tables if tables is not None else ClaimTables()
        self._op = Guard(ROLE, faults, self.tables.lock)

    def claim(self, record: DispatchRecord, holder: str, now_ms: int, lease_ms: int) -> Claim:
        t = self.tables
        with self._op("claim"):
            floor = t.floors.get(record.partition)
            if floor is None:
                # The fast path knows nothing of this partition: the durable
                # floor decides, and seeds it (never the record's fence, which
                # may be the stale one).
                floor = t.floors[record.partition] = t.durable_floors.get(record.partition, 0)
            if record.fence < floor:
                return Claim(ClaimOutcome.FENCED, fence_floor=floor)
            floor = t.floors[record.partition] = record.fence
            key = record.idempotency_key
            row = t.rows.get(key)
            if row is None:
                t.rows[key] = ClaimRow(
                    record.run_id,
                    "running",
                    holder,
                    record.fence,
                    now_ms + lease_ms,
                    None,
                    now_ms,
                    delivery=record.attempt,
                )
                return Claim(ClaimOutcome.CLAIMED, fence_floor=floor)
            if row.state == PRUNED_STATE:
                return Claim(ClaimOutcome.PRUNED, fence_floor=floor)
            if row.state == "succeeded":
                return Claim(ClaimOutcome.SUCCEEDED, result=row.result, fence_floor=floor)
            if row.state == "running" and row.lease_expires_ms > now_ms and row.holder != holder:
                return Claim(ClaimOutcome.BUSY, fence_floor=floor, busy_until_ms=row.lease_expires_ms)
            if row.state == "failed" and record.attempt <= row.delivery:
                return Claim(ClaimOutcome.FAILED, fence_floor=floor, failure=row.result)
            # A dead lease, a let-go run, a later delivery of a failed one,
            # or this holder's own claim again: the cluster's conditional
            # take-over, which wins here.
            t.rows[key] = replace_row(
                row,
                state="running",
                holder=holder,
                fence=record.fence,
                lease_expires_ms=now_ms + lease_ms,
                updated_at_ms=now_ms,
                delivery=max(row.delivery, record.attempt),
            )
            failure = row.result if row.state == "failed" else None
            return Claim(ClaimOutcome.TAKEN_OVER, fence_floor=floor, checkpoint=row.checkpoint, failure=failure)

    def heartbeat(self, keys: Sequence[str], holders: Sequence[str], now_ms: int, lease_ms: int) -> list[int]:
        t = self.tables
        not_extended = []
        with self._op("heartbeat"):
            for i, (key, holder) in enumerate(zip(keys, holders, strict=True)):
                row = t.rows.get(key)
                # Like the cluster's conditional update: a lease already
                # expired is still extended while nobody has taken over.
                if row is not None and row.holder == holder and row.state == "running":
                    t.rows[key] = replace_row(row, lease_expires_ms=now_ms + lease_ms, updated_at_ms=now_ms)
                else:
                    not_extended.append(i)
        return not_extended

    def raise_fence(self, partition: int, fence: int) -> None:
        t = self.tables
        with self._op("raise_fence"):
            # Durable first, as on the cluster. A fast path that forgot the
            # partition stays without it: seeding it from this raise alone
            # could set it below a higher durable floor.
            t.durable_floors[partition] = max(t.durable_floors.get(partition, 0), fence)
            if partition in t.floors:
                t.floors[partition] = max(t.floors[partition], fence)

    def complete(self, key: str, holder: str, succeeded: bool, result: str | None, now_ms: int) -> bool:
        t = self.tables
        with self._op("complete"):
            row = t.rows.get(key)
            if row is None or row.holder != holder:
                return False  # no longer ours: whoever took over decides
            if row.state != "running":
                return True  # ended by this holder already
            state = completed_state(succeeded, result)
            t.rows[key] = replace_row(row, state=state, result=result, updated_at_ms=now_ms)
            return True

    def failed_claim(self, key: str) -> FailedClaim | None:
        with self._op("failed_claim"):
            row = self.tables.rows.get(key)
            if row is None or row.state != "failed" or row.result is None:
                return None
            return FailedClaim(row.delivery, row.result)

    def unfinished_claim(self, key: str, now_ms: int) -> ClaimHolder | None:
        with self._op("unfinished_claim"):
            row = self.tables.rows.get(key)
            if row is None or row.state != "running":
                return None
            return ClaimHolder(row.holder, row.fence, row.lease_expires_ms if row.lease_expires_ms > now_ms else None)

    def save_checkpoint(self, key: str, holder: str, state: str, now_ms: int) -> bool:
        t = self.tables
        with self._op("save_checkpoint"):
            row = t.rows.get(key)
            # As heartbeat: the holder's running claim, expired or not,
            # while nobody has taken it over.
            if row is None or row.holder != holder or row.state != "running":
                return False
            t.rows[key] = replace_row(row, checkpoint=state, updated_at_ms=now_ms)
            return True
