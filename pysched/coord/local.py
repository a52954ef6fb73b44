"""The embedded coordinator: one lease row with a term counter.

A node that finds the lease free or expired takes it with the term plus one;
the term is the fence. In the same transaction it raises every partition's
fence floor, so a worker rejects whatever the previous holder still sends
from the moment the new term exists.

A node that finds the lease held stands by, and says so in a row of its own
(``standby/{holder}``, in the same table, renewed by the poll that found the
lease held): `pysched status` lists it, until it stops (its row is deleted)
or its row runs out (it died).
"""

from __future__ import annotations

from pathlib import Path

from pysched.protocols import Lease
from pysched.stores.sqlite_db import SQLiteDatabase

LEASE_NAME = "scheduler"
STANDBY_PREFIX = "standby/"
# A scheduler renews its lease every second or so: one not renewed for this
# long is gone, not slow.
SEEN_WITHIN_MS = 60_000


def scheduler_seen(db: SQLiteDatabase, now_ms: int, within_ms: int = SEEN_WITHIN_MS) -> bool:
    """Whether a scheduler held the lease of this database lately (one that
    stopped cleanly gave it up, and counts as gone)."""
    row = db.connection().execute("SELECT expires_at_ms FROM leases WHERE name = ?", (LEASE_NAME,)).fetchone()
    return row is not None and int(row[0]) >= now_ms - within_ms


class SQLiteLeaseCoordinator:
    """One leader for every partition of the embedded scheduler."""

    def __init__(self, db: SQLiteDatabase | str | Path, ttl_ms: int = 5_000) -> None:
        self.db = db if isinstance(db, SQLiteDatabase) else SQLiteDatabase(db)
        # The database's own count: the partitions its jobs are placed in.
        self.partitions = self.db.partitions
        self.ttl_ms = ttl_ms
        # Each poll renews the lease for ttl_ms; a second's margin covers a
        # batch still being handed on when the answer runs out.
        self.answer_valid_ms = max(ttl_ms - 1_000, ttl_ms // 2)
        self._leases: dict[str, Lease] = {}

    def poll(self, holder: str, now_ms: int) -> dict[int, int]:
        lease = self._leases.pop(holder, None)
        if lease is not None:
            lease = self.renew(lease, now_ms)
        if lease is None:
            lease = self.acquire(holder, now_ms)
        if lease is None:
            return {}
        self._leases[holder] = lease
        return dict.fromkeys(range(self.partitions), lease.fence)

    def giving_up(self, holder: str) -> dict[int, int]:
        return {}  # one lease for every partition: nothing is handed over alone

    def leaders(self) -> dict[int, Lease]:
        lease = self.current()
        # Released (its holder stopped): an end of 0 would read as a lease
        # with no set end, led by a node that is gone.
        if lease is None or lease.expires_at_ms == 0:
            return {}
        return dict.fromkeys(range(self.partitions), lease)

    def acquire(self, holder: str, now_ms: int) -> Lease | None:
        with self.db.transaction() as conn:
            row = conn.execute(
                "SELECT holder, term, expires_at_ms FROM leases WHERE name = ?", (LEASE_NAME,)
            ).fetchone()
            if row is None:
                term = 1
            else:
                current_holder, term, expires_at_ms = row
                if current_holder == holder and expires_at_ms > now_ms:
                    # our live lease: renew in place
                    conn.execute(
                        "UPDATE leases SET expires_at_ms = ? WHERE name = ?", (now_ms + self.ttl_ms, LEASE_NAME)
                    )
                    return Lease(holder, int(term), now_ms + self.ttl_ms)
                if expires_at_ms > now_ms:
                    # another live holder: wait, and say so; forget the
                    # standbys gone long since (killed: nothing deleted theirs)
                    conn.execute(
                        "INSERT INTO leases (name, holder, term, expires_at_ms) VALUES (?, ?, 0, ?)"
                        " ON CONFLICT (name) DO UPDATE SET expires_at_ms = excluded.expires_at_ms",
                        (STANDBY_PREFIX + holder, holder, now_ms + self.ttl_ms),
                    )
                    conn.execute(
                        "DELETE FROM leases WHERE name LIKE ? AND expires_at_ms < ?",
                        (STANDBY_PREFIX + "%", now_ms - SEEN_WITHIN_MS),
                    )
                    return None
                term = int(term) + 1
            conn.execute(
                "INSERT INTO leases (name, holder, term, expires_at_ms) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, term = excluded.term,"
                " expires_at_ms = excluded.expires_at_ms",
                (LEASE_NAME, holder, term, now_ms + self.ttl_ms),
            )
            conn.executemany(
                "INSERT INTO fences (partition, fence) VALUES (?, ?)"
                " ON CONFLICT (partition) DO UPDATE SET fence = max(fence, excluded.fence)",
                [(p, term) for p in range(self.partitions)],
            )
            conn.execute("DELETE FROM leases WHERE name = ?", (STANDBY_PREFIX + holder,))
            return Lease(holder, term, now_ms + self.ttl_ms)

    def renew(self, lease: Lease, now_ms: int) -> Lease | None:
        # Renewal succeeds while nobody has started a newer term, even past
        # expiry: no one else can have led in between.
        with self.db.transaction() as conn:
            cur = conn.execute(
                "UPDATE leases SET expires_at_ms = ? WHERE name = ? AND holder = ? AND term = ?",
                (now_ms + self.ttl_ms, LEASE_NAME, lease.holder, lease.fence),
            )
            if cur.rowcount != 1:
                return None
        return Lease(lease.holder, lease.fence, now_ms + self.ttl_ms)

    def release(self, holder: str) -> None:
        with self.db.transaction() as conn:
            conn.execute("UPDATE leases SET expires_at_ms = 0 WHERE name = ? AND holder = ?", (LEASE_NAME, holder))
            conn.execute("DELETE FROM leases WHERE name = ?", (STANDBY_PREFIX + holder,))
        self._leases.pop(holder, None)

    def current(self) -> Lease | None:
        row = (
            self.db.connection()
            .execute("SELECT holder, term, expires_at_ms FROM leases WHERE name = ?", (LEASE_NAME,))
            .fetchone()
        )
        return None if row is None else Lease(str(row[0]), int(row[1]), int(row[2]))

    def standing_by(self, now_ms: int) -> list[str]:
        """The nodes standing by: up, their lease polls finding the lease
        held by another, within the lease's TTL."""
        rows = (
            self.db.connection()
            .execute(
                "SELECT holder FROM leases WHERE name LIKE ? AND expires_at_ms > ? ORDER BY holder",
                (STANDBY_PREFIX + "%", now_ms),
            )
            .fetchall()
        )
        return [str(row[0]) for row in rows]
