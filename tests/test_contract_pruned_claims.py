"""Contract tests of a dispatch record delivered again after its run's
history, and with it its claim, was pruned: every engine alike. Kafka keeps
a record for its topic's retention, and delivers it again whenever its
offset was not committed (a rebalance, a consumer whose commits stalled, a
group whose offsets expired); the fence it carries may still be the
partition's, and Redis may have lost what it knew of the claim."""

from __future__ import annotations

from typing import Any

import tests.test_contract as contract
from pysched.clock import ManualClock
from pysched.model import Job
from pysched.protocols import PRUNED_STATE, ClaimOutcome, PlannedRun, Run
from pysched.retention import PRUNED_CLAIM_KEPT_MS
from pysched.targets import RunContext
from pysched.worker import Executor, WorkerConfig
from tests.test_contract import Backend, _fresh_t0, backend, dispatch, every, record

__all__ = ["_fresh_t0", "backend"]  # the shared fixtures, used by name

_calls: list[str] = []


def counted(ctx: RunContext) -> None:
    _calls.append(ctx.idempotency_key)


def _job() -> Job:
    return Job.model_validate(
        {
            "id": "every-10s",
            "schedule": {"kind": "cron", "expr": "*/10 * * * * *"},
            "target": {"kind": "python", "ref": f"{__name__}:counted"},
        }
    )


def _run_twice(backend: Backend) -> list[Run]:
    """Runs 1 and 2 of a job firing every 10 s, each run by a worker to
    success under fence 1; returns their rows as handed on."""
    t0 = contract.T0
    backend.store.add_job(_job(), 0, 0, PlannedRun(t0 + 10_000, t0 + 10_000), t0)
    handed: list[Run] = []
    for k in (1, 2):
        now = t0 + 10_000 * k
        sent, _ = dispatch(backend, t0 + 60_000, 1, now)
        for row in sent:
            if row.run_id in {r.run_id for r in handed}:
                continue  # a store may send a run again while its watermark trails
            handed.append(row)
            executor = Executor(backend.claims, backend.store, ManualClock(now + 5), "w1", WorkerConfig())
            assert executor.attempt([executor.new_execution(record(row, 1))]) == [ClaimOutcome.CLAIMED]
    assert [r.run_at_ms for r in handed] == [t0 + 10_000, t0 + 20_000]
    assert [r.state for r in backend.store.history("every-10s")] == ["succeeded", "succeeded"]
    return handed


def _forget_fast_path(backend: Backend) -> None:
    """Redis loses what it held of this keyspace (a restart without
    persistence): only the cluster has a fast path."""
    claims: Any = backend.claims
    redis = getattr(claims, "redis", None)
    if redis is not None:
        for key in redis.scan_iter(match=f"{claims.prefix}:*", count=1_000):
            redis.delete(key)


def test_a_record_delivered_again_after_its_run_was_pruned_is_not_run_again(backend: Backend) -> None:
    # Hole C5: claims went with their history (1,000 runs or 7 days), while
    # Kafka may deliver a record for as long as it keeps it: the claim of
    # the old run was not there, so the record claimed it anew and ran it
    # a second time.
    first, _ = _run_twice(backend)
    _calls.clear()
    now = contract.T0 + 30_000
    assert backend.store.prune_history([0], None, 1, 100, now) == 1
    assert [r.run_at_ms for r in backend.store.history("every-10s")] == [contract.T0 + 20_000]
    _forget_fast_path(backend)
    executor = Executor(backend.claims, backend.store, ManualClock(now + 10), "w2", WorkerConfig())
    outcomes = executor.attempt([executor.new_execution(record(first, 1))])
    assert outcomes == [ClaimOutcome.PRUNED]
    assert _calls == []
    # Nothing of it comes back into the history, nor is it owed again.
    assert [r.run_at_ms for r in backend.store.history("every-10s")] == [contract.T0 + 20_000]
    owed = backend.store.due_runs(every(1), now + 60_000, now + 20)
    assert first.run_at_ms not in {r.run_at_ms for r in owed}


def _expires_in_s(backend: Backend, key: str) -> int | None:
    """On the cluster, the seconds left of the claim row's TTL (None: it
    has none)."""
    store: Any = backend.store
    query = f"SELECT TTL(state) AS left_s FROM {store.keyspace}.claims WHERE idem_key = %s"
    row = store.tables.execute(query, (key,)).one()
    return None if row is None or row.left_s is None else int(row.left_s)


def test_a_pruned_claim_is_kept_until_its_records_can_no_longer_be_delivered(backend: Backend) -> None:
    # What pruned claims become is bounded: once no record of their runs
    # can be delivered any more, they go.
    first, _ = _run_twice(backend)
    key = record(first, 1).idempotency_key
    now = contract.T0 + 30_000
    written_at = backend.clock.now_ms()
    assert backend.store.prune_history([0], None, 1, 100, now) == 1
    assert contract._claim_state(backend, key) == PRUNED_STATE
    if backend.name == "cluster":
        # Cassandra expires it: the TTL the pruning gave it.
        left_s = _expires_in_s(backend, key)
        assert left_s is not None and PRUNED_CLAIM_KEPT_MS // 1_000 - 60 < left_s <= PRUNED_CLAIM_KEPT_MS // 1_000
        return
    if backend.name == "cluster-memtables":
        # The in-memory tables expire it by their clock, as Cassandra does.
        backend.clock.advance(written_at + PRUNED_CLAIM_KEPT_MS - 1_000 - backend.clock.now_ms())
        assert contract._claim_state(backend, key) == PRUNED_STATE
        backend.clock.advance(1_000)
        assert contract._claim_state(backend, key) is None
        return
    # A pass just before the horizon keeps it, one past it deletes it.
    assert backend.store.prune_history([0], None, 1, 100, now + PRUNED_CLAIM_KEPT_MS) == 0
    assert contract._claim_state(backend, key) == PRUNED_STATE
    assert backend.store.prune_history([0], None, 1, 100, now + PRUNED_CLAIM_KEPT_MS + 1) == 0
    assert contract._claim_state(backend, key) is None
