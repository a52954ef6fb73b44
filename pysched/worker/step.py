"""One worker as a step: it owns one consumer and handles one delivery at a
time, a little more at each ``step(now_ms)``, never sleeping. Threads drive
it in production (pool.py); a simulator drives it on a virtual clock.

A delivery whose handling fails (a store or claims timeout) is not passed
over: the same execution tries again after a full-jitter backoff, and the
worker takes nothing else meanwhile, because on Kafka acknowledging a later
record commits past it. A run held elsewhere under a live lease is looked at
again later, the same way. A delivery is acknowledged once it is dealt with;
one let go unfinished (at a stop, or when its run is interrupted) is not, and
is delivered again.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from pysched import native
from pysched.protocols import BatchConsumer, ClaimOutcome, Delivery, DispatchConsumer
from pysched.records import RecordError
from pysched.worker.executor import Execution, Executor

log = logging.getLogger("pysched.worker")


@dataclass(eq=False)
class _Held:
    """The delivery a worker has taken and not yet dealt with."""

    delivery: Delivery
    execution: Execution
    retry_at_ms: int = 0
    failures: int = 0  # attempts that raised, for the backoff


class DeliveryWorker:
    """``batch``: the most deliveries it takes at once, from a consumer that
    can give several (protocols.BatchConsumer, the embedded queue); others
    give one at a time. A batch's claims are taken in one write and its
    runs' ends recorded in another; its targets are called as the
    executor's ``calls`` say. Where the executor counts its node's
    ``capacity``, it takes no more deliveries than there are places free,
    so that every run it takes starts at once."""

    def __init__(self, consumer: DispatchConsumer, executor: Executor, rng: random.Random, batch: int = 1) -> None:
        self.consumer = consumer
        self.executor = executor
        self._rng = rng
        self._batch = batch if isinstance(consumer, BatchConsumer) else 1
        self._held: list[_Held] = []
        self._stopped = False

    @property
    def retry_at_ms(self) -> int | None:
        """When a delivery held is to be tried again; None when none is."""
        return min((h.retry_at_ms for h in self._held), default=None)

    @property
    def finished(self) -> bool:
        """No step will do anything again: stopped and holding nothing, or
        abandoned (the node's runs were interrupted)."""
        return self.executor.abandoned.is_set() or (self._stopped and not self._held)

    def stop(self) -> None:
        """Take no new delivery, and let go, unacknowledged, of the ones whose
        run has not ended. One whose run has ended is still recorded, by the
        steps that follow, until the executor is abandoned."""
        self._stopped = True
        self._let_go([h for h in self._held if h.execution.ended is None])

    def step(self, now_ms: int, wait_s: float = 0.0) -> bool:
        """Make progress; whether anything was done.

        Tries the deliveries held again once ``now_ms`` reaches their
        ``retry_at_ms``, and does nothing before. With none held, takes the
        next delivery (or batch), waiting at most ``wait_s`` for one (0: not
        at all), and attempts it. A store or claims failure is caught,
        logged and retried by a later step; what the consumer raises is
        raised, and the consumer is then to be closed and replaced.
        """
        if self.executor.abandoned.is_set():
            self._let_go(self._held)
            return False
        if self._held:
            due = [h for h in self._held if now_ms >= h.retry_at_ms]
            if not due:
                return False
            self._attempt(due)
            return True
        if self._stopped:
            return False
        capacity = self.executor.capacity
        places = self._batch if capacity is None else capacity.reserve(self._batch, wait_s)
        if places == 0:
            return False  # every place is taken: the runs queued wait there
        try:
            deliveries = self._take(places, wait_s)
        finally:
            if capacity is not None:
                capacity.give_back(places - len(self._held))
        if not deliveries:
            return False
        if self._held:
            self._attempt(list(self._held))
        return True

    def _take(self, most: int, wait_s: float) -> list[Delivery]:
        """Up to ``most`` deliveries, held as new executions (each holding a
        place of the capacity, where it is counted); an undecodable one is
        acknowledged and dropped."""
        if most > 1 and isinstance(self.consumer, BatchConsumer):
            deliveries = self.consumer.next_batch(most, wait_s)
        else:
            delivery = self.consumer.next(wait_s)
            deliveries = [] if delivery is None else [delivery]
        for delivery in deliveries:
            try:
                record = native.decode(delivery.payload)
            except RecordError:
                # It will never decode, however often it is tried: passed
                # over, loudly, so it does not hold up the records behind it.
                log.exception("dropped an undecodable dispatch record of %d bytes", len(delivery.payload))
                self.executor.count("errors")
                self._ack(delivery)
                continue
            execution = self.executor.new_execution(record)
            execution.reserved = self.executor.capacity is not None
            self._held.append(_Held(delivery, execution))
        return deliveries

    def _attempt(self, batch: list[_Held]) -> None:
        executor = self.executor
        try:
            outcomes = executor.attempt([h.execution for h in batch])
        except Exception:
            keys = ", ".join(h.execution.record.idempotency_key for h in batch[:3])
            more = f" and {len(batch) - 3} more" if len(batch) > 3 else ""
            log.exception("handling %s%s failed, will try again", keys, more)
            executor.count("errors")
            # They failed together and are tried again together.
            failures = max(h.failures for h in batch) + 1
            retry_at_ms = executor.clock.now_ms() + self._backoff_ms(failures)
            for held in batch:
                held.failures = failures
                held.retry_at_ms = retry_at_ms
            return
        if executor.abandoned.is_set():
            self._let_go(self._held)
            return
        for held, outcome in zip(batch, outcomes, strict=True):
            if held.execution.interrupted:
                # Not acknowledged: Kafka delivers the run again (the embedded
                # engine's next leader hands it on again), as a new attempt.
                self._let_go([held])
            elif outcome is ClaimOutcome.BUSY:
                # Wait for it to finish or for its lease to die, then look again.
                now_ms = executor.clock.now_ms()
                held.retry_at_ms = now_ms + executor.config.busy_recheck_ms(held.execution.busy_until_ms, now_ms)
            else:
                self._held.remove(held)
                executor.end([held.execution])
                self._ack(held.delivery)

    def _backoff_ms(self, failures: int) -> int:
        """Full jitter: retries of a failing store spread out rather than
        arrive together."""
        return self._rng.randint(0, self.executor.config.retry_cap_ms(failures))

    def _let_go(self, held: list[_Held]) -> None:
        """Drop deliveries held, unacknowledged: they are delivered again."""
        dropped = list(held)
        self.executor.end([h.execution for h in dropped])
        self._held = [h for h in self._held if h not in dropped]

    def _ack(self, delivery: Delivery) -> None:
        try:
            self.consumer.ack(delivery)
        except Exception as exc:
            # The delivery is dealt with: if the commit was lost, the next
            # one covers it, or a redelivery finds the run done.
            log.warning("acknowledging a delivery failed: %s", exc)
            self.executor.count("errors")
