"""CPU time of running processes, read from /proc: what `bench cost`
divides by the runs executed. A process's figure includes its descendants
(a server started through a wrapper script, a worker's job children)."""

from __future__ import annotations

import os
import threading
import time
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (which may hold spaces), or
    None for a process that has gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2 :].split()


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def cpu_seconds(pid: int, children: Mapping[int, list[int]]) -> float:
    """User and system CPU of ``pid`` and its live descendants, plus what
    descendants that ended and were waited for had used."""
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        fields = _stat_fields(current)
        if fields is None:
            continue
        # utime, stime, cutime, cstime: fields 14-17 of stat(5), 12-15 here.
        total += sum(int(f) for f in fields[11:15]) / _TICKS
        pending.extend(children.get(current, []))
    return total


@dataclass(frozen=True)
class CpuSample:
    at_ms: int
    seconds: dict[str, float]  # process name -> CPU seconds so far


@dataclass
class CpuSampler:
    """Samples the CPU of named processes every ``every_s`` in a thread of
    its own, so any window can be read off afterwards."""

    pids: dict[str, int]
    every_s: float = 1.0
    samples: list[CpuSample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> CpuSample:
        children = _children()
        at = time.time_ns() // 1_000_000
        return CpuSample(at, {name: cpu_seconds(pid, children) for name, pid in self.pids.items()})

    def start(self) -> None:
        self.samples.append(self.sample())
        self._thread = threading.Thread(target=self._loop, name="bench-cpu-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.samples.append(self.sample())

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append(self.sample())

    def at(self, at_ms: int) -> dict[str, float]:
        """Each process's CPU seconds at ``at_ms``, interpolated between the
        samples around it."""
        times = [s.at_ms for s in self.samples]
        k = min(max(bisect_left(times, at_ms), 1), len(self.samples) - 1)
        before, after = self.samples[k - 1], self.samples[k]
        span = max(1, after.at_ms - before.at_ms)
        share = min(1.0, max(0.0, (at_ms - before.at_ms) / span))
        return {
            name: before.seconds[name] + share * (after.seconds[name] - before.seconds[name]) for name in before.seconds
        }

    def used(self, from_ms: int, to_ms: int) -> dict[str, float]:
        """CPU seconds each process used between two moments."""
        start, end = self.at(from_ms), self.at(to_ms)
        return {name: max(0.0, end[name] - start[name]) for name in start}
