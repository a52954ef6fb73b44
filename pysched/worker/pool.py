"""Workers: take dispatch records, pass the fence check and the idempotency
claim, run the target, record the outcome.

Each execution of a delivery claims its run under a holder of its own, the
node's holder and a number: two threads of one node are two executions, and
one never takes over a run the other has in flight. One heartbeat per worker
pool extends the leases of the claims of its executions still running every
``heartbeat_ms``; if the pool dies, its claims expire after ``lease_ms`` and
the run is handed on again.

A delivery whose handling fails (a store or claims timeout) is not passed
over: its execution tries again, with backoff, until the outcome is recorded
or the pool stops, and the consumer acknowledges nothing past it meanwhile.
A run that ended is recorded, not run again. A supervisor replaces any worker
or heartbeat thread that ends before the stop, and logs it as an error.
"""

from __future__ import annotations

import functools
import itertools
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from pysched import native
from pysched.clock import Clock
from pysched.protocols import (
    ClaimOutcome,
    DispatchConsumer,
    Dispatcher,
    IdempotencyClaims,
    JobNotFound,
    ScheduleStore,
)
from pysched.records import DispatchRecord, RecordError
from pysched.shell import kill_running
from pysched.targets import context_for, run_target

log = logging.getLogger("pysched.worker")


@dataclass(frozen=True)
class WorkerConfig:
    concurrency: int = 4
    lease_ms: int = 30_000
    heartbeat_ms: int = 10_000
    poll_s: float = 0.2
    supervise_s: float = 1.0
    # A failed handling is tried again after a full-jitter backoff that
    # doubles from retry_base_s up to retry_max_s.
    retry_base_s: float = 0.2
    retry_max_s: float = 10.0


@dataclass(frozen=True)
class _Ended:
    """How a run ended, to record: ``state`` succeeded, failed or cancelled,
    or None for a run replaced by a reschedule (its history row says so)."""

    state: str | None
    error: str | None
    result: str | None
    at_ms: int


@dataclass
class _Execution:
    """One execution of one delivery, through every attempt a failure costs
    it: the holder of its claim, and how the run ended once it has."""

    holder: str
    ended: _Ended | None = None


