"""`python -m bench burst`: the instant spike, repeated, medians reported."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from loadgen.registration import LoadPlan
from loadgen.runner import run_cluster, run_embedded
from loadgen.shapes import Load, spike_jobs
from pysched.config import load as load_config

ROOT = Path(__file__).resolve().parent.parent


def spike(n: int, config: str | None, quiet: bool = True) -> dict[str, Any]:
    """One instant spike of n runs, due once they are all registered."""

    def build(ledger: Path, prefix: str, instant: int) -> Load:
        return Load.one_shots(spike_jobs(n, instant, "instant", 0, ledger, prefix))

    if config is None:
        attempt = run_embedded(LoadPlan(n, build), 4, 120, 5, quiet)
    else:
        attempt = run_cluster(load_config(config), LoadPlan(n, build), 120, 5, quiet)
    figures = attempt.figures({})
    figures.pop("_fire_lags")
    return figures


@contextmanager
def cluster_processes(config: str, nodes: int, workers: int) -> Iterator[None]:
    """Nodes and workers for the run, stopped by their PIDs afterwards."""
    procs = []
    logs = ROOT / ".services" / "bench-logs"
    logs.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pysched"]
    for k in range(nodes):
        with (logs / f"node-{k}.log").open("ab") as out:
            procs.append(
                subprocess.Popen(
                    [*argv, "up", "--config", config, "--workers", "0", "--quiet"], stdout=out, stderr=out, cwd=ROOT
                )
            )
    for k in range(workers):
        with (logs / f"worker-{k}.log").open("ab") as out:
            procs.append(
                subprocess.Popen([*argv, "worker", "--config", config, "--quiet"], stdout=out, stderr=out, cwd=ROOT)
            )
    try:
        time.sleep(8)  # elected and consuming
        for p in procs:
            if p.poll() is not None:
                raise SystemExit(f"bench: a pysched process exited at start (logs in {logs})")
        yield
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)


def burst(n: int, repeat: int, config: str | None, nodes: int, workers: int) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    if config is not None and (nodes or workers):
        with cluster_processes(config, nodes, workers):
            runs = [spike(n, config) for _ in range(repeat)]
    else:
        runs = [spike(n, config) for _ in range(repeat)]
    keys = ("p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms")
    return {
        "mode": "cluster" if config else "embedded",
        "n": n,
        "repeat": repeat,
        "missed": sum(r["missed"] for r in runs),
        "duplicates": sum(r["duplicates"] for r in runs),
        "executed": sum(r["executed"] for r in runs),
        # Registration attempts over the runs: more than repeat means some
        # were too slow for their instant and were done again.
        "attempts": sum(r["attempts"] for r in runs),
        **{k: statistics.median(r[k] for r in runs) for k in keys},
        "register_s": statistics.median(r["register_s"] for r in runs),
        "runs": runs,
    }
