"""Contract tests of run checkpoints, kept under the run's claim: every
engine alike."""

from __future__ import annotations

import json

import tests.test_contract as contract
from pysched.protocols import ClaimOutcome
from tests.test_contract import Backend, _fresh_t0, backend, record

__all__ = ["_fresh_t0", "backend"]  # the shared fixtures, used by name

LEASE = 1_000


def _row() -> tuple[int, str, int, int, int, int, int]:
    t0 = contract.T0
    return (7, "job", t0, t0, 1, 1, 0)


def test_a_fresh_claim_has_no_checkpoint(backend: Backend) -> None:
    claim = backend.claims.claim(record(_row(), 1), "w1", contract.T0, LEASE)
    assert (claim.outcome, claim.checkpoint) == (ClaimOutcome.CLAIMED, None)


def test_a_take_over_resumes_from_the_last_checkpoint(backend: Backend) -> None:
    t0, rec = contract.T0, record(_row(), 1)
    backend.claims.claim(rec, "w1", t0, LEASE)
    assert backend.claims.save_checkpoint(rec.idempotency_key, "w1", json.dumps({"n": 1}), t0 + 100)
    assert backend.claims.save_checkpoint(rec.idempotency_key, "w1", json.dumps({"n": 2}), t0 + 200)
    # w1 dies; its lease runs out and w2 takes the run over.
    claim = backend.claims.claim(rec, "w2", t0 + 2_000, LEASE)
    assert claim.outcome is ClaimOutcome.TAKEN_OVER
    assert claim.checkpoint is not None and json.loads(claim.checkpoint) == {"n": 2}


def test_a_checkpoint_from_an_execution_taken_over_is_refused(backend: Backend) -> None:
    t0, rec = contract.T0, record(_row(), 1)
    backend.claims.claim(rec, "w1", t0, LEASE)
    assert backend.claims.save_checkpoint(rec.idempotency_key, "w1", '{"n": 1}', t0 + 100)
    backend.claims.claim(rec, "w2", t0 + 2_000, LEASE)
    assert backend.claims.save_checkpoint(rec.idempotency_key, "w2", '{"n": 5}', t0 + 2_100)
    # w1 was only paused: what it writes now must not undo w2's progress.
    assert not backend.claims.save_checkpoint(rec.idempotency_key, "w1", '{"n": 2}', t0 + 2_200)
    backend.workers_died()  # w2 dies in turn
    claim = backend.claims.claim(rec, "w3", t0 + 5_000, LEASE)
    assert claim.checkpoint == '{"n": 5}'


def test_no_checkpoint_without_a_running_claim(backend: Backend) -> None:
    t0, rec = contract.T0, record(_row(), 1)
    assert not backend.claims.save_checkpoint(rec.idempotency_key, "w1", "{}", t0)
    backend.claims.claim(rec, "w1", t0, LEASE)
    backend.claims.complete(rec.idempotency_key, "w1", False, None, t0 + 100)
    assert not backend.claims.save_checkpoint(rec.idempotency_key, "w1", "{}", t0 + 200)


def test_a_retry_after_a_failure_keeps_the_checkpoint(backend: Backend) -> None:
    # The same logical run (same key): the next attempt resumes too.
    t0, rec = contract.T0, record(_row(), 1)
    backend.claims.claim(rec, "w1", t0, LEASE)
    backend.claims.save_checkpoint(rec.idempotency_key, "w1", '{"step": 3}', t0 + 100)
    backend.claims.complete(rec.idempotency_key, "w1", False, None, t0 + 200)
    claim = backend.claims.claim(rec._replace(attempt=2), "w2", t0 + 300, LEASE)
    assert (claim.outcome, claim.checkpoint) == (ClaimOutcome.TAKEN_OVER, '{"step": 3}')