class WorkerPool:
    def __init__(
        self,
        dispatcher: Dispatcher,
        claims: IdempotencyClaims,
        store: ScheduleStore,
        clock: Clock,
        holder: str,
        config: WorkerConfig | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.claims = claims
        self.store = store
        self.clock = clock
        self.holder = holder
        self.config = config or WorkerConfig()
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._executions = itertools.count(1)
        # Execution holder -> the idempotency key it has claimed and runs.
        self._running: dict[str, str] = {}
        # The supervised threads by name, and the supervisor itself.
        self._threads: dict[str, threading.Thread] = {}
        self._supervisor: threading.Thread | None = None
        self._abandoned = threading.Event()

    def start(self, stop: threading.Event) -> None:
        for i in range(self.config.concurrency):
            self._start_thread(f"pysched-worker-{i}", stop)
        self._start_thread("pysched-heartbeat", stop)
        self._supervisor = threading.Thread(
            target=self._supervise, args=(stop,), name="pysched-supervisor", daemon=True
        )
        self._supervisor.start()

    def join(self, timeout_s: float) -> bool:
        """Wait for the threads to end after the stop, at most ``timeout_s``
        or until abandon(); whether they all ended."""
        deadline = time.monotonic() + timeout_s
        threads = [*self._threads.values(), *([self._supervisor] if self._supervisor else [])]
        for t in threads:
            while t.is_alive() and not self._abandoned.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                t.join(min(remaining, 0.1))
        return not any(t.is_alive() for t in threads)

    def abandon(self) -> None:
        """Stop now: kill the shell commands running (with their children)
        and record no outcome from here on. The runs left unfinished keep
        their claims until the leases run out, then are handed on again."""
        if self._abandoned.is_set():
            return
        self._abandoned.set()
        killed = kill_running()
        with self._lock:
            unfinished = len(self._running)
        if unfinished:
            log.warning("left %d runs unfinished (%d shell commands killed)", unfinished, killed)

    @property
    def abandoned(self) -> bool:
        return self._abandoned.is_set()

    def alive(self) -> list[str]:
        """Names of the worker and heartbeat threads that are running."""
        return sorted(name for name, t in self._threads.items() if t.is_alive())

    def _start_thread(self, name: str, stop: threading.Event) -> None:
        loop: Callable[[], None]
        if name == "pysched-heartbeat":
            loop = functools.partial(self._heartbeat, stop)
        else:
            loop = functools.partial(self._consume, self.dispatcher.consumer(), stop)
        t = threading.Thread(target=self._guarded, args=(name, loop, stop), name=name, daemon=True)
        self._threads[name] = t
        t.start()

    def _guarded(self, name: str, loop: Callable[[], None], stop: threading.Event) -> None:
        try:
            loop()
        except BaseException:
            # Logged here, with its cause; the supervisor replaces the thread.
            log.exception("%s died", name)
            return
        if not stop.is_set():
            log.error("%s ended before the node stopped", name)

    def _supervise(self, stop: threading.Event) -> None:
        """A thread that ends before the stop, for whatever reason, is
        replaced: a pool must not shrink silently until nothing runs."""
        while not stop.wait(self.config.supervise_s):
            for name, t in list(self._threads.items()):
                if t.is_alive() or stop.is_set():
                    continue
                log.error("%s is not running: starting a replacement", name)
                try:
                    self._start_thread(name, stop)
                except Exception:
                    log.exception("could not replace %s, will retry", name)
                    continue
                self._count("replaced")

    def _count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def _consume(self, consumer: DispatchConsumer, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                delivery = consumer.next(self.config.poll_s)
                if delivery is None:
                    continue
                if not self._deliver(delivery.payload, stop):
                    return  # stopped first: not acknowledged, so delivered again
                if self._abandoned.is_set():
                    return  # not acknowledged: an unfinished run is delivered again
                consumer.ack(delivery)
        finally:
            consumer.close()

    def _heartbeat(self, stop: threading.Event) -> None:
        while not stop.wait(self.config.heartbeat_ms / 1000):
            with self._lock:
                running = list(self._running.items())
            if running:
                holders = [holder for holder, _ in running]
                keys = [key for _, key in running]
                try:
                    self.claims.heartbeat(keys, holders, self.clock.now_ms(), self.config.lease_ms)
                except Exception as exc:
                    log.warning("heartbeat failed, will retry: %s", exc)

    def _new_execution(self) -> _Execution:
        """One execution of a delivery, whose claims holder is unique to it
        within the node, as the node's holder is to the node."""
        return _Execution(f"{self.holder}/{next(self._executions)}")

    def _end(self, execution: _Execution) -> None:
        """The execution is over: its claim, if it still holds one (it ended
        without recording an outcome), is no longer extended and runs out."""
        with self._lock:
            self._running.pop(execution.holder, None)

    def _backoff_s(self, attempt: int) -> float:
        """Full-jitter exponential backoff: retries of a failing store spread
        out rather than arrive together."""
        return random.uniform(0, min(self.config.retry_max_s, self.config.retry_base_s * 2**attempt))

    def _deliver(self, payload: bytes, stop: threading.Event) -> bool:
        """Handle one delivery to its end. A failed attempt (a store or claims
        timeout) is tried again by the same execution, after a backoff, rather
        than passed over: on Kafka, acknowledging a later record commits past
        it. True once it is dealt with; False when the pool stopped first, and
        it must not be acknowledged."""
        try:
            record = native.decode(payload)
        except RecordError:
            # It will never decode, however often it is tried: passed over,
            # loudly, so it does not hold up the records behind it.
            log.exception("dropped an undecodable dispatch record of %d bytes", len(payload))
            self._count("errors")
            return True
        execution = self._new_execution()
        try:
            attempt = 0
            while True:
                try:
                    self._attempt(record, execution, stop)
                    return True
                except Exception:
                    log.exception("handling %s failed, will try again", record.idempotency_key)
                    self._count("errors")
                # Nothing starts after the stop, but a run that has ended is
                # worth recording for as long as the drain lasts.
                halt = stop if execution.ended is None else self._abandoned
                if halt.wait(self._backoff_s(attempt)):
                    return False
                attempt += 1
        finally:
            self._end(execution)

    def handle(self, payload: bytes, stop: threading.Event | None = None) -> ClaimOutcome:
        """One attempt at one delivery, as its own execution; raises what the
        attempt raised."""
        execution = self._new_execution()
        try:
            return self._attempt(native.decode(payload), execution, stop)
        finally:
            self._end(execution)

    def _attempt(self, record: DispatchRecord, execution: _Execution, stop: threading.Event | None) -> ClaimOutcome:
        """Claim, run and record, or, once the run has ended in an earlier
        attempt, only record: a run whose outcome failed to record must not
        run again."""
        outcome = ClaimOutcome.CLAIMED
        if execution.ended is None:
            outcome = self._claim(record, execution, stop)
            if outcome not in (ClaimOutcome.CLAIMED, ClaimOutcome.TAKEN_OVER):
                return outcome
            execution.ended = self._run(record)
            if self._abandoned.is_set():
                log.warning("left %s run_at=%d unfinished: the pool stopped now", record.job_id, record.run_at_ms)
                return outcome
        self._record(record, execution, execution.ended)
        return outcome

    def _claim(self, record: DispatchRecord, execution: _Execution, stop: threading.Event | None) -> ClaimOutcome:
        """Take the run's claim for ``execution``; the outcome, once dealt
        with unless it says to run it."""
        while True:
            claim = self.claims.claim(record, execution.holder, self.clock.now_ms(), self.config.lease_ms)
            if claim.outcome is not ClaimOutcome.BUSY or stop is None:
                break
            # Another worker runs it under a live lease: wait for it to finish
            # or for its lease to die, then look again.
            log.info("waiting on %s: it runs elsewhere under a live lease", record.idempotency_key)
            if stop.wait(min(self.config.lease_ms, 5_000) / 1000):
                break
        self._count(claim.outcome.value)
        if claim.outcome is ClaimOutcome.FENCED:
            # Sent by a leader that has lost the partition, perhaps before it
            # lost it: the run is still owed, to the new leader.
            handed_back = self.store.hand_back(record, self.clock.now_ms())
            log.warning(
                "rejected %s run_at=%d: fence %d is below the partition's %d (a stale leader)%s",
                record.job_id,
                record.run_at_ms,
                record.fence,
                claim.fence_floor,
                "; handed back to its leader" if handed_back else "",
            )
        elif claim.outcome is ClaimOutcome.SUCCEEDED:
            log.info("skipped %s: %s already succeeded", record.job_id, record.idempotency_key)
        elif claim.outcome is not ClaimOutcome.BUSY:
            # Claimed: extended by the heartbeat until the execution ends.
            with self._lock:
                self._running[execution.holder] = record.idempotency_key
        return claim.outcome

    def _run(self, record: DispatchRecord) -> _Ended:
        """Run the target, unless the run was cancelled or replaced after it
        was handed on; what is to be recorded."""
        try:
            job_record = self.store.get_job(record.job_id)
        except JobNotFound:
            job_record = None
        if job_record is None or job_record.state == "cancelled":
            return _Ended("cancelled", "job cancelled before the run", None, self.clock.now_ms())
        if not self.store.run_started(record, self.holder, self.clock.now_ms()):
            # Rescheduled after it was handed on: never runs, and its row
            # belongs to the cancellation.
            return _Ended(None, None, None, self.clock.now_ms())
        job = job_record.job
        outcome = run_target(job, context_for(job, record))
        return _Ended(
            "succeeded" if outcome.succeeded else "failed", outcome.error, outcome.result, self.clock.now_ms()
        )

    def _record(self, record: DispatchRecord, execution: _Execution, ended: _Ended) -> None:
        """Record the run's end in its history and on its claim; both writes
        are idempotent, so an attempt that failed halfway is simply repeated."""
        if ended.state is not None:
            self.store.run_finished(record, ended.state, ended.error, ended.result, ended.at_ms)
        succeeded = ended.state != "failed"
        self.claims.complete(record.idempotency_key, execution.holder, succeeded, ended.result, ended.at_ms)
        if ended.state in ("succeeded", "failed"):
            self._count(ended.state)
        else:
            self._count("cancelled")
        if ended.state == "succeeded":
            log.info("ran %s: succeeded%s", record.job_id, f": {ended.result}" if ended.result else "")
        elif ended.state == "failed":
            log.warning("ran %s: failed: %s", record.job_id, ended.error)
        else:
            log.info("skipped %s run_at=%d: cancelled", record.job_id, record.run_at_ms)
