"""The partition leader: store -> timing wheel -> dispatcher, under fences.

A node's leader polls its coordinator for the partitions it leads, each with
a fence. For those partitions it loads the next ``horizon`` of runs into the
native wheel every ``reload_every`` (and at once when jobs change), ticks
every 10 ms, and hands due runs on in batches:

1. ``dispatcher.publish``: returns once the records are handed on (Kafka:
   acknowledged by the broker; in process: queued);
2. ``store.finish_dispatch``: the runs are recorded as handed on, the next
   runs of recurring jobs planned, and only then do the partitions'
   watermarks move past the batch.

A crash anywhere in between makes the next leader send a run again, never
lose it; the workers' idempotency claim turns that into one effect. The wheel
is a cache of the store: a reload that overlaps fires nothing twice, and a run
that disappeared from the store (cancelled, rescheduled) leaves the wheel.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import numpy as np

from pysched import native
from pysched.clock import Clock
from pysched.planning import next_run
from pysched.protocols import (
    NEAR_MS,
    SETTLE_MS,
    Coordinator,
    Dispatcher,
    Run,
    ScheduleStore,
)

log = logging.getLogger("pysched.leader")
T = TypeVar("T")


@dataclass(frozen=True)
class LeaderConfig:
    horizon_ms: int = 60_000
    reload_every_ms: int = 30_000
    tick_ms: int = 10
    change_poll_ms: int = 100
    coordinate_every_ms: int = 1_000
    # How often quiet partitions' watermarks are moved up to now: what a new
    # leader may send again after a failover.
    watermark_every_ms: int = 5_000
    standby_poll_ms: int = 500
    retry_backoff_ms: tuple[int, ...] = (100, 200, 500, 1_000, 2_000, 5_000)
    # False coordinates and records from the tick loop itself: deterministic
    # under a simulated clock (test hook), but a slow backend then delays ticks.
    threads: bool = True

    def __post_init__(self) -> None:
        # Registrations due later than NEAR_MS send no change notice: the
        # periodic reload must come round before they are due.
        if self.reload_every_ms >= NEAR_MS or self.horizon_ms < NEAR_MS:
            raise ValueError(
                f"reload_every_ms must be under {NEAR_MS} and horizon_ms at least {NEAR_MS}:"
                " runs registered further ahead are found by the periodic reload alone"
            )


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
        self.fences: dict[int, int] = {}  # what the tick loop acts on
        self._owned: dict[int, int] = {}  # what the coordinator last granted
        self._granted_at = 0  # when the poll that granted it began
        self._unanswered_logged = False
        self._owned_lock = threading.Lock()
        self._wheel = native.TimingWheel(clock.now_ms())
        # run_id -> the row to send, for the runs in the wheel: kept in the
        # shape the codec takes, so a burst converts nothing when it fires.
        self._pending: dict[int, Run] = {}
        # Runs handed on that the store may still return: a reload that finds
        # one again at the same attempt (its watermark trails, its record is
        # still being written) must not resend it; at a later attempt (its
        # worker's lease died, a new fence) it is a new delivery.
        self._sent: dict[int, tuple[int, int]] = {}  # run_id -> (attempt, partition)
        # Runs due but not yet handed on (overdue when loaded, or a failed
        # publish), by run id: a reload during an outage finds them again and
        # must not queue a second copy.
        self._retry: dict[int, Run] = {}
        self._failures = 0
        self._retry_at = 0
        self._standby_logged = False
        # Recording what was sent (next runs, watermarks) happens off the tick
        # thread: a burst's 50,000 store writes must not hold up the next fire.
        self._to_finish: queue.SimpleQueue[tuple[list[Run], dict[int, int], dict[int, int], int]] = queue.SimpleQueue()
        self._finished: queue.SimpleQueue[list[Run]] = queue.SimpleQueue()
        self._unfinished = 0
        self._unfinished_lock = threading.Lock()
        # Loading happens off the tick thread too: reading 25,000 rows from the
        # store must not sit between two ticks. The loader hands what it read
        # to the tick thread, which alone touches the wheel.
        self._loaded: queue.SimpleQueue[_Loaded] = queue.SimpleQueue()
        self._reload_all = threading.Event()
        self._next_reload = self._next_change_poll = 0
        self._versions: dict[int, int] = {}
        # Runs the finisher planned, by the number of the hand-over that
        # brought them: a load that began before they existed must not take
        # their absence from it for a cancellation.
        self._generation = 0
        self._born: dict[int, int] = {}
        # Per partition led under its current fence, when the last read of it
        # that reached the wheel began: every run of the partition the store
        # held then, due by then, has been sent once the ticks pass it. A
        # watermark moves no further (less SETTLE_MS), and not at all for a
        # partition not yet read: its predecessor's unsent runs lie there.
        self._read_at: dict[int, int] = {}

    # -- the loops ------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Coordinate in a thread of its own; tick in this one."""
        coordinating = loading = finishing = None
        if self.config.threads:
            coordinating = threading.Thread(
                target=self._coordinate_loop, args=(stop,), name="pysched-coordinator", daemon=True
            )
            coordinating.start()
            loading = threading.Thread(target=self._load_loop, args=(stop,), name="pysched-loader", daemon=True)
            loading.start()
            finishing = threading.Thread(target=self._finish_loop, args=(stop,), name="pysched-finisher", daemon=True)
            finishing.start()
        try:
            self._tick_loop(stop)
        finally:
            stop.set()
            if coordinating is not None:
                coordinating.join(10)
            if loading is not None:
                loading.join(30)
            if finishing is not None:
                finishing.join(60)  # what was sent gets recorded before we let go
            # A clean hand-over: the successor starts from here, not from the
            # last periodic watermark.
            self._mark_quiet(self.clock.now_ms(), inline=True)
            self._guard(lambda: self.coordinator.release(self.holder))
            if self.fences:
                log.info("released leadership of %d partitions", len(self.fences))
            self.fences = {}

    def _coordinate_loop(self, stop: threading.Event) -> None:
        # Leases are kept apart from the ticks: a slow coordinator call never
        # delays a fire, and a paused process wakes up ticking (its stale
        # sends are what the fences are for).
        while not stop.is_set():
            self._coordinate()
            stop.wait(self.config.coordinate_every_ms / 1000)

    def _coordinate(self) -> None:
        began = self.clock.now_ms()
        owned = self._guard(lambda: self.coordinator.poll(self.holder, began))
        if owned is not None:
            with self._owned_lock:
                self._owned = owned
                self._granted_at = began

    def _granted(self, now: int) -> dict[int, int]:
        """What the coordinator granted, while its answer holds: past that,
        another node may lead these partitions, and this one stops sending
        until the coordinator answers again."""
        with self._owned_lock:
            owned, granted_at = self._owned, self._granted_at
        if not owned or now < granted_at + self.coordinator.answer_valid_ms:
            self._unanswered_logged = False
            return owned
        if not self._unanswered_logged:
            log.error(
                "no answer from the coordinator for %.1f s: stopped leading %d partitions until it answers",
                (now - granted_at) / 1000,
                len(owned),
            )
            self._unanswered_logged = True
        return {}

    def _tick_loop(self, stop: threading.Event) -> None:
        cfg = self.config
        next_coordinate = next_watermark = 0
        while not stop.is_set():
            now = self.clock.now_ms()
            if not cfg.threads and now >= next_coordinate:
                next_coordinate = now + cfg.coordinate_every_ms
                self._coordinate()
            owned = self._granted(now)
            if owned != self.fences and self._take(owned):
                self._reload_all.set()
            if not self.fences:
                self.clock.sleep(cfg.standby_poll_ms / 1000)
                continue
            if not cfg.threads:
                self._load(now)
            self._take_loaded()
            self._take_finished()
            due = self._wheel.advance(now)
            if len(due) or (self._retry and now >= self._retry_at):
                self._dispatch(due)
            if now >= next_watermark and self._mark_quiet(now, inline=not cfg.threads):
                next_watermark = now + cfg.watermark_every_ms
            after = self.clock.now_ms()
            # Sleep to the next tick boundary so ticks do not drift.
            self.clock.sleep((cfg.tick_ms - after % cfg.tick_ms) / 1000)

    def _guard(self, call: Callable[[], T]) -> T | None:
        """Run a backend call; a failure is logged and retried on a later tick."""
        try:
            return call()
        except Exception as exc:
            log.warning("backend call failed, will retry: %s: %s", type(exc).__name__, exc)
            return None

    def _take(self, owned: dict[int, int]) -> bool:
        """Act on what the coordinator granted; True when partitions were gained."""
        lost = [p for p in self.fences if self.fences[p] != owned.get(p)]
        gained = {p: f for p, f in owned.items() if self.fences.get(p) != f}
        if lost:
            log.warning("no longer leading partitions %s", _ranges(lost))
            self._forget(set(lost))
        if gained:
            self._standby_logged = False
            fences = sorted(set(gained.values()))
            span = str(fences[0]) if len(fences) == 1 else f"{fences[0]}..{fences[-1]}"
            log.info("leading partitions %s with fences %s", _ranges(gained), span)
        self.fences = dict(owned)
        if not owned:
            self._log_standby()
        return bool(gained)

    def _log_standby(self) -> None:
        if not self._standby_logged:
            leaders = self._guard(self.coordinator.leaders) or {}
            holders = sorted({lease.holder for lease in leaders.values()})
            log.info("standby: partitions led by %s", ", ".join(holders) or "nobody yet")
            self._standby_logged = True

    def _forget(self, partitions: set[int]) -> None:
        # What was read and sent under the old fence counts for nothing under
        # a new one: those sends met (or will meet) the workers' fence check.
        for p in partitions:
            self._read_at.pop(p, None)
        self._sent = {r: s for r, s in self._sent.items() if s[1] not in partitions}
        for run_id in [r for r, row in self._pending.items() if row.partition in partitions]:
            self._wheel.cancel(run_id)
            del self._pending[run_id]
        self._retry = {r: row for r, row in self._retry.items() if row.partition not in partitions}

    # -- loading --------------------------------------------------------------

    def _load_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if self.fences:
                self._load(self.clock.now_ms())
            stop.wait(self.config.change_poll_ms / 1000)

    def _load(self, now: int) -> None:
        """Read what the wheel should hold: every ``reload_every``, at once
        after gaining partitions, and for the partitions whose jobs changed."""
        cfg = self.config
        fences = self.fences  # replaced, never changed in place, by the tick thread
        if not fences:
            return
        if self._reload_all.is_set() or now >= self._next_reload:
            self._reload_all.clear()
            if self._guard(partial(self._read, fences, now, True)):
                self._next_reload = now + cfg.reload_every_ms
            else:
                self._reload_all.set()
            return
        if now < self._next_change_poll:
            return
        self._next_change_poll = now + cfg.change_poll_ms
        versions = self._guard(self.store.change_versions)
        if versions is None:
            return
        changed = {p: f for p, f in fences.items() if versions.get(p) != self._versions.get(p)}
        if not changed or self._guard(partial(self._read, changed, now, False)):
            self._versions = versions

    def _read(self, fences: dict[int, int], now: int, idle: bool) -> bool:
        generation = self._generation
        horizon = now + self.config.horizon_ms
        rows = self.store.due_runs(fences, horizon, now)
        self._loaded.put(_Loaded(fences, rows, horizon, generation, idle, now))
        return True

    def _take_loaded(self) -> None:
        while True:
            try:
                loaded = self._loaded.get_nowait()
            except queue.Empty:
                return
            self._apply(loaded)

    def _apply(self, loaded: _Loaded) -> None:
        # Partitions lost (or led again under a new fence) since the read
        # are not this load's to touch.
        fences = {p: f for p, f in loaded.fences.items() if self.fences.get(p) == f}
        rows = [row for row in loaded.rows if row.partition in fences]
        fresh = {row.run_id for row in rows}
        # Runs that left the store (cancelled, rescheduled) leave the wheel;
        # runs planned after the read began are not in it and stay.
        gone = [
            r
            for r, row in self._pending.items()
            if row.partition in fences and r not in fresh and self._born.get(r, -1) <= loaded.generation
        ]
        for run_id in gone:
            self._wheel.cancel(run_id)
            del self._pending[run_id]
        self._add([row for row in rows if self._sent.get(row.run_id, _UNSENT)[0] != row.attempt], loaded.horizon)
        for p in fences:
            self._read_at[p] = max(self._read_at.get(p, loaded.read_at), loaded.read_at)
        if loaded.idle:
            # Forget a sent run only once the store no longer returns it, not
            # after a while: a watermark held back by a slow store would
            # otherwise bring back, and resend, everything sent since.
            read = {row.run_id for row in loaded.rows}
            self._sent = {r: s for r, s in self._sent.items() if r in read or s[1] not in loaded.fences}
            self._born = {r: g for r, g in self._born.items() if r in self._pending}

    def _mark_quiet(self, now: int, inline: bool) -> bool:
        """Tell the store nothing of our partitions is left unsent up to now,
        so the watermarks of quiet partitions keep up too. Queued behind the
        batches being recorded, unless ``inline``."""
        with self._unfinished_lock:
            busy = self._unfinished > 0
        if busy or self._retry or not self.fences:
            return False
        fences = dict(self.fences)
        marks = self._marks(fences, now)
        if not inline:
            self._queue_finish([], fences, marks, now)
            return True
        return self._guard(partial(self.store.finish_dispatch, [], fences, marks, now, next_run)) is not None

    def _marks(self, fences: dict[int, int], now: int) -> dict[int, int]:
        """How far each partition's watermark may move once what was sent by
        ``now`` is recorded (called on the tick thread, after the due runs
        were handed on)."""
        return {p: min(now, self._read_at[p]) - SETTLE_MS for p in fences if p in self._read_at}

    def _add(self, rows: list[Run], horizon: int) -> None:
        self._pending.update((row.run_id, row) for row in rows)
        handles, due = native.load_page(rows, horizon)
        expired = self._wheel.insert_batch(handles, due)
        for run_id in expired.tolist():
            row = self._pending.pop(run_id, None)
            if row is not None:  # a run the store returned twice expires once
                self._retry[run_id] = row

    # -- dispatching ----------------------------------------------------------

    def _dispatch(self, due: np.ndarray) -> None:
        batch = self._retry
        self._retry = {}
        for run_id in due.tolist():
            row = self._pending.pop(run_id, None)
            if row is not None:
                batch[run_id] = row
        fences = dict(self.fences)
        rows = [row for row in batch.values() if row.partition in fences]
        if not rows:
            return
        now = self.clock.now_ms()
        try:
            self.dispatcher.publish(*_encode(rows, fences, now))
        except Exception as exc:
            # Nothing moved past these runs: keep them and try again shortly.
            delay = self.config.retry_backoff_ms[min(self._failures, len(self.config.retry_backoff_ms) - 1)]
            self._failures += 1
            self._retry = {row.run_id: row for row in rows} | self._retry
            self._retry_at = self.clock.now_ms() + delay
            log.warning(
                "dispatch of %d runs failed (%s: %s); retrying in %d ms", len(rows), type(exc).__name__, exc, delay
            )
            return
        self._failures = 0
        self._sent.update((row.run_id, (row.attempt, row.partition)) for row in rows)
        marks = self._marks(fences, now)
        if self.config.threads:
            self._queue_finish(rows, fences, marks, now)
        else:
            self._tell(rows, fences, now)
            self._finished.put(self._finish(rows, fences, marks, now, threading.Event()))
            self._take_finished()

    def _queue_finish(self, sent: list[Run], fences: dict[int, int], marks: dict[int, int], now: int) -> None:
        with self._unfinished_lock:
            self._unfinished += 1
        self._to_finish.put((sent, fences, marks, now))

    def _tell(self, sent: list[Run], fences: dict[int, int], now: int) -> None:
        if self.on_dispatch is not None:
            for row in sent:
                self.on_dispatch(_event(row, now, fences[row.partition]))

    # -- recording ------------------------------------------------------------

    def _finish_loop(self, stop: threading.Event) -> None:
        while True:
            try:
                sent, fences, marks, now = self._to_finish.get(timeout=0.1)
            except queue.Empty:
                if stop.is_set():
                    return
                continue
            try:
                # Observers hear of a batch here, not on the tick thread: a
                # log line per run of a 25,000-run burst would delay the next.
                self._tell(sent, fences, now)
                self._finished.put(self._finish(sent, fences, marks, now, stop))
            finally:
                with self._unfinished_lock:
                    self._unfinished -= 1

    def _finish(
        self, sent: list[Run], fences: dict[int, int], marks: dict[int, int], now: int, stop: threading.Event
    ) -> list[Run]:
        """Record a sent batch, retrying until the store takes it: the runs
        are out, so giving up would leave their jobs unplanned."""
        failures = 0
        while True:
            try:
                return self.store.finish_dispatch(sent, fences, marks, now, next_run)
            except Exception as exc:
                delay = self.config.retry_backoff_ms[min(failures, len(self.config.retry_backoff_ms) - 1)]
                failures += 1
                log.warning(
                    "recording %d sent runs failed (%s: %s); retrying in %d ms",
                    len(sent),
                    type(exc).__name__,
                    exc,
                    delay,
                )
                if stop.wait(delay / 1000) and failures > 3:
                    return []  # stopping: a successor sends these again

    def _take_finished(self) -> None:
        horizon = self.clock.now_ms() + self.config.horizon_ms
        while True:
            try:
                planned = self._finished.get_nowait()
            except queue.Empty:
                return
            self._generation += 1
            # Planned by a batch sent before a partition was lost: its new
            # leader reads them from the store.
            near = [row for row in planned if row.due_ms < horizon and row.partition in self.fences]
            self._born.update(dict.fromkeys([row.run_id for row in near], self._generation))
            self._add(near, horizon)


