"""Pure-Python twin of the native timing wheel: a heap with lazy deletion.

Same interface and same observable behaviour as ``pysched._native.TimingWheel``:
10 ms ticks, deadlines rounded up, "now" rounded down, expired inserts refused,
re-inserts moving rather than duplicating, output ordered by (due, handle).
"""

from __future__ import annotations

import heapq
from itertools import count

import numpy as np
import numpy.typing as npt

TICK_MS = 10


def deadline_tick(ms: int) -> int:
    return 0 if ms <= 0 else -(-ms // TICK_MS)


def now_tick(ms: int) -> int:
    return 0 if ms <= 0 else ms // TICK_MS


class TimingWheel:
    def __init__(self, now_ms: int) -> None:
        self._elapsed = now_tick(now_ms)
        self._heap: list[tuple[int, int, int, int]] = []  # (tick, due, handle, seq)
        self._live: dict[int, tuple[int, int]] = {}  # handle -> (due, seq)
        self._seq = count()

    def insert(self, handle: int, due_ms: int) -> bool:
        present = self._live.get(handle)
        if present is not None:
            if present[0] == due_ms:
                return True
            del self._live[handle]
        tick = deadline_tick(due_ms)
        if tick <= self._elapsed:
            return False
        seq = next(self._seq)
        self._live[handle] = (due_ms, seq)
        heapq.heappush(self._heap, (tick, due_ms, handle, seq))
        return True

    def insert_batch(self, handles: npt.NDArray[np.int64], due_ms: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        if len(handles) != len(due_ms):
            raise ValueError(f"handles ({len(handles)}) and due_ms ({len(due_ms)}) differ in length")
        expired = [int(h) for h, d in zip(handles, due_ms, strict=True) if not self.insert(int(h), int(d))]
        return np.array(expired, dtype=np.int64)

    def cancel(self, handle: int) -> bool:
        return self._live.pop(handle, None) is not None

    def advance(self, now_ms: int) -> npt.NDArray[np.int64]:
        now = now_tick(now_ms)
        fired: list[tuple[int, int]] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, due, handle, seq = heapq.heappop(heap)
            live = self._live.get(handle)
            if live is not None and live[1] == seq:
                del self._live[handle]
                fired.append((due, handle))
        self._elapsed = max(self._elapsed, now)
        fired.sort()
        return np.array([h for _, h in fired], dtype=np.int64)

    def memory_bytes(self) -> int:
        # Not comparable to the native figure; benchmarks measure with tracemalloc.
        return 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, handle: int) -> bool:
        return handle in self._live
