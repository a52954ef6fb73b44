"""The catch-up lane: runs found long overdue (the leader was down, the
partition moved, a job was paused) are handed on after the runs due now,
oldest first, at most ``rate`` a second: recovering from an outage never
starves what is due now, nor floods the workers and the targets.

Touched by the tick alone, as the cache is."""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Collection

from pysched.protocols import Run

_WINDOW_MS = 1_000


class CatchUpLane:
    def __init__(self, rate_per_s: int) -> None:
        self.rate_per_s = rate_per_s
        self._queue: list[tuple[int, int]] = []  # (due_ms, run_id), oldest first
        self._runs: dict[int, Run] = {}  # run_id -> the run, while it waits
        self._by_partition: Counter[int] = Counter()
        # (when, how many) handed on within the last second: the rate is a
        # hard limit over any one-second window, not an average.
        self._sent: deque[tuple[int, int]] = deque()
        self._sent_in_window = 0

    def __len__(self) -> int:
        return len(self._runs)

    def add(self, rows: list[Run]) -> None:
        """Runs to hand on later; one already waiting is not queued twice (a
        reload finds it again while it waits)."""
        for row in rows:
            if row.run_id not in self._runs:
                self._runs[row.run_id] = row
                self._by_partition[row.partition] += 1
                heapq.heappush(self._queue, (row.due_ms, row.run_id))

    def take(self, now: int) -> list[Run]:
        """The oldest runs waiting, as many as the rate allows at ``now``."""
        while self._sent and self._sent[0][0] <= now - _WINDOW_MS:
            self._sent_in_window -= self._sent.popleft()[1]
        room = min(self.rate_per_s - self._sent_in_window, len(self._runs))
        taken: list[Run] = []
        while len(taken) < room and self._queue:
            _, run_id = heapq.heappop(self._queue)
            row = self._runs.pop(run_id, None)
            if row is not None:  # else forgotten with its partition
                self._by_partition[row.partition] -= 1
                taken.append(row)
        if taken:
            self._sent.append((now, len(taken)))
            self._sent_in_window += len(taken)
        return taken

    def holds(self, partition: int) -> bool:
        """Whether runs of ``partition`` wait here: its watermark must not
        pass them, or a successor would never read them."""
        return self._by_partition[partition] > 0

    def __contains__(self, run_id: int) -> bool:
        return run_id in self._runs

    def waiting(self) -> list[Run]:
        return list(self._runs.values())

    def drop(self, run_ids: Collection[int]) -> None:
        """Runs no longer to hand on (their partition lost, or gone from the
        store: cancelled, paused, rescheduled)."""
        for run_id in run_ids:
            row = self._runs.pop(run_id, None)
            if row is not None:
                self._by_partition[row.partition] -= 1

    def forget(self, partitions: Collection[int]) -> None:
        """Partitions lost: their new leader reads these runs itself."""
        self.drop([r for r, row in self._runs.items() if row.partition in partitions])
