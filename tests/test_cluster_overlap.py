"""Overlap ``forbid`` on the cluster: the twin of test_overlap_processes.py
with real `pysched up` and two `pysched worker` processes on the real
servers. A job due every second whose runs take 3 s never runs two at once,
across the threads of a worker, and across the two workers when the one
running a run stops and Kafka hands the job's partition to the other while
that run is still going: the slot lives in the store, not in a worker."""

from __future__ import annotations

import itertools
import os
import shlex
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Cluster, cli_json, wait_for
from tests.overlap_runs import THREE_SECONDS, ended_on, executions, running_on

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _worker(cluster: Cluster, name: str) -> int:
    return cluster.start(name, "worker", "--workers", "4", "--grace", "10", "--lease", "2").pid


def _cli_json(cluster: Cluster, *args: str) -> Any:
    return cli_json(*args, "--config", str(cluster.config_path), db=cluster.tmp / "unused.db")


def test_forbid_never_runs_two_at_once_across_worker_processes(cluster: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    out.mkdir()
    cluster.node("node")
    pids = {"worker-1": _worker(cluster, "worker-1"), "worker-2": _worker(cluster, "worker-2")}
    wait_for(lambda: len(cluster.leaders()) == cluster.config.partitions, 60, "every partition to have a leader")
    _cli_json(
        cluster, "add", "tick", "--cron", "* * * * * *", "--jitter", "0", "--overlap", "forbid",
        "--shell", f"cd {shlex.quote(str(out))} && {{ {THREE_SECONDS}; }}",
    )  # fmt: skip

    def ended_anywhere() -> bool:
        return any(ended_on(out, pid) >= 1 for pid in pids.values())

    wait_for(ended_anywhere, 60, "a run to end", tmp_path / "node.log")
    # The job's runs all go to one Kafka partition: one worker runs them,
    # on any of its four threads, one at a time, until a rebalance (the
    # second worker joining the group late) moves that partition.
    running: list[int] = []

    def a_run_in_progress() -> bool:
        running[:] = [pid for pid in pids.values() if running_on(out, pid)]
        return bool(running)

    wait_for(a_run_in_progress, 10, "a run in progress", tmp_path / "node.log")
    assert len(running) == 1, f"two runs at once: {executions(out)}"
    first = running[0]
    name = next(n for n, pid in pids.items() if pid == first)
    other = next(pid for pid in pids.values() if pid != first)
    # It stops: its partitions go to the other worker at once, which gets
    # the next fires while the run here finishes within the grace.
    os.kill(first, signal.SIGTERM)
    wait_for(lambda: ended_on(out, other) >= 1, 60, "a run to end on the other worker", tmp_path / "node.log")
    cluster.procs[name].wait(30)

    runs = executions(out)
    assert {pid for _, _, pid in runs} == {first, other}
    now_ns = time.time_ns()
    for (_, end, _), (next_start, _, _) in itertools.pairwise(runs):
        # A run cut short (no end) is taken as running until now.
        assert next_start >= (end if end is not None else now_ns), f"two runs at once: {runs}"
    missed = _cli_json(cluster, "show", "tick")["missed"]
    # Fires each second, runs of 3 s: two of three fires are missed at least.
    assert missed["overlap"] >= 2, missed
    print(f"{len(runs)} runs, none at once; missed {missed}")
