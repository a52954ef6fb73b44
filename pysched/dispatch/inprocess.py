"""The embedded dispatcher: a queue inside the node.

Durability comes from the store, not from here: the runs were marked
dispatched in the store before ``publish``; if the process dies with payloads
still queued, the next leader hands those runs on again.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Sequence

from pysched.protocols import Delivery


class InProcessConsumer:
    def __init__(self, source: queue.SimpleQueue[Delivery]) -> None:
        self._source = source

    def next(self, timeout_s: float) -> Delivery | None:
        try:
            return self._source.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def ack(self, delivery: Delivery) -> None:
        pass  # nothing to redeliver from: the store re-dispatches lost runs

    def close(self) -> None:
        pass


class InProcessDispatcher:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Delivery] = queue.SimpleQueue()
        self._closed = False

    def publish(self, batch: Sequence[tuple[int, bytes]]) -> None:
        if self._closed:
            raise RuntimeError("dispatcher is closed")
        now = time.time_ns() // 1_000_000
        for _, payload in batch:
            self._queue.put(Delivery(payload, now))

    def consumer(self) -> InProcessConsumer:
        return InProcessConsumer(self._queue)

    def close(self) -> None:
        self._closed = True

    def qsize(self) -> int:
        return self._queue.qsize()
