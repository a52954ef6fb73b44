"""Attacks on the leader's sweep (ScheduleStore.sweep_owed)."""

from __future__ import annotations

import pytest

import tests.test_contract as contract
from pysched.clock import ManualClock
from pysched.leader.recording import record_sent
from pysched.model import Job
from pysched.protocols import SWEEP_BUCKET_MS, SWEEP_LOOK_AFTER_MS, PlannedRun
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


def _never_retried(t0: int) -> Job:
    return Job.model_validate(
        {
            "id": "o",
            "schedule": {"kind": "once", "run_at_ms": t0 + 100},
            "target": {"kind": "python", "ref": f"{__name__}:failing"},
            "retry": {"retries": 0},
        }
    )


def test_a_dead_letter_whose_history_write_was_refused_is_not_run_again_by_the_sweep(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    # The sweep takes a failed claim whose history still says running for
    # a dead worker's run, and owes it again as the next delivery; that
    # delivery takes the failed claim over and runs the target again,
    # though the failure the claim keeps says no retry is left.
    if backend.name != "sqlite":
        reason = "the sweep owes again a run whose failed claim is a dead letter: it runs again"
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    calls.clear()
    t0 = contract.T0
    store = backend.store
    store.add_job(_never_retried(t0), 0, 0, PlannedRun(t0 + 100, t0 + 100), t0)
    (sent,) = store.due_runs(every(1), t0 + 60_000, t0 + 500)
    record_sent(store, [sent], every(1), {}, t0 + 500)
    record_sent(store, [], every(1), read_through(t0 + 20_000), t0 + 20_000)
    # Attempt 1 fails; retries 0: a dead letter. Its claim keeps the failure,
    # then the history write is refused (a store brownout) and the worker dies.
    with monkeypatch.context() as m:

        def refused(*args: object) -> None:
            raise ConnectionError("write timed out")

        m.setattr(store, "run_failed", refused)
        w1 = Executor(backend.claims, store, ManualClock(t0 + 600), "w1", WorkerConfig(lease_ms=LEASE_MS))
        with pytest.raises(ConnectionError):
            w1.attempt([w1.new_execution(record(sent, 1))])
    backend.workers_died()
    assert len(calls) == 1
    # The leader's sweep, and whatever it owes is delivered.
    store.sweep_owed(every(1), t0 + SWEEP_AT)
    at = t0 + SWEEP_AT + SWEEP_BUCKET_MS
    for owed in store.due_runs(every(1), t0 + HORIZON, at):
        record_sent(store, [owed], every(1), read_through(at), at)
        w2 = Executor(backend.claims, store, ManualClock(at + 100), "w2", WorkerConfig(lease_ms=LEASE_MS))
        w2.attempt([w2.new_execution(record(owed, 1))])
    # A dead letter runs again only when redriven.
    (run,) = store.history("o")
    assert run.state == "failed", run
    assert len(calls) == 1, calls
