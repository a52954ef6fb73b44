"""Drive a scheduler and watch its dispatch channel.

Embedded: loadgen starts a scheduler in this process on a fresh database and
taps the in-process dispatcher (the time each record was handed over).
Cluster: loadgen registers through the cluster's store and reads the dispatch
topic in its own consumer group (each record's broker LogAppendTime); the
running nodes and workers do the rest.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from loadgen.measure import Observed, read_ledger
from loadgen.shapes import Load
from pysched import native
from pysched.config import ClusterConfig
from pysched.dispatch.inprocess import InProcessDispatcher
from pysched.node import Node, open_cluster_store, open_embedded
from pysched.protocols import JobNotActive, JobNotFound, ScheduleStore
from pysched.records import DispatchRecord
from pysched.registry import register_many
from pysched.worker import WorkerConfig

if TYPE_CHECKING:  # the driver is loaded only for a cluster run
    from confluent_kafka import Consumer


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# Jobs a second each engine registers here in bulk, with room to spare: the
# cluster's rate is one lightweight transaction and one logged batch per job.
REGISTER_RATE = {"embedded": 20_000, "cluster": 250}


def registration_lead_s(n: int, embedded: bool) -> float:
    """Seconds to allow for registering n runs before the first is due."""
    return 3 + n / REGISTER_RATE["embedded" if embedded else "cluster"]


class RegisteredLate(RuntimeError):
    """Registration was still going when the runs fell due: the figures would
    time registration, not firing."""


def _check_in_time(load: Load) -> None:
    first_due = min(load.expected.values())
    late_s = (now_ms() - first_due) / 1000
    if late_s > -0.5:
        raise RegisteredLate(
            f"registration finished {late_s:+.1f} s from the first due time; start the runs later (--in, --at)"
        )


class TappedDispatcher(InProcessDispatcher):
    """The in-process queue, noting when each batch was handed over."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: list[tuple[int, Sequence[bytes]]] = []

    def publish(self, partitions: Sequence[int], payloads: Sequence[bytes]) -> None:
        super().publish(partitions, payloads)
        self.handed.append((now_ms(), payloads))

    def observe(self, observed: Observed) -> None:
        # Decoded after the fact: nothing but a timestamp on the hot path.
        handed, self.handed = self.handed, []
        for at, batch in handed:
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
    while time.monotonic() < deadline:
        done = len(set(read_ledger(ledger)[0]) & observed.expected.keys())
        progress.update(executed, completed=done)
        if done >= len(observed.dispatched):
            break
        poll()
        time.sleep(0.2)
    time.sleep(0.5)  # a straggling duplicate would land now
    poll()


MakeLoad = Callable[[Path, str], Load]


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


def _prepare(make_load: MakeLoad) -> tuple[Path, Path, Load, Observed]:
    """A scratch folder, its ledger, the jobs, and what to expect of them."""
    tmp = Path(tempfile.mkdtemp(prefix="pysched-loadgen-"))
    ledger = tmp / "ledger.txt"
    load = make_load(ledger, f"lg{uuid.uuid4().hex[:6]}-")
    return tmp, ledger, load, Observed(dict(load.expected))


def _cancel_all(progress: Progress, store: ScheduleStore, load: Load) -> None:
    """Recurring jobs would go on firing after the run: cancel every one."""
    task = progress.add_task("cancelling", total=len(load.jobs))

    def cancel(job_id: str) -> None:
        with contextlib.suppress(JobNotFound, JobNotActive):  # gone already: nothing to stop
            store.cancel_job(job_id, now_ms())
        progress.advance(task)

    with ThreadPoolExecutor(32, thread_name_prefix="loadgen-cancel") as pool:
        list(pool.map(cancel, [job.id for job in load.jobs]))


def run_embedded(
    make_load: MakeLoad,
    workers: int,
    timeout_s: float,
    exec_timeout_s: float,
    quiet: bool = False,
) -> tuple[Observed, Path, float]:
    # A fresh database in a scratch folder: recurring jobs die with it.
    tmp, ledger, load, observed = _prepare(make_load)
    backends = open_embedded(tmp / "loadgen.db")
    tap = TappedDispatcher()
    backends.dispatcher = tap
    with _progress() if not quiet else Progress(disable=True) as progress:
        task = progress.add_task("registering", total=len(load.jobs))
        t = time.monotonic()
        for start in range(0, len(load.jobs), 5_000):
            chunk = load.jobs[start : start + 5_000]
            register_many(backends.store, chunk, now_ms())
            progress.update(task, completed=start + len(chunk))
        register_s = time.monotonic() - t
        _check_in_time(load)
        node = Node(backends, worker_config=WorkerConfig(concurrency=workers))
        stop = threading.Event()
        thread = threading.Thread(target=node.run, args=(stop,), name="loadgen-node", daemon=True)
        thread.start()
        try:
            last_due = max(load.expected.values())
            _wait(progress, observed, ledger, last_due, timeout_s, lambda: tap.observe(observed), exec_timeout_s)
        finally:
            stop.set()
            thread.join(30)
            tap.observe(observed)
            backends.close()
    return observed, ledger, register_s


def run_cluster(
    config: ClusterConfig,
    make_load: MakeLoad,
    timeout_s: float,
    exec_timeout_s: float,
    quiet: bool = False,
) -> tuple[Observed, Path, float]:
    _, ledger, load, observed = _prepare(make_load)
    consumer = watch_topic(config, from_start=False)

    def poll() -> None:
        for record, appended_at in appended(consumer, 0.05):
            observed.saw_dispatch(record.idempotency_key, appended_at)

    store, close = open_cluster_store(config)
    try:
        with _progress() if not quiet else Progress(disable=True) as progress:
            task = progress.add_task("registering", total=len(load.jobs))
            t = time.monotonic()
            try:
                for start in range(0, len(load.jobs), 2_000):
                    chunk = load.jobs[start : start + 2_000]
                    register_many(store, chunk, now_ms(), config.partitions)
                    progress.update(task, completed=start + len(chunk))
                    poll()
                register_s = time.monotonic() - t
                _check_in_time(load)
                last_due = max(load.expected.values())
                _wait(progress, observed, ledger, last_due, timeout_s, poll, exec_timeout_s)
            finally:
                if load.recurring:
                    _cancel_all(progress, store, load)
    finally:
        consumer.close()
        close()
    return observed, ledger, register_s
