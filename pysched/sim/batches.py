"""Deliveries taken several at once from the in-memory Kafka consumer, for a
world with --target-time, whose workers take batches as a real worker does
from the embedded queue.

Kafka commits an offset, not a record: acknowledging a later delivery of a
partition would commit past an earlier one still running, and a crash would
then never deliver that one again. So each acknowledgement here commits
only the offsets below the first one of its partition still unacknowledged;
a delivery let go stays unacknowledged and holds the commit below it, to be
delivered again (with those after it, which their claims turn away) by the
next consumer of its partition."""

from __future__ import annotations

from pysched.memory.dispatcher import MemoryConsumer, RecordToken
from pysched.protocols import Delivery


class BatchingConsumer:
    """A MemoryConsumer that gives several deliveries at once (a
    protocols.BatchConsumer), each acknowledged on its own."""

    def __init__(self, consumer: MemoryConsumer) -> None:
        self.consumer = consumer
        # Per partition: the deliveries taken, by offset, and whether each is
        # acknowledged, until the commit passes them.
        self._taken: dict[int, dict[int, tuple[Delivery, bool]]] = {}

    def next(self, timeout_s: float) -> Delivery | None:
        delivery = self.consumer.next(timeout_s)
        if delivery is not None:
            token = _token(delivery)
            self._taken.setdefault(token.partition, {})[token.offset] = (delivery, False)
        return delivery

    def next_batch(self, most: int, timeout_s: float) -> list[Delivery]:
        first = self.next(timeout_s)
        if first is None:
            return []
        batch = [first]
        while len(batch) < most and (delivery := self.next(0)) is not None:
            batch.append(delivery)
        return batch

    def may_deliver(self) -> bool:
        return self.consumer.may_deliver()

    def ack(self, delivery: Delivery) -> None:
        token = _token(delivery)
        taken = self._taken.get(token.partition, {})
        if token.offset not in taken:
            return
        taken[token.offset] = (delivery, True)
        last: Delivery | None = None
        for offset in sorted(taken):
            held, acked = taken[offset]
            if not acked:
                break
            last = held
            del taken[offset]
        if last is not None:
            self.consumer.ack(last)

    def close(self) -> None:
        self.consumer.close()

    def crash(self) -> None:
        self.consumer.crash()


def _token(delivery: Delivery) -> RecordToken:
    token = delivery.token
    if not isinstance(token, RecordToken):
        raise TypeError(f"not a delivery of the in-memory dispatcher: {token!r}")
    return token
