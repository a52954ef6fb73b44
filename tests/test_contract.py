"""Contract tests: every backend of a role passes the same tests.

The fixture is parametrized over the backends that exist; the distributed
ones join the list with their servers."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pysched.model import Job
from pysched.node import EmbeddedBackends, open_embedded
from pysched.planning import next_run
from pysched.protocols import (
    ClaimOutcome,
    Coordinator,
    IdempotencyClaims,
    JobExists,
    JobNotActive,
    JobNotFound,
    PlannedRun,
    ScheduleStore,
)
from pysched.records import DispatchRecord

T0 = 1_800_000_000_000  # a fixed epoch-ms "now"


@dataclass
class Backend:
    store: ScheduleStore
    claims: IdempotencyClaims
    coordinator: Coordinator


@pytest.fixture(params=["sqlite"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    embedded: EmbeddedBackends = open_embedded(tmp_path / "contract.db", partitions=4, lease_ttl_ms=5_000)
    yield Backend(embedded.store, embedded.claims, embedded.coordinator)
    embedded.db.close()


def cron_job(job_id: str = "every-10s", expr: str = "*/10 * * * * *") -> Job:
    return Job.model_validate(
        {"id": job_id, "schedule": {"kind": "cron", "expr": expr}, "target": {"kind": "shell", "command": "true"}}
    )


def once_job(job_id: str, at: int) -> Job:
    return Job.model_validate(
        {"id": job_id, "schedule": {"kind": "once", "run_at_ms": at}, "target": {"kind": "shell", "command": "true"}}
    )


def record(row: tuple[int, str, int, int, int, int, int], fence: int) -> DispatchRecord:
    run_id, job_id, run_at, due, partition, attempt, group = row
    return DispatchRecord(run_id, job_id, run_at, due, partition, attempt, group, fence, T0)


def test_add_then_read(backend: Backend) -> None:
    rec = backend.store.add_job(cron_job(), 1, 250, PlannedRun(T0 + 10_000, T0 + 10_250), T0)
    assert rec.state == "active"
    assert rec.next_run == PlannedRun(T0 + 10_000, T0 + 10_250)
    assert backend.store.get_job("every-10s") == rec
    assert [j.job.id for j in backend.store.list_jobs()] == ["every-10s"]


def test_duplicate_id_changes_nothing(backend: Backend) -> None:
    backend.store.add_job(cron_job(), 1, 0, PlannedRun(T0 + 10_000, T0 + 10_000), T0)
    token = backend.store.change_token()
    with pytest.raises(JobExists):
        backend.store.add_job(cron_job(expr="0 * * * *"), 1, 0, PlannedRun(T0 + 5, T0 + 5), T0)
    rec = backend.store.get_job("every-10s")
    assert rec.job.schedule.model_dump()["expr"] == "*/10 * * * * *"
    assert backend.store.due_runs(T0 + 10**9, 1, T0) == [(backend.store.due_runs(T0 + 10**9, 1, T0)[0][0], T0 + 10_000)]
    assert backend.store.change_token() == token


def test_dispatch_hands_each_run_on_once_and_plans_the_next(backend: Backend) -> None:
    backend.store.add_job(cron_job(), 2, 0, PlannedRun(T0 + 10_000, T0 + 10_000), T0)
    ((run_id, due),) = backend.store.due_runs(T0 + 60_000, 1, T0)
    first = backend.store.dispatch([run_id], 1, T0 + 10_001, next_run)
    assert [r[:5] for r in first.rows] == [(run_id, "every-10s", T0 + 10_000, due, 2)]
    assert first.rows[0][5] == 1  # attempt
    assert len(first.next_runs) == 1 and first.next_runs[0][1] == T0 + 20_000
    # A reload with overlap asks again: nothing is handed on twice.
    again = backend.store.dispatch([run_id], 1, T0 + 10_002, next_run)
    assert again.rows == [] and again.next_runs == []
    assert backend.store.due_runs(T0 + 60_000, 1, T0 + 10_002) == [(first.next_runs[0][0], T0 + 20_000)]
    assert backend.store.watermarks() == {2: T0 + 10_000}


def test_one_shot_completes_after_dispatch(backend: Backend) -> None:
    backend.store.add_job(once_job("once", T0 + 500), 0, 0, PlannedRun(T0 + 500, T0 + 500), T0)
    ((run_id, _),) = backend.store.due_runs(T0 + 1_000, 1, T0)
    out = backend.store.dispatch([run_id], 1, T0 + 500, next_run)
    assert len(out.rows) == 1 and out.next_runs == []
    assert backend.store.get_job("once").state == "completed"


def test_cancel_stops_pending_runs_and_keeps_history(backend: Backend) -> None:
    backend.store.add_job(cron_job(), 0, 0, PlannedRun(T0 + 10_000, T0 + 10_000), T0)
    ((run_id, _),) = backend.store.due_runs(T0 + 60_000, 1, T0)
    rec = backend.store.cancel_job("every-10s", T0 + 1)
    assert rec.state == "cancelled" and rec.next_run is None
    assert backend.store.dispatch([run_id], 1, T0 + 10_000, next_run).rows == []
    assert [r.state for r in backend.store.history("every-10s")] == ["cancelled"]
    with pytest.raises(JobNotActive):
        backend.store.cancel_job("every-10s", T0 + 2)
    with pytest.raises(JobNotFound):
        backend.store.cancel_job("nope", T0)


def test_reschedule_replaces_pending_runs(backend: Backend) -> None:
    backend.store.add_job(cron_job(), 0, 0, PlannedRun(T0 + 10_000, T0 + 10_000), T0)
    new = cron_job(expr="0 * * * *")
    rec = backend.store.reschedule(new, 0, PlannedRun(T0 + 3_600_000, T0 + 3_600_000), T0 + 1)
    assert rec.next_run == PlannedRun(T0 + 3_600_000, T0 + 3_600_000)
    assert [d for _, d in backend.store.due_runs(T0 + 10**8, 1, T0)] == [T0 + 3_600_000]
    with pytest.raises(JobNotFound):
        backend.store.reschedule(cron_job("nope"), 0, None, T0)


def test_runs_of_an_older_fence_are_handed_on_again(backend: Backend) -> None:
    backend.store.add_job(once_job("o", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    ((run_id, _),) = backend.store.due_runs(T0 + 1_000, 1, T0)
    backend.store.dispatch([run_id], 1, T0 + 100, next_run)
    assert backend.store.due_runs(T0 + 1_000, 1, T0 + 200) == []  # same leader: already handed on
    assert backend.store.due_runs(T0 + 1_000, 2, T0 + 200) == [(run_id, T0 + 100)]  # new term: queue was lost
    again = backend.store.dispatch([run_id], 2, T0 + 300, next_run)
    assert again.rows[0][5] == 2  # attempt 2


def test_running_run_with_dead_lease_is_handed_on_again(backend: Backend) -> None:
    backend.store.add_job(once_job("o", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    ((run_id, _),) = backend.store.due_runs(T0 + 1_000, 1, T0)
    (row,) = backend.store.dispatch([run_id], 1, T0 + 100, next_run).rows
    assert backend.claims.claim(record(row, 1), "w1", T0 + 110, 30_000).outcome is ClaimOutcome.CLAIMED
    backend.store.run_started(run_id, 1, "w1", T0 + 110)
    assert backend.store.due_runs(T0 + 1_000, 1, T0 + 20_000) == []  # lease alive
    assert backend.store.due_runs(T0 + 1_000, 1, T0 + 40_000) == [(run_id, T0 + 100)]  # lease died


def test_claim_outcomes(backend: Backend) -> None:
    row = (7, "job", T0, T0, 1, 1, 0)
    c = backend.claims
    assert c.claim(record(row, 3), "w1", T0, 30_000).outcome is ClaimOutcome.CLAIMED
    assert c.claim(record(row, 3), "w2", T0 + 1, 30_000).outcome is ClaimOutcome.BUSY
    assert c.claim(record(row, 3), "w2", T0 + 30_001, 30_000).outcome is ClaimOutcome.TAKEN_OVER
    c.complete(record(row, 3).idempotency_key, "w2", True, "42", T0 + 30_002)
    done = c.claim(record(row, 3), "w3", T0 + 30_003, 30_000)
    assert (done.outcome, done.result) == (ClaimOutcome.SUCCEEDED, "42")
    stale = c.claim(record((8, "job", T0 + 1, T0 + 1, 1, 1, 0), 2), "w1", T0, 30_000)
    assert (stale.outcome, stale.fence_floor) == (ClaimOutcome.FENCED, 3)


def test_completion_by_a_former_holder_changes_nothing(backend: Backend) -> None:
    row = (7, "job", T0, T0, 1, 1, 0)
    key = record(row, 1).idempotency_key
    backend.claims.claim(record(row, 1), "w1", T0, 1_000)
    backend.claims.claim(record(row, 1), "w2", T0 + 2_000, 1_000)  # w1's lease died
    backend.claims.complete(key, "w1", True, "late", T0 + 2_100)
    assert backend.claims.claim(record(row, 1), "w3", T0 + 2_200, 1_000).outcome is ClaimOutcome.BUSY


def test_heartbeat_keeps_claims_alive(backend: Backend) -> None:
    row = (7, "job", T0, T0, 1, 1, 0)
    backend.claims.claim(record(row, 1), "w1", T0, 1_000)
    assert backend.claims.heartbeat("w1", T0 + 900, 1_000) == 1
    assert backend.claims.claim(record(row, 1), "w2", T0 + 1_500, 1_000).outcome is ClaimOutcome.BUSY


def test_leadership_and_fences(backend: Backend) -> None:
    co = backend.coordinator
    a = co.acquire("a", T0)
    assert a is not None and a.fence == 1
    assert co.acquire("b", T0 + 1_000) is None
    renewed = co.renew(a, T0 + 2_000)
    assert renewed is not None and renewed.expires_at_ms > a.expires_at_ms
    b = co.acquire("b", renewed.expires_at_ms)
    assert b is not None and b.fence == 2
    assert co.renew(renewed, renewed.expires_at_ms + 1) is None
    # The new term raised every partition's floor: the old fence is rejected.
    row = (1, "job", T0, T0, 3, 1, 0)
    assert backend.claims.claim(record(row, 1), "w", T0, 1_000).outcome is ClaimOutcome.FENCED
    co.release(b)
    c = co.acquire("c", T0 + 10_001)
    assert c is not None and c.fence == 3
