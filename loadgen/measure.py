"""Figures from what was observed outside pysched: dispatch records seen on
the channel, executions the jobs wrote to their ledger."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class Observed:
    expected: dict[str, int]  # idempotency key -> due_ms
    dispatched: dict[str, int] = field(default_factory=dict)  # key -> first dispatch time seen
    dispatch_copies: Counter[str] = field(default_factory=Counter)

    def saw_dispatch(self, key: str, at_ms: int) -> None:
        if key in self.expected:
            self.dispatch_copies[key] += 1
            self.dispatched.setdefault(key, at_ms)


def percentiles(lags: list[int]) -> dict[str, float | None]:
    if not lags:
        return {"p50_ms": None, "p90_ms": None, "p99_ms": None, "p999_ms": None, "max_ms": None}
    a = np.asarray(lags, dtype=np.float64)
    p50, p90, p99, p999 = np.percentile(a, [50, 90, 99, 99.9])
    return {
        "p50_ms": round(float(p50), 1),
        "p90_ms": round(float(p90), 1),
        "p99_ms": round(float(p99), 1),
        "p999_ms": round(float(p999), 1),
        "max_ms": round(float(a.max()), 1),
    }


class LedgerTail:
    """The ledger read as it grows: each ``read`` parses only the lines
    appended since the last, so watching a run of 50,000 costs the watcher
    (which shares the machine, and in the embedded runs the process, with
    what it measures) one pass over the file, not one per look. A line
    still being written is left for the next read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.executions: Counter[str] = Counter()
        self.started: dict[str, int] = {}
        self._offset = 0

    def read(self) -> Counter[str]:
        """Executions per key so far."""
        if not self.path.exists():
            return self.executions
        with self.path.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        whole = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(whole)
        for line in whole.decode().splitlines():
            key, _, start = line.split()
            self.executions[key] += 1
            self.started.setdefault(key, int(start))
        return self.executions


def read_ledger(path: Path) -> tuple[Counter[str], dict[str, int]]:
    """Executions per key, and each key's first start time."""
    tail = LedgerTail(path)
    tail.read()
    return tail.executions, tail.started


def report(observed: Observed, ledger: Path, register_s: float, extra: dict[str, Any]) -> dict[str, Any]:
    executions, started = read_ledger(ledger)
    due = observed.expected
    fire_lags = [observed.dispatched[k] - due[k] for k in observed.dispatched]
    start_lags = [started[k] - due[k] for k in started if k in due]
    out: dict[str, Any] = {
        "n": len(due),
        "fired": len(observed.dispatched),
        "missed": len(due) - len(observed.dispatched),
        "executed": len(set(executions) & set(due)),
        "duplicates": sum(c - 1 for k, c in executions.items() if k in due and c > 1),
        "redispatched": sum(c - 1 for c in observed.dispatch_copies.values() if c > 1),
        **percentiles(fire_lags),
        "start": percentiles(start_lags),
        "register_s": round(register_s, 2),
        **extra,
    }
    out["_fire_lags"] = fire_lags
    return out


def plot(fire_lags: list[int], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = np.sort(np.asarray(fire_lags, dtype=np.float64))
    fig, (cdf, hist) = plt.subplots(1, 2, figsize=(11, 4))
    cdf.plot(a, np.arange(1, len(a) + 1) / max(len(a), 1))
    cdf.set_xlabel("fire lag (ms)")
    cdf.set_ylabel("fraction of runs")
    cdf.set_title("fire-lag CDF")
    cdf.grid(True, alpha=0.3)
    top = max(10.0, float(a.max()) if len(a) else 10.0)
    hist.hist(a, bins=np.arange(min(0.0, float(a.min()) if len(a) else 0.0), top + 10, 10))
    hist.set_xlabel("fire lag (ms), 10 ms bins")
    hist.set_ylabel("runs")
    hist.set_title("per-10-ms histogram")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
