"""Contract tests of the leader's sweep (ScheduleStore.sweep_owed): a run
handed on whose worker died unheard, its claim dead and no row owing it, is
owed again once and runs once; every engine alike. The embedded engine owes
such a run by its state and claim already (its sweep finds nothing to do);
the cluster's watermark has passed it, and Kafka delivers it again only on
a rebalance."""

from __future__ import annotations

import pytest

import tests.test_contract as contract
from pysched.clock import ManualClock
from pysched.leader.recording import record_sent
from pysched.model import Job
from pysched.protocols import (
    DEAD_CLAIM_AFTER_MS,
    SWEEP_BUCKET_MS,
    SWEEP_LOOK_AFTER_MS,
    ClaimOutcome,
    PlannedRun,
    Run,
)
from pysched.worker import Executor, WorkerConfig
from tests.test_contract import (
    Backend,
    _fresh_t0,
    _while_running,
    backend,
    every,
    once_job,
    read_through,
    record,
)

__all__ = ["_fresh_t0", "backend"]  # the shared fixtures, used by name

HORIZON = 600_000
LEASE_MS = 5_000
SENT_AT = 500
# When the sweep's look at the run sent at SENT_AT has come due and been
# read, with its claim's lease long dead.
SWEEP_AT = SENT_AT + SWEEP_LOOK_AFTER_MS + 3 * SWEEP_BUCKET_MS
assert SWEEP_AT > SENT_AT + LEASE_MS + DEAD_CLAIM_AFTER_MS


def _sent(backend: Backend, job: Job | None = None) -> Run:
    """A one-shot due at T0+100, handed on at T0+SENT_AT under fence 1; the
    leader has then moved its watermarks past it."""
    t0 = contract.T0
    store = backend.store
    store.add_job(job or once_job("o", t0 + 100), 0, 0, PlannedRun(t0 + 100, t0 + 100), t0)
    (sent,) = [r for r in store.due_runs(every(1), t0 + 60_000, t0 + SENT_AT) if r.job_id == "o"]
    record_sent(store, [sent], every(1), {}, t0 + SENT_AT)
    _leader_moves_on(backend, t0 + 20_000)
    return sent


def _leader_moves_on(backend: Backend, now: int) -> None:
    record_sent(backend.store, [], every(1), read_through(now), now)


def _owed(backend: Backend, now: int) -> list[tuple[str, int]]:
    return [(r.job_id, r.attempt) for r in backend.store.due_runs(every(1), contract.T0 + HORIZON, now)]


def test_a_run_whose_worker_died_unheard_is_owed_again_by_the_sweep_and_runs_once(backend: Backend) -> None:
    # Hole C1, the part left: the worker's process died after its hand-back
    # failed (or the hand-back was lost): history and claim said running,
    # the claim's lease long dead, and nothing handed the run on again.
    t0 = contract.T0
    store, claims = backend.store, backend.claims
    sent = _sent(backend)
    delivered = record(sent, 1)
    assert claims.claim(delivered, "w1/1", t0 + 600, LEASE_MS).outcome is ClaimOutcome.CLAIMED
    assert store.run_started(delivered, "w1", t0 + 600) == 1
    backend.workers_died()
    if backend.name != "sqlite":  # which reads runs by their state and claim, never from a watermark
        assert _owed(backend, t0 + SWEEP_AT) == []
    assert store.sweep_owed(every(1), t0 + SWEEP_AT) == (0 if backend.name == "sqlite" else 1)
    # Owed once, as its next delivery: a second sweep adds nothing.
    assert store.sweep_owed(every(1), t0 + SWEEP_AT + SWEEP_BUCKET_MS) == 0
    (again,) = store.due_runs(every(1), t0 + HORIZON, t0 + SWEEP_AT + SWEEP_BUCKET_MS)
    assert (again.run_id, again.attempt) == (sent.run_id, 2)
    sent_at = t0 + SWEEP_AT + SWEEP_BUCKET_MS
    record_sent(store, [again], every(1), read_through(sent_at), sent_at)
    redelivered = record(again, 1)
    assert claims.claim(redelivered, "w2/1", sent_at + 100, LEASE_MS).outcome is ClaimOutcome.TAKEN_OVER
    # The same attempt: the first never ended.
    assert store.run_started(redelivered, "w2", sent_at + 100) == 1
    assert claims.complete(redelivered.idempotency_key, "w2/1", True, "ok", sent_at + 200)
    store.run_finished(redelivered, "succeeded", None, "ok", sent_at + 200)
    later = sent_at + SWEEP_LOOK_AFTER_MS + 3 * SWEEP_BUCKET_MS
    assert store.sweep_owed(every(1), later) == 0
    _leader_moves_on(backend, later)
    assert _owed(backend, later + 1_000) == []
    (run,) = store.history("o")
    assert (run.state, run.worker, run.attempt) == ("succeeded", "w2", 1)


