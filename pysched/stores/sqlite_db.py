"""The embedded database: one SQLite file in WAL mode shared by the store,
the lease coordinator and the claims, one connection per thread."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    partition INTEGER NOT NULL,
    jitter_ms INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    run_id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL REFERENCES jobs(job_id),
    run_at_ms INTEGER NOT NULL,
    due_ms INTEGER NOT NULL,
    partition INTEGER NOT NULL,
    attempt_group INTEGER NOT NULL DEFAULT 0,
    attempt INTEGER NOT NULL DEFAULT 0,
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
    updated_at_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS claims_by_holder ON claims (holder, state);
"""


class SQLiteDatabase:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._local = threading.local()
        # executescript manages its own transaction; every statement is idempotent.
        self.connection().executescript(SCHEMA)

    def connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(self.path, isolation_level=None, timeout=30.0, check_same_thread=False)
            except sqlite3.OperationalError as exc:
                raise OSError(f"cannot open database {self.path!r}: {exc}") from None
            conn.execute("PRAGMA journal_mode=WAL")
            # FULL: a commit is on disk before it is acknowledged.
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            self._local.conn = conn
        return conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT: writers queue on the lock up front, so
        a read-then-write decision is never made on stale data."""
        conn = self.connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
