"""A worker on the embedded queue takes several deliveries at once, never
more than its share of what is queued; a batch's claims are one commit, its
starts another and its ends a third; a batch whose recording fails is recorded again without
running anything twice; and a node that begins to stop starts nothing more
of a batch, whose runs are then handed on again and run once."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from pysched import native
from pysched.breakers import BreakerPolicy
from pysched.clock import SystemClock
from pysched.dispatch.inprocess import InProcessDispatcher
from pysched.leader.recording import record_sent
from pysched.model import Job
from pysched.node import Backends
from pysched.registry import register
from pysched.targets import RunContext
from pysched.worker import DeliveryWorker, Executor, WorkerConfig

T = TypeVar("T")

CONFIG = WorkerConfig(concurrency=1, batch=4, retry_base_s=0.01, retry_max_s=0.05)

_runs: list[str] = []
_while_running: list[Callable[[], None]] = []


def count_run(ctx: RunContext) -> None:
    _runs.append(ctx.idempotency_key)
    while _while_running:
        _while_running.pop(0)()


# A run of the job named here signals, then waits until released.
_blocking: dict[str, threading.Event] = {}


def count_or_block(ctx: RunContext) -> None:
    count_run(ctx)
    if ctx.job_id in _blocking:
        _blocking["calling"].set()
        _blocking[ctx.job_id].wait(10)


def count_and_fail(ctx: RunContext) -> None:
    count_run(ctx)
    raise RuntimeError("the downstream is down")


@pytest.fixture(autouse=True)
def _no_runs_yet() -> Iterator[None]:
    _runs.clear()
    _while_running.clear()
    yield
    _runs.clear()
    _while_running.clear()


def _job(job_id: str, target: str = "count_run") -> Job:
    at = SystemClock().now_ms() + 1_000
    return Job.model_validate(
        {
            "id": job_id,
            "schedule": {"kind": "once", "run_at_ms": at},
            "target": {"kind": "python", "ref": f"{__name__}:{target}"},
            # They call one service: one breaker and budget between them.
            "downstream": "svc:batch",
        }
    )


def _queue(backends: Backends, dispatcher: InProcessDispatcher, n: int, target: str = "count_run") -> list[str]:
    """Register n one-shots, hand their runs on as a leader does, and queue
    them; their idempotency keys, in queue order."""
    now = SystemClock().now_ms()
    ids = [f"job-{k:02d}" for k in range(n)]
    for job_id in ids:
        register(backends.store, _job(job_id, target), now)
    fences = backends.coordinator.poll("leader", now)
    rows = backends.store.due_runs(fences, now + 60_000, now)
    record_sent(backends.store, rows, fences, {}, now)
    rows.sort(key=lambda row: row.job_id)
    payloads = [native.encode_batch([row], fences[row.partition], now)[0] for row in rows]
    dispatcher.publish([row.partition for row in rows], payloads)
    return [native.decode(p).idempotency_key for p in payloads]


def _worker(backends: Backends, dispatcher: InProcessDispatcher, executor: Executor | None = None) -> DeliveryWorker:
    executor = executor or Executor(backends.claims, backends.store, SystemClock(), "node-1", CONFIG)
    return DeliveryWorker(dispatcher.consumer(), executor, random.Random(3), CONFIG.batch)


def _times_out_on_call(n: int, real: Callable[..., T]) -> Callable[..., T]:
    """``real``, whose ``n``-th call (from 1) times out instead."""
    calls = 0

    def wrapped(*args: object, **kwargs: object) -> T:
        nonlocal calls
        calls += 1
        if calls == n:
            raise TimeoutError("the store timed out")
        return real(*args, **kwargs)

    return wrapped


def _traced(backends: Backends) -> list[str]:
    """The statements of the database's writers from now on, as a list
    that grows."""
    seen: list[str] = []
    writes = backends.store.db._writes  # type: ignore[attr-defined]
    with writes.transaction() as conn:
        conn.set_trace_callback(seen.append)
    seen.clear()
    return seen


def _commits(statements: list[str]) -> list[list[str]]:
    """The writes of each commit, in order."""
    commits: list[list[str]] = []
    for sql in statements:
        if sql == "BEGIN IMMEDIATE":
            commits.append([])
        elif sql.startswith(("INSERT", "UPDATE", "DELETE")):
            commits[-1].append(sql)
    return commits


def test_a_batchs_claims_starts_and_ends_are_written_together(backends: Backends) -> None:
    dispatcher = InProcessDispatcher()
    keys = _queue(backends, dispatcher, 6)
    worker = _worker(backends, dispatcher)
    traced = _traced(backends)
    assert worker.step(SystemClock().now_ms())
    assert _runs == keys[:4]
    commits = _commits(traced)
    # The batch's claims, its starts, then its ends: each run's claim and
    # history in the same commit, and the batch's in one unless an end
    # waited long enough to be written before a later target (a slow
    # machine). The downstream's attempt counts are written now and then.
    commits = [c for c in commits if not any("attempt_counts" in sql for sql in c)]
    assert [sql.split(" (")[0] for sql in commits[0]] == ["INSERT INTO claims"] * 4
    assert [sql.startswith("UPDATE runs SET state = 'running'") for sql in commits[1]] == [True] * 4
    ends = commits[2:]
    assert 1 <= len(ends) <= 4
    assert sum(len(end) for end in ends) == 8
    for end in ends:
        kinds = [sql.split(" SET")[0] for sql in end]
        assert kinds.count("UPDATE claims") == kinds.count("UPDATE runs")
    assert dispatcher.qsize() == 2
    assert [r.state for k in range(4) for r in backends.store.history(f"job-{k:02d}")] == ["succeeded"] * 4
    assert worker.step(SystemClock().now_ms())
    assert _runs == keys


def test_a_worker_takes_no_more_than_its_share_of_the_queue(backends: Backends) -> None:
    dispatcher = InProcessDispatcher()
    _queue(backends, dispatcher, 5)
    first = _worker(backends, dispatcher)
    _worker(backends, dispatcher)  # a second consumer shares the queue
    assert first.step(SystemClock().now_ms())
    # One, and half of the four left.
    assert len(_runs) == 3
    assert dispatcher.qsize() == 2


def test_a_batch_whose_recording_failed_is_recorded_again_and_nothing_runs_twice(backends: Backends) -> None:
    dispatcher = InProcessDispatcher()
    keys = _queue(backends, dispatcher, 3)
    worker = _worker(backends, dispatcher)
    store = backends.store
    store.run_finished = _times_out_on_call(2, store.run_finished)  # type: ignore[method-assign]
    assert worker.step(SystemClock().now_ms())
    # The second end was not written, nor its claim's completion (the same
    # commit); the third run may not have been called yet.
    (second,) = store.history("job-01")
    assert second.state == "running"
    assert _runs in (keys[:2], keys)
    retry_at = worker.retry_at_ms
    assert retry_at is not None
    # Tried again together, after one backoff.
    assert worker.step(retry_at)
    assert worker.retry_at_ms is None
    assert _runs == keys
    assert [r.state for k in range(3) for r in store.history(f"job-{k:02d}")] == ["succeeded"] * 3
    assert worker.retry_at_ms is None


def test_a_stopping_node_starts_no_more_of_a_batch_and_its_runs_are_handed_on_again(backends: Backends) -> None:
    dispatcher = InProcessDispatcher()
    keys = _queue(backends, dispatcher, 4)
    executor = Executor(backends.claims, backends.store, SystemClock(), "node-1", CONFIG)
    stopping = threading.Event()
    executor.stopping = stopping
    worker = _worker(backends, dispatcher, executor)
    _while_running.append(stopping.set)
    assert worker.step(SystemClock().now_ms())
    assert _runs == keys[:1]
    assert worker.retry_at_ms is None  # nothing held: the three were let go of
    for k in range(1, 4):
        # Recorded started with the batch, then interrupted before their
        # targets: owed again, as their next attempt.
        (run,) = backends.store.history(f"job-{k:02d}")
        assert run.state == "interrupted"
    # The next node's leader, once the stopped one's lease has run out,
    # hands them on again.
    now = SystemClock().now_ms() + 600_000
    fences = backends.coordinator.poll("node-2", now)
    again = [r for r in backends.store.due_runs(fences, now + 60_000, now) if r.job_id != "job-00"]
    assert sorted(r.job_id for r in again) == ["job-01", "job-02", "job-03"]
    payloads = [native.encode_batch([row], fences[row.partition], now)[0] for row in again]
    dispatcher.publish([row.partition for row in again], payloads)
    restarted = _worker(backends, dispatcher)
    while dispatcher.qsize():
        restarted.step(SystemClock().now_ms())
    assert sorted(_runs) == sorted(keys)


def test_a_breaker_opened_by_a_batchs_first_calls_parks_its_later_runs_and_spends_no_attempt(
    backends: Backends,
) -> None:
    # Five failures in a row open the breaker the batch's jobs share: its
    # last three runs, recorded started with it, make no call and keep
    # their first attempt.
    dispatcher = InProcessDispatcher()
    config = WorkerConfig(concurrency=1, batch=8, breaker=BreakerPolicy(failure_threshold=5))
    executor = Executor(backends.claims, backends.store, SystemClock(), "node-1", config)
    keys = _queue(backends, dispatcher, 8, target="count_and_fail")
    worker = DeliveryWorker(dispatcher.consumer(), executor, random.Random(3), config.batch)
    assert worker.step(SystemClock().now_ms())
    assert _runs == keys[:5]
    runs = [backends.store.history(f"job-{k:02d}")[0] for k in range(8)]
    # Retried, within the retry budget.
    assert [r.state for r in runs] == ["retrying"] * 5 + ["parked"] * 3
    assert [r.attempt for r in runs[5:]] == [1, 1, 1]
    assert not any(r.failures for r in runs[5:])


def test_the_retry_budget_is_asked_outside_the_write_that_records_the_failure(backends: Backends) -> None:
    # The budget holds a lock of its own while its counts wait for the
    # database; asked from inside a write, it would wait on a thread that
    # waits on this one.
    dispatcher = InProcessDispatcher()
    executor = Executor(backends.claims, backends.store, SystemClock(), "node-1", CONFIG)
    writes = backends.store.db._writes  # type: ignore[attr-defined]
    inside: list[bool] = []
    grant = executor.downstreams.grant_retry

    def watched(downstream: str) -> bool:
        inside.append(writes.connection_in_use() is not None)
        return grant(downstream)

    executor.downstreams.grant_retry = watched  # type: ignore[method-assign]
    _queue(backends, dispatcher, 3, target="count_and_fail")
    worker = DeliveryWorker(dispatcher.consumer(), executor, random.Random(3), CONFIG.batch)
    assert worker.step(SystemClock().now_ms())
    assert inside == [False, False, False]


def test_a_run_whose_job_is_cancelled_while_it_waits_in_its_batch_is_not_called(backends: Backends) -> None:
    dispatcher = InProcessDispatcher()
    executor = Executor(backends.claims, backends.store, SystemClock(), "node-1", CONFIG)
    keys = _queue(backends, dispatcher, 3)

    def cancel_the_second() -> None:
        now = SystemClock().now_ms()
        backends.store.cancel_job("job-01", now)
        executor.heartbeat_step(now)  # finds its job cancelled

    _while_running.append(cancel_the_second)
    worker = DeliveryWorker(dispatcher.consumer(), executor, random.Random(3), CONFIG.batch)
    assert worker.step(SystemClock().now_ms())
    assert _runs == [keys[0], keys[2]]
    (run,) = backends.store.history("job-01")
    assert run.state == "cancelled"
    assert "cancelled" in (run.error or "")


def test_an_end_whose_recording_failed_is_recorded_even_after_its_lease_was_lost(backends: Backends) -> None:
    # The store was down long enough for the heartbeat to give the lease up:
    # the run has ended all the same, and is recorded, not run again.
    dispatcher = InProcessDispatcher()
    executor = Executor(backends.claims, backends.store, SystemClock(), "node-1", CONFIG)
    keys = _queue(backends, dispatcher, 1)
    backends.claims.complete = _times_out_on_call(1, backends.claims.complete)  # type: ignore[method-assign]
    worker = DeliveryWorker(dispatcher.consumer(), executor, random.Random(3), CONFIG.batch)
    assert worker.step(SystemClock().now_ms())
    (execution,) = [h.execution for h in worker._held]
    executor.stop(execution, "its lease ran out: not renewed", lease_lost=True)
    retry_at = worker.retry_at_ms
    assert retry_at is not None
    assert worker.step(retry_at)
    assert _runs == keys
    assert [r.state for r in backends.store.history("job-00")] == ["succeeded"]


def test_a_stop_past_its_grace_records_the_runs_that_ended_and_wait_in_their_batch(backends: Backends) -> None:
    dispatcher = InProcessDispatcher()
    executor = Executor(backends.claims, backends.store, SystemClock(), "node-1", CONFIG)
    keys = _queue(backends, dispatcher, 2, target="count_or_block")
    calling_second = _blocking["calling"] = threading.Event()
    release = _blocking["job-01"] = threading.Event()
    worker = DeliveryWorker(dispatcher.consumer(), executor, random.Random(3), CONFIG.batch)
    stepping = threading.Thread(target=worker.step, args=(SystemClock().now_ms(),))
    stepping.start()
    try:
        assert calling_second.wait(10)
        executor.record_ended()  # what the pool's interruption does
        assert [r.state for r in backends.store.history("job-00")] == ["succeeded"]
        assert [r.state for r in backends.store.history("job-01")] == ["running"]
    finally:
        release.set()
        stepping.join(10)
        _blocking.clear()
    assert _runs == keys
    assert [r.state for r in backends.store.history("job-00")] == ["succeeded"]


def test_a_run_of_a_batch_that_ended_is_recorded_before_the_next_of_its_batch_is_called(backends: Backends) -> None:
    """One after another on one thread, as the simulator calls them: the
    first run's end is in the store before the second target starts, so
    that a crash while the second runs does not run the first again."""
    dispatcher = InProcessDispatcher()
    keys = _queue(backends, dispatcher, 2, "count_then_look")
    _at_second_call.append(lambda: _seen.extend(r.state for r in backends.store.history("job-00")))
    assert _worker(backends, dispatcher).step(SystemClock().now_ms())
    assert _runs == keys
    assert _seen == ["succeeded"]


# What the second call of a batch does, and what it saw.
_at_second_call: list[Callable[[], None]] = []
_seen: list[str] = []


def count_then_look(ctx: RunContext) -> None:
    count_run(ctx)
    if len(_runs) == 2:
        while _at_second_call:
            _at_second_call.pop()()