def _python_once(t0: int) -> Job:
    return Job.model_validate(
        {
            "id": "o",
            "schedule": {"kind": "once", "run_at_ms": t0 + 100},
            "target": {"kind": "python", "ref": f"{contract.__name__}:stopped_while_running"},
        }
    )


@pytest.mark.parametrize("first", ["sweep", "worker"])
def test_a_sweep_racing_the_workers_own_hand_back_owes_the_run_once(backend: Backend, first: str) -> None:
    # The worker's heartbeat failed for a whole lease (its lease ran out,
    # nobody took the run over) and it hands the run back as it stops it;
    # the leader's sweep finds the same run under a dead claim. Whichever
    # comes first owes it; the other finds it owed and adds no delivery.
    t0 = contract.T0
    store = backend.store
    sent = _sent(backend, _python_once(t0))
    clock = ManualClock(t0 + 600)
    executor = Executor(backend.claims, store, clock, "w1", WorkerConfig(lease_ms=LEASE_MS))
    execution = executor.new_execution(record(sent, 1))
    swept: list[int] = []
    if first == "sweep":
        # Cut off from every server while its target ran on, the worker
        # comes back after the sweep owed the run again.
        _while_running.append(lambda: clock.advance(SWEEP_AT - 600))
        _while_running.append(lambda: swept.append(store.sweep_owed(every(1), t0 + SWEEP_AT)))
    else:
        _while_running.append(lambda: clock.advance(LEASE_MS + 1_000))
    _while_running.append(lambda: executor.stop(execution, "its lease ran out", lease_lost=True))
    assert executor.attempt([execution]) == [ClaimOutcome.CLAIMED]
    if first == "worker":
        # Its leader hands the run on again, from the worker's hand-back
        # (the embedded engine: by its state), before the sweep looks.
        at = clock.now_ms() + 1_000
        (back,) = store.due_runs(every(1), t0 + HORIZON, at)
        assert (back.run_id, back.attempt) == (sent.run_id, 2)
        record_sent(store, [back], every(1), read_through(at), at)
        # Not claimed yet when the sweep looks (a consumer's backlog): the
        # claim it finds, let go of, is the first delivery's.
        swept.append(store.sweep_owed(every(1), t0 + SWEEP_AT))
        redelivered = record(back, 1)
        assert backend.claims.claim(redelivered, "w2/1", t0 + SWEEP_AT, LEASE_MS).outcome is ClaimOutcome.TAKEN_OVER
        _leader_moves_on(backend, t0 + SWEEP_AT)
        assert _owed(backend, t0 + SWEEP_AT + 1_000) == []
        assert swept == [0]
        return
    assert swept == [0 if backend.name == "sqlite" else 1]
    if backend.name != "sqlite":
        # Its claim no longer its own, the worker wrote nothing after: no
        # interruption, no hand-back of its own beside the sweep's row.
        assert store.history("o")[0].state == "running"
    # One delivery owed, whoever owed it.
    assert _owed(backend, t0 + SWEEP_AT + 1_000) == [("o", 2)]
    redelivered = record(sent._replace(attempt=2), 1)
    assert backend.claims.claim(redelivered, "w2/1", t0 + SWEEP_AT + 1_100, LEASE_MS).outcome is (
        ClaimOutcome.TAKEN_OVER
    )
