"""The embedded database: one SQLite file in WAL mode shared by the store,
the lease coordinator and the claims, one connection per thread.

The file is marked as pysched's (``PRAGMA application_id`` and a schema
version in ``meta``), so a file of another program is refused rather than
written into. Files made before the mark existed have the tables but no
mark; they are accepted and marked on their next write.

``meta`` also holds the partition count, written when the file is created
and read by every process that opens it: the store places jobs by it and the
lease coordinator leads that many partitions. Files made before the count
was stored were used with 64 by every client (the only count the CLI and
``open_embedded`` knew), so that is their count, recorded on their next
write."""

from __future__ import annotations

import os
import sqlite3
import threading
import uuid
from contextlib import AbstractContextManager, suppress
from pathlib import Path
from typing import Literal

from pysched.protocols import DEFAULT_PARTITIONS, PartitionsMismatch
from pysched.stores.group_commit import GroupCommit

# "psch": what `file` and `sqlite3` show for a pysched database.
APPLICATION_ID = 0x70736368
SCHEMA_VERSION = 1
# The count of every database made before the count was stored.
UNRECORDED_PARTITIONS = 64

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    partition INTEGER NOT NULL,
    jitter_ms INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    runs_since_ms INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS runs (
    run_id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL REFERENCES jobs(job_id),
    run_at_ms INTEGER NOT NULL,
    due_ms INTEGER NOT NULL,
    partition INTEGER NOT NULL,
    attempt_group INTEGER NOT NULL DEFAULT 0,
    -- attempt: what a user sees (protocols.next_attempt), delivery: how
    -- often the run was handed on (Run.attempt), ended_attempt: its last
    -- attempt that failed or was interrupted. No semicolons in comments here:
    -- the schema is split at them.
    attempt INTEGER NOT NULL DEFAULT 0,
    delivery INTEGER NOT NULL DEFAULT 0,
    ended_attempt INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL,
    fence INTEGER,
    dispatched_at_ms INTEGER,
    started_at_ms INTEGER,
    ended_at_ms INTEGER,
    worker TEXT,
    error TEXT,
    result TEXT,
    UNIQUE (job_id, run_at_ms, attempt_group)
);
CREATE INDEX IF NOT EXISTS runs_by_state_due ON runs (state, due_ms);
CREATE TABLE IF NOT EXISTS missed_runs (
    job_id TEXT NOT NULL,
    first_ms INTEGER NOT NULL,
    end_ms INTEGER NOT NULL,
    reason TEXT NOT NULL,
    PRIMARY KEY (job_id, first_ms)
);
CREATE TABLE IF NOT EXISTS run_failures (
    run_id INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    failure TEXT NOT NULL,
    PRIMARY KEY (run_id, attempt)
);
CREATE TABLE IF NOT EXISTS partition_changes (partition INTEGER PRIMARY KEY, version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS watermarks (partition INTEGER PRIMARY KEY, fired_through_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY, holder TEXT NOT NULL, term INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS fences (partition INTEGER PRIMARY KEY, fence INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS claims (
    idem_key TEXT PRIMARY KEY,
    run_id INTEGER NOT NULL,
    state TEXT NOT NULL,
    holder TEXT NOT NULL,
    fence INTEGER NOT NULL,
    lease_expires_ms INTEGER NOT NULL,
    result TEXT,
    updated_at_ms INTEGER NOT NULL,
    delivery INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS claims_by_holder ON claims (holder, state);
-- The claims of pruned runs, by when they were pruned: each pruning pass
-- deletes those kept long enough (retention.py).
CREATE INDEX IF NOT EXISTS pruned_claims ON claims (updated_at_ms) WHERE state = 'pruned';
-- A run's last checkpoint, by its claim's key: a table of its own, so that a
-- file made before checkpoints gains it with the rest of the schema.
CREATE TABLE IF NOT EXISTS checkpoints (
    idem_key TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    holder TEXT NOT NULL,
    saved_at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS breakers (
    downstream TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    state TEXT NOT NULL,
    failures INTEGER NOT NULL,
    opened_at_ms INTEGER,
    reopens_at_ms INTEGER,
    probe_until_ms INTEGER
);
CREATE TABLE IF NOT EXISTS running_slots (
    job_id TEXT PRIMARY KEY,
    idem_key TEXT NOT NULL,
    holder TEXT NOT NULL,
    lease_expires_ms INTEGER NOT NULL,
    waiting TEXT,
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS attempt_counts (
    downstream TEXT NOT NULL,
    bucket_ms INTEGER NOT NULL,
    holder TEXT NOT NULL,
    calls INTEGER NOT NULL,
    retries INTEGER NOT NULL,
    PRIMARY KEY (downstream, bucket_ms, holder)
);
"""


# What a database made by pysched before it was marked holds.
_TABLES = frozenset({"meta", "jobs", "runs", "partition_changes", "watermarks", "leases", "fences", "claims"})


class DatabaseUnusable(OSError):
    """The file cannot serve as the scheduler's database; the message names
    the path and says why, on one line."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path!r}: {reason}")
        self.path = path
        self.reason = reason


# What a process does with the database: only read it (the file must
# exist; nothing is created or marked), change what is in it (it must exist
# and be writable), or also start one (created, mode 0600, if missing).
Access = Literal["read", "write", "create"]


class SQLiteDatabase:
    """``partitions``: the count a new database is created with (default
    64); for an existing one, what the caller expects, refused with
    PartitionsMismatch if the file says otherwise. Either way the file's
    count is ``self.partitions``."""

    def __init__(self, path: str | Path, *, access: Access = "create", partitions: int | None = None) -> None:
        self.path = os.fspath(path)
        self.partitions = DEFAULT_PARTITIONS
        self._local = threading.local()
        # The process's writes: one connection, their commits grouped.
        self._writes = GroupCommit(self._open_connection)
        if not self.path:
            raise DatabaseUnusable(self.path, "an empty path names no file; give the database's file")
        if self.path == ":memory:":
            raise DatabaseUnusable(self.path, "an in-memory database is lost when the command exits; give a file")
        # mode=rw: SQLite never creates the file itself, so only the code
        # below decides whether a database comes into being, and with what mode.
        self._uri = Path(self.path).absolute().as_uri() + "?mode=rw"
        created = _create(self.path, partitions) if access == "create" else _require(self.path)
        try:
            self._prepare(access, partitions)
        except DatabaseUnusable:
            self.close()
            if created:
                for suffix in ("", "-wal", "-shm"):
                    with suppress(OSError):
                        Path(self.path + suffix).unlink()
            raise
        except PartitionsMismatch:
            self.close()
            raise

    def _prepare(self, access: Access, partitions: int | None) -> None:
        try:
            conn = self.connection()
            empty = _identify(self.path, conn)
            if empty and access != "create":
                raise DatabaseUnusable(self.path, "not a pysched database (it holds no tables)")
            if access == "read":
                self.partitions = self._check_partitions(conn, partitions)
                return
            # Only now that the file is known to be ours (or empty): WAL is
            # a mark in the file's header, which stays.
            conn.execute("PRAGMA journal_mode=WAL")
            # A write on every open for writing: a file that cannot be
            # written fails here, once, not in a retry loop later.
            with self.transaction() as conn:
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                _add_attempt_columns(conn)
                _add_runs_since_column(conn)
                _add_claim_delivery_column(conn)
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?)"
                    " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (SCHEMA_VERSION,),
                )
                # Written once: in the transaction that also reads it back,
                # so of two processes creating the file the first one's
                # count holds and the second is checked against it.
                named = DEFAULT_PARTITIONS if partitions is None else partitions
                count = named if empty else UNRECORDED_PARTITIONS
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('partitions', ?) ON CONFLICT (key) DO NOTHING", (count,)
                )
                self.partitions = self._check_partitions(conn, partitions)
        except sqlite3.Error as exc:
            raise _unusable(self.path, exc) from None

    def _check_partitions(self, conn: sqlite3.Connection, expected: int | None) -> int:
        row = conn.execute("SELECT value FROM meta WHERE key = 'partitions'").fetchone()
        stored = UNRECORDED_PARTITIONS if row is None else int(row[0])
        if expected is not None and expected != stored:
            raise PartitionsMismatch(f"database {self.path!r}", expected, stored)
        return stored

    def connection(self) -> sqlite3.Connection:
        """This thread's connection for reads; inside a transaction, the
        transaction's, so a read there sees what it wrote."""
        writing = self._writes.connection_in_use()
        if writing is not None:
            return writing
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._open_connection()
            self._local.conn = conn
        return conn

    def _open_connection(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self._uri, uri=True, isolation_level=None, timeout=30.0, check_same_thread=False)
            # FULL: a commit is on disk before it is acknowledged.
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
        except sqlite3.Error as exc:
            raise _unusable(self.path, exc) from None
        return conn

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT: writers queue on the lock up front, so
        a read-then-write decision is never made on stale data. The
        process's transactions that come together share one commit
        (group_commit.py); each returns once its commit is on disk."""
        return self._writes.transaction()

    def close(self) -> None:
        """Close this thread's connection, and the writers' once their
        last group is committed (a later write opens it again)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
        self._writes.close()


def _add_attempt_columns(conn: sqlite3.Connection) -> None:
    """A database made before runs counted deliveries apart from attempts:
    its ``attempt`` was the delivery, and a run retrying, failed or
    interrupted had ended that one."""
    columns = {str(r[1]) for r in conn.execute("PRAGMA table_info(runs)")}
    if "delivery" in columns:
        return
    conn.execute("ALTER TABLE runs ADD COLUMN delivery INTEGER NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE runs ADD COLUMN ended_attempt INTEGER NOT NULL DEFAULT 0")
    conn.execute(
        "UPDATE runs SET delivery = attempt,"
        " ended_attempt = CASE WHEN state IN ('retrying', 'failed', 'interrupted') THEN attempt ELSE 0 END"
    )


def _add_runs_since_column(conn: sqlite3.Connection) -> None:
    """A database made before a cancelled job's id could be registered
    again: none of its jobs replaced another."""
    columns = {str(r[1]) for r in conn.execute("PRAGMA table_info(jobs)")}
    if "runs_since_ms" not in columns:
        conn.execute("ALTER TABLE jobs ADD COLUMN runs_since_ms INTEGER NOT NULL DEFAULT 0")


def _add_claim_delivery_column(conn: sqlite3.Connection) -> None:
    """A database made before a claim kept the delivery it was taken for:
    its failed claims are taken over by any delivery, as they were."""
    columns = {str(r[1]) for r in conn.execute("PRAGMA table_info(claims)")}
    if "delivery" not in columns:
        conn.execute("ALTER TABLE claims ADD COLUMN delivery INTEGER NOT NULL DEFAULT 0")


def _create(path: str, partitions: int | None) -> bool:
    """Make the database if missing, readable by its owner alone (SQLite
    gives its -wal and -shm files the same mode). True if the file was
    created empty here, to be prepared in place.

    A new database is prepared under a name of its own and linked into
    place whole: two processes starting on a fresh path at once (a node and
    an `add`) would otherwise race to switch the same empty file to WAL and
    write its schema, and one of them fails ("database is locked", even
    "disk I/O error"). Of two links the first holds; the other process opens
    it like any existing database."""
    if os.path.lexists(path):
        return _require(path)
    draft = f"{path}.new-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        os.close(os.open(draft, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        raise DatabaseUnusable(path, f"cannot create it: {exc.strerror}") from None
    try:
        try:
            built = SQLiteDatabase(draft, access="create", partitions=partitions)
        except DatabaseUnusable as exc:
            raise DatabaseUnusable(path, exc.reason) from None
        try:
            # Everything into the file itself: the draft's -wal is not linked.
            # From a connection of its own: one that prepared the file may
            # still hold a statement's snapshot, which the checkpoint waits on.
            built.close()
            built.connection().execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            built.close()
        try:
            os.link(draft, path)
        except FileExistsError:
            return _require(path)  # another process's database came first
        except OSError:
            return _create_in_place(path)  # a file system without hard links
        return False
    finally:
        for suffix in ("", "-wal", "-shm"):
            with suppress(OSError):
                Path(draft + suffix).unlink()


def _create_in_place(path: str) -> bool:
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return _require(path)
    except OSError as exc:
        raise DatabaseUnusable(path, f"cannot create it: {exc.strerror}") from None
    return True


def _require(path: str) -> bool:
    if not Path(path).exists():
        raise DatabaseUnusable(path, "no such file (add or up creates it)")
    if Path(path).is_dir():
        raise DatabaseUnusable(path, "is a directory")
    return False


def _identify(path: str, conn: sqlite3.Connection) -> bool:
    """Raise unless the file is a pysched database; True if it is empty."""
    app_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
    tables = {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if app_id == APPLICATION_ID:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is not None and int(row[0]) > SCHEMA_VERSION:
            raise DatabaseUnusable(
                path, f"made by a newer pysched (schema version {row[0]}; this one knows up to {SCHEMA_VERSION})"
            )
        return False
    if app_id != 0:
        raise DatabaseUnusable(path, f"not a pysched database (an SQLite file of another program, id {app_id:#x})")
    tables.discard("sqlite_sequence")
    if not tables:
        return True
    if tables >= _TABLES:
        return False  # made before databases were marked
    raise DatabaseUnusable(path, "not a pysched database (an SQLite file of another program)")


def _unusable(path: str, exc: sqlite3.Error) -> DatabaseUnusable:
    code = getattr(exc, "sqlite_errorname", "")
    if code in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
        return DatabaseUnusable(path, f"not a pysched database ({exc})")
    if code.startswith("SQLITE_READONLY"):
        return DatabaseUnusable(path, f"cannot be written ({exc})")
    if code.startswith("SQLITE_CANTOPEN"):
        return DatabaseUnusable(
            path, f"cannot be opened ({exc}); its directory must be writable too, for the -wal and -shm files"
        )
    return DatabaseUnusable(path, str(exc))
