"""Overlap ``forbid`` with real `pysched up` processes on one database: a job
due every second whose runs take 3 s never runs two at once, across the
worker threads of a node, and across two nodes when the one running a run
stops and the other takes over while that run is still going."""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

import pytest

from tests.helpers import cli, cli_json, start_node, stop_node, wait_for
from tests.overlap_runs import THREE_SECONDS, ended_on, executions, running_on


@pytest.mark.slow
def test_forbid_never_runs_two_at_once_across_workers_and_nodes(tmp_path: Path, db_path: Path) -> None:
    cli(
        "add",
        "tick",
        "--cron",
        "* * * * * *",
        "--jitter",
        "0",
        "--shell",
        THREE_SECONDS,
        "--overlap",
        "forbid",
        db=db_path,
        cwd=tmp_path,
    )
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    a = start_node(db_path, tmp_path, a_log, "--workers", "4", "--grace", "10")
    b = None
    try:
        # Node a leads and runs the job on its four workers.
        wait_for(lambda: ended_on(tmp_path, a.pid) >= 1, 30, "a run to end on node a", a_log)
        b = start_node(db_path, tmp_path, b_log, "--workers", "4", "--grace", "10")
        time.sleep(1)  # b is up and standing by
        wait_for(lambda: running_on(tmp_path, a.pid), 10, "a run in progress on node a", a_log)
        # a hands its partitions on and finishes its run within the grace:
        # b fires the next runs while that run is still going.
        os.kill(a.pid, signal.SIGTERM)
        wait_for(lambda: ended_on(tmp_path, b.pid) >= 1, 30, "a run to end on node b", b_log)
    finally:
        stop_node(a)
        if b is not None:
            stop_node(b)
    runs = executions(tmp_path)
    assert {pid for _, _, pid in runs} == {a.pid, b.pid}
    now_ns = time.time_ns()
    for (_, end, _), (next_start, _, _) in itertools.pairwise(runs):
        # A run cut short (no end) is taken as running until now.
        assert next_start >= (end if end is not None else now_ns), f"two runs at once: {runs}"
    missed = cli_json("show", "tick", db=db_path)["missed"]
    assert missed["overlap"] >= 2, missed


@pytest.mark.parametrize("value", ["sometimes", "Forbid", ""])
def test_a_bad_overlap_is_refused_naming_the_option(tmp_path: Path, db_path: Path, value: str) -> None:
    proc = cli("add", "j", "--cron", "* * * * *", "--shell", "true", "--overlap", value, db=db_path, check=False)
    assert proc.returncode == 2
    assert "--overlap" in proc.stderr and "Traceback" not in proc.stderr
