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
from pysched.protocols import ClaimOutcome, Delivery, DispatchConsumer
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
    def __init__(self, consumer: DispatchConsumer, executor: Executor, rng: random.Random) -> None:
        self.consumer = consumer
        self.executor = executor
        self._rng = rng
        self._held: _Held | None = None
        self._stopped = False

    @property
    def retry_at_ms(self) -> int | None:
        """When the delivery held is to be tried again; None when none is."""
        return None if self._held is None else self._held.retry_at_ms

    @property
    def finished(self) -> bool:
        """No step will do anything again: stopped and holding nothing, or
        abandoned (the node's runs were interrupted)."""
        return self.executor.abandoned.is_set() or (self._stopped and self._held is None)

    def stop(self) -> None:
        """Take no new delivery, and let go, unacknowledged, of one whose run
        has not ended. One whose run has ended is still recorded, by the
        steps that follow, until the executor is abandoned."""
        self._stopped = True
        if self._held is not None and self._held.execution.ended is None:
            self._let_go()

    def step(self, now_ms: int, wait_s: float = 0.0) -> bool:
        """Make progress; whether anything was done.

        Tries the delivery held again once ``now_ms`` reaches its
        ``retry_at_ms``, and does nothing before. With none held, takes the
        next delivery, waiting at most ``wait_s`` for one (0: not at all),
        and attempts it. A store or claims failure is caught, logged and
        retried by a later step; what the consumer's ``next`` raises is
        raised, and the consumer is then to be closed and replaced.
        """
        if self.executor.abandoned.is_set():
            if self._held is not None:
                self._let_go()
            return False
        held = self._held
        if held is not None:
            if now_ms < held.retry_at_ms:
                return False
            self._attempt(held)
            return True
        if self._stopped:
            return False
        delivery = self.consumer.next(wait_s)
        if delivery is None:
            return False
        try:
            record = native.decode(delivery.payload)
        except RecordError:
            # It will never decode, however often it is tried: passed over,
            # loudly, so it does not hold up the records behind it.
            log.exception("dropped an undecodable dispatch record of %d bytes", len(delivery.payload))
            self.executor.count("errors")
            self._ack(delivery)
            return True
        self._held = _Held(delivery, self.executor.new_execution(record))
        self._attempt(self._held)
        return True

    def _attempt(self, held: _Held) -> None:
        executor = self.executor
        try:
            (outcome,) = executor.attempt([held.execution])
        except Exception:
            log.exception("handling %s failed, will try again", held.execution.record.idempotency_key)
            executor.count("errors")
            held.failures += 1
            held.retry_at_ms = executor.clock.now_ms() + self._backoff_ms(held.failures)
            return
        if executor.abandoned.is_set() or held.execution.interrupted:
            # Not acknowledged: Kafka delivers the run again (the embedded
            # engine's next leader hands it on again), as a new attempt.
            self._let_go()
        elif outcome is ClaimOutcome.BUSY:
            # Wait for it to finish or for its lease to die, then look again.
            now_ms = executor.clock.now_ms()
            held.retry_at_ms = now_ms + executor.config.busy_recheck_ms(held.execution.busy_until_ms, now_ms)
        else:
            self._held = None
            executor.end([held.execution])
            self._ack(held.delivery)

    def _backoff_ms(self, failures: int) -> int:
        """Full jitter: retries of a failing store spread out rather than
        arrive together."""
        return self._rng.randint(0, self.executor.config.retry_cap_ms(failures))

    def _let_go(self) -> None:
        """Drop the delivery held, unacknowledged: it is delivered again."""
        if self._held is not None:
            self.executor.end([self._held.execution])
            self._held = None

    def _ack(self, delivery: Delivery) -> None:
        try:
            self.consumer.ack(delivery)
        except Exception as exc:
            # The delivery is dealt with: if the commit was lost, the next
            # one covers it, or a redelivery finds the run done.
            log.warning("acknowledging a delivery failed: %s", exc)
            self.executor.count("errors")
