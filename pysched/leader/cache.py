"""The wheel and what it holds: a cache of the store's runs for the
partitions led, touched by the tick alone.

A reload that overlaps fires nothing twice, a run that left the store
(cancelled, rescheduled) leaves the wheel, and a run planned after a read
began is not taken for cancelled by that read."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from itertools import repeat

import numpy as np

from pysched import native
from pysched.leader.lane import CatchUpLane
from pysched.leader.loading import Loaded
from pysched.protocols import SETTLE_MS, Run

# Past this many, the runs the recorder planned are pruned of those since
# sent (and twice as many as were kept then): no pass over them all at
# every read of a few partitions.
_BORN_PRUNED_PAST = 4_096


class RunCache:
    def __init__(self, start_ms: int, catch_up_rate: int) -> None:
        self._wheel = native.TimingWheel(start_ms)
        # Runs found long overdue, handed on after those due now (lane.py).
        self.lane = CatchUpLane(catch_up_rate)
        # run_id -> the run, for the runs in the wheel: kept in the shape the
        # codec takes, so a burst converts nothing when it fires.
        self._pending: dict[int, Run] = {}
        # partition -> the ids of its runs put in the wheel, some since taken:
        # a read of a few partitions looks at their runs alone.
        self._put: defaultdict[int, set[int]] = defaultdict(set)
        # Runs handed on that the store may still return: a reload that finds
        # one again at the same attempt (its watermark trails, its record is
        # still being written) must not resend it; at a later attempt (its
        # worker's lease died, a new fence) it is a new delivery.
        self._sent: defaultdict[int, dict[int, int]] = defaultdict(dict)  # partition -> run_id -> attempt
        # Runs due but not yet handed on (overdue when loaded, or a failed
        # publish), by run id: a reload during an outage finds them again and
        # must not queue a second copy.
        self._overdue: dict[int, Run] = {}
        # Runs the recorder planned, by the number of the hand-over that
        # brought them: a load that began before they existed must not take
        # their absence from it for a cancellation.
        self.generation = 0
        self._born: dict[int, int] = {}
        self._born_pruned_past = _BORN_PRUNED_PAST
        # Per partition led under its current fence, when the last read of it
        # that reached the wheel began: every run of the partition the store
        # held then, due by then, has been sent once the ticks pass it. A
        # watermark moves no further (less SETTLE_MS), and not at all for a
        # partition not yet read: its predecessor's unsent runs lie there.
        self._read_at: dict[int, int] = {}

    @property
    def has_overdue(self) -> bool:
        return bool(self._overdue)

    @property
    def waiting(self) -> int:
        """The runs held to hand on: in the wheel, or due and not yet handed
        on (the catch-up lane's are the lane's). Read from other threads
        (metrics): two len() calls, exact enough without a lock."""
        return len(self._pending) + len(self._overdue)

    def apply(self, loaded: Loaded, fences: dict[int, int]) -> None:
        """Put a read in the wheel; ``fences`` are those led now."""
        # Partitions lost (or led again under a new fence) since the read
        # are not this load's to touch.
        current = {p: f for p, f in loaded.fences.items() if fences.get(p) == f}
        rows = [row for row in loaded.rows if row.partition in current]
        fresh = {row.run_id for row in rows}
        # Runs that left the store (cancelled, rescheduled) leave the wheel;
        # runs planned after the read began are not in it and stay.
        for p in current:
            put = {r for r in self._put.get(p, ()) if r in self._pending}
            gone = [r for r in put if r not in fresh and self._born.get(r, -1) <= loaded.generation]
            for run_id in gone:
                self._wheel.cancel(run_id)
                del self._pending[run_id]
            self._put[p] = put.difference(gone)
        self.lane.drop(
            [
                row.run_id
                for row in self.lane.waiting()
                if row.partition in current
                and row.run_id not in fresh
                and self._born.get(row.run_id, -1) <= loaded.generation
            ]
        )
        self._add([row for row in rows if self._sent_attempt(row) != row.attempt], loaded.horizon)
        for p in current:
            self._read_at[p] = max(self._read_at.get(p, loaded.read_at), loaded.read_at)
        if loaded.idle:
            # Forget a sent run only once the store no longer returns it, not
            # after a while: a watermark held back by a slow store would
            # otherwise bring back, and resend, everything sent since.
            read = {row.run_id for row in loaded.rows}
            for p in loaded.fences:
                if p in self._sent:
                    self._sent[p] = {r: a for r, a in self._sent[p].items() if r in read}
        if len(self._born) > self._born_pruned_past:
            self._born = {r: g for r, g in self._born.items() if r in self._pending or r in self.lane}
            self._born_pruned_past = max(_BORN_PRUNED_PAST, 2 * len(self._born))

    def add_planned(self, planned: list[Run], fences: dict[int, int], horizon: int) -> None:
        """The next runs the recorder planned, those due within ``horizon``."""
        self.generation += 1
        # Planned by a batch sent before a partition was lost: its new
        # leader reads them from the store.
        # One already sent or waiting in the catch-up lane (a recording
        # retried after its answer was lost names its runs again) is not
        # queued twice.
        near = [
            row
            for row in planned
            if row.due_ms < horizon
            and row.partition in fences
            and row.run_id not in self._sent.get(row.partition, ())
            and row.run_id not in self.lane
        ]
        self._born.update(dict.fromkeys([row.run_id for row in near], self.generation))
        self._add(near, horizon)

    def take_due(self, now: int, fences: dict[int, int], with_overdue: bool) -> list[Run]:
        """The runs due by ``now`` of the partitions led, once each, taken out
        of the cache; the overdue ones too when ``with_overdue`` (or when any
        run is due: they go in the same batch)."""
        due: np.ndarray = self._wheel.advance(now)
        if not len(due) and not with_overdue:
            return []
        if not self._overdue:
            # Nothing to merge with: pop straight into the batch. A burst's
            # 50,000 runs each cost a dict insert in the merge below (about
            # 3 ms of its fire lag). pop(..., None) still takes a run the
            # wheel returned twice once.
            pop = self._pending.pop
            return [row for row in map(pop, due.tolist(), repeat(None)) if row is not None and row.partition in fences]
        batch = self._overdue
        self._overdue = {}
        for run_id in due.tolist():
            row = self._pending.pop(run_id, None)
            if row is not None:
                batch[run_id] = row
        return [row for row in batch.values() if row.partition in fences]

    def put_back(self, rows: list[Run]) -> None:
        """Runs whose publish failed: first in the next batch."""
        self._overdue = {row.run_id: row for row in rows} | self._overdue

    def sent(self, rows: list[Run]) -> None:
        sent = self._sent
        for row in rows:
            sent[row.partition][row.run_id] = row.attempt

    def _sent_attempt(self, row: Run) -> int:
        by_run = self._sent.get(row.partition)
        return -1 if by_run is None else by_run.get(row.run_id, -1)

    def forget(self, partitions: Collection[int]) -> None:
        """Partitions lost or led under a new fence: what was read and sent
        under the old fence counts for nothing under the new one (those sends
        met, or will meet, the workers' fence check)."""
        self.lane.forget(partitions)
        for p in partitions:
            self._read_at.pop(p, None)
            self._sent.pop(p, None)
            for run_id in self._put.pop(p, ()):
                if self._pending.pop(run_id, None) is not None:
                    self._wheel.cancel(run_id)
        self._overdue = {r: row for r, row in self._overdue.items() if row.partition not in partitions}

    def marks(self, fences: dict[int, int], now: int) -> dict[int, int]:
        """How far each partition's watermark may move once what was sent by
        ``now`` is recorded (asked after the runs due by ``now`` were handed
        on)."""
        return {p: min(now, self._read_at[p]) - SETTLE_MS for p in fences if p in self._read_at}

    def _add(self, rows: list[Run], horizon: int) -> None:
        self._pending.update((row.run_id, row) for row in rows)
        put = self._put
        for run in rows:
            put[run.partition].add(run.run_id)
        handles, due = native.load_page(rows, horizon)
        expired = self._wheel.insert_batch(handles, due)
        for run_id in expired.tolist():
            row = self._pending.pop(run_id, None)
            if row is not None:  # a run the store returned twice expires once
                self._overdue[run_id] = row
