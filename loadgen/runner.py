"""Drive a scheduler and watch its dispatch channel.

Embedded: loadgen starts a scheduler in this process on a fresh database and
taps the in-process dispatcher (the time each record was handed over).
Cluster: loadgen registers through the cluster's store and reads the dispatch
topic in its own consumer group (each record's broker LogAppendTime); the
running nodes and workers do the rest.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from pysched import native
from pysched.config import ClusterConfig
from pysched.dispatch.inprocess import InProcessDispatcher
from pysched.metrics import NodeMetrics
from pysched.model import Job
from pysched.node import Backends, Node, open_cluster_store, open_embedded
from pysched.protocols import JobNotActive, JobNotFound, ScheduleStore
from pysched.records import DispatchRecord
from pysched.registry import register_many
from pysched.worker import WorkerConfig
from pysched_loadgen.measure import LedgerTail, Observed
from pysched_loadgen.registration import Attempt, LoadPlan, now_ms, register_before_due

if TYPE_CHECKING:  # the driver is loaded only for a cluster run
    from confluent_kafka import Consumer


class TappedDispatcher(InProcessDispatcher):
    """The in-process queue, noting when each batch was handed over."""

    def __init__(self) -> None:
        super().__init__()
        # Appended by the leader's thread, taken by the observer's: one deque
        # for good. Swapped for an empty list at each look, it lost a batch
        # the leader appended to the list the observer had already read.
        self.handed: deque[tuple[int, Sequence[bytes]]] = deque()

    def publish(self, partitions: Sequence[int], payloads: Sequence[bytes]) -> None:
        super().publish(partitions, payloads)
        self.handed.append((now_ms(), payloads))

    def observe(self, observed: Observed) -> None:
        # Decoded after the fact: nothing but a timestamp on the hot path.
        handed = self.handed
        while handed:
            at, batch = handed.popleft()
            for payload in batch:
                observed.saw_dispatch(native.decode(payload).idempotency_key, at)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description:<22}"),
        BarColumn(),
        TextColumn("{task.completed:>8.0f}/{task.total:<8.0f}"),
        TimeElapsedColumn(),
        transient=False,
    )


def _wait(
    progress: Progress,
    observed: Observed,
    ledger: Path,
    last_due_ms: int,
    timeout_s: float,
    poll: Callable[[], None],
    exec_timeout_s: float,
) -> None:
    n = len(observed.expected)
    waiting = progress.add_task("waiting for the spike", total=max(1, last_due_ms - now_ms()))
    start = now_ms()
    while now_ms() < last_due_ms:
        poll()
        progress.update(waiting, completed=now_ms() - start)
        time.sleep(0.05)
    progress.update(waiting, completed=max(1, last_due_ms - start))
    fired = progress.add_task("dispatched", total=n)
    deadline = time.monotonic() + timeout_s
    while len(observed.dispatched) < n and time.monotonic() < deadline:
        poll()
        progress.update(fired, completed=len(observed.dispatched))
        time.sleep(0.05)
    poll()
    progress.update(fired, completed=len(observed.dispatched))
    executed = progress.add_task("executed", total=n)
    deadline = time.monotonic() + exec_timeout_s
    tail = LedgerTail(ledger)
    while time.monotonic() < deadline:
        done = len(tail.read().keys() & observed.expected.keys())
        progress.update(executed, completed=done)
        if done >= len(observed.dispatched):
            break
        poll()
        time.sleep(0.2)
    time.sleep(0.5)  # a straggling duplicate would land now
    poll()


def watch_topic(config: ClusterConfig, from_start: bool) -> Consumer:
    """A consumer of the dispatch topic in a group of its own: it sees every
    record without taking one from the workers. Returns once assigned."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": config.kafka,
            "group.id": f"loadgen-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest" if from_start else "latest",
            "enable.auto.commit": False,
            "log_level": 3,
        }
    )
    assigned = threading.Event()
    consumer.subscribe([config.topic], on_assign=lambda c, parts: assigned.set())
    while not assigned.is_set():
        consumer.poll(0.2)
    return consumer


