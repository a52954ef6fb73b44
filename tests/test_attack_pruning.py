"""Attacks on pruned runs' claims kept as tombstones (retention.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

import tests.test_contract as contract
from pysched.protocols import ClaimOutcome, FailedAttempt, PlannedRun
from tests.test_contract import Backend, _fresh_t0, backend, cron_job, dispatch, record

__all__ = ["_fresh_t0", "backend"]  # the shared fixtures, used by name


@pytest.mark.parametrize("lands", ["before the first write", "before the claims are buried"])
def test_a_dead_letter_redriven_while_its_job_s_history_is_pruned_runs(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, lands: str
) -> None:
    # The pruner reads a job's runs, finds an old dead letter finished, and
    # deletes it and buries its claim with plain writes; a redrive of that
    # dead letter lands between the read and the writes. The redrive said
    # yes and left a row owing the run, but the run's history is gone and
    # its claim a tombstone: the delivery is skipped as PRUNED, and the run
    # the user redrove never runs and is nowhere recorded.
    t0 = contract.T0
    store, claims = backend.store, backend.claims
    store.add_job(cron_job("c"), 0, 0, PlannedRun(t0 + 10_000, t0 + 10_000), t0)
    # Run 1 fails for good (a dead letter); run 2 succeeds.
    (first,), _ = dispatch(backend, t0 + 60_000, 1, t0 + 10_000)
    dead = record(first, 1)
    assert claims.claim(dead, "w1/1", t0 + 10_100, 30_000).outcome is ClaimOutcome.CLAIMED
    store.run_started(dead, "w1", t0 + 10_100)
    failure = FailedAttempt(1, "w1", t0 + 10_100, t0 + 10_200, "RuntimeError: boom", "exception", True)
    assert claims.complete(dead.idempotency_key, "w1/1", False, None, t0 + 10_200)
    store.run_failed(dead, failure, None)
    (second,), _ = dispatch(backend, t0 + 60_000, 1, t0 + 20_000)
    ok = record(second, 1)
    assert claims.claim(ok, "w1/2", t0 + 20_100, 30_000).outcome is ClaimOutcome.CLAIMED
    store.run_started(ok, "w1", t0 + 20_100)
    assert claims.complete(ok.idempotency_key, "w1/2", True, None, t0 + 20_200)
    store.run_finished(ok, "succeeded", None, None, t0 + 20_200)
    assert [r.state for r in store.dead_letters()] == ["failed"]

    redriven: list[bool] = []
    if backend.name == "cluster-memtables":
        tables = store.tables  # type: ignore[attr-defined]
        execute_many = tables.execute_many

        def interleaved(statements: Sequence[tuple[Any, Any]], concurrency: int) -> Any:
            # The pruner's writes, after its read of the runs: the redrive
            # lands before the first of them, or before the claims' burial.
            if lands == "before the first write":
                read = store._run_ends  # type: ignore[attr-defined]
                writes = not any(s is read for s, _ in statements)
            else:
                bury = store._bury_claim  # type: ignore[attr-defined]
                writes = any(s is bury for s, _ in statements)
            if not redriven and writes:
                redriven.append(store.redrive("c", first.run_at_ms, 0, t0 + 30_000))
            return execute_many(statements, concurrency)

        monkeypatch.setattr(tables, "execute_many", interleaved)
    else:
        redriven.append(store.redrive("c", first.run_at_ms, 0, t0 + 30_000))
    store.prune_history([0], None, 1, 100, t0 + 30_000)
    monkeypatch.undo()
    if backend.name == "cluster-memtables" and lands == "before the first write":
        assert redriven == [True], "the redrive landed before any write of the pruner's"
    if redriven != [True]:
        # The redrive came too late: nothing was promised, and the dead
        # letter went with its run.
        assert store.dead_letters() == []
        return
    # The redrive was acknowledged: its run is delivered, and runs.
    at = t0 + 40_000
    owed = [r for r in store.due_runs(contract.every(1), t0 + 120_000, at) if r.run_at_ms == first.run_at_ms]
    assert owed, "the redriven run is owed by no row"
    again = record(owed[0], 1)
    assert claims.claim(again, "w2/1", at, 30_000).outcome in (ClaimOutcome.CLAIMED, ClaimOutcome.TAKEN_OVER)
