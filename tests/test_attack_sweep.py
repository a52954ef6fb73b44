"""Attacks on the leader's sweep (ScheduleStore.sweep_owed)."""

from __future__ import annotations

import random

import pytest

import tests.test_contract as contract
from pysched.clock import ManualClock
from pysched.leader.recording import record_sent
from pysched.model import Job
from pysched.protocols import SWEEP_BUCKET_MS, SWEEP_LOOK_AFTER_MS, FailedAttempt, PlannedRun
from pysched.records import DispatchRecord
from pysched.targets import RunContext
from pysched.worker import Executor, WorkerConfig
from tests.test_contract import Backend, _fresh_t0, backend, every, read_through, record

__all__ = ["_fresh_t0", "backend"]  # the shared fixtures, used by name

HORIZON = 600_000
LEASE_MS = 5_000
SWEEP_AT = 500 + SWEEP_LOOK_AFTER_MS + 3 * SWEEP_BUCKET_MS

calls: list[int] = []


def failing(ctx: RunContext) -> None:
    calls.append(ctx.attempt)
    raise RuntimeError("a partial effect, then a failure")


def _retried(t0: int, retries: int, delay_ms: int) -> Job:
    return Job.model_validate(
        {
            "id": "o",
            "schedule": {"kind": "once", "run_at_ms": t0 + 100},
            "target": {"kind": "python", "ref": f"{__name__}:failing"},
            "retry": {"retries": retries, "backoff_base_s": delay_ms / 1000, "backoff_cap_s": delay_ms / 1000},
        }
    )


class _AtCeiling(random.Random):
    """Draws every full-jitter delay at its ceiling: the retry's due time
    is the policy's base, known to the test."""

    def randint(self, a: int, b: int) -> int:
        return b


def _fail_unheard(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, job: Job
) -> tuple[DispatchRecord, FailedAttempt, int | None]:
    """Attempt 1 of ``job`` fails at t0 + 600; its claim keeps the failure,
    then the history write is refused (a store brownout) and the worker
    dies. Returns the history write refused (run_failed's arguments)."""
    refused_writes: list[tuple[DispatchRecord, FailedAttempt, int | None]] = []
    calls.clear()
    t0 = contract.T0
    store = backend.store
    store.add_job(job, 0, 0, PlannedRun(t0 + 100, t0 + 100), t0)
    (sent,) = store.due_runs(every(1), t0 + 60_000, t0 + 500)
    record_sent(store, [sent], every(1), {}, t0 + 500)
    record_sent(store, [], every(1), read_through(t0 + 20_000), t0 + 20_000)
    with monkeypatch.context() as m:

        def refused(record: DispatchRecord, failure: FailedAttempt, retry_due_ms: int | None) -> None:
            refused_writes.append((record, failure, retry_due_ms))
            raise ConnectionError("write timed out")

        m.setattr(store, "run_failed", refused)
        config = WorkerConfig(lease_ms=LEASE_MS)
        w1 = Executor(backend.claims, store, ManualClock(t0 + 600), "w1", config, rng=_AtCeiling())
        with pytest.raises(ConnectionError):
            w1.attempt([w1.new_execution(record(sent, 1))])
    backend.workers_died()
    assert len(calls) == 1
    (write,) = refused_writes
    return write


def _sweep_and_deliver(backend: Backend, sweep_at: int, deliver_at: int) -> None:
    """The leader's sweep at ``sweep_at``; whatever is due by ``deliver_at``
    is then delivered and run."""
    store = backend.store
    store.sweep_owed(every(1), sweep_at)
    for owed in store.due_runs(every(1), deliver_at + HORIZON, deliver_at):
        if owed.due_ms > deliver_at:
            continue
        record_sent(store, [owed], every(1), read_through(deliver_at), deliver_at)
        w2 = Executor(backend.claims, store, ManualClock(deliver_at + 100), "w2", WorkerConfig(lease_ms=LEASE_MS))
        w2.attempt([w2.new_execution(record(owed, 1))])


def test_a_dead_letter_whose_history_write_was_refused_is_not_run_again_by_the_sweep(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sweep finds a failed claim whose history still says running (its
    # worker died unheard): the failure the claim keeps says no retry is
    # left, so the run is a dead letter, never a delivery to run again.
    t0 = contract.T0
    _fail_unheard(backend, monkeypatch, _retried(t0, 0, 1_000))
    _sweep_and_deliver(backend, t0 + SWEEP_AT, t0 + SWEEP_AT + SWEEP_BUCKET_MS)
    # A dead letter runs again only when redriven.
    (run,) = backend.store.history("o")
    assert run.state == "failed", run
    assert len(calls) == 1, calls


def test_a_failure_whose_history_write_was_refused_is_retried_after_its_backoff_not_at_the_sweep(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A failure with a retry left, kept on its claim for a retry due far
    # after the sweep: the sweep records the failure and the retry waits its
    # backoff, rather than the next attempt running at sweep time.
    backoff_ms = SWEEP_AT + 40_000
    t0 = contract.T0
    _fail_unheard(backend, monkeypatch, _retried(t0, 1, backoff_ms))
    retry_due = t0 + 600 + backoff_ms
    _sweep_and_deliver(backend, t0 + SWEEP_AT, t0 + SWEEP_AT + SWEEP_BUCKET_MS)
    (run,) = backend.store.history("o")
    assert run.state == "retrying", run
    assert [f.attempt for f in backend.store.get_run("o", t0 + 100).failures] == [1]
    assert len(calls) == 1, calls
    # Due at the retry time the failing worker chose, and run then, once.
    _sweep_and_deliver(backend, retry_due, retry_due)
    assert calls == [1, 2], calls


def test_a_failure_recorded_by_the_sweep_and_then_by_its_slow_worker_is_one_failure_and_one_retry(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker was only slow: its history write, tried again, lands after
    # the sweep recorded the failure its claim kept. The retry was due
    # before the sweep (the sweep places it at its own time), the worker's
    # at the time it drew: still one failure, and the retry runs once.
    t0 = contract.T0
    late_write = _fail_unheard(backend, monkeypatch, _retried(t0, 1, 40_000))
    backend.store.sweep_owed(every(1), t0 + SWEEP_AT)
    backend.store.run_failed(*late_write)
    for at in range(t0 + SWEEP_AT, t0 + SWEEP_AT + 5 * SWEEP_BUCKET_MS, SWEEP_BUCKET_MS):
        _sweep_and_deliver(backend, at, at)
    assert [f.attempt for f in backend.store.get_run("o", t0 + 100).failures] == [1, 2]
    assert calls == [1, 2], calls
