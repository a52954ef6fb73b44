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

# One pair of files per execution: its start time and node, then its end.
THREE_SECONDS = (
    'n="$PYSCHED_RUN_ID.$PYSCHED_ATTEMPT"; echo "$(date +%s%N) $PPID" > "start.$n.tmp" && mv "start.$n.tmp" "start.$n";'
    ' sleep 3; date +%s%N > "end.$n.tmp" && mv "end.$n.tmp" "end.$n"'
)


def _executions(cwd: Path) -> list[tuple[int, int | None, int]]:
    """(start ns, end ns or None while running or cut short, node pid)."""
    out = []
    for start in cwd.glob("start.*"):
        if start.name.endswith(".tmp"):
            continue
        started_ns, pid = start.read_text().split()
        end = cwd / ("end." + start.name.removeprefix("start."))
        out.append((int(started_ns), int(end.read_text()) if end.exists() else None, int(pid)))
    return sorted(out)


def _ended_on(cwd: Path, pid: int) -> int:
    return sum(1 for _, end, node in _executions(cwd) if node == pid and end is not None)


def _running_on(cwd: Path, pid: int) -> bool:
    return any(end is None and node == pid for _, end, node in _executions(cwd))


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
        wait_for(lambda: _ended_on(tmp_path, a.pid) >= 1, 30, "a run to end on node a", a_log)
        b = start_node(db_path, tmp_path, b_log, "--workers", "4", "--grace", "10")
        time.sleep(1)  # b is up and standing by
        wait_for(lambda: _running_on(tmp_path, a.pid), 10, "a run in progress on node a", a_log)
        # a hands its partitions on and finishes its run within the grace:
        # b fires the next runs while that run is still going.
        os.kill(a.pid, signal.SIGTERM)
        wait_for(lambda: _ended_on(tmp_path, b.pid) >= 1, 30, "a run to end on node b", b_log)
    finally:
        stop_node(a)
        if b is not None:
            stop_node(b)
    runs = _executions(tmp_path)
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
