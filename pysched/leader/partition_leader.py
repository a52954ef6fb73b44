"""The partition leader: its parts, the tick that joins them, and the threads
that run them in production (SyncDriver runs them on one thread instead)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from pysched.clock import Clock
from pysched.leader.cache import RunCache
from pysched.leader.config import BatchDispatched, LeaderConfig, RunDispatched
from pysched.leader.firing import Publisher
from pysched.leader.guard import ranges
from pysched.leader.leases import LeaseKeeper
from pysched.leader.loading import Loader
from pysched.leader.recording import Recorder, SentBatch
from pysched.leader.sweeping import Sweeper
from pysched.protocols import Coordinator, Dispatcher, Run, ScheduleStore

log = logging.getLogger("pysched.leader")

# A stopping leader gives up recording what it sent after this many failed
# attempts: its successor sends those runs again.
_ATTEMPTS_WHEN_STOPPING = 4


class PartitionLeader:
    """Leads the partitions its coordinator grants: loads their runs into
    the wheel, fires them through the dispatcher under their fences, and
    records them. Each part does one bounded piece of work per step:

    - ``leases.step``: one coordinator poll;
    - ``loader.step``: at most one store read;
    - ``tick``: act on what the others produced and fire what is due;
    - ``recorder.step``: record one sent batch;
    - ``sweeper.step``: at most one sweep for runs owed again.
    """

    def __init__(
        self,
        store: ScheduleStore,
        coordinator: Coordinator,
        dispatcher: Dispatcher,
        clock: Clock,
        holder: str,
        config: LeaderConfig | None = None,
        on_dispatch: Callable[[RunDispatched], None] | None = None,
        on_batch: Callable[[BatchDispatched], None] | None = None,
    ) -> None:
        self.clock = clock
        self.holder = holder
        self.config = cfg = config or LeaderConfig()
        self.fences: dict[int, int] = {}  # what the tick acts on
        self.leases = LeaseKeeper(coordinator, holder)
        self.cache = RunCache(clock.now_ms(), cfg.catch_up_rate)
        self.lane = self.cache.lane
        self.loader = Loader(store, cfg, lambda: self.fences, lambda: self.cache.generation)
        self.publisher = Publisher(dispatcher, cfg)
        self.recorder = Recorder(store, cfg, on_dispatch, on_batch)
        self.sweeper = Sweeper(store, cfg, lambda: self.fences)
        self._next_watermark = 0
        self._standby_logged = False

    # -- the tick -------------------------------------------------------------

    def tick(self, now: int) -> bool:
        """Take what the coordinator granted, what was loaded and what was
        planned; fire what is due by ``now``; now and then tell the store
        that quiet partitions have nothing left to send. Whether it fired."""
        # Read before the grant: answered, the grant is at least that answer.
        answered = self.leases.answered
        owned = self.leases.granted(now)
        if owned != self.fences and self._take(owned):
            self.loader.reload_all()
        if not self.fences and answered and not self._standby_logged:
            # Said once each time it comes to lead nothing, from the start
            # too (a node that never led would otherwise never say so).
            log.info("standby: partitions led by %s", ", ".join(self.leases.leader_names()) or "nobody yet")
            self._standby_logged = True
        if not self.fences:
            # Planned under fences no longer led: their next leader reads
            # them from the store.
            self.recorder.take_planned()
            return False
        self._take_loaded()
        horizon = now + self.config.horizon_ms
        for runs in self.recorder.take_planned():
            # Due, they are taken in this tick, before any mark is asked (or
            # wait as overdue, which holds every mark back: _mark_quiet).
            self.cache.add_planned(runs, self.fences, horizon)
        had_overdue = self.cache.has_overdue
        rows = self.cache.take_due(now, self.fences, had_overdue and self.publisher.retry_due(now))
        late_before = now - self.config.catch_up_after_ms
        late = [row for row in rows if row.due_ms < late_before]
        if late:
            # Filtered again only when some are late: each pass over a
            # 50,000-run burst adds 1.5 ms to its fire lag.
            self.lane.add(late)
            rows = [row for row in rows if row.due_ms >= late_before]
        replays = self.lane.take(now) if self.lane and self.publisher.retry_due(now) else []
        rows += replays
        if rows:
            self._fire(rows, now)
        if now >= self._next_watermark and self._mark_quiet(now):
            self._next_watermark = now + self.config.watermark_every_ms
        return bool(rows)

    def _take(self, owned: dict[int, int]) -> bool:
        """Act on what the coordinator granted; True when partitions were gained."""
        lost = [p for p in self.fences if self.fences[p] != owned.get(p)]
        gained = {p: f for p, f in owned.items() if self.fences.get(p) != f}
        if lost:
            log.warning("no longer leading partitions %s", ranges(lost))
            self.cache.forget(set(lost))
        if gained:
            self._standby_logged = False
            fences = sorted(set(gained.values()))
            span = str(fences[0]) if len(fences) == 1 else f"{fences[0]}..{fences[-1]}"
            log.info("leading partitions %s with fences %s", ranges(gained), span)
        self.fences = dict(owned)
        return bool(gained)

    def _take_loaded(self) -> None:
        while not self.loader.loaded.empty():
            self.cache.apply(self.loader.loaded.get_nowait(), self.fences)

    def _fire(self, rows: list[Run], now: int) -> None:
        fences = dict(self.fences)
        if not self.publisher.publish(rows, fences, now):
            self.cache.put_back(rows)  # nothing moved past them
            return
        self.cache.sent(rows)
        self.recorder.submit(SentBatch(rows, fences, self._marks(fences, now), now))

    def _marks(self, fences: dict[int, int], now: int) -> dict[int, int]:
        """The cache's marks, but none for a partition with runs waiting in
        the catch-up lane: unsent, they must stay ahead of its watermark.
        (Runs planned after these marks are asked, and due before them, are
        held ahead by the recorder: Recorder._held_marks.)"""
        return {p: mark for p, mark in self.cache.marks(fences, now).items() if not self.lane.holds(p)}

    def _mark_quiet(self, now: int) -> bool:
        """Tell the store nothing of the partitions read is left unsent up
        to now, so the watermarks of quiet partitions keep up too; queued
        behind the batches being recorded."""
        if self.recorder.busy or self.cache.has_overdue or not self.fences:
            return False
        fences = dict(self.fences)
        self.recorder.submit(SentBatch([], fences, self._marks(fences, now), now))
        return True

    # -- stopping -------------------------------------------------------------

    def hand_over(self) -> None:
        """Stop leading, cleanly: what was sent gets recorded (or given up
        after a few failures), the watermarks move up to now so that the
        successor starts from here, and the partitions are released."""
        self._mark_quiet(self.clock.now_ms())
        while self.recorder.busy and self.recorder.failures < _ATTEMPTS_WHEN_STOPPING:
            if not self.recorder.step(self.clock.now_ms()):
                self.clock.sleep(0.05)
        dropped = self.recorder.drop()
        if dropped:
            log.warning("gave up recording %d sent batches: the next leader sends them again", dropped)
        self.leases.release()
        if self.fences:
            log.info("released leadership of %d partitions", len(self.fences))
        self.fences = {}

    # -- production: a thread per part -----------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Poll, load and record in threads of their own; tick in this one."""
        cfg = self.config
        parts = [
            threading.Thread(
                target=self._repeat,
                args=(self.leases.step, cfg.coordinate_every_ms, stop),
                name="pysched-coordinator",
                daemon=True,
            ),
            threading.Thread(
                target=self._repeat,
                args=(self.loader.step, cfg.change_poll_ms, stop),
                name="pysched-loader",
                daemon=True,
            ),
            threading.Thread(
                target=self._repeat,
                args=(self.sweeper.step, min(cfg.sweep_every_ms, 1_000), stop),
                name="pysched-sweeper",
                daemon=True,
            ),
            threading.Thread(target=self._record_loop, args=(stop,), name="pysched-recorder", daemon=True),
        ]
        for t in parts:
            t.start()
        try:
            while not stop.is_set():
                self.tick(self.clock.now_ms())
                if not self.fences:
                    self.clock.sleep(cfg.standby_poll_ms / 1000)
                    continue
                # Sleep to the next tick boundary so ticks do not drift.
                self.clock.sleep((cfg.tick_ms - self.clock.now_ms() % cfg.tick_ms) / 1000)
        finally:
            stop.set()
            for t, wait_s in zip(parts, (10, 30, 30, 60), strict=True):
                t.join(wait_s)  # the recorder last: what was sent gets recorded
            self.hand_over()

    def _repeat(self, step: Callable[[int], bool], every_ms: int, stop: threading.Event) -> None:
        while not stop.is_set():
            step(self.clock.now_ms())
            stop.wait(every_ms / 1000)

    def _record_loop(self, stop: threading.Event) -> None:
        while True:
            recorded = self.recorder.step(self.clock.now_ms())
            if stop.is_set() and (not self.recorder.busy or self.recorder.failures >= _ATTEMPTS_WHEN_STOPPING):
                return
            if not recorded:
                self.recorder.wait_for_work(0.1)
