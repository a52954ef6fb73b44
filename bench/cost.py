"""`python -m bench cost --config C --rate R --duration S`: the CPU each
process of the cluster spends per executed run, during a sustained load of
every-minute jobs (`pysched-loadgen sustain --shape recurring`).

The bench starts the nodes (leaders only) and the workers itself, so each is
measured apart; the servers are those `scripts/services` started (their PIDs
in its state file). The window is the load's: from its first run's due time
to its last's, plus the time the last took to be executed; registration
before it and the cancelling after it are left out. Each process's idle use
is measured too, over a quiet spell before the load is registered, and
reported beside it: a server's background work (Cassandra's compactions and
gossip, Kafka's log flushes) is paid at any rate, so the per-run figure
falls as the rate grows until the machine is full.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from bench.burst import ROOT, cluster_processes
from bench.cpu import CpuSampler
from pysched.config import load as load_config
from pysched_loadgen.measure import read_ledger
from pysched_loadgen.registration import LoadPlan, now_ms
from pysched_loadgen.runner import run_cluster
from pysched_loadgen.shapes import MINUTE_MS, Load, sustain_recurring

# The servers a cluster run uses (Temporal serves only Temporal targets).
SERVERS = ("cassandra", "kafka", "etcd", "redis")
IDLE_S = 15.0
# How long after the last due time the window stays open at most: the runs
# still being executed then are counted, and their CPU with them.
TAIL_S = 30.0


class ServersUnknown(RuntimeError):
    """The servers' PIDs cannot be read: nothing was started."""


def server_pids(state_file: Path) -> dict[str, int]:
    if not state_file.exists():
        raise ServersUnknown(f"no servers' state file at {state_file}: start them with scripts/services up")
    state = json.loads(state_file.read_text())
    missing = [s for s in SERVERS if not isinstance(state.get(s), dict) or "pid" not in state[s]]
    if missing:
        raise ServersUnknown(f"{state_file} names no running {', '.join(missing)}")
    return {name: int(state[name]["pid"]) for name in SERVERS}


def starts(ledger: Path) -> list[int]:
    """When each execution in the ledger started (every run of the load's
    jobs, the minutes after the measured ones included)."""
    if not ledger.exists():
        return []
    return [int(line.split()[2]) for line in ledger.read_text().splitlines() if line.count(" ") == 2]


def cost(
    config_path: str, rate: float, duration_s: float, nodes: int, workers: int, threads: int, state_file: Path
) -> dict[str, Any]:
    config = load_config(config_path)
    minutes = max(1, math.ceil(duration_s / 60))
    n = round(rate * 60)

    def build(ledger: Path, prefix: str, start: int) -> Load:
        return sustain_recurring(rate, minutes, start, ledger, prefix)

    servers = server_pids(state_file)
    with cluster_processes(config_path, nodes, workers, threads) as procs:
        pids = {**{f"leader-{k}": p.pid for k, p in enumerate(procs.nodes)}}
        pids |= {f"worker-{k}": p.pid for k, p in enumerate(procs.workers)}
        pids |= servers
        sampler = CpuSampler(pids)
        sampler.start()
        idle_from = now_ms()
        time.sleep(IDLE_S)
        idle_to = now_ms()
        try:
            attempt = run_cluster(config, LoadPlan(n, build, None, MINUTE_MS), 120, 600, quiet=True)
        finally:
            sampler.stop()
    figures = attempt.figures({"rate": rate, "duration_s": minutes * 60, "shape": "recurring"})
    figures.pop("_fire_lags")
    executions, started = read_ledger(attempt.ledger)
    expected = attempt.load.expected
    first_due, last_due = min(expected.values()), max(expected.values())
    last_start = max((started[k] for k in started if k in expected), default=last_due)
    window_to = min(max(last_due, last_start) + 1_000, last_due + round(TAIL_S * 1000))
    # Every execution that started in the window is counted, those of the
    # jobs' next minute too: their firing is in the CPU measured.
    runs = sum(1 for at in starts(attempt.ledger) if first_due <= at <= window_to)
    window_s = (window_to - first_due) / 1000
    used = sampler.used(first_due, window_to)
    idle = sampler.used(idle_from, idle_to)
    idle_s = (idle_to - idle_from) / 1000
    per_process = {
        name: {
            "cpu_s": round(used[name], 2),
            "ms_per_run": round(used[name] * 1000 / max(1, runs), 3),
            "busy_percent_of_a_core": round(100 * used[name] / window_s, 1),
            "idle_percent_of_a_core": round(100 * idle[name] / idle_s, 1),
            "ms_per_run_above_idle": round(
                max(0.0, used[name] - idle[name] * window_s / idle_s) * 1000 / max(1, runs), 3
            ),
        }
        for name in pids
    }

    def total(key: str, names: list[str]) -> float:
        return round(sum(per_process[name][key] for name in names), 3)

    groups = {
        "leaders": [name for name in pids if name.startswith("leader-")],
        "workers": [name for name in pids if name.startswith("worker-")],
        **{name: [name] for name in SERVERS},
    }
    return {
        "runs_in_window": runs,
        "window_s": round(window_s, 1),
        "cpu_ms_per_run": total("ms_per_run", list(pids)),
        "cpu_ms_per_run_above_idle": total("ms_per_run_above_idle", list(pids)),
        "by_group": {
            group: {"ms_per_run": total("ms_per_run", names), "above_idle": total("ms_per_run_above_idle", names)}
            for group, names in groups.items()
        },
        "processes": per_process,
        "load": figures,
        "missed": figures["missed"],
        "duplicates": figures["duplicates"],
        "not_executed": figures["fired"] - figures["executed"],
        "executions_seen": sum(executions.values()),
        "worker_threads": threads,
        "state_file": str(state_file.relative_to(ROOT) if state_file.is_relative_to(ROOT) else state_file),
    }
