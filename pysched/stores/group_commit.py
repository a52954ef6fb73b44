"""Group commit: the write transactions of a process's threads share one
commit, and so one fsync, when they come together.

With ``synchronous=FULL`` every commit waits for the disk (about 0.2 ms
here), and a run costs its worker four writes (claim, start, finish, claim
completed): one thread's commits in a row bound a node near 1,400 runs a
second, whatever the number of worker threads, since SQLite lets one
writer at a time. Here a process's writers share one connection. Each
transaction runs whole, as before, inside a savepoint of a transaction
the group keeps open; the last writer in line commits it for everyone, and
each caller returns only once the commit holding its writes is on disk. A
writer whose body raises is rolled back to its savepoint alone; a commit
that fails fails every transaction of its group.

A body reads what the group's earlier bodies wrote: they are serialised
as before, and either all commit or none does. Nothing leaves a
transaction before its commit: the caller waits for it.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# How long a writer waits for the others of its process before it gives up
# with "database is locked", as SQLite's busy timeout did when each thread
# had a connection of its own: a failure its caller retries, not a thread
# stuck for good behind one that waits on it.
LOCK_TIMEOUT_S = 30.0

# How often a writer waiting for its group's commit looks whether one is
# still coming.
_RECHECK_S = 1.0

# A group commits once it holds this many transactions, even with writers
# waiting: a steady stream of writers would otherwise keep it open, and
# its first writer waiting, for as long as the stream lasts.
MAX_GROUP = 256


class _Failed:
    """A commit that failed, kept until each of its group's writers has
    seen it."""

    def __init__(self, error: sqlite3.Error, members: int) -> None:
        self.error = error
        self.members = members


class GroupCommit:
    """``connect`` opens the shared connection (autocommit mode, usable
    from any thread), once, on the first write."""

    def __init__(self, connect: Callable[[], sqlite3.Connection], lock_timeout_s: float = LOCK_TIMEOUT_S) -> None:
        self._connect = connect
        self._lock_timeout_s = lock_timeout_s
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._committed_cv = threading.Condition(self._lock)
        # Writers waiting for the lock: while there is one, the writer
        # before it leaves the commit to it.
        self._queued = 0
        self._queued_lock = threading.Lock()
        # The group open (its number), how many transactions it holds, and
        # the number of the last group whose commit was tried.
        self._open: int | None = None
        self._size = 0
        self._last = 0
        self._ended = 0
        self._failed: dict[int, _Failed] = {}
        self._local = threading.local()

    def queued(self) -> int:
        """How many writers wait for the lock."""
        with self._queued_lock:
            return self._queued

    def connection_in_use(self) -> sqlite3.Connection | None:
        """The shared connection while this thread is inside a transaction:
        a read made there sees what the group wrote."""
        return self._conn if getattr(self._local, "inside", False) else None

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction, committed (with the others of its group)
        when the caller gets control back. One opened inside another on the
        same thread is a part of it: a savepoint, taken back alone if its
        body raises, committed with the outer one."""
        if getattr(self._local, "inside", False):
            with self._nested() as conn:
                yield conn
            return
        with self._queued_lock:
            self._queued += 1
        locked = self._lock.acquire(timeout=self._lock_timeout_s)
        with self._queued_lock:
            self._queued -= 1
        if not locked:
            raise sqlite3.OperationalError(
                f"database is locked: another writer of this process held it for {self._lock_timeout_s:g} s"
            )
        try:
            group = self._join()
            assert self._conn is not None
            conn = self._conn
            try:
                conn.execute("SAVEPOINT pysched_write")
                self._local.inside = True
                try:
                    yield conn
                finally:
                    self._local.inside = False
                conn.execute("RELEASE pysched_write")
            except BaseException as exc:
                self._undo(group, exc)
                self._wait_for(group, failed_body=True)
                raise
            self._leave(group)
            self._wait_for(group, failed_body=False)
        finally:
            self._lock.release()

    @contextmanager
    def _nested(self) -> Iterator[sqlite3.Connection]:
        assert self._conn is not None
        conn = self._conn
        depth = self._local.depth = getattr(self._local, "depth", 0) + 1
        name = f"pysched_part_{depth}"
        conn.execute(f"SAVEPOINT {name}")
        try:
            yield conn
        except BaseException:
            conn.execute(f"ROLLBACK TO {name}")
            conn.execute(f"RELEASE {name}")
            raise
        else:
            conn.execute(f"RELEASE {name}")
        finally:
            self._local.depth = depth - 1

    def close(self) -> None:
        """Commit the group still open, then close the shared connection."""
        with self._lock:
            if self._open is not None:
                self._commit()
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _join(self) -> int:
        """The group to write in, opened (BEGIN IMMEDIATE: the file's write
        lock, taken up front) if none is."""
        if self._conn is None:
            self._conn = self._connect()
        if self._open is None:
            self._conn.execute("BEGIN IMMEDIATE")
            self._last += 1
            self._open = self._last
            self._size = 0
        self._size += 1
        return self._open

    def _leave(self, group: int) -> None:
        """A transaction of ``group`` is written: the last writer in line
        commits the group."""
        with self._queued_lock:
            queued = self._queued
        if queued == 0 or self._size >= MAX_GROUP:
            self._commit()

    def _undo(self, group: int, error: BaseException) -> None:
        """Take back a transaction whose body (or savepoint) raised: to its
        savepoint, the group's other transactions kept. An error that ended
        the whole transaction (SQLite rolls back on some I/O errors) fails
        the group."""
        assert self._conn is not None
        conn = self._conn
        try:
            conn.execute("ROLLBACK TO pysched_write")
            conn.execute("RELEASE pysched_write")
        except sqlite3.Error:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._end(group, sqlite3.OperationalError(f"the group's transaction was rolled back: {error}"))
            return
        self._leave(group)

    def _commit(self) -> None:
        assert self._conn is not None and self._open is not None
        group = self._open
        try:
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            self._end(group, exc)
            return
        self._end(group, None)

    def _end(self, group: int, error: sqlite3.Error | None) -> None:
        """``group`` is over, committed or (``error``) not: its writers go on."""
        if self._open != group:
            return
        if error is not None:
            self._failed[group] = _Failed(error, self._size)
        self._open = None
        self._ended = group
        self._committed_cv.notify_all()

    def _wait_for(self, group: int, failed_body: bool) -> None:
        """Until ``group`` is committed; raises its commit's error (not for
        a body that raised: its own error says more)."""
        while self._ended < group:
            if self._committed_cv.wait(_RECHECK_S):
                continue
            # No commit came. The writer it was left to may have given up
            # waiting for the lock (LOCK_TIMEOUT_S): then, with no writer
            # left in line, this one commits the group.
            with self._queued_lock:
                queued = self._queued
            if self._open == group and queued == 0:
                self._commit()
        failed = self._failed.get(group)
        if failed is None:
            return
        failed.members -= 1
        if failed.members == 0:
            del self._failed[group]
        if not failed_body:
            raise failed.error
