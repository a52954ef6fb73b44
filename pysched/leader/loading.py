"""Loading: reading from the store what the wheel should hold.

Off the tick thread in production: reading 25,000 rows must not sit between
two ticks. The loader hands what it read over a queue; the tick applies it,
and alone touches the wheel."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from pysched.leader.config import LeaderConfig
from pysched.leader.guard import guarded
from pysched.protocols import Run, ScheduleStore

# How often the sweep reads, at most: the fewer partitions a read takes,
# the less a run due meanwhile waits behind it.
_SWEEP_READ_EVERY_MS = 1_000


@dataclass(frozen=True)
class Loaded:
    """What one read found, for the tick to put in the wheel."""

    fences: dict[int, int]  # the partitions read, under the fences they were led by
    rows: list[Run]
    horizon: int
    generation: int  # hand-overs of planned runs taken before the read began
    idle: bool  # a periodic read: also the time to prune what the leader keeps of these partitions
    read_at: int  # the read began no earlier


class Loader:
    """Reads every partition led at once after partitions were gained
    (``reload_all``), those whose jobs changed, and each of them again
    within every ``reload_every_ms``: a sweep of a few partitions at a time.

    The sweep is the safety net (a run registered too far ahead to send a
    change notice, a run whose lease ran out). Read all at once, it took
    the whole horizon (40,000 runs on a busy node) in one go every 30 s,
    and the runs due meanwhile waited behind it; in slices, no read is
    more than a few partitions'."""

    def __init__(
        self,
        store: ScheduleStore,
        config: LeaderConfig,
        fences: Callable[[], dict[int, int]],
        generation: Callable[[], int],
    ) -> None:
        self.store = store
        self.config = config
        self._fences = fences  # the tick's view: replaced, never changed in place
        self._generation = generation
        self.loaded: queue.SimpleQueue[Loaded] = queue.SimpleQueue()
        self._reload_all = threading.Event()
        self._reload_all.set()
        self._next_sweep = self._next_change_poll = 0
        self._versions: dict[int, int] = {}
        self._read_at: dict[int, int] = {}  # partition -> when its last read began
        self._next_lease_check = 0

    def reload_all(self) -> None:
        """Read every partition led at the next step."""
        self._reload_all.set()

    def step(self, now: int) -> bool:
        """At most one read (or one change poll and a read); whether it read."""
        cfg = self.config
        fences = self._fences()
        if not fences:
            return False
        if self._reload_all.is_set():
            self._reload_all.clear()
            if guarded(lambda: self._read(fences, now, idle=True)):
                self._next_sweep = now + self._sweep_every(len(fences))
                return True
            self._reload_all.set()
            return False
        if now >= self._next_sweep:
            # Kept to its beat, so that a sweep of many reads is not later
            # by a step's wait for each of them.
            every = self._sweep_every(len(fences))
            beat = self._next_sweep if now - self._next_sweep < every else now
            part = self._sweep_slice(fences, beat + every)
            if guarded(lambda: self._read(part, now, idle=True)):
                self._next_sweep = beat + every
                return True
            return False
        if now >= self._next_lease_check:
            # A run whose worker died is owed again once its lease runs out:
            # read then, so it is handed on within the lease, not up to a
            # sweep later. Only leases run out since every partition was
            # last read: those reads found the others.
            self._next_lease_check = now + cfg.lease_check_ms
            read_through = min(self._read_at.get(p, 0) for p in fences)
            expiry = guarded(lambda: self.store.next_lease_expiry(fences, read_through))
            if expiry is not None and expiry < now:
                self._reload_all.set()
                return False
        if now < self._next_change_poll:
            return False
        self._next_change_poll = now + cfg.change_poll_ms
        versions = guarded(self.store.change_versions)
        if versions is None:
            return False
        changed = {p: f for p, f in fences.items() if versions.get(p) != self._versions.get(p)}
        if not changed:
            self._versions = versions
            return False
        if guarded(lambda: self._read(changed, now, idle=False)):
            self._versions = versions
            return True
        return False

    def _sweep_every(self, partitions: int) -> int:
        """The wait between two sweep reads: about a second (no more than
        ``reload_every_ms``), and the whole sweep within ``reload_every_ms``."""
        reads = -(-partitions // self._sweep_size(partitions))
        # Each read may come a step (change_poll_ms) after its beat.
        return max(1, (self.config.reload_every_ms - self.config.change_poll_ms) // reads)

    def _sweep_size(self, partitions: int) -> int:
        reads = max(1, self.config.reload_every_ms // _SWEEP_READ_EVERY_MS)
        return -(-partitions // reads)

    def _sweep_slice(self, fences: dict[int, int], next_beat: int) -> dict[int, int]:
        """The few partitions led read longest ago; more when some would
        go unread past ``reload_every_ms`` by the next sweep read (a store
        that stalled, a read that failed): a late sweep catches up, it
        does not stretch."""
        cfg = self.config
        read_at = self._read_at
        led = sorted(fences, key=lambda p: (read_at.get(p, -1), p))
        overdue_by_next = next_beat + cfg.change_poll_ms - cfg.reload_every_ms
        behind = sum(1 for p in led if read_at.get(p, -1) < overdue_by_next)
        return {p: fences[p] for p in led[: max(self._sweep_size(len(led)), behind)]}

    def _read(self, fences: dict[int, int], now: int, idle: bool) -> bool:
        generation = self._generation()
        horizon = now + self.config.horizon_ms
        rows = self.store.due_runs(fences, horizon, now)
        self.loaded.put(Loaded(fences, rows, horizon, generation, idle, now))
        self._read_at.update(dict.fromkeys(fences, now))
        return True
