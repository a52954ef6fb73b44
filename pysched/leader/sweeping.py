"""Sweeping: the leader's safety net for runs nothing else hands on again.

A run handed on and then lost by its worker (it died after its hand-back
failed, or the hand-back was lost) stays ``running`` under a dead claim on
the cluster: the watermark has passed it and Kafka delivers it again only
on a rebalance. A row written behind the watermark despite its placement
is never read. Every ``sweep_every_ms`` the leader asks the store to owe
such runs again (ScheduleStore.sweep_owed); the store's change notice then
has the loader read them. Off the tick thread, as the loader is."""

from __future__ import annotations

import logging
from collections.abc import Callable

from pysched.leader.config import LeaderConfig
from pysched.leader.guard import guarded, ranges
from pysched.protocols import ScheduleStore

log = logging.getLogger("pysched.leader")
# A sweep that failed is tried again this much later, not at the next
# step: a store that refuses calls is not asked ten times a second.
_AFTER_FAILURE_MS = 1_000


class Sweeper:
    def __init__(self, store: ScheduleStore, config: LeaderConfig, fences: Callable[[], dict[int, int]]) -> None:
        self.store = store
        self.config = config
        self._fences = fences  # the tick's view: replaced, never changed in place
        self._next_sweep = 0
        self.owed_again = 0  # runs owed again by every sweep so far

    def step(self, now: int) -> bool:
        """At most one sweep, when one is due; whether it owed any run again."""
        fences = self._fences()
        if not fences or now < self._next_sweep:
            return False
        owed = guarded(lambda: self.store.sweep_owed(fences, now))
        if owed is None:
            self._next_sweep = now + min(_AFTER_FAILURE_MS, self.config.sweep_every_ms)
            return False
        self._next_sweep = now + self.config.sweep_every_ms
        if owed:
            self.owed_again += owed
            log.warning("owed %d runs again that nothing would hand on (partitions %s)", owed, ranges(fences))
        return owed > 0
