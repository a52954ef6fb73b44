"""The embedded dispatcher: a queue inside the node.

Durability comes from the store, not from here: a run is recorded as handed
on only after it was queued; if the process dies first, the store still has
it and the next leader sends it again.

The queue holds whole batches, so handing on a burst of 50,000 runs is one
append, not 50,000 queue operations.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

from pysched.clock import Clock, SystemClock
from pysched.protocols import Delivery


class InProcessConsumer:
    def __init__(self, dispatcher: InProcessDispatcher) -> None:
        self._dispatcher = dispatcher
        self._closed = False

    def next(self, timeout_s: float) -> Delivery | None:
        return self._dispatcher.take(timeout_s)

    def next_batch(self, most: int, timeout_s: float) -> list[Delivery]:
        first = self.next(timeout_s)
        if first is None:
            return []
        return [first, *self._dispatcher.take_share(most - 1)]

    def ack(self, delivery: Delivery) -> None:
        pass  # nothing to redeliver from: the store re-dispatches lost runs

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._dispatcher.consumer_closed()


class InProcessDispatcher:
    def __init__(self, clock: Clock | None = None) -> None:
        # Stamps each record's enqueue time, as Kafka's LogAppendTime would.
        self._clock = clock or SystemClock()
        # Whole batches with the time they were queued; the consumers walk
        # the oldest one with a cursor.
        self._batches: deque[tuple[Sequence[bytes], int]] = deque()
        self._cursor = 0
        self._ready = threading.Condition()
        self._closed = False
        # How many consumers share the queue (never fewer than one): a
        # consumer taking several at once takes no more than its share.
        self._consumers = 0

    def publish(self, partitions: Sequence[int], payloads: Sequence[bytes]) -> None:
        if self._closed:
            raise RuntimeError("dispatcher is closed")
        if not payloads:
            return
        now = self._clock.now_ms()
        with self._ready:
            self._batches.append((payloads, now))
            self._ready.notify_all()

    def take(self, timeout_s: float) -> Delivery | None:
        with self._ready:
            if not self._batches and not self._ready.wait(timeout_s):
                return None
            taken = self._pop(1)
        return taken[0] if taken else None

    def take_share(self, most: int) -> list[Delivery]:
        """Up to ``most`` of the deliveries queued, without waiting, and no
        more than a consumer's share of them."""
        with self._ready:
            return self._pop(min(most, -(-self._queued() // max(1, self._consumers))))

    def _pop(self, most: int) -> list[Delivery]:
        """Up to ``most`` deliveries from the front of the queue (under the
        lock)."""
        taken: list[Delivery] = []
        while len(taken) < most and self._batches:
            payloads, at = self._batches[0]
            end = min(len(payloads), self._cursor + most - len(taken))
            taken.extend(Delivery(payload, at) for payload in payloads[self._cursor : end])
            self._cursor = end
            if self._cursor == len(payloads):
                self._batches.popleft()
                self._cursor = 0
        return taken

    def _queued(self) -> int:
        return sum(len(p) for p, _ in self._batches) - self._cursor

    def consumer(self) -> InProcessConsumer:
        with self._ready:
            self._consumers += 1
        return InProcessConsumer(self)

    def consumer_closed(self) -> None:
        with self._ready:
            self._consumers -= 1

    def close(self) -> None:
        self._closed = True
        with self._ready:
            self._ready.notify_all()

    def qsize(self) -> int:
        with self._ready:
            return self._queued()
