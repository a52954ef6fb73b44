"""Recording: telling the store what was handed on, with the next runs the
core planned for it, so that the watermarks move.

Off the tick thread in production: a burst's 50,000 store writes must not
hold up the next fire. Batches are recorded in the order they were sent."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pysched.leader.config import LeaderConfig, RunDispatched
from pysched.planning import plan_after_dispatch
from pysched.protocols import Fences, NextRuns, Run, ScheduleStore

log = logging.getLogger("pysched.leader")


@dataclass(frozen=True)
class SentBatch:
    """Runs handed on at ``sent_at`` (none: a quiet mark), and how far each
    partition's watermark may move once they are recorded."""

    rows: list[Run]
    fences: dict[int, int]
    marks: dict[int, int]
    sent_at: int
    # Partitions of the rows sent past their due time by more than a
    # settle: catch-up replays, whose next runs may be planned due in the
    # past (see PartitionLeader._marks).
    overdue: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Planned:
    """What recording a batch planned, for the tick to take into the cache."""

    runs: list[Run]
    overdue: frozenset[int]


def record_sent(
    store: ScheduleStore, rows: Sequence[Run], fences: Fences, marks: Mapping[int, int], now_ms: int
) -> list[Run]:
    """Record ``rows`` handed on at ``now_ms``: the store is read once for
    their jobs, the core plans what follows them, the store records both.
    Returns the next runs stored."""
    jobs = store.planning_state({row.job_id for row in rows}) if rows else {}
    next_runs = plan_after_dispatch(rows, jobs, now_ms)
    return store.finish_dispatch(rows, fences, marks_before(marks, next_runs), now_ms, next_runs)


def marks_before(marks: Mapping[int, int], next_runs: NextRuns) -> dict[int, int]:
    """``marks``, each held below the next runs planned in its partition.
    A catch-up replay plans its next run due in the past, while the batch
    that sent the one before may carry a mark up to now (the catch-up lane
    held nothing of the partition when it was sent): a watermark moved past
    that run hides it from every later read of the partition, and the run,
    dropped from the lane as gone at the next reload, would never be sent."""
    held = dict(marks)
    for nxt in next_runs.runs:
        mark = held.get(nxt.partition)
        if mark is not None and nxt.run.due_ms <= mark:
            held[nxt.partition] = nxt.run.due_ms - 1
    return held


class Recorder:
    def __init__(
        self,
        store: ScheduleStore,
        config: LeaderConfig,
        on_dispatch: Callable[[RunDispatched], None] | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.on_dispatch = on_dispatch
        self._lock = threading.Lock()
        self._batches: collections.deque[SentBatch] = collections.deque()
        self._work = threading.Event()  # set when a batch is submitted
        self._told = False  # whether observers heard of the first batch
        self._failures = 0
        self._retry_at = 0
        # The runs each recorded batch planned, for the tick to load.
        self.planned: collections.deque[Planned] = collections.deque()

    def submit(self, batch: SentBatch) -> None:
        with self._lock:
            self._batches.append(batch)
        self._work.set()

    def wait_for_work(self, timeout_s: float) -> None:
        """Block until a batch is submitted or ``timeout_s`` passed (the
        production thread, between steps that recorded nothing)."""
        self._work.wait(timeout_s)
        self._work.clear()

    @property
    def busy(self) -> bool:
        """Whether batches wait to be recorded."""
        with self._lock:
            return bool(self._batches)

    @property
    def failures(self) -> int:
        return self._failures

    def step(self, now: int) -> bool:
        """One attempt at recording the oldest batch; whether it was
        recorded. A failure is tried again after a backoff, for as long as it
        takes: the runs are out, and giving up would leave their jobs
        unplanned."""
        with self._lock:
            batch = self._batches[0] if self._batches else None
        if batch is None or now < self._retry_at:
            return False
        if not self._told:
            # Observers hear of a batch here, not on the tick thread: a log
            # line per run of a 25,000-run burst would delay the next.
            self._tell(batch)
            self._told = True
        try:
            planned = record_sent(self.store, batch.rows, batch.fences, batch.marks, batch.sent_at)
        except Exception as exc:
            self._failures += 1
            delay = self.config.backoff_ms(self._failures)
            self._retry_at = now + delay
            log.warning(
                "recording %d sent runs failed (%s: %s); retrying in %d ms",
                len(batch.rows),
                type(exc).__name__,
                exc,
                delay,
            )
            return False
        self._failures = 0
        self._told = False
        # Planned before the batch leaves the queue: a tick that finds the
        # recorder idle finds what it planned in ``planned`` too.
        self.planned.append(Planned(planned, batch.overdue))
        with self._lock:
            self._batches.popleft()
        return True

    def drop(self) -> int:
        """Give up what is left (stopping, the store unreachable): a
        successor sends those runs again. How many batches were dropped."""
        with self._lock:
            dropped = len(self._batches)
            self._batches.clear()
        return dropped

    def _tell(self, batch: SentBatch) -> None:
        if self.on_dispatch is None:
            return
        for row in batch.rows:
            self.on_dispatch(
                RunDispatched(
                    row.job_id,
                    row.run_id,
                    row.run_at_ms,
                    row.due_ms,
                    batch.sent_at,
                    batch.fences[row.partition],
                    row.attempt,
                )
            )
