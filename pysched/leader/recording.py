"""Recording: telling the store what was handed on, with the next runs the
core planned for it, so that the watermarks move.

Off the tick thread in production: a burst's 50,000 store writes must not
hold up the next fire. Batches are recorded in the order they were sent."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from pysched.leader.config import BatchDispatched, LeaderConfig, RunDispatched
from pysched.planning import plan_after_dispatch, planned_before
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


@dataclass
class _Hold:
    """What the runs one recording planned ask of the marks of the batches
    sent before the tick knew of them (_held_marks)."""

    # Per partition, the earliest due of those runs.
    first_due: dict[int, int]
    # The number of the first batch sent after the tick took the runs (its
    # marks count them); None until it takes them.
    known_from: int | None = None


# Jobs are read and planned this many at a time: a burst of 50,000 one-shots
# would otherwise hold 50,000 parsed job definitions at once.
_PLAN_SLICE = 2_000


def _plan(store: ScheduleStore, rows: Sequence[Run], now_ms: int) -> NextRuns:
    """What follows ``rows``, planned a slice of jobs at a time; a job's
    runs are all in one slice, in the order sent."""
    by_job: dict[str, list[Run]] = {}
    for row in rows:
        by_job.setdefault(row.job_id, []).append(row)
    ids = list(by_job)
    planned = NextRuns([], [])
    for start in range(0, len(ids), _PLAN_SLICE):
        sliced = ids[start : start + _PLAN_SLICE]
        sliced_rows = [row for job_id in sliced for row in by_job[job_id]]
        jobs = store.planning_state(sliced)
        part = plan_after_dispatch(sliced_rows, jobs, now_ms)
        planned.runs.extend(part.runs)
        planned.completed.extend(part.completed)
        planned.planned_from.update(part.planned_from)
        planned.stored_before.extend(planned_before(sliced_rows, jobs))
    return planned


@dataclass(frozen=True)
class _Queued:
    number: int  # batches are numbered as submitted, from 0
    batch: SentBatch


def record_sent(
    store: ScheduleStore, rows: Sequence[Run], fences: Fences, marks: Mapping[int, int], now_ms: int
) -> list[Run]:
    """Record ``rows`` handed on at ``now_ms``: the store is read for their
    jobs, the core plans what follows them, the store records both in one
    write. Returns the next runs stored, and those an earlier recording of
    the same runs stored (planning.planned_before)."""
    next_runs = _plan(store, rows, now_ms)
    planned = [*next_runs.runs, *next_runs.stored_before]
    held = held_below(marks, first_due((nxt.partition, nxt.run.due_ms) for nxt in planned))
    return store.finish_dispatch(rows, fences, held, now_ms, next_runs)


def first_due(runs: Iterable[tuple[int, int]]) -> dict[int, int]:
    """Per partition, the earliest due of ``runs`` (partition, due)."""
    out: dict[int, int] = {}
    for partition, due in runs:
        if due < out.get(partition, due + 1):
            out[partition] = due
    return out


def held_below(marks: Mapping[int, int], first: Mapping[int, int]) -> dict[int, int]:
    """``marks``, each held below the earliest run ``first`` names in its
    partition. A watermark moved past a run not yet sent hides it from
    every later read of the partition: its leader's next reload drops it
    (from the catch-up lane too) as gone, a successor never reads it, and a
    recurring job whose next run it was never runs again. Such a run is
    one the core planned, due in the past, after the marks were asked: a
    catch-up replay's next missed time, or the next run of a run whose
    recording came late (the store refusing writes while reads went on)."""
    held = dict(marks)
    for partition, due in first.items():
        mark = held.get(partition)
        if mark is not None and due <= mark:
            held[partition] = due - 1
    return held


class Recorder:
    def __init__(
        self,
        store: ScheduleStore,
        config: LeaderConfig,
        on_dispatch: Callable[[RunDispatched], None] | None = None,
        on_batch: Callable[[BatchDispatched], None] | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.on_dispatch = on_dispatch
        self.on_batch = on_batch
        self._lock = threading.Lock()
        self._batches: collections.deque[_Queued] = collections.deque()
        self._submitted = 0  # the number of the next batch submitted
        self._work = threading.Event()  # set when a batch is submitted
        self._told = False  # whether observers heard of the first batch
        self._failures = 0
        self._retry_at = 0
        # The runs each recorded batch planned, for the tick to take.
        self._planned: collections.deque[tuple[list[Run], _Hold]] = collections.deque()
        # Their holds, until no batch left to record was sent before the
        # tick took them: each such batch's marks are held below them.
        self._holds: collections.deque[_Hold] = collections.deque()

    def submit(self, batch: SentBatch) -> None:
        with self._lock:
            self._batches.append(_Queued(self._submitted, batch))
            self._submitted += 1
        self._work.set()

    def take_planned(self) -> list[list[Run]]:
        """What recording planned since the last call, for the tick: the
        marks of every batch it submits from here count these runs."""
        with self._lock:
            for _, hold in self._planned:
                hold.known_from = self._submitted
            taken = [runs for runs, _ in self._planned]
            self._planned.clear()
        return taken

    def _held_marks(self, queued: _Queued) -> dict[int, int]:
        """The batch's marks, held below the runs planned after it was sent
        and not yet sent themselves, for all the tick knew then."""
        marks = dict(queued.batch.marks)
        with self._lock:
            # Taken in order, so known_from only grows along the queue (None
            # at its tail): what is left after the head is dropped counts.
            while self._holds and (known := self._holds[0].known_from) is not None and known <= queued.number:
                self._holds.popleft()
            holds = [hold.first_due for hold in self._holds]
        for first in holds:
            marks = held_below(marks, first)
        return marks

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
            queued = self._batches[0] if self._batches else None
        if queued is None or now < self._retry_at:
            return False
        batch = queued.batch
        if not self._told:
            # Observers hear of a batch here, not on the tick thread: a log
            # line per run of a 25,000-run burst would delay the next.
            self._tell(batch)
            self._told = True
        try:
            planned = record_sent(self.store, batch.rows, batch.fences, self._held_marks(queued), batch.sent_at)
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
        # recorder idle finds what it planned in what it planned too.
        with self._lock:
            if planned:
                hold = _Hold(first_due((run.partition, run.due_ms) for run in planned))
                self._planned.append((planned, hold))
                self._holds.append(hold)
            self._batches.popleft()
        return True

    def drop(self) -> int:
        """Give up what is left (stopping, the store unreachable): a
        successor sends those runs again. How many batches were dropped."""
        with self._lock:
            dropped = len(self._batches)
            self._batches.clear()
        self.take_planned()  # under fences no longer led: a successor reads them
        return dropped

    def _tell(self, batch: SentBatch) -> None:
        if self.on_batch is not None and batch.rows:
            self.on_batch(BatchDispatched(batch.rows, batch.sent_at))
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
