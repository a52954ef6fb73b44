"""Which records of each Kafka partition a process has taken and not yet
finished, and how far it may commit: up to (not including) the oldest one
still in flight. Records finish in any order (a six-hour run and the short
runs behind it on the same partition); the commit only ever covers records
that are done, so a process that dies has every unfinished record
delivered again (the idempotency claims make a done one a no-op)."""

from __future__ import annotations

import heapq
from collections.abc import Collection


class OffsetTracker:
    def __init__(self) -> None:
        self._in_flight: dict[int, list[int]] = {}  # partition -> offsets taken, a heap
        self._done: dict[int, set[int]] = {}  # finished, not yet below the commit
        self._next: dict[int, int] = {}  # one past the highest offset taken

    def taken(self, partition: int, offset: int) -> None:
        heapq.heappush(self._in_flight.setdefault(partition, []), offset)
        self._next[partition] = max(self._next.get(partition, 0), offset + 1)

    def done(self, partition: int, offset: int) -> int | None:
        """Mark a record finished; the offset to commit for its partition
        when that moved (the next record to read after a restart), else
        None. A record of a partition forgotten meanwhile is ignored."""
        heap = self._in_flight.get(partition)
        if heap is None or offset not in heap:
            return None
        done = self._done.setdefault(partition, set())
        done.add(offset)
        moved = False
        while heap and heap[0] in done:
            done.discard(heapq.heappop(heap))
            moved = True
        if not moved:
            return None
        return heap[0] if heap else self._next[partition]

    def in_flight(self) -> int:
        return sum(len(heap) for heap in self._in_flight.values())

    def forget(self, partitions: Collection[int]) -> None:
        """Partitions taken away (a rebalance): their records are another
        consumer's to deliver again, and their commits no longer ours."""
        for partition in partitions:
            self._in_flight.pop(partition, None)
            self._done.pop(partition, None)
            self._next.pop(partition, None)
