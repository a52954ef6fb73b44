"""A job that ends its worker's process (os._exit, no timeout), on real
`pysched up` nodes sharing one database: the node that takes the run over
says which run was in flight on the dead node and records that attempt;
the run is not run again past its retries, nor after it has ended its
worker's process twice, so it cannot take every node down in turn."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import cli, cli_json, start_node, stop_node, wait_for

pytestmark = pytest.mark.slow

HARD_EXIT = """
import os
from pathlib import Path


def hard_exit(ctx):
    Path(f"ran.{os.getpid()}").touch()
    os._exit(9)
"""


def _dead_letter(db: Path, job: str) -> dict[str, object] | None:
    letters = [d for d in cli_json("dlq", "ls", db=db) if d["job_id"] == job]
    return letters[0] if letters else None


def _run_poison(tmp_path: Path, db_path: Path, nodes: int, *add: str) -> tuple[list[subprocess.Popen[bytes]], str]:
    (tmp_path / "poison.py").write_text(HARD_EXIT)
    logs = [tmp_path / f"node{i}.log" for i in range(nodes)]
    procs = [start_node(db_path, tmp_path, log, "--lease", "2") for log in logs]
    cli("add", "exit-raw", "--in", "1", "--python", "poison:hard_exit", *add, db=db_path, cwd=tmp_path)
    wait_for(lambda: _dead_letter(db_path, "exit-raw") is not None, 120, "the run to become a dead letter", logs[0])
    return procs, "\n".join(log.read_text() for log in logs)


def test_with_no_retries_a_run_that_ended_its_process_is_not_run_again(tmp_path: Path, db_path: Path) -> None:
    procs, logs = _run_poison(tmp_path, db_path, 2, "--retries", "0")
    try:
        assert len(list(tmp_path.glob("ran.*"))) == 1
        assert sorted(p.poll() is None for p in procs) == [False, True]  # one node died, one lives
        (run,) = cli_json("history", "exit-raw", db=db_path)
        assert run["state"] == "failed" and run["attempt"] == 1
        assert "ended with its worker's process" in run["error"] and "no retries left" in run["error"]
        assert "taking over exit-raw" in logs and "attempt 1 was running on" in logs
    finally:
        for proc in procs:
            stop_node(proc)


def test_a_run_that_ended_its_process_twice_is_dead_lettered_and_the_third_node_lives(
    tmp_path: Path, db_path: Path
) -> None:
    procs, _ = _run_poison(tmp_path, db_path, 3)  # retries: 3 by default
    try:
        assert len(list(tmp_path.glob("ran.*"))) == 2
        assert sorted(p.poll() is None for p in procs) == [False, False, True]
        (run,) = cli_json("history", "exit-raw", db=db_path)
        assert run["state"] == "failed"
        assert "ended its worker's process 2 times" in run["error"]
        letter = _dead_letter(db_path, "exit-raw")
        assert letter is not None
        failures = letter["failures"]
        assert isinstance(failures, list)
        assert [(f["attempt"], f["kind"], f["dead_lettered"]) for f in failures] == [
            (1, "lost", False),
            (2, "lost", True),
        ]
    finally:
        for proc in procs:
            stop_node(proc)
