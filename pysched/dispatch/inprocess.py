"""The embedded dispatcher: a queue inside the node.

Durability comes from the store, not from here: the runs were marked
dispatched in the store before ``publish``; if the process dies with payloads
still queued, the next leader hands those runs on again.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence


class InProcessDispatcher:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._closed = False

    def publish(self, payloads: Sequence[bytes]) -> None:
        if self._closed:
            raise RuntimeError("dispatcher is closed")
        for payload in payloads:
            self._queue.put(payload)

    def consume(self, timeout_s: float) -> bytes | None:
        try:
            return self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def close(self) -> None:
        self._closed = True

    def qsize(self) -> int:
        return self._queue.qsize()
