"""The threads of a node's workers: ``concurrency`` delivery workers, each
on a thread of its own that loops over its step, and one heartbeat thread
that extends the claims of the runs in flight every ``heartbeat_ms``, until
the last worker has finished (through the grace period after a stop); if the
pool dies, its claims expire after ``lease_ms`` and the runs are handed on
again. A supervisor replaces any worker or heartbeat thread that ends before
the stop, and logs it as an error.

After the stop, the runs still running when the grace period is over (or on
``interrupt``) are interrupted: their shell commands are asked to end, then
killed, and each run is recorded interrupted with its claim let go of.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable

from pysched import native
from pysched.clock import Clock
from pysched.protocols import (
    ClaimOutcome,
    DeadLetterSink,
    DispatchConsumer,
    Dispatcher,
    IdempotencyClaims,
    ScheduleStore,
)
from pysched.shell import stop_commands
from pysched.worker.calls import Capacity, ThreadedCalls
from pysched.worker.config import WorkerConfig
from pysched.worker.executor import Executor
from pysched.worker.observer import RunObserver
from pysched.worker.step import DeliveryWorker

log = logging.getLogger("pysched.worker")


class WorkerPool:
    def __init__(
        self,
        dispatcher: Dispatcher,
        claims: IdempotencyClaims,
        store: ScheduleStore,
        clock: Clock,
        holder: str,
        config: WorkerConfig | None = None,
        rng: random.Random | None = None,
        dead_letters: DeadLetterSink | None = None,
        observer: RunObserver | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.clock = clock
        self.config = config or WorkerConfig()
        # Every run a worker takes starts at once, on a thread of its own,
        # and no more run at once than ``concurrency``.
        self.executor = Executor(
            claims,
            store,
            clock,
            holder,
            self.config,
            dead_letters=dead_letters,
            observer=observer,
            calls=ThreadedCalls(),
            capacity=Capacity(self.config.concurrency),
        )
        # The executor's: what the workers did, and how often the supervisor stepped in.
        self.counts: Counter[str] = self.executor.counts
        # Each worker draws its backoffs from a generator of its own, seeded
        # from this one: threads do not share one generator's state.
        self._rng = rng or random.Random()
        self._rng_lock = threading.Lock()
        # The supervised threads by name, and the supervisor itself.
        self._threads: dict[str, threading.Thread] = {}
        self._supervisor: threading.Thread | None = None
        # One interruption at a time: the grace running out and a second
        # stop signal may both ask for it.
        self._interrupt_lock = threading.Lock()

    def start(self, stop: threading.Event) -> None:
        self.executor.stopping = stop
        for i in range(self.config.concurrency):
            self._start_thread(f"pysched-worker-{i}", stop)
        self._start_thread("pysched-heartbeat", stop)
        self._supervisor = threading.Thread(
            target=self._supervise, args=(stop,), name="pysched-supervisor", daemon=True
        )
        self._supervisor.start()

    def join(self, timeout_s: float) -> bool:
        """Wait for the threads to end after the stop, at most ``timeout_s``
        or until the runs are interrupted; whether they all ended."""
        deadline = time.monotonic() + timeout_s
        threads = [*self._threads.values(), *([self._supervisor] if self._supervisor else [])]
        for t in threads:
            while t.is_alive() and not self.abandoned:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                t.join(min(remaining, 0.1))
        return not any(t.is_alive() for t in threads)

    def interrupt(self, why: str) -> None:
        """Interrupt the runs still running: start no target from now on,
        stop the shell commands (SIGTERM to each one's process group, up to
        ``kill_after_s``, then SIGKILL), and record each run interrupted,
        its claim let go of; then the workers record and acknowledge nothing
        more. Their deliveries, unacknowledged, come again as new attempts.
        A Python or HTTP target's thread cannot be stopped: its run is
        recorded all the same, and the process's exit ends the thread."""
        with self._interrupt_lock:
            if self.abandoned:
                return
            executions = self.executor.interrupt()
            stopped = stop_commands(self.executor.interrupting, self.config.kill_after_s)
            self.executor.record_interrupted(executions, why)
            self.executor.record_ended()
            self.executor.abandoned.set()
        if executions:
            log.warning(
                "interrupted %d runs (%d processes stopped: shell commands, timed Python targets)",
                len(executions),
                stopped,
            )

    def interrupt_going_on(self, why: str) -> None:
        """Record interrupted, their claims let go of, the runs that went on
        past the interruption (targets in threads, in a process that lives
        on): the process is about to exit, which ends them."""
        executions = self.executor.interrupt(process_exits=True)
        self.executor.record_interrupted(executions, why)

    def wait_ended(self, timeout_s: float | None = None) -> bool:
        """Wait for every worker and heartbeat thread to end, the runs that
        go on past an interruption included; whether they all did."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for t in list(self._threads.values()):
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads.values())

    @property
    def abandoned(self) -> bool:
        return self.executor.abandoned.is_set()

    def alive(self) -> list[str]:
        """Names of the worker and heartbeat threads that are running."""
        return sorted(name for name, t in self._threads.items() if t.is_alive())

    def handle(self, payload: bytes) -> ClaimOutcome:
        """One attempt at one delivery, as its own execution; raises what the
        attempt raised."""
        execution = self.executor.new_execution(native.decode(payload))
        try:
            (outcome,) = self.executor.attempt([execution])
            return outcome
        finally:
            self.executor.end([execution])

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
                self.executor.count("replaced")

    def _new_rng(self) -> random.Random:
        with self._rng_lock:
            return random.Random(self._rng.getrandbits(64))

    def _consume(self, consumer: DispatchConsumer, stop: threading.Event) -> None:
        """Step a worker until it has finished after the stop. It waits in
        the consumer for a delivery when it holds none, and on the stop for
        a backoff, or, once stopped, until the interruption: a run that has
        ended is worth recording for as long as the grace period lasts."""
        worker = DeliveryWorker(consumer, self.executor, self._new_rng(), self.config.batch)
        try:
            while True:
                if stop.is_set():
                    worker.stop()
                if worker.finished:
                    return
                now_ms = self.clock.now_ms()
                if worker.step(now_ms, wait_s=self.config.poll_s):
                    continue
                retry_at_ms = worker.retry_at_ms
                if retry_at_ms is not None:
                    halt = self.executor.abandoned if stop.is_set() else stop
                    halt.wait(max(0, retry_at_ms - now_ms) / 1000)
        finally:
            consumer.close()

    def _heartbeat(self, stop: threading.Event) -> None:
        """Beat until the workers have finished after the stop: a run that
        goes on through the grace period, or past it (a target in a thread,
        which an interruption cannot stop), must keep its claim, or another
        node would take it over and run it a second time beside it."""
        beat_s = self.config.heartbeat_ms / 1000
        next_beat = time.monotonic() + beat_s
        while True:
            time.sleep(min(self.config.poll_s, beat_s))
            # Claims held, by runs going on or by an interruption not yet
            # recorded, are kept until they are let go of.
            if (self.abandoned or (stop.is_set() and not self._workers_alive())) and not self.executor.running():
                return
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + beat_s
                self.executor.heartbeat_step(self.clock.now_ms())

    def _workers_alive(self) -> bool:
        return any(t.is_alive() for name, t in list(self._threads.items()) if name != "pysched-heartbeat")
