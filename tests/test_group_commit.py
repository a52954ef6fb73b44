"""Group commit on the embedded database: a transaction is on disk when it
returns, transactions that come together share one commit, a body that
raises takes back its own writes alone, a commit that fails fails every
transaction of its group, and a nested transaction is a part of the one
around it. Threads meet at explicit points, never at a sleep."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pysched.stores.group_commit import GroupCommit
from pysched.stores.sqlite_db import SQLiteDatabase
from tests.helpers import wait_for


class Counted:
    """A GroupCommit on a file of its own, counting the commits it makes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.commits = 0
        setup = sqlite3.connect(path, isolation_level=None)
        setup.execute("PRAGMA journal_mode=WAL")
        setup.execute("CREATE TABLE parents (id INTEGER PRIMARY KEY)")
        setup.execute(
            "CREATE TABLE rows (id INTEGER PRIMARY KEY,"
            " parent INTEGER REFERENCES parents(id) DEFERRABLE INITIALLY DEFERRED)"
        )
        setup.execute("INSERT INTO parents VALUES (1)")
        setup.close()
        self.group = GroupCommit(self._connect)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA foreign_keys=ON")
        conn.set_trace_callback(self._trace)
        return conn

    def _trace(self, statement: str) -> None:
        if statement == "COMMIT":
            self.commits += 1

    def rows(self) -> list[int]:
        """What is on disk, read by a connection of its own."""
        reader = sqlite3.connect(self.path)
        try:
            return [int(r[0]) for r in reader.execute("SELECT id FROM rows ORDER BY id")]
        finally:
            reader.close()

    def insert(self, row: int, parent: int = 1) -> None:
        with self.group.transaction() as conn:
            conn.execute("INSERT INTO rows VALUES (?, ?)", (row, parent))


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Counted]:
    counted = Counted(tmp_path / "group.db")
    yield counted
    counted.group.close()


def _in_a_group_behind(db: Counted, first: int, then: list[tuple[int, int]]) -> dict[int, BaseException | None]:
    """Thread ``first`` writes and, before its body ends, the others queue
    for the lock: all of them share its group. Returns each thread's error."""
    outcomes: dict[int, BaseException | None] = {}
    inside = threading.Event()
    release = threading.Event()

    def record(row: int, parent: int) -> None:
        try:
            db.insert(row, parent)
            outcomes[row] = None
        except BaseException as exc:
            outcomes[row] = exc

    def holder() -> None:
        try:
            with db.group.transaction() as conn:
                conn.execute("INSERT INTO rows VALUES (?, 1)", (first,))
                inside.set()
                release.wait(10)
            outcomes[first] = None
        except BaseException as exc:
            outcomes[first] = exc

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    assert inside.wait(10)
    for row, parent in then:
        t = threading.Thread(target=record, args=(row, parent))
        threads.append(t)
        t.start()
    wait_for(lambda: db.group.queued() == len(then), 10, "the writers to queue")
    release.set()
    for t in threads:
        t.join(10)
    return outcomes


def test_a_transaction_is_on_disk_when_it_returns(db: Counted) -> None:
    db.insert(1)
    assert db.rows() == [1]
    assert db.commits == 1


def test_transactions_that_come_together_share_one_commit(db: Counted) -> None:
    outcomes = _in_a_group_behind(db, 1, [(2, 1), (3, 1), (4, 1)])
    assert outcomes == {1: None, 2: None, 3: None, 4: None}
    assert db.rows() == [1, 2, 3, 4]
    assert db.commits == 1


def test_a_body_that_raises_takes_back_its_own_writes_alone(db: Counted) -> None:
    db.insert(1)
    with pytest.raises(ZeroDivisionError), db.group.transaction() as conn:
        conn.execute("INSERT INTO rows VALUES (2, 1)")
        raise ZeroDivisionError
    db.insert(3)
    assert db.rows() == [1, 3]


def test_a_commit_that_fails_fails_every_transaction_of_its_group(db: Counted) -> None:
    # Row 3 names a parent that does not exist: the deferred key is checked
    # at the commit, which fails for the whole group.
    outcomes = _in_a_group_behind(db, 1, [(2, 1), (3, 99)])
    assert all(isinstance(e, sqlite3.IntegrityError) for e in outcomes.values()), outcomes
    assert db.rows() == []
    db.insert(4)  # the group is over: the next one commits
    assert db.rows() == [4]


def test_a_nested_transaction_is_a_part_of_the_one_around_it(db: Counted) -> None:
    with db.group.transaction() as conn:
        conn.execute("INSERT INTO rows VALUES (1, 1)")
        with db.group.transaction() as inner:
            inner.execute("INSERT INTO rows VALUES (2, 1)")
        with pytest.raises(ZeroDivisionError), db.group.transaction() as inner:
            inner.execute("INSERT INTO rows VALUES (3, 1)")
            raise ZeroDivisionError
        assert db.rows() == []  # nothing on disk before the outer one ends
    assert db.rows() == [1, 2]
    assert db.commits == 1


def test_a_read_inside_a_transaction_sees_what_it_wrote(tmp_path: Path) -> None:
    database = SQLiteDatabase(tmp_path / "pysched.db")
    try:
        with database.transaction() as conn:
            conn.execute("INSERT INTO meta (key, value) VALUES ('probe', 7)")
            row = database.connection().execute("SELECT value FROM meta WHERE key = 'probe'").fetchone()
        assert row == (7,)
    finally:
        database.close()


def test_many_threads_writing_at_once_lose_nothing(db: Counted) -> None:
    def write(base: int) -> None:
        for k in range(50):
            db.insert(base + k)

    threads = [threading.Thread(target=write, args=(1000 * t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert db.rows() == sorted(1000 * t + k for t in range(8) for k in range(50))
    assert db.commits <= 8 * 50


def test_a_group_left_to_a_writer_that_gave_up_is_committed_all_the_same(db: Counted) -> None:
    # A writer in line when a body ends is left the group's commit; if it
    # then gives up waiting for the lock (lock_timeout_s), nobody is left in
    # line, and the writer waiting for its commit makes it itself. The
    # writer in line is stood in for by the count of writers queued.
    with db.group._queued_lock:
        db.group._queued += 1
    done = threading.Event()

    def write() -> None:
        db.insert(1)
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    wait_for(lambda: db.group._open is not None and not db.group._lock.locked(), 10, "the body to end")
    assert db.rows() == []  # left to the writer in line
    with db.group._queued_lock:
        db.group._queued -= 1  # which gave up
    assert done.wait(10)
    writer.join(10)
    assert db.rows() == [1]
    assert db.commits == 1


def test_a_writer_kept_from_the_lock_too_long_fails_in_words(tmp_path: Path) -> None:
    db = Counted(tmp_path / "group.db")
    db.group = GroupCommit(db._connect, lock_timeout_s=0.2)
    failed: list[BaseException] = []

    def second() -> None:
        try:
            db.insert(2)
        except sqlite3.OperationalError as exc:
            failed.append(exc)

    with db.group.transaction() as conn:
        conn.execute("INSERT INTO rows VALUES (1, 1)")
        t = threading.Thread(target=second)
        t.start()
        t.join(10)
    assert [str(e) for e in failed] == ["database is locked: another writer of this process held it for 0.2 s"]
    assert db.rows() == [1]
    assert db.group.queued() == 0
    db.group.close()
