"""The CLI as a user runs it: good input registers, bad input names the field
and stores nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import cli, cli_json


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--cron", "61 * * * *", "--shell", "true"], "expr: Bad minute"),
        (["--cron", "* * *", "--shell", "true"], "expr: expected 5 fields"),
        (["--cron", "@sometimes", "--shell", "true"], "expr: unknown macro"),
        (["--cron", "* * * * *", "--tz", "Mars/Olympus", "--shell", "true"], "tz: unknown time zone"),
        (["--at", "tomorrow-ish", "--shell", "true"], "--at: not an ISO 8601 time"),
        (["--at", "2001-01-01T00:00:00+00:00", "--shell", "true"], "--at:"),
        (["--in", "-3", "--shell", "true"], "--in: must not be negative"),
        (["--in", "3"], "give exactly one of --shell, --python, --http"),
        (["--in", "3", "--cron", "* * * * *", "--shell", "true"], "give exactly one of --cron, --at, --in"),
        (["--in", "3", "--python", "not a ref"], "target.ref"),
        (["--in", "3", "--http", "ftp://example.org/x"], "target.url"),
        (["--in", "3", "--shell", "true", "--jitter", "-1"], "jitter_window_s"),
        (["--in", "3", "--shell", "true", "--payload", "{nope"], "--payload: not JSON"),
    ],
)
def test_bad_input_names_the_field_and_stores_nothing(db_path: Path, args: list[str], field: str) -> None:
    proc = cli("add", "job", *args, db=db_path, check=False)
    assert proc.returncode != 0
    assert field in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not db_path.exists()


def test_bad_id_is_refused(db_path: Path) -> None:
    proc = cli("add", "a:b", "--in", "3", "--shell", "true", db=db_path, check=False)
    assert proc.returncode != 0 and "id:" in proc.stderr


def test_duplicate_id_is_refused_and_keeps_the_first(db_path: Path) -> None:
    cli("add", "nightly", "--cron", "0 2 * * *", "--tz", "Europe/Paris", "--shell", "true", db=db_path)
    proc = cli("add", "nightly", "--cron", "0 3 * * *", "--shell", "false", db=db_path, check=False)
    assert proc.returncode != 0 and "id: job 'nightly' already exists" in proc.stderr
    (job,) = cli_json("ls", db=db_path)
    assert job["schedule"] == {"kind": "cron", "expr": "0 2 * * *", "tz": "Europe/Paris"}
    assert job["target"]["command"] == "true"


def test_job_lifecycle_through_the_cli(db_path: Path) -> None:
    added = cli_json("add", "report", "--cron", "*/15 * * * *", "--python", "mymod:run", "--jitter", "30", db=db_path)
    assert added["state"] == "active" and added["next_run_at"] is not None
    assert 0 <= added["jitter_ms"] < 30_000
    shown = cli_json("show", "report", db=db_path)
    assert shown["id"] == "report" and shown["last_run"] is None
    # Minute 7 never meets */15, so the old pending run is cancelled, not revived.
    moved = cli_json("reschedule", "report", "--cron", "7 * * * *", db=db_path)
    assert moved["schedule"]["expr"] == "7 * * * *"
    assert ":07:00.000" in moved["next_run_at"]
    assert [r["state"] for r in cli_json("history", "report", db=db_path)] == ["cancelled"]
    gone = cli_json("cancel", "report", db=db_path)
    assert gone["state"] == "cancelled" and gone["next_run_at"] is None
    assert cli("cancel", "report", db=db_path, check=False).returncode != 0
    assert "no job 'ghost'" in cli("show", "ghost", db=db_path, check=False).stderr


def test_critical_jobs_have_no_jitter(db_path: Path) -> None:
    job = cli_json("add", "payroll", "--cron", "0 9 * * 1-5", "--critical", "--http", "http://127.0.0.1:9/", db=db_path)
    assert job["jitter_ms"] == 0 and job["critical"] is True
