"""Idempotency claims on the embedded database: a conditional insert keyed by
the run's idempotency key, behind a fence check, in one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pysched.protocols import PRUNED_STATE, Claim, ClaimHolder, ClaimOutcome, FailedClaim, completed_state
from pysched.records import DispatchRecord
from pysched.stores.sqlite_db import SQLiteDatabase


class SQLiteClaims:
    def __init__(self, db: SQLiteDatabase | str | Path) -> None:
        self.db = db if isinstance(db, SQLiteDatabase) else SQLiteDatabase(db)

    def claim(self, record: DispatchRecord, holder: str, now_ms: int, lease_ms: int) -> Claim:
        key = record.idempotency_key
        with self.db.transaction() as conn:
            row = conn.execute("SELECT fence FROM fences WHERE partition = ?", (record.partition,)).fetchone()
            floor = 0 if row is None else int(row[0])
            if record.fence < floor:
                # stale leader: reject
                return Claim(ClaimOutcome.FENCED, fence_floor=floor)
            if record.fence > floor:
                conn.execute(
                    "INSERT INTO fences (partition, fence) VALUES (?, ?)"
                    " ON CONFLICT (partition) DO UPDATE SET fence = max(fence, excluded.fence)",
                    (record.partition, record.fence),
                )
            existing = conn.execute(
                "SELECT state, holder, lease_expires_ms, result, delivery FROM claims WHERE idem_key = ?", (key,)
            ).fetchone()
            if existing is None:
                conn.execute(
                    "INSERT INTO claims (idem_key, run_id, state, holder, fence, lease_expires_ms, updated_at_ms,"
                    " delivery) VALUES (?, ?, 'running', ?, ?, ?, ?, ?)",
                    (key, record.run_id, holder, record.fence, now_ms + lease_ms, now_ms, record.attempt),
                )
                return Claim(ClaimOutcome.CLAIMED, fence_floor=max(floor, record.fence))
            state, current_holder, lease_expires_ms, result, delivery = existing
            if state == PRUNED_STATE:
                # its run's history was pruned: a stale record (retention.py)
                return Claim(ClaimOutcome.PRUNED, fence_floor=max(floor, record.fence))
            if state == "succeeded":
                # done before: replay
                return Claim(ClaimOutcome.SUCCEEDED, result=result, fence_floor=max(floor, record.fence))
            if state == "running" and lease_expires_ms > now_ms and current_holder != holder:
                # another live holder: back off
                return Claim(ClaimOutcome.BUSY, fence_floor=max(floor, record.fence), busy_until_ms=lease_expires_ms)
            if state == "failed" and record.attempt <= delivery:
                # this delivery, or a later one, failed: not run again
                return Claim(ClaimOutcome.FAILED, fence_floor=max(floor, record.fence), failure=result)
            # dead lease, let go of, a later delivery of a failed run, or the
            # holder itself trying again: take over
            conn.execute(
                "UPDATE claims SET state = 'running', holder = ?, fence = ?, lease_expires_ms = ?,"
                " updated_at_ms = ?, delivery = max(delivery, ?) WHERE idem_key = ?",
                (holder, record.fence, now_ms + lease_ms, now_ms, record.attempt, key),
            )
            saved = conn.execute("SELECT state FROM checkpoints WHERE idem_key = ?", (key,)).fetchone()
            return Claim(
                ClaimOutcome.TAKEN_OVER,
                fence_floor=max(floor, record.fence),
                checkpoint=None if saved is None else str(saved[0]),
                failure=result if state == "failed" else None,
            )

    def heartbeat(self, keys: Sequence[str], holders: Sequence[str], now_ms: int, lease_ms: int) -> list[int]:
        # One transaction for the whole worker, and only the claims named: a
        # claim its execution left without an outcome must expire.
        expires_ms = now_ms + lease_ms
        not_extended = []
        with self.db.transaction() as conn:
            for i, (key, holder) in enumerate(zip(keys, holders, strict=True)):
                cur = conn.execute(
                    "UPDATE claims SET lease_expires_ms = ?, updated_at_ms = ?"
                    " WHERE idem_key = ? AND holder = ? AND state = 'running'",
                    (expires_ms, now_ms, key, holder),
                )
                if cur.rowcount == 0:
                    not_extended.append(i)
        return not_extended

    def raise_fence(self, partition: int, fence: int) -> None:
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT INTO fences (partition, fence) VALUES (?, ?)"
                " ON CONFLICT (partition) DO UPDATE SET fence = max(fence, excluded.fence)",
                (partition, fence),
            )

    def complete(self, key: str, holder: str, succeeded: bool, result: str | None, now_ms: int) -> bool:
        # Ours while the holder is: a take-over writes its own, in a
        # transaction this one is ordered with. Not that no later delivery
        # is on its way: a leader hands a running run on again once its
        # lease has run out (stores/sqlite.py _ELIGIBLE), before anyone
        # claims it. A failure refuses every delivery handed on before it
        # (the run's, as its row has it now): its retry is a later one.
        state = completed_state(succeeded, result)
        with self.db.transaction() as conn:
            cur = conn.execute(
                "UPDATE claims SET state = ?, result = ?, updated_at_ms = ?, delivery = CASE WHEN ? = 'failed'"
                " THEN max(delivery, coalesce((SELECT r.delivery FROM runs r WHERE r.run_id = claims.run_id), 0))"
                " ELSE delivery END WHERE idem_key = ? AND holder = ?",
                (state, result, now_ms, state, key, holder),
            )
            return cur.rowcount > 0

    def failed_claim(self, key: str) -> FailedClaim | None:
        row = (
            self.db.connection()
            .execute("SELECT delivery, result FROM claims WHERE idem_key = ? AND state = 'failed'", (key,))
            .fetchone()
        )
        if row is None or row[1] is None:
            return None
        return FailedClaim(int(row[0]), str(row[1]))

    def unfinished_claim(self, key: str, now_ms: int) -> ClaimHolder | None:
        # Nothing to ask: the embedded store hands nothing back (a run sent
        # under an older fence, or started by a claim that ran out and not
        # yet handed on again, is eligible again by its state:
        # stores/sqlite.py _ELIGIBLE), so no start needs discounting.
        return None

    def save_checkpoint(self, key: str, holder: str, state: str, now_ms: int) -> bool:
        # Under the claim, in the transaction that checks it: a taker-over's
        # claim update and this write are serialized by the database lock.
        with self.db.transaction() as conn:
            cur = conn.execute(
                "INSERT INTO checkpoints (idem_key, state, holder, saved_at_ms)"
                " SELECT ?, ?, ?, ? WHERE EXISTS"
                " (SELECT 1 FROM claims WHERE idem_key = ? AND holder = ? AND state = 'running')"
                " ON CONFLICT (idem_key) DO UPDATE SET state = excluded.state, holder = excluded.holder,"
                " saved_at_ms = excluded.saved_at_ms",
                (key, state, holder, now_ms, key, holder),
            )
            return cur.rowcount == 1
