"""Runs due together, on a real `pysched up`: each starts when a worker is
free, never behind another run taken with it, and the start its history
records is when its target was called."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.helpers import cli, cli_json, now_ms, start_node, stop_node, wait_for

pytestmark = pytest.mark.slow

# Waits (at most 120 s) for its own release file, leaving a marker when it
# starts: the test decides when it ends.
HOLD = (
    'touch "started.$PYSCHED_JOB_ID";'
    ' for i in $(seq 2400); do [ -e "release.$PYSCHED_JOB_ID" ] && break; sleep 0.05; done'
)


def _due_together(in_s: float) -> str:
    at = datetime.now(UTC) + timedelta(seconds=in_s)
    return at.isoformat(timespec="milliseconds")


def _history(db: Path, job: str) -> dict[str, object]:
    (run,) = cli_json("history", job, db=db)
    assert isinstance(run, dict)
    return run


def _started_ms(run: dict[str, object]) -> int:
    started = run["started_at"]
    assert isinstance(started, str)
    return int(datetime.fromisoformat(started).timestamp() * 1000)


def test_a_short_run_due_with_a_long_one_starts_beside_it_not_after_it(tmp_path: Path, db_path: Path) -> None:
    log = tmp_path / "node.log"
    node = start_node(db_path, tmp_path, log, "--workers", "4")
    try:
        at = _due_together(3)
        cli("add", "long", "--at", at, "--shell", HOLD, db=db_path, cwd=tmp_path)
        cli("add", "short", "--at", at, "--shell", "touch started.short", db=db_path, cwd=tmp_path)
        # Before, the short one waited in the long one's batch until it ended:
        # here, until the test gave up.
        wait_for(lambda: (tmp_path / "started.long").exists(), 60, "the long run to start", log)
        wait_for(lambda: _history(db_path, "short")["state"] == "succeeded", 60, "the short run to end", log)
        assert _history(db_path, "long")["state"] == "running"
        (tmp_path / "release.long").touch()
        wait_for(lambda: _history(db_path, "long")["state"] == "succeeded", 60, "the long run to end", log)
    finally:
        (tmp_path / "release.long").touch()
        stop_node(node)


def test_runs_beyond_the_workers_wait_in_the_queue_and_record_when_they_really_started(
    tmp_path: Path, db_path: Path
) -> None:
    log = tmp_path / "node.log"
    node = start_node(db_path, tmp_path, log, "--workers", "2")
    jobs = ["hold-1", "hold-2", "hold-3"]
    try:
        at = _due_together(3)
        for job in jobs:
            cli("add", job, "--at", at, "--shell", HOLD, db=db_path, cwd=tmp_path)

        def started() -> list[str]:
            return [job for job in jobs if (tmp_path / f"started.{job}").exists()]

        wait_for(lambda: len(started()) == 2, 60, "two runs to start", log)
        time.sleep(1)
        assert len(started()) == 2  # two workers: the third waits
        (waiting,) = set(jobs) - set(started())
        assert _history(db_path, waiting)["state"] != "running"
        released_ms = now_ms()
        (tmp_path / f"release.{started()[0]}").touch()
        wait_for(lambda: (tmp_path / f"started.{waiting}").exists(), 60, "the third run to start", log)
        # Its start is when a worker took it up, after the release, not when
        # it was handed on with the others.
        run = _history(db_path, waiting)
        assert _started_ms(run) >= released_ms
        start_lag_ms = run["start_lag_ms"]
        assert isinstance(start_lag_ms, int)
        assert start_lag_ms >= released_ms - int(datetime.fromisoformat(at).timestamp() * 1000)
    finally:
        for job in jobs:
            (tmp_path / f"release.{job}").touch()
        stop_node(node)
    for job in jobs:
        assert _history(db_path, job)["state"] in ("succeeded", "running", "interrupted")
