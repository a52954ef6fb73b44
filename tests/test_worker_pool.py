"""The worker pool keeps its size, never moves past a record it failed to
handle, and runs a key in one execution at a time."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import pytest

from pysched import native
from pysched.clock import SystemClock
from pysched.dispatch.inprocess import InProcessConsumer, InProcessDispatcher
from pysched.leader.recording import record_sent
from pysched.model import Job
from pysched.node import Backends, open_embedded
from pysched.protocols import Claim, ClaimHolder, ClaimOutcome, Delivery, FailedClaim, IdempotencyClaims
from pysched.records import DispatchRecord
from pysched.registry import register
from pysched.targets import RunContext
from pysched.worker import WorkerConfig, WorkerPool
from tests.helpers import wait_for


class _DyingConsumer(InProcessConsumer):
    """Ends its thread the way hostile code can: SystemExit, which a thread
    swallows without a word."""

    def next(self, timeout_s: float) -> Delivery | None:
        raise SystemExit(3)


class _FirstConsumerDies(InProcessDispatcher):
    def __init__(self) -> None:
        super().__init__()
        self.consumers = 0

    def consumer(self) -> InProcessConsumer:
        self.consumers += 1
        return _DyingConsumer(self) if self.consumers == 1 else InProcessConsumer(self)


def test_a_worker_thread_that_dies_is_replaced_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    backends = open_embedded(tmp_path / "pysched.db")
    dispatcher = _FirstConsumerDies()
    config = WorkerConfig(concurrency=1, supervise_s=0.05)
    pool = WorkerPool(dispatcher, backends.claims, backends.store, SystemClock(), "test-holder", config)
    stop = threading.Event()
    caplog.set_level(logging.INFO, logger="pysched.worker")
    pool.start(stop)
    try:
        wait_for(lambda: pool.counts["replaced"] == 1, 10, "the dead worker to be replaced")
        assert pool.alive() == ["pysched-heartbeat", "pysched-worker-0"]
        # The replacement consumes: an undecodable record reaches a worker.
        dispatcher.publish([0], [b"not a dispatch record"])
        wait_for(lambda: pool.counts["errors"] == 1, 10, "the replacement to take the record")
        assert dispatcher.qsize() == 0
    finally:
        stop.set()
        pool.join(5)
        backends.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors[:2] == ["pysched-worker-0 died", "pysched-worker-0 is not running: starting a replacement"]


# -- a handling that fails, and executions that overlap ------------------------


class _ScriptedConsumer:
    """Hands out the dispatcher's payloads in order and records what is
    acknowledged; once none is left it sets the stop, so a pool's run ends
    when every delivery was dealt with, however long that took."""

    def __init__(self, dispatcher: _ScriptedDispatcher) -> None:
        self._dispatcher = dispatcher

    def next(self, timeout_s: float) -> Delivery | None:
        d = self._dispatcher
        with d.lock:
            if d.position == len(d.payloads):
                d.stop.set()
                return None
            d.position += 1
            return Delivery(d.payloads[d.position - 1], 0, d.position - 1)

    def ack(self, delivery: Delivery) -> None:
        with self._dispatcher.lock:
            self._dispatcher.acked.append(int(cast(int, delivery.token)))

    def close(self) -> None:
        pass


class _ScriptedDispatcher:
    """A Kafka partition in miniature: one consumer reads it in order, and
    what counts is which deliveries it acknowledged."""

    def __init__(self, payloads: list[bytes], stop: threading.Event) -> None:
        self.payloads = payloads
        self.stop = stop
        self.lock = threading.Lock()
        self.position = 0
        self.acked: list[int] = []

    def publish(self, partitions: Sequence[int], payloads: Sequence[bytes]) -> None:
        raise NotImplementedError("the script is fixed")

    def consumer(self) -> _ScriptedConsumer:
        return _ScriptedConsumer(self)

    def close(self) -> None:
        pass


class _TimesOutOnce:
    """The real claims, but the first call of each method named in ``fail``
    raises TimeoutError, as a claims server that timed out does."""

    def __init__(self, claims: IdempotencyClaims, fail: set[str]) -> None:
        self._claims = claims
        self._fail = set(fail)

    def _maybe_fail(self, method: str) -> None:
        if method in self._fail:
            self._fail.discard(method)
            raise TimeoutError(f"{method} timed out")

    def claim(self, record: DispatchRecord, holder: str, now_ms: int, lease_ms: int) -> Claim:
        self._maybe_fail("claim")
        return self._claims.claim(record, holder, now_ms, lease_ms)

    def heartbeat(self, keys: Sequence[str], holders: Sequence[str], now_ms: int, lease_ms: int) -> list[int]:
        return self._claims.heartbeat(keys, holders, now_ms, lease_ms)

    def raise_fence(self, partition: int, fence: int) -> None:
        self._claims.raise_fence(partition, fence)

    def complete(self, key: str, holder: str, succeeded: bool, result: str | None, now_ms: int) -> bool:
        self._maybe_fail("complete")
        return self._claims.complete(key, holder, succeeded, result, now_ms)

    def failed_claim(self, key: str) -> FailedClaim | None:
        return self._claims.failed_claim(key)


def _dispatched(backends: Backends, jobs: list[Job]) -> list[bytes]:
    """Register one-shot ``jobs`` and hand their runs on, as a leader does:
    the payloads a worker receives, in the order of ``jobs``."""
    now = SystemClock().now_ms()
    for job in jobs:
        register(backends.store, job, now)
    fences = backends.coordinator.poll("leader", now)
    rows = backends.store.due_runs(fences, now + 60_000, now)
    record_sent(backends.store, rows, fences, {}, now)
    rows.sort(key=lambda row: [j.id for j in jobs].index(row.job_id))
    return [native.encode_batch([row], fences[row.partition], now)[0] for row in rows]


def _shell_job(job_id: str, command: str) -> Job:
    at = SystemClock().now_ms() + 1_000
    return Job.model_validate(
        {"id": job_id, "schedule": {"kind": "once", "run_at_ms": at}, "target": {"kind": "shell", "command": command}}
    )


def _run_pool(backends: Backends, claims: IdempotencyClaims, payloads: list[bytes]) -> _ScriptedDispatcher:
    """Run a one-thread pool until its consumer has handed out every
    payload and the pool has stopped."""
    stop = threading.Event()
    dispatcher = _ScriptedDispatcher(payloads, stop)
    config = WorkerConfig(concurrency=1, retry_base_s=0.01, retry_max_s=0.05)
    pool = WorkerPool(dispatcher, claims, backends.store, SystemClock(), "node-1", config)
    pool.start(stop)
    assert pool.join(60), "the pool did not stop"
    return dispatcher


def test_a_record_whose_claim_timed_out_is_run_before_a_later_one_is_acknowledged(tmp_path: Path) -> None:
    # On Kafka, acknowledging the second record commits past the first: had
    # the first been skipped, it would never be delivered again.
    backends = open_embedded(tmp_path / "pysched.db")
    try:
        payloads = _dispatched(backends, [_shell_job("first", "true"), _shell_job("second", "true")])
        dispatcher = _run_pool(backends, _TimesOutOnce(backends.claims, {"claim"}), payloads)
        assert dispatcher.acked == [0, 1]
        assert [r.state for r in backends.store.history("first")] == ["succeeded"]
        assert [r.state for r in backends.store.history("second")] == ["succeeded"]
    finally:
        backends.close()


def test_an_outcome_that_failed_to_record_is_recorded_and_the_run_not_repeated(tmp_path: Path) -> None:
    backends = open_embedded(tmp_path / "pysched.db")
    ran = tmp_path / "ran"
    try:
        (payload,) = _dispatched(backends, [_shell_job("job", f"echo once >> {ran}")])
        dispatcher = _run_pool(backends, _TimesOutOnce(backends.claims, {"complete"}), [payload])
        assert dispatcher.acked == [0]
        assert ran.read_text() == "once\n"
        assert [r.state for r in backends.store.history("job")] == ["succeeded"]
        # The claim says so too: it is not left running, and is never run again.
        again = backends.claims.claim(native.decode(payload), "another-node", SystemClock().now_ms(), 30_000)
        assert again.outcome is ClaimOutcome.SUCCEEDED
    finally:
        backends.close()


class _MemoryClaims:
    """Idempotency claims in memory, with the contract's rules (those the
    cluster's Redis and Cassandra claims follow): a live claim is BUSY to
    any other holder and taken over by its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claims: dict[str, tuple[str, str, int, str | None]] = {}  # key -> state, holder, expiry, result
        self._floors: dict[int, int] = {}

    def claim(self, record: DispatchRecord, holder: str, now_ms: int, lease_ms: int) -> Claim:
        with self._lock:
            floor = self._floors.get(record.partition, 0)
            if record.fence < floor:
                return Claim(ClaimOutcome.FENCED, fence_floor=floor)
            self._floors[record.partition] = floor = record.fence
            key = record.idempotency_key
            current = self._claims.get(key)
            if current is not None:
                state, current_holder, expires_ms, result = current
                if state == "succeeded":
                    return Claim(ClaimOutcome.SUCCEEDED, result=result, fence_floor=floor)
                if state == "running" and expires_ms > now_ms and current_holder != holder:
                    return Claim(ClaimOutcome.BUSY, fence_floor=floor)
            self._claims[key] = ("running", holder, now_ms + lease_ms, None)
            return Claim(ClaimOutcome.CLAIMED if current is None else ClaimOutcome.TAKEN_OVER, fence_floor=floor)

    def heartbeat(self, keys: Sequence[str], holders: Sequence[str], now_ms: int, lease_ms: int) -> list[int]:
        not_extended = []
        with self._lock:
            for i, (key, holder) in enumerate(zip(keys, holders, strict=True)):
                current = self._claims.get(key)
                if current is not None and current[:2] == ("running", holder):
                    self._claims[key] = ("running", holder, now_ms + lease_ms, None)
                else:
                    not_extended.append(i)
        return not_extended

    def raise_fence(self, partition: int, fence: int) -> None:
        with self._lock:
            self._floors[partition] = max(fence, self._floors.get(partition, 0))

    def unfinished_claim(self, key: str, now_ms: int) -> ClaimHolder | None:
        with self._lock:
            current = self._claims.get(key)
            if current is None or current[0] != "running":
                return None
            return ClaimHolder(current[1], 0, current[2] if current[2] > now_ms else None)

    def complete(self, key: str, holder: str, succeeded: bool, result: str | None, now_ms: int) -> bool:
        with self._lock:
            current = self._claims.get(key)
            if current is not None and current[:2] == ("running", holder):
                self._claims[key] = ("succeeded" if succeeded else "failed", holder, current[2], result)
            return current is not None and current[1] == holder

    def failed_claim(self, key: str) -> FailedClaim | None:
        return None  # its failures keep nothing to record


