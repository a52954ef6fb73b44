"""The --db file as a user may get it wrong: a misspelt path, a name that is
no file, someone else's file, a file that cannot be written. Each is one
line naming --db and the path, exit 2, and nothing created or changed."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pysched.claims.sqlite import SQLiteClaims
from pysched.coord.local import SQLiteLeaseCoordinator
from pysched.protocols import ClaimOutcome
from pysched.records import DispatchRecord
from pysched.stores.sqlite import SQLiteScheduleStore
from pysched.stores.sqlite_db import SCHEMA, SQLiteDatabase
from tests.helpers import cli, cli_json

ADD = ("add", "job", "--in", "600", "--shell", "true")
READS = [("ls",), ("show", "job"), ("history", "job"), ("status",)]
WRITES = [ADD, ("cancel", "job"), ("reschedule", "job", "--in", "900")]


def refused(proc: subprocess.CompletedProcess[str], db: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --db {db!r}: "), proc.stderr


@pytest.mark.parametrize("name", ["", ":memory:"])
@pytest.mark.parametrize("args", [*WRITES, ("up",)], ids=lambda a: a[0])
def test_a_name_that_is_no_file_is_refused(tmp_path: Path, name: str, args: tuple[str, ...]) -> None:
    refused(cli(*args, db=name, cwd=tmp_path, check=False, timeout_s=20), name)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [*READS, *WRITES[1:]], ids=lambda a: a[0])
def test_only_add_and_up_create_a_database(tmp_path: Path, args: tuple[str, ...]) -> None:
    misspelt = tmp_path / "pysched.bd"
    refused(cli(*args, db=misspelt, check=False), str(misspelt))
    assert list(tmp_path.iterdir()) == []


def test_a_new_database_is_private_to_its_owner_and_marked(tmp_path: Path, db_path: Path) -> None:
    from pysched.stores.sqlite_db import APPLICATION_ID

    os.umask(0o022)
    cli(*ADD, db=db_path)
    db = SQLiteDatabase(db_path)  # holds the -wal and -shm files open
    try:
        for name in ("pysched.db", "pysched.db-wal", "pysched.db-shm"):
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
        assert db.connection().execute("PRAGMA application_id").fetchone() == (APPLICATION_ID,)
    finally:
        db.close()


def test_a_database_made_before_the_mark_is_still_used(db_path: Path) -> None:
    with sqlite3.connect(db_path) as conn:
        conn.executescript(SCHEMA)
    assert cli_json("ls", db=db_path) == []
    cli(*ADD, db=db_path)
    assert [job["id"] for job in cli_json("ls", db=db_path)] == ["job"]


def test_a_database_made_before_runs_kept_deliveries_apart_keeps_its_runs_owed(db_path: Path) -> None:
    # Its ``attempt`` was the delivery: a run retrying after its second
    # delivery failed is handed on as the third, and starts as attempt 3.
    # Nor did its jobs know when their runs began (an id used once).
    old = (
        SCHEMA.replace("    delivery INTEGER NOT NULL DEFAULT 0,\n", "")
        .replace("    ended_attempt INTEGER NOT NULL DEFAULT 0,\n", "")
        .replace(
            "    updated_at_ms INTEGER NOT NULL,\n    runs_since_ms INTEGER NOT NULL DEFAULT 0\n",
            "    updated_at_ms INTEGER NOT NULL\n",
        )
    )
    with sqlite3.connect(db_path) as conn:
        conn.executescript(old)
        assert "delivery" not in {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
        assert "runs_since_ms" not in {r[1] for r in conn.execute("PRAGMA table_info(jobs)")}
        conn.execute("INSERT INTO jobs VALUES ('job', '{}', 'active', 0, 0, 0, 0)")
        conn.execute(
            "INSERT INTO runs (job_id, run_at_ms, due_ms, partition, attempt, state)"
            " VALUES ('job', 1, 5, 0, 2, 'retrying')"
        )
    store = SQLiteScheduleStore(db_path)
    (run,) = store.due_runs({0: 1}, 1_000, 10)
    assert run.attempt == 3
    record = DispatchRecord(*run, fence=1, dispatched_at_ms=10)
    assert store.run_started(record, "w1", 20) == 3
    store.db.close()


def test_a_database_made_before_claims_kept_their_delivery_gains_it(db_path: Path) -> None:
    # Its failed claims knew no delivery: any delivery takes them over, as
    # it did; a claim failed from now on refuses its own delivery.
    old = SCHEMA.replace(
        "    updated_at_ms INTEGER NOT NULL,\n    delivery INTEGER NOT NULL DEFAULT 0\n",
        "    updated_at_ms INTEGER NOT NULL\n",
    )
    assert old != SCHEMA
    with sqlite3.connect(db_path) as conn:
        conn.executescript(old)
        conn.execute(
            "INSERT INTO claims (idem_key, run_id, state, holder, fence, lease_expires_ms, result, updated_at_ms)"
            " VALUES ('job:1:0', 7, 'failed', 'w1', 1, 0, 'exit status 1', 0)"
        )
    claims = SQLiteClaims(db_path)
    record = DispatchRecord(7, "job", 1, 1, 0, 1, 0, fence=1, dispatched_at_ms=10)
    assert claims.claim(record, "w2", 20, 30_000).outcome is ClaimOutcome.TAKEN_OVER
    claims.complete(record.idempotency_key, "w2", False, "{}", 30)
    assert claims.claim(record, "w3", 40, 30_000).outcome is ClaimOutcome.FAILED
    claims.db.close()


def _garbage(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 16)


def _other_program(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
        conn.execute("INSERT INTO notes (text) VALUES ('mine')")


def _other_program_with_an_id(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA application_id = 42")
        conn.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY)")


@pytest.mark.parametrize("make", [_garbage, _other_program, _other_program_with_an_id])
@pytest.mark.parametrize("args", [*READS, *WRITES, ("up",)], ids=lambda a: a[0])
def test_a_file_that_is_not_a_pysched_database_is_refused_untouched(
    tmp_path: Path, make: object, args: tuple[str, ...]
) -> None:
    path = tmp_path / "notes.db"
    make(path)  # type: ignore[operator]
    before = path.read_bytes()
    proc = cli(*args, db=path, check=False, timeout_s=20)
    refused(proc, str(path))
    assert "not a pysched database" in proc.stderr
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    """Root writes through file modes: make the file immutable instead."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(stat.S_IMODE(mode) & ~0o222)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("running as root without chattr +i: nothing can be read-only")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)


