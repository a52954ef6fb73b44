"""`python -m bench burst`: the instant spike, repeated, medians reported.

Two lags per run: the fire lag (due to handed on: the dispatch record seen)
and the start lag (due to the job function called: the time the job itself
writes in its ledger), which is what a user feels. Each spike runs in a
process of its own, so the peak RSS reported is that spike's alone
(registration included); on a cluster that process holds only the
registrant and the watcher, so no RSS is given.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pysched.config import load as load_config
from pysched_loadgen.registration import LoadPlan
from pysched_loadgen.runner import run_cluster, run_embedded
from pysched_loadgen.shapes import Load, spike_jobs

ROOT = Path(__file__).resolve().parent.parent
# The worker threads of the embedded node: as many as the peers get.
THREADS = 10
# How long a spike waits for its runs to be executed once all were handed
# on: far past any start lag worth measuring, and the bound of a CI run.
EXECUTE_TIMEOUT_S = 900.0


def peak_rss_mb() -> float:
    """This process's peak resident set so far (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def spike(n: int, config: str | None, quiet: bool = True, metrics: bool = False) -> dict[str, Any]:
    """One instant spike of n runs, due once they are all registered,
    watched until every run handed on was executed; embedded, ``metrics``
    has the node count into its Prometheus metrics."""

    def build(ledger: Path, prefix: str, instant: int) -> Load:
        return Load.one_shots(spike_jobs(n, instant, "instant", 0, ledger, prefix))

    if config is None:
        attempt = run_embedded(LoadPlan(n, build), THREADS, 120, EXECUTE_TIMEOUT_S, quiet, metrics)
    else:
        attempt = run_cluster(load_config(config), LoadPlan(n, build), 120, EXECUTE_TIMEOUT_S, quiet)
    figures = attempt.figures({})
    figures.pop("_fire_lags")
    figures["not_executed"] = figures["fired"] - figures["executed"]
    if config is None:
        figures["peak_rss_mb"] = peak_rss_mb()
    return figures


def in_own_process(measure: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``measure(*args)`` in a fresh interpreter: its peak RSS is its own,
    and nothing it leaves behind (threads, caches) weighs on the next."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(measure, *args).result()


@dataclass(frozen=True)
class ClusterProcesses:
    nodes: list[subprocess.Popen[bytes]]  # `pysched up --workers 0`: leaders only
    workers: list[subprocess.Popen[bytes]]


@contextmanager
def cluster_processes(
    config: str, nodes: int, workers: int, worker_threads: int | None = None
) -> Iterator[ClusterProcesses]:
    """Nodes and workers for the run, stopped by their PIDs afterwards."""
    threads = [] if worker_threads is None else ["--workers", str(worker_threads)]
    procs: list[subprocess.Popen[bytes]] = []
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
                subprocess.Popen(
                    [*argv, "worker", "--config", config, *threads, "--quiet"], stdout=out, stderr=out, cwd=ROOT
                )
            )
    try:
        time.sleep(8)  # elected and consuming
        for p in procs:
            if p.poll() is not None:
                raise SystemExit(f"bench: a pysched process exited at start (logs in {logs})")
        yield ClusterProcesses(procs[:nodes], procs[nodes:])
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)


def burst(n: int, repeat: int, config: str | None, nodes: int, workers: int, metrics: bool = False) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    if config is not None and (nodes or workers):
        with cluster_processes(config, nodes, workers):
            runs = [in_own_process(spike, n, config) for _ in range(repeat)]
    else:
        runs = [in_own_process(spike, n, config, True, metrics) for _ in range(repeat)]
    keys = ("p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms")

    def median_of(key: str, within: str | None = None) -> float | None:
        values = [(r if within is None else r[within]).get(key) for r in runs]
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None

    return {
        "mode": "cluster" if config else "embedded",
        "metrics": metrics,
        "n": n,
        "repeat": repeat,
        "missed": sum(r["missed"] for r in runs),
        "duplicates": sum(r["duplicates"] for r in runs),
        "executed": sum(r["executed"] for r in runs),
        "not_executed": sum(r["not_executed"] for r in runs),
        # Registration attempts over the runs: more than repeat means some
        # were too slow for their instant and were done again.
        "attempts": sum(r["attempts"] for r in runs),
        # The fire lag (handed on), then the start lag (the function called).
        **{k: median_of(k) for k in keys},
        "start": {k: median_of(k, "start") for k in keys},
        "peak_rss_mb": median_of("peak_rss_mb"),
        "register_s": statistics.median(r["register_s"] for r in runs),
        "register_write_s": statistics.median(r["register_write_s"] for r in runs),
        "runs": runs,
    }