# What the Python target below sees: each start of the run, and the signal
# that lets the first one finish.
_starts: list[str] = []
_first_started = threading.Event()
_let_first_finish = threading.Event()


def held_run(ctx: RunContext) -> None:
    """A Python target whose first start keeps running until released."""
    _starts.append(ctx.idempotency_key)
    if len(_starts) == 1:
        _first_started.set()
        _let_first_finish.wait(30)


def test_a_sibling_thread_of_the_same_node_does_not_take_over_a_run_in_flight(tmp_path: Path) -> None:
    # After a rebalance a record still running on one consumer thread is
    # delivered to another of the same process: one node, two executions.
    backends = open_embedded(tmp_path / "pysched.db")
    _starts.clear()
    _first_started.clear()
    _let_first_finish.clear()
    at = SystemClock().now_ms() + 1_000
    job = Job.model_validate(
        {
            "id": "held",
            "schedule": {"kind": "once", "run_at_ms": at},
            "target": {"kind": "python", "ref": f"{__name__}:held_run"},
        }
    )
    pool = WorkerPool(backends.dispatcher, _MemoryClaims(), backends.store, SystemClock(), "node-1")
    try:
        (payload,) = _dispatched(backends, [job])
        outcomes: list[ClaimOutcome] = []
        first = threading.Thread(target=lambda: outcomes.append(pool.handle(payload)))
        first.start()
        assert _first_started.wait(30), "the first execution did not start"
        try:
            second = pool.handle(payload)
        finally:
            _let_first_finish.set()
            first.join(30)
        assert second is ClaimOutcome.BUSY
        assert outcomes == [ClaimOutcome.CLAIMED]
        assert len(_starts) == 1
        assert [r.state for r in backends.store.history("held")] == ["succeeded"]
    finally:
        backends.close()