@pytest.mark.parametrize("args", [*WRITES, ("up",)], ids=lambda a: a[0])
def test_a_read_only_database_is_refused_at_once(db_path: Path, args: tuple[str, ...]) -> None:
    cli(*ADD[:2], "--in", "700", "--shell", "true", db=db_path)
    with read_only(db_path):
        started = time.monotonic()
        proc = cli(*args, db=db_path, check=False, timeout_s=30)
        refused(proc, str(db_path))
        assert "cannot be written" in proc.stderr
        assert time.monotonic() - started < 25  # no retry loop
        # Reading it is still fine.
        assert [job["id"] for job in cli_json("ls", db=db_path)] == ["job"]


def test_a_database_in_a_read_only_directory_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    with read_only(folder):
        refused(cli(*ADD, db=folder / "new.db", check=False), str(folder / "new.db"))
    assert list(folder.iterdir()) == []


def test_add_warns_when_no_scheduler_runs_on_the_database(db_path: Path) -> None:
    proc = cli(*ADD, db=db_path)
    assert f"pysched up --db {db_path}" in proc.stderr and "warning:" in proc.stderr
    # A scheduler holding the lease: no warning.
    db = SQLiteDatabase(db_path)
    try:
        SQLiteLeaseCoordinator(db).poll("node-a", time.time_ns() // 1_000_000)
        quiet = cli("add", "other", "--in", "600", "--shell", "true", db=db_path)
        assert quiet.stderr == ""
    finally:
        db.close()


def test_a_job_a_later_version_refuses_is_still_listed_shown_and_cancelled(db_path: Path) -> None:
    # Stored by a version that accepted it: an expression that never fires,
    # a zone that depends on the machine. One such job once made `ls` and
    # every command on that job fail.
    cli("add", "stale", "--cron", "0 9 * * *", "--shell", "true", db=db_path)
    cli("add", "other", "--cron", "0 9 * * *", "--shell", "true", db=db_path)
    with sqlite3.connect(db_path) as conn:
        spec = conn.execute("SELECT spec FROM jobs WHERE job_id = 'stale'").fetchone()[0]
        spec = spec.replace('"0 9 * * *"', '"0 0 */8 * 1#5"').replace('"UTC"', '"localtime"')
        conn.execute("UPDATE jobs SET spec = ? WHERE job_id = 'stale'", (spec,))
    assert sorted(job["id"] for job in cli_json("ls", db=db_path)) == ["other", "stale"]
    assert "1#5" in cli("show", "stale", db=db_path).stdout
    cli("history", "stale", db=db_path)
    # Its stored zone is kept unless another is given, and is refused as any
    # new schedule's would be.
    kept = cli("reschedule", "stale", "--cron", "0 1 * * *", db=db_path, check=False)
    assert kept.returncode == 2 and "--tz: time zone 'localtime' depends on the machine" in kept.stderr
    cli("reschedule", "stale", "--cron", "0 1 * * *", "--tz", "UTC", db=db_path)
    assert cli_json("show", "stale", db=db_path)["schedule"]["expr"] == "0 1 * * *"
    cli("cancel", "stale", db=db_path)
    assert {job["id"]: job["state"] for job in cli_json("ls", db=db_path)}["stale"] == "cancelled"


_OPEN_AT_GO = """
import sys
from pathlib import Path
from pysched.protocols import PartitionsMismatch
from pysched.stores.sqlite_db import DatabaseUnusable, SQLiteDatabase
go = Path(sys.argv[2])
while not go.exists():  # spinning: the processes leave within microseconds of each other
    pass
try:
    print(SQLiteDatabase(sys.argv[1], access="create", partitions=int(sys.argv[3])).partitions)
except (DatabaseUnusable, PartitionsMismatch) as exc:
    print(exc)
"""


def test_processes_starting_together_on_a_new_path_all_open_one_database(tmp_path: Path) -> None:
    # `pysched up` and `pysched add` run at once on a fresh path: each used
    # to switch the same empty file to WAL and write its schema, and one
    # failed ("database is locked", "disk I/O error").
    for round_ in range(8):
        db, go = tmp_path / f"{round_}.db", tmp_path / f"go.{round_}"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _OPEN_AT_GO, str(db), str(go), str(count)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for count in (8, 16)
        ]
        time.sleep(0.5)  # all waiting on the file; a late one opens an existing database
        go.touch()
        answers = [p.communicate(timeout=60)[0].strip() for p in procs]
        # One count holds (the first link's); the others are told it differs.
        opened = [a for a in answers if a.isdigit()]
        assert len(opened) == 1, answers
        assert all("partitions" in a for a in answers if not a.isdigit()), answers
        assert SQLiteDatabase(db, access="read").partitions == int(opened[0])
    assert sorted(p.name for p in tmp_path.iterdir() if ".new-" in p.name) == []