def appended(consumer: Consumer, timeout_s: float) -> Iterator[tuple[DispatchRecord, int]]:
    """The dispatch records that arrived, each with the broker's append time."""
    for msg in consumer.consume(10_000, timeout=timeout_s):
        if msg.error() is None:
            yield native.decode(msg.value() or b""), msg.timestamp()[1]


def _cancel_all(progress: Progress, store: ScheduleStore, jobs: Sequence[Job]) -> None:
    task = progress.add_task("cancelling", total=len(jobs))

    def cancel(job_id: str) -> None:
        with contextlib.suppress(JobNotFound, JobNotActive):  # gone already: nothing to stop
            store.cancel_job(job_id, now_ms())
        progress.advance(task)

    with ThreadPoolExecutor(32, thread_name_prefix="loadgen-cancel") as pool:
        list(pool.map(cancel, [job.id for job in jobs]))


def run_embedded(
    plan: LoadPlan,
    workers: int,
    timeout_s: float,
    exec_timeout_s: float,
    quiet: bool = False,
    metrics: bool = False,
) -> Attempt:
    """``metrics``: the node counts what it does into its metrics, unserved
    (what that costs the fire path is what it measures)."""
    # Each attempt registers into a fresh database in its own folder: one
    # given up on is closed before the scheduler starts, and never fires.
    databases: dict[int, Backends] = {}

    def write(attempt: Attempt, jobs: list[Job]) -> None:
        if attempt.number not in databases:
            databases[attempt.number] = open_embedded(attempt.folder / "loadgen.db")
        register_many(databases[attempt.number].store, jobs, now_ms())

    def discard(attempt: Attempt) -> None:
        backends = databases.pop(attempt.number, None)
        if backends is not None:
            backends.close()

    with _progress() if not quiet else Progress(disable=True) as progress:
        attempt = register_before_due(plan, True, 5_000, write, discard, progress)
        backends = databases.pop(attempt.number)
        tap = TappedDispatcher()
        backends.dispatcher = tap
        node = Node(
            backends, worker_config=WorkerConfig(concurrency=workers), metrics=NodeMetrics() if metrics else None
        )
        stop = threading.Event()
        thread = threading.Thread(target=node.run, args=(stop,), name="loadgen-node", daemon=True)
        thread.start()
        try:
            last_due = max(attempt.load.expected.values())
            observed = attempt.observed
            _wait(
                progress, observed, attempt.ledger, last_due, timeout_s, lambda: tap.observe(observed), exec_timeout_s
            )
        finally:
            stop.set()
            thread.join(30)
            tap.observe(attempt.observed)
            backends.close()
    return attempt


def run_cluster(
    config: ClusterConfig,
    plan: LoadPlan,
    timeout_s: float,
    exec_timeout_s: float,
    quiet: bool = False,
) -> Attempt:
    consumer = watch_topic(config, from_start=False)

    def poll(observed: Observed, wait_s: float = 0.05) -> None:
        for record, appended_at in appended(consumer, wait_s):
            observed.saw_dispatch(record.idempotency_key, appended_at)

    store, close = open_cluster_store(config)
    try:
        with _progress() if not quiet else Progress(disable=True) as progress:

            def write(attempt: Attempt, jobs: list[Job]) -> None:
                register_many(store, jobs, now_ms())
                poll(attempt.observed, 0)  # keeps the consumer in its group; no time taken

            def withdraw(attempt: Attempt) -> None:
                # Given up on before its runs fall due, as a rule: none of
                # them fires. A run already handed on fires into a ledger
                # nobody reads.
                _cancel_all(progress, store, attempt.load.jobs[: attempt.written])

            # Small chunks: a rate too slow for the instant shows early.
            attempt = register_before_due(plan, False, 500, write, withdraw, progress)
            try:
                last_due = max(attempt.load.expected.values())
                observed = attempt.observed
                _wait(progress, observed, attempt.ledger, last_due, timeout_s, lambda: poll(observed), exec_timeout_s)
            finally:
                if attempt.load.recurring:  # they would go on firing
                    _cancel_all(progress, store, attempt.load.jobs)
    finally:
        consumer.close()
        close()
    return attempt