_UNSENT = (-1, -1)


@dataclass(frozen=True)
class _Loaded:
    """What the loader read, for the tick thread to put in the wheel."""

    fences: dict[int, int]
    rows: list[Run]
    horizon: int
    generation: int  # hand-overs of planned runs taken before the read began
    idle: bool  # a full reload: also the time to prune what the leader keeps
    read_at: int  # the read began no earlier


def _encode(rows: list[Run], fences: dict[int, int], now: int) -> tuple[list[int], list[bytes]]:
    distinct = set(fences.values())
    if len(distinct) == 1:
        # One fence for every partition (the embedded leader): one batch.
        return [r.partition for r in rows], native.encode_batch(rows, distinct.pop(), now)
    by_fence: dict[int, list[Run]] = {}
    for row in rows:
        by_fence.setdefault(fences[row.partition], []).append(row)
    partitions: list[int] = []
    payloads: list[bytes] = []
    for fence, group in by_fence.items():
        partitions.extend(r.partition for r in group)
        payloads.extend(native.encode_batch(group, fence, now))
    return partitions, payloads


def _event(row: Run, now: int, fence: int) -> RunDispatched:
    run_id, job_id, run_at_ms, due_ms, _, attempt, _ = row
    return RunDispatched(job_id, run_id, run_at_ms, due_ms, now, fence, attempt)


def _ranges(partitions: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5': readable logs for 64 partitions."""
    out: list[str] = []
    for p in sorted(partitions):
        if out and out[-1].split("-")[-1] == str(p - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{p}"
        else:
            out.append(str(p))
    return ",".join(out)