# -- the stop: the grace period, then the interruption ------------------------


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has ended


def test_a_run_keeps_its_claim_through_the_grace_then_is_interrupted_and_let_go_of(tmp_path: Path) -> None:
    backends = open_embedded(tmp_path / "pysched.db")
    pid_file = tmp_path / "pid"
    stop = threading.Event()
    (payload,) = _dispatched(backends, [_shell_job("long", f"echo $$ > {pid_file}; sleep 60")])
    dispatcher = _ScriptedDispatcher([payload], stop)
    # A short lease, beaten often: it would run out within the wait below
    # were the claim not extended after the stop.
    config = WorkerConfig(concurrency=1, lease_ms=2_000, heartbeat_ms=100, kill_after_s=10)
    pool = WorkerPool(dispatcher, backends.claims, backends.store, SystemClock(), "node-1", config)
    record = native.decode(payload)
    pid = None
    pool.start(stop)
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() != "", 30, "the run to start")
        pid = int(pid_file.read_text())
        stop.set()
        assert not pool.join(4.5), "the run went on through the grace period"
        # Still its own: another node would not run it beside it.
        now = SystemClock().now_ms()
        assert backends.claims.claim(record, "node-2/1", now, 30_000).outcome is ClaimOutcome.BUSY
        pool.interrupt("the test stopped the node")
        wait_for(lambda: not pool.alive(), 10, "the worker and heartbeat threads to end")
        wait_for(lambda: not _alive(pid), 10, "the command to be gone")
        assert [(r.state, r.attempt) for r in backends.store.history("long")] == [("interrupted", 1)]
        assert dispatcher.acked == []
        assert pool.counts["interrupted"] == 1 and pool.counts["failed"] == 0
        # Let go of: the next delivery takes it at once.
        now = SystemClock().now_ms()
        assert backends.claims.claim(record, "node-2/1", now, 30_000).outcome is ClaimOutcome.TAKEN_OVER
    finally:
        stop.set()
        pool.interrupt("the test ended")
        backends.close()
        if pid is not None and _alive(pid):
            os.killpg(pid, signal.SIGKILL)
