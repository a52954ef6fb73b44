"""The partition leader: store -> timing wheel -> dispatcher, under a fence.

While it holds the lease, the leader loads the next ``horizon`` of runs into
the native wheel every ``reload_every`` (and at once when jobs change), ticks
every 10 ms, and hands due runs on in batches: each batch is marked
dispatched in the store (with the fence, the next runs of recurring jobs and
the watermarks) before it is published. The wheel is a cache of the store: a
reload with overlap fires nothing twice because the store only hands on runs
still eligible.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pysched import native
from pysched.clock import Clock
from pysched.planning import next_run
from pysched.protocols import Coordinator, Dispatcher, DispatchRow, Lease, ScheduleStore

log = logging.getLogger("pysched.leader")


@dataclass(frozen=True)
class LeaderConfig:
    horizon_ms: int = 60_000
    reload_every_ms: int = 30_000
    tick_ms: int = 10
    change_poll_ms: int = 100
    renew_every_ms: int = 1_000
    standby_poll_ms: int = 500


@dataclass(frozen=True)
class RunDispatched:
    """Past-tense event for observers (the CLI logs it; tests count it)."""

    job_id: str
    run_id: int
    run_at_ms: int
    due_ms: int
    dispatched_at_ms: int
    fence: int
    attempt: int


class PartitionLeader:
    def __init__(
        self,
        store: ScheduleStore,
        coordinator: Coordinator,
        dispatcher: Dispatcher,
        clock: Clock,
        holder: str,
        config: LeaderConfig | None = None,
        on_dispatch: Callable[[RunDispatched], None] | None = None,
    ) -> None:
        self.store = store
        self.coordinator = coordinator
        self.dispatcher = dispatcher
        self.clock = clock
        self.holder = holder
        self.config = config or LeaderConfig()
        self.on_dispatch = on_dispatch
        self.lease: Lease | None = None

    def run(self, stop: threading.Event) -> None:
        """Stand by until elected, lead until the lease is lost, repeat."""
        waiting_logged = False
        while not stop.is_set():
            lease = self.coordinator.acquire(self.holder, self.clock.now_ms())
            if lease is None:
                if not waiting_logged:
                    current = self.coordinator.current()
                    log.info(
                        "standby: %s leads with fence %s",
                        current.holder if current else "?",
                        current.fence if current else "?",
                    )
                    waiting_logged = True
                stop.wait(self.config.standby_poll_ms / 1000)
                continue
            waiting_logged = False
            log.info("leading with fence %d", lease.fence)
            self.lease = lease
            try:
                self._lead(stop)
            finally:
                if self.lease is not None and stop.is_set():
                    self.coordinator.release(self.lease)
                    log.info("released leadership (fence %d)", self.lease.fence)
                self.lease = None

    def _lead(self, stop: threading.Event) -> None:
        cfg = self.config
        assert self.lease is not None
        fence = self.lease.fence
        now = self.clock.now_ms()
        wheel = native.TimingWheel(now)
        next_reload = now
        next_renew = now + cfg.renew_every_ms
        next_change_poll = now + cfg.change_poll_ms
        token = self.store.change_token()
        while not stop.is_set():
            now = self.clock.now_ms()
            if now >= next_renew:
                renewed = self.coordinator.renew(self.lease, now)
                if renewed is None:
                    log.warning("lost leadership (fence %d): another node took over", fence)
                    return
                self.lease = renewed
                next_renew = now + cfg.renew_every_ms
            if now >= self.lease.expires_at_ms:
                # Could not renew in time: stop sending before someone else leads.
                log.warning("lease expired unrenewed (fence %d)", fence)
                return
            if now >= next_change_poll:
                next_change_poll = now + cfg.change_poll_ms
                new_token = self.store.change_token()
                if new_token != token:
                    token = new_token
                    next_reload = now
            if now >= next_reload:
                self._reload(wheel, fence, now)
                next_reload = now + cfg.reload_every_ms
            due = wheel.advance(now)
            if len(due):
                self._dispatch(wheel, due, fence)
            # Sleep to the next tick boundary so ticks do not drift.
            after = self.clock.now_ms()
            self.clock.sleep((cfg.tick_ms - after % cfg.tick_ms) / 1000)

    def _reload(self, wheel: native.TimingWheel, fence: int, now: int) -> None:
        horizon = now + self.config.horizon_ms
        rows = self.store.due_runs(horizon, fence, now)
        handles, due = native.load_page(rows, horizon)
        expired = wheel.insert_batch(handles, due)
        if len(expired):
            self._dispatch(wheel, expired, fence)

    def _dispatch(self, wheel: native.TimingWheel, run_ids: Sequence[int] | np.ndarray, fence: int) -> None:
        now = self.clock.now_ms()
        result = self.store.dispatch([int(r) for r in run_ids], fence, now, next_run)
        if result.rows:
            self.dispatcher.publish(native.encode_batch(result.rows, fence, now))
            if self.on_dispatch is not None:
                for row in result.rows:
                    self.on_dispatch(_event(row, now, fence))
        horizon = now + self.config.horizon_ms
        soon = [(r, d) for r, d in result.next_runs if d < horizon]
        if soon:
            handles, due = native.load_page(soon, horizon)
            expired = wheel.insert_batch(handles, due)
            if len(expired):
                self._dispatch(wheel, expired, fence)


def _event(row: DispatchRow, now: int, fence: int) -> RunDispatched:
    run_id, job_id, run_at_ms, due_ms, _, attempt, _ = row
    return RunDispatched(job_id, run_id, run_at_ms, due_ms, now, fence, attempt)
