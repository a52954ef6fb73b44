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


@dataclass(frozen=True)
class Loaded:
    """What one read found, for the tick to put in the wheel."""

    fences: dict[int, int]  # the partitions read, under the fences they were led by
    rows: list[Run]
    horizon: int
    generation: int  # hand-overs of planned runs taken before the read began
    idle: bool  # a full reload: also the time to prune what the leader keeps
    read_at: int  # the read began no earlier


class Loader:
    """Reads every ``reload_every``, at once after partitions were gained
    (``reload_all``), and for the partitions whose jobs changed."""

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
        self._next_reload = self._next_change_poll = 0
        self._versions: dict[int, int] = {}
        self._read_through = 0  # when the last read of every partition began
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
        if self._reload_all.is_set() or now >= self._next_reload:
            self._reload_all.clear()
            if guarded(lambda: self._read(fences, now, idle=True)):
                self._next_reload = now + cfg.reload_every_ms
                self._read_through = now
                return True
            self._reload_all.set()
            return False
        if now >= self._next_lease_check:
            # A run whose worker died is owed again once its lease runs out:
            # read then, so it is handed on within the lease, not up to a
            # periodic read later. Only leases run out since the last read:
            # that read found the others.
            self._next_lease_check = now + cfg.lease_check_ms
            expiry = guarded(lambda: self.store.next_lease_expiry(fences, self._read_through))
            if expiry is not None and expiry < now:
                self._next_reload = now
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

    def _read(self, fences: dict[int, int], now: int, idle: bool) -> bool:
        generation = self._generation()
        horizon = now + self.config.horizon_ms
        rows = self.store.due_runs(fences, horizon, now)
        self.loaded.put(Loaded(fences, rows, horizon, generation, idle, now))
        return True
