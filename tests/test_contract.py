"""Contract tests: every backend of a role passes the same tests.

The fixture is parametrized over the backends that exist; the distributed
ones join the list with their servers. The in-memory ones model the cluster
on a clock of their own, which stands still unless a test moves it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pysched.clock import Clock, ManualClock, SystemClock
from pysched.leader.recording import record_sent
from pysched.memory import open_memory
from pysched.memory.claims import MemoryClaims
from pysched.memory_cluster import open_memory_cluster
from pysched.model import Job
from pysched.node import open_cluster, open_embedded
from pysched.protocols import (
    PRUNED_STATE,
    SETTLE_MS,
    ClaimOutcome,
    Coordinator,
    FailedAttempt,
    FailedClaim,
    IdempotencyClaims,
    JobExists,
    JobNotActive,
    JobNotFound,
    MissedRuns,
    PlannedRun,
    Run,
    ScheduleStore,
)
from pysched.records import DispatchRecord
from pysched.targets import RunContext
from pysched.worker import Executor, WorkerConfig
from tests.conftest import cluster_config_for

# "Now" for each test: the next whole minute, so that stores whose watermarks
# start at their creation (real time) see every run the test plans. Set per
# test by the fixture below, since a long session outlives any fixed value.
T0 = 0


@pytest.fixture(autouse=True)
def _fresh_t0() -> None:
    global T0
    # At least 10 s ahead: every run a test plans is then due ahead of the
    # cluster's watermarks (SETTLE_MS before its keyspace was made), where a
    # store keeps the due time it was given.
    T0 = ((time.time_ns() // 1_000_000 + 10_000) // 60_000 + 1) * 60_000


@dataclass
class Backend:
    name: str
    store: ScheduleStore
    claims: IdempotencyClaims
    coordinator: Coordinator
    # The servers' clock: the wall clock, but for the in-memory engine.
    clock: Clock = field(default_factory=SystemClock)

    def clock_ms(self) -> int:
        return self.clock.now_ms()

    def workers_died(self) -> None:
        """The worker processes holding runs die. The embedded and in-memory
        claims see it when a later call's time passes the leases; the
        cluster's held runs live in etcd, under the process's lease, which
        a death ends after its TTL, on etcd's clock: ended here at once."""
        run_leases = getattr(self.claims, "run_leases", None)
        if run_leases is not None:
            run_leases.revoke()


@pytest.fixture(params=["sqlite", "memory", "cluster-memtables", pytest.param("cluster", marks=pytest.mark.cluster)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        embedded = open_embedded(tmp_path / "contract.db", partitions=4, lease_ttl_ms=5_000)
        yield Backend("sqlite", embedded.store, embedded.claims, embedded.coordinator)
        embedded.close()
        return
    if request.param == "memory":
        # Created a minute before T0, as a cluster's tables are some time
        # before the test's first planned run.
        clock = ManualClock(T0 - 60_000)
        node = open_memory(partitions=4, clock=clock, dispatcher_partitions=2).node()
        yield Backend("memory", node.store, node.claims, node.coordinator, clock)
        return
    if request.param == "cluster-memtables":
        # The cluster's store and claims over Cassandra's tables, Redis and
        # etcd's run leases in memory, on a clock of their own.
        clock = ManualClock(T0 - 60_000)
        servers = open_memory_cluster(partitions=4, clock=clock)
        mem = servers.node()
        yield Backend("cluster-memtables", mem.store, mem.claims, mem.coordinator, clock)
        return
    services = request.getfixturevalue("services")
    config = cluster_config_for(services, request.getfixturevalue("keyspace"), partitions=4, kafka_partitions=2)
    cluster = open_cluster(config)
    yield Backend("cluster", cluster.store, cluster.claims, cluster.coordinator)
    cluster.close()


def cron_job(job_id: str = "every-10s", expr: str = "*/10 * * * * *") -> Job:
    return Job.model_validate(
        {"id": job_id, "schedule": {"kind": "cron", "expr": expr}, "target": {"kind": "shell", "command": "true"}}
    )


def once_job(job_id: str, at: int) -> Job:
    return Job.model_validate(
        {"id": job_id, "schedule": {"kind": "once", "run_at_ms": at}, "target": {"kind": "shell", "command": "true"}}
    )


def record(row: Run | tuple[int, str, int, int, int, int, int], fence: int) -> DispatchRecord:
    run_id, job_id, run_at, due, partition, attempt, group = row
    return DispatchRecord(run_id, job_id, run_at, due, partition, attempt, group, fence, T0)


def every(fence: int) -> dict[int, int]:
    """Every partition of the test backends, led under ``fence``."""
    return dict.fromkeys(range(4), fence)


def read_through(now: int) -> dict[int, int]:
    """The watermarks of a leader that read every partition at ``now``."""
    return dict.fromkeys(range(4), now - SETTLE_MS)


def due(backend: Backend, horizon: int, fence: int, now: int) -> list[tuple[int, int]]:
    return [(r.run_id, r.due_ms) for r in backend.store.due_runs(every(fence), horizon, now)]


def dispatch(backend: Backend, horizon: int, fence: int, now: int) -> tuple[list[Run], list[Run]]:
    """One leader step: everything due, begun, (published,) finished."""
    sent = [r for r in backend.store.due_runs(every(fence), horizon, now) if r.due_ms <= now]
    planned = record_sent(backend.store, sent, every(fence), read_through(now), now)
    return sent, planned


def test_add_then_read(backend: Backend) -> None:
    before = backend.store.change_versions()
    rec = backend.store.add_job(cron_job(), 1, 250, PlannedRun(T0 + 10_000, T0 + 10_250), T0)
    after = backend.store.change_versions()
    assert after.get(1) != before.get(1)
    assert {p: v for p, v in after.items() if p != 1} == {p: v for p, v in before.items() if p != 1}
    assert rec.state == "active"
    assert rec.next_run == PlannedRun(T0 + 10_000, T0 + 10_250)
    assert backend.store.get_job("every-10s") == rec
    assert [j.job.id for j in backend.store.list_jobs()] == ["every-10s"]


def test_bulk_registration_skips_existing_ids(backend: Backend) -> None:
    backend.store.add_job(cron_job("a"), 0, 0, PlannedRun(T0 + 10_000, T0 + 10_000), T0)
    items = [
        (cron_job("a", "0 * * * *"), 0, 0, PlannedRun(T0 + 20_000, T0 + 20_000)),
        (once_job("b", T0 + 30_000), 1, 0, PlannedRun(T0 + 30_000, T0 + 30_000)),
        (once_job("c", T0 + 40_000), 3, 0, PlannedRun(T0 + 40_000, T0 + 40_000)),
    ]
    assert backend.store.add_jobs(items, T0) == ["a"]
    assert [j.job.id for j in backend.store.list_jobs()] == ["a", "b", "c"]
    assert backend.store.get_job("a").job.schedule.model_dump()["expr"] == "*/10 * * * * *"
    assert [d for _, d in due(backend, T0 + 60_000, 1, T0)] == [T0 + 10_000, T0 + 30_000, T0 + 40_000]


def test_bulk_registration_keeps_the_first_of_an_id_listed_twice(backend: Backend) -> None:
    items = [
        (once_job("b", T0 + 30_000), 1, 0, PlannedRun(T0 + 30_000, T0 + 30_000)),
        (cron_job("a"), 0, 0, PlannedRun(T0 + 10_000, T0 + 10_000)),
        (once_job("b", T0 + 50_000), 2, 0, PlannedRun(T0 + 50_000, T0 + 50_000)),
    ]
    assert backend.store.add_jobs(items, T0) == ["b"]
    assert [j.job.id for j in backend.store.list_jobs()] == ["a", "b"]
    assert [d for _, d in due(backend, T0 + 60_000, 1, T0)] == [T0 + 10_000, T0 + 30_000]


def test_duplicate_id_changes_nothing(backend: Backend) -> None:
    backend.store.add_job(cron_job(), 1, 0, PlannedRun(T0 + 10_000, T0 + 10_000), T0)
    versions = backend.store.change_versions()
    with pytest.raises(JobExists):
        backend.store.add_job(cron_job(expr="0 * * * *"), 1, 0, PlannedRun(T0 + 5, T0 + 5), T0)
    rec = backend.store.get_job("every-10s")
    assert rec.job.schedule.model_dump()["expr"] == "*/10 * * * * *"
    assert [d for _, d in due(backend, T0 + 60_000, 1, T0)] == [T0 + 10_000]
    assert backend.store.change_versions() == versions


def test_dispatch_hands_each_run_on_once_and_plans_the_next(backend: Backend) -> None:
    job = cron_job("minutely", "0 * * * * *")
    backend.store.add_job(job, 2, 0, PlannedRun(T0 + 60_000, T0 + 60_000), T0)
    ((run_id, due_ms),) = due(backend, T0 + 120_000, 1, T0)
    sent, planned = dispatch(backend, T0 + 120_000, 1, T0 + 60_001)
    assert [r[:5] for r in sent] == [(run_id, "minutely", T0 + 60_000, due_ms, 2)]
    assert sent[0].attempt == 1
    assert [(r.due_ms, r.job_id, r.run_at_ms, r.partition) for r in planned] == [
        (T0 + 120_000, "minutely", T0 + 120_000, 2)
    ]
    # Once the leader says nothing is left unsent up to a later now, the store
    # never hands the run out again (within the settle window it may: the
    # leader skips what it sent itself).
    record_sent(backend.store, [], every(1), read_through(T0 + 75_000), T0 + 75_000)
    assert due(backend, T0 + 180_000, 1, T0 + 75_000) == [(planned[0].run_id, T0 + 120_000)]
    assert backend.store.watermarks()[2] >= T0 + 60_000 - 10_000


def test_a_resend_plans_nothing_twice(backend: Backend) -> None:
    # One rule, in the core (planning.is_resend), for every engine: a run
    # handed on again by a new leader finds its job's next run already
    # planned, and plans no other. Where runs are read from a watermark, the
    # run already planned is named again for the leader to hold its
    # watermark below and take into its wheel (planning.planned_before).
    job = cron_job("minutely", "0 * * * * *")
    backend.store.add_job(job, 2, 0, PlannedRun(T0 + 60_000, T0 + 60_000), T0)
    (first,), (planned,) = dispatch(backend, T0 + 120_000, 1, T0 + 60_001)
    for p in range(4):
        backend.store.raise_fence(p, 2)
    again = [r for r in backend.store.due_runs(every(2), T0 + 120_000, T0 + 60_100) if r.run_id == first.run_id]
    assert len(again) == 1
    named = [] if backend.name == "sqlite" else [planned]
    assert record_sent(backend.store, again, every(2), {}, T0 + 60_100) == named
    assert backend.store.get_job("minutely").next_run == PlannedRun(T0 + 120_000, T0 + 120_000)
    later = [r for r in backend.store.due_runs(every(2), T0 + 180_000, T0 + 60_200) if r.run_id != first.run_id]
    assert [(r.run_id, r.due_ms) for r in later] == [(planned.run_id, T0 + 120_000)]


def test_a_run_read_again_by_a_new_leader_is_its_next_delivery_and_the_same_attempt(backend: Backend) -> None:
    store = backend.store
    store.add_job(once_job("o", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    (sent,), _ = dispatch(backend, T0 + 60_000, 1, T0 + 100)
    assert sent.attempt == 1
    # Its own leader reads it again (if at all) as the attempt it sent: it
    # skips it.
    assert [r.attempt for r in store.due_runs(every(1), T0 + 60_000, T0 + 200)] in ([], [1])
    for p in range(4):
        store.raise_fence(p, 2)
    (again,) = store.due_runs(every(2), T0 + 60_000, T0 + 300)
    assert (again.run_id, again.attempt) == (sent.run_id, 2)
    record_sent(store, [again], every(2), {}, T0 + 300)
    # No attempt of it ended: its start is still the first attempt.
    assert [(r.state, r.attempt) for r in store.history("o")] == [("dispatched", 1)]
    # A run rejected for the old fence and handed back is not a third delivery.
    store.hand_back(record(sent, 1), T0 + 400)
    assert [r.attempt for r in store.due_runs(every(2), T0 + 60_000, T0 + 500)] in ([], [2])
    assert store.run_started(record(again, 2), "w1", T0 + 600) == 1


def test_a_job_rescheduled_to_an_earlier_time_keeps_its_schedule(backend: Backend) -> None:
    # The embedded store's own rule took the cancelled later run for the next
    # one already planned, and the job never fired again.
    backend.store.add_job(cron_job("m", "0 * * * * *"), 0, 0, PlannedRun(T0 + 300_000, T0 + 300_000), T0)
    backend.store.reschedule(cron_job("m", "0 * * * * *"), 0, PlannedRun(T0 + 60_000, T0 + 60_000), T0 + 1)
    sent, planned = dispatch(backend, T0 + 120_000, 1, T0 + 60_001)
    assert [r.run_at_ms for r in sent] == [T0 + 60_000]
    assert [r.run_at_ms for r in planned] == [T0 + 120_000]
    assert backend.store.get_job("m").next_run == PlannedRun(T0 + 120_000, T0 + 120_000)


def test_a_run_registered_late_for_its_time_still_fires(backend: Backend) -> None:
    # A slow registration: its run's time had passed by the time it was stored.
    past = backend.clock_ms() - 120_000
    backend.store.add_job(once_job("late", past), 0, 0, PlannedRun(past, past), past)
    now = backend.clock_ms()
    assert [r.job_id for r in backend.store.due_runs(every(1), now + 60_000, now)] == ["late"]


def test_a_registration_landing_behind_the_watermark_still_fires(backend: Backend) -> None:
    # Seen in CI with one core busy: 241 of 5,000 runs whose registration
    # landed more than SETTLE_MS after its check were never handed on.
    wall = backend.clock_ms()
    backend.store.add_job(once_job("early", wall + 1_000), 0, 0, PlannedRun(wall + 1_000, wall + 1_000), wall)
    # A leader ahead of this registration (a slower write, or another clock)
    # has handed its partition on through wall + 10 min.
    dispatch(backend, wall + 900_000, 1, wall + 600_000)
    due = wall + 300_000
    backend.store.add_job(once_job("late", due), 0, 0, PlannedRun(due, due), wall)
    assert "late" in [r.job_id for r in backend.store.due_runs(every(1), wall + 900_000, wall + 601_000)]


@pytest.mark.parametrize("how", ["add_job", "add_jobs", "reschedule"])
def test_a_registration_the_watermark_passes_while_it_is_written_still_fires(
    backend: Backend, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The registrant reads the watermarks, places its run ahead of them,
    # and writes it; meanwhile a leader whose read missed the row moves the
    # watermark past it. The run must still be read, and the job say when.
    store = backend.store
    wall = backend.clock_ms()
    store.add_job(once_job("early", wall + 1_000), 0, 0, PlannedRun(wall + 1_000, wall + 1_000), wall)
    far = wall + 3_600_000
    if how == "reschedule":
        store.add_job(once_job("late", far), 0, 0, PlannedRun(far, far), wall)
    # A leader ahead of the registrant, as in the test above.
    dispatch(backend, wall + 900_000, 1, wall + 600_000)
    read_watermarks = store.watermarks

    def watermarks_then_a_leader_moves_on() -> dict[int, int]:
        marks = read_watermarks()
        monkeypatch.setattr(store, "watermarks", read_watermarks)
        record_sent(store, [], every(1), read_through(wall + 700_000), wall + 700_000)
        return marks

    # Only a store that places runs by its watermarks reads them here.
    monkeypatch.setattr(store, "watermarks", watermarks_then_a_leader_moves_on)
    due = wall + 300_000
    job, planned = once_job("late", due), PlannedRun(due, due)
    if how == "add_job":
        store.add_job(job, 0, 0, planned, wall)
    elif how == "add_jobs":
        assert store.add_jobs([(job, 0, 0, planned)], wall) == []
    else:
        store.reschedule(job, 0, planned, wall)
    (late,) = [r for r in store.due_runs(every(1), wall + 900_000, wall + 701_000) if r.job_id == "late"]
    assert late.run_at_ms == due
    assert store.get_job("late").next_run == PlannedRun(due, late.due_ms)
    if backend.name != "sqlite":  # which reads runs by their state, not from a watermark
        assert late.due_ms > store.watermarks()[0] >= wall + 690_000


def test_a_stale_leaders_record_hides_nothing_from_its_successor(backend: Backend) -> None:
    # Found by the paused-leader process test with one core busy: 55 of
    # 1,000 runs lost. The paused leader woke, sent its due runs (the workers
    # rejected its fence) and recorded them, moving the watermark past them
    # before its successor read the partition.
    backend.store.add_job(once_job("o", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    rows = backend.store.due_runs(every(1), T0 + 60_000, T0 + 100)
    assert [r.job_id for r in rows] == ["o"]
    for p in range(4):
        backend.store.raise_fence(p, 2)  # the successor's fence, published before it reads
    record_sent(backend.store, list(rows), every(1), read_through(T0 + 30_000), T0 + 30_000)
    assert [r.job_id for r in backend.store.due_runs(every(2), T0 + 90_000, T0 + 30_100)] == ["o"]


def test_a_stale_leaders_record_writes_nothing_its_successor_wrote(backend: Backend) -> None:
    # A leader's store writes are fenced, not only what it sends: a paused
    # leader that wakes and records a send must neither plan the job's next
    # run (its successor plans it, from the job as it is by then) nor mark
    # the run handed on under its old fence over its successor's mark, which
    # would make the run look owed again.
    store = backend.store
    store.add_job(cron_job("c", "0 * * * * *"), 0, 0, PlannedRun(T0 + 60_000, T0 + 60_000), T0)
    (stale,) = store.due_runs(every(1), T0 + 90_000, T0 + 60_000)
    for p in range(4):
        store.raise_fence(p, 2)  # the successor's, published before it reads
    sent, planned = dispatch(backend, T0 + 90_000, 2, T0 + 61_000)
    assert [(r.run_at_ms, r.attempt) for r in sent] == [(T0 + 60_000, 1)]
    assert [r.run_at_ms for r in planned] == [T0 + 120_000]
    assert record_sent(store, [stale], every(1), read_through(T0 + 62_000), T0 + 62_000) == []
    again = store.due_runs(every(2), T0 + 150_000, T0 + 63_000)
    assert [(r.run_at_ms, r.attempt) for r in again if r.attempt > 1] == [], "handed on again"
    assert T0 + 120_000 in [r.run_at_ms for r in again]


def test_a_run_rejected_for_its_fence_reaches_the_new_leader(backend: Backend) -> None:
    # Found by the paused-leader process test with one core busy: runs a
    # leader sent, and recorded sent, just before its partition moved were
    # rejected by the workers for their (by then) old fence, and the new
    # leader started from a watermark already past them.
    store = backend.store
    store.add_job(once_job("o", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    (sent,), _ = dispatch(backend, T0 + 60_000, 1, T0 + 30_000)
    for p in range(4):
        store.raise_fence(p, 2)
    backend.claims.raise_fence(0, 2)
    rejected = record(sent, 1)
    assert backend.claims.claim(rejected, "w1", T0 + 30_100, 30_000).outcome is ClaimOutcome.FENCED
    store.hand_back(rejected, T0 + 30_100)
    assert [r.job_id for r in store.due_runs(every(2), T0 + 90_000, T0 + 30_200)] == ["o"]
    # A run that started meanwhile is not handed back.
    assert store.run_started(record(sent, 2), "w2", T0 + 30_300)
    assert not store.hand_back(rejected, T0 + 30_400)


def test_a_run_whose_start_was_recorded_by_the_worker_then_fenced_reaches_the_new_leader(backend: Backend) -> None:
    # Found by the simulator (seed 5022): a worker's claim held, its start
    # was recorded but the call timed out; its retry met the new leader's
    # fence, and the hand-back found the run "started" and dropped it. The
    # run never ran.
    store, claims = backend.store, backend.claims
    store.add_job(once_job("o", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    (sent,), _ = dispatch(backend, T0 + 60_000, 1, T0 + 30_000)
    delivered = record(sent, 1)
    assert claims.claim(delivered, "w1/1", T0 + 30_100, 1_000).outcome is ClaimOutcome.CLAIMED
    assert store.run_started(delivered, "w1", T0 + 30_100)  # its answer lost
    for p in range(4):
        store.raise_fence(p, 2)
    claims.raise_fence(0, 2)
    assert claims.claim(delivered, "w1/1", T0 + 30_200, 1_000).outcome is ClaimOutcome.FENCED
    store.hand_back(delivered, T0 + 30_200, started_by="w1")
    # Once the fenced execution's claim has run out, the new leader has it.
    assert [r.job_id for r in store.due_runs(every(2), T0 + 90_000, T0 + 31_300)] == ["o"]
    # Started by another worker: that one runs it, and nothing is handed back.
    assert not store.hand_back(delivered, T0 + 31_400, started_by="w9")


# What the python target below does while it runs.
_while_running: list[Callable[[], None]] = []


def stopped_while_running(ctx: RunContext) -> None:
    while _while_running:
        _while_running.pop(0)()
    if ctx.cancelled.is_set():
        raise RuntimeError("stopped: ctx.cancelled was set")


def test_a_run_stopped_as_its_lease_ran_out_unrenewed_is_owed_again_by_its_retry(backend: Backend) -> None:
    # Hole C1: the heartbeat failed for a whole lease (etcd, Cassandra or
    # the network down a while), nobody took the run over, and its worker
    # stopped it. Dropped, it stayed running, owed by nothing on the
    # cluster. Its claim still its worker's, the run is recorded as its
    # target ended after the stop: a failure, owed again by its retry.
    store = backend.store
    job = Job.model_validate(
        {
            "id": "o",
            "schedule": {"kind": "once", "run_at_ms": T0 + 100},
            "target": {"kind": "python", "ref": f"{__name__}:stopped_while_running"},
        }
    )
    store.add_job(job, 0, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    (sent,), _ = dispatch(backend, T0 + 60_000, 1, T0 + 30_000)
    executor = Executor(backend.claims, store, ManualClock(T0 + 30_000), "w1", WorkerConfig(lease_ms=30_000))
    execution = executor.new_execution(record(sent, 1))
    _while_running.append(lambda: executor.stop(execution, "its lease ran out", lease_lost=True))
    assert executor.attempt([execution]) == [ClaimOutcome.CLAIMED]
    (run,) = store.history("o")
    assert (run.state, run.attempt) == ("retrying", 1)
    owed = store.due_runs(every(1), T0 + 90_000, T0 + 32_000)
    assert [(r.job_id, r.attempt, r.due_ms) for r in owed] == [("o", 2, run.due_ms)]


def test_a_run_handed_back_ahead_of_the_watermark_is_read_once(backend: Backend) -> None:
    # Found by the paused-leader process test: the run's first row and the
    # row its hand-back added, read together, crashed the leader's wheel.
    store = backend.store
    store.add_job(once_job("o", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    (sent,), _ = dispatch(backend, T0 + 60_000, 1, T0 + 500)
    for p in range(4):
        store.raise_fence(p, 2)
    backend.claims.raise_fence(0, 2)
    store.hand_back(record(sent, 1), T0 + 600)
    assert [(r.job_id, r.due_ms) for r in store.due_runs(every(2), T0 + 60_000, T0 + 700)] == [("o", T0 + 100)]


def test_one_shot_completes_after_dispatch(backend: Backend) -> None:
    backend.store.add_job(once_job("once", T0 + 500), 0, 0, PlannedRun(T0 + 500, T0 + 500), T0)
    sent, planned = dispatch(backend, T0 + 1_000, 1, T0 + 500)
    assert len(sent) == 1 and planned == []
    assert backend.store.get_job("once").state == "completed"


def test_cancel_stops_pending_runs_and_keeps_history(backend: Backend) -> None:
    backend.store.add_job(cron_job(), 0, 0, PlannedRun(T0 + 10_000, T0 + 10_000), T0)
    assert len(due(backend, T0 + 60_000, 1, T0)) == 1
    rec = backend.store.cancel_job("every-10s", T0 + 1)
    assert rec.state == "cancelled" and rec.next_run is None
    assert due(backend, T0 + 60_000, 1, T0 + 10_000) == []
    assert dispatch(backend, T0 + 60_000, 1, T0 + 10_000) == ([], [])
    assert [r.state for r in backend.store.history("every-10s")] == ["cancelled"]
    with pytest.raises(JobNotActive):
        backend.store.cancel_job("every-10s", T0 + 2)
    with pytest.raises(JobNotFound):
        backend.store.cancel_job("nope", T0)


def test_a_cancelled_id_is_registered_again_as_a_new_job(backend: Backend) -> None:
    # The old job ran once (a dead letter), missed a time, and was cancelled
    # with a run under way; the new job at its id shows none of it, and
    # nothing the old job's worker writes late is the new job's.
    store = backend.store
    store.add_job(cron_job(), 0, 0, PlannedRun(T0 + 10_000, T0 + 10_000), T0)
    (first,), _ = dispatch(backend, T0 + 20_000, 1, T0 + 10_000)
    assert backend.claims.claim(record(first, 1), "w1", T0 + 10_010, 30_000).outcome is ClaimOutcome.CLAIMED
    assert store.run_started(record(first, 1), "w1", T0 + 10_020) == 1
    failure = FailedAttempt(1, "w1", T0 + 10_020, T0 + 10_030, "exit status 1", "exception")
    store.run_failed(record(first, 1), failure, None)
    (second,), _ = dispatch(backend, T0 + 30_000, 1, T0 + 20_000)
    store.run_missed(record(second, 1), MissedRuns("every-10s", T0 + 20_000, T0 + 20_001, "skipped"), "late", T0)
    assert store.dead_letters() and store.missed_runs(["every-10s"])
    store.cancel_job("every-10s", T0 + 20_500)
    rec = store.add_job(cron_job(), 0, 0, PlannedRun(T0 + 30_000, T0 + 30_000), T0 + 21_000)
    assert (rec.state, rec.next_run) == ("active", PlannedRun(T0 + 30_000, T0 + 30_000))
    assert store.get_job("every-10s").state == "active"
    assert store.history("every-10s") == [] and store.last_runs(["every-10s"]) == {}
    assert store.dead_letters() == [] and store.missed_runs(["every-10s"]) == {}
    # The old job's worker, late: its run starts not and its end lands nowhere.
    assert store.run_started(record(first, 1), "w1", T0 + 21_100) is None
    store.run_finished(record(first, 1), "succeeded", None, "late", T0 + 21_200)
    store.run_failed(record(second, 1), FailedAttempt(1, "w1", None, T0 + 21_300, "late", "exception"), T0 + 25_000)
    assert store.history("every-10s") == [] and store.dead_letters() == []
    assert not store.redrive("every-10s", first.run_at_ms, 0, T0 + 21_400)
    # The new job's first run is its own: a key of its own, claimed afresh.
    (new,), _ = dispatch(backend, T0 + 40_000, 1, T0 + 30_000)
    assert record(new, 1).idempotency_key not in {record(first, 1).idempotency_key, record(second, 1).idempotency_key}
    assert backend.claims.claim(record(new, 1), "w2", T0 + 30_010, 30_000).outcome is ClaimOutcome.CLAIMED
    assert store.run_started(record(new, 1), "w2", T0 + 30_020) == 1
    assert [(r.run_at_ms, r.state, r.attempt) for r in store.history("every-10s")] == [(T0 + 30_000, "running", 1)]


def test_only_a_cancelled_jobs_id_is_taken_by_a_new_job(backend: Backend) -> None:
    # An active, paused or completed job keeps its id: a completed one-shot's
    # history stays (trigger runs it again), and a sync never replaces it.
    store = backend.store
    store.add_job(cron_job("active"), 0, 0, PlannedRun(T0 + 10_000, T0 + 10_000), T0)
    store.add_job(cron_job("paused"), 0, 0, PlannedRun(T0 + 10_000, T0 + 10_000), T0)
    store.pause_job("paused", T0 + 1)
    store.add_job(once_job("done", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    dispatch(backend, T0 + 1_000, 1, T0 + 150)
    assert store.get_job("done").state == "completed"
    for job_id in ("active", "paused", "done"):
        with pytest.raises(JobExists):
            store.add_job(cron_job(job_id), 0, 0, PlannedRun(T0 + 60_000, T0 + 60_000), T0 + 200)
    with pytest.raises(JobExists, match="completed"):
        store.add_job(cron_job("done"), 0, 0, PlannedRun(T0 + 60_000, T0 + 60_000), T0 + 200)
    store.add_job(cron_job("gone"), 0, 0, PlannedRun(T0 + 10_000, T0 + 10_000), T0)
    store.cancel_job("gone", T0 + 300)
    items = [(cron_job(j, "0 * * * * *"), 0, 0, PlannedRun(T0 + 60_000, T0 + 60_000)) for j in ("active", "gone")]
    assert store.add_jobs(items, T0 + 400) == ["active"]
    assert store.get_job("gone").state == "active" and store.get_job("gone").job == cron_job("gone", "0 * * * * *")
    assert store.get_job("active").job == cron_job("active")


def test_a_one_shot_declared_again_at_the_time_it_ran_is_refused(backend: Backend) -> None:
    # Its run's key (id and time) was the old job's, which a worker and the
    # target have met: the new job must run later, or take a new id.
    store = backend.store
    store.add_job(once_job("once", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    dispatch(backend, T0 + 1_000, 1, T0 + 150)
    store.cancel_job("once", T0 + 200)
    with pytest.raises(JobExists, match="handed on"):
        store.add_job(once_job("once", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100), T0 + 300)
    assert store.add_jobs([(once_job("once", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100))], T0 + 300) == ["once"]
    assert store.get_job("once").state == "cancelled"
    rec = store.add_job(once_job("once", T0 + 5_000), 0, 0, PlannedRun(T0 + 5_000, T0 + 5_000), T0 + 300)
    assert rec.state == "active" and store.history("once") == []


def test_a_run_rescheduled_after_it_was_sent_does_not_start(backend: Backend) -> None:
    backend.store.add_job(cron_job(), 0, 0, PlannedRun(T0 + 10_000, T0 + 10_000), T0)
    (row,) = list(backend.store.due_runs(every(1), T0 + 60_000, T0 + 10_000))
    # Sent, not yet started, when the job moves to another schedule.
    backend.store.reschedule(cron_job(expr="7 * * * *"), 0, PlannedRun(T0 + 420_000, T0 + 420_000), T0 + 10_001)
    assert not backend.store.run_started(record(row, 1), "w1", T0 + 10_002)


def test_a_run_rescheduled_after_its_dispatch_was_recorded_does_not_start(backend: Backend) -> None:
    # The hole the test above leaves: once finish_dispatch has planned the
    # next run, the run sent is no longer the job's pending one, and a
    # reschedule that cancels only pending runs let it start, under the new
    # spec the worker reads at run time.
    backend.store.add_job(cron_job(), 0, 0, PlannedRun(T0 + 10_000, T0 + 10_000), T0)
    (sent,), (planned,) = dispatch(backend, T0 + 60_000, 1, T0 + 10_000)
    backend.store.reschedule(cron_job(expr="7 * * * *"), 0, PlannedRun(T0 + 420_000, T0 + 420_000), T0 + 10_001)
    assert not backend.store.run_started(record(sent, 1), "w1", T0 + 10_002)
    assert not backend.store.run_started(record(planned, 1), "w1", T0 + 20_000)
    states = {r.run_at_ms: r.state for r in backend.store.history("every-10s")}
    assert states[sent.run_at_ms] == "cancelled"
    # The new schedule's run is due; a store that re-reads behind its
    # watermark may list the old one too, which run_started refused above.
    assert T0 + 420_000 in [r.due_ms for r in backend.store.due_runs(every(2), T0 + 500_000, T0 + 20_000)]


def test_a_run_started_before_a_reschedule_keeps_its_start(backend: Backend) -> None:
    backend.store.add_job(cron_job(), 0, 0, PlannedRun(T0 + 10_000, T0 + 10_000), T0)
    (sent,), _ = dispatch(backend, T0 + 60_000, 1, T0 + 10_000)
    assert backend.store.run_started(record(sent, 1), "w1", T0 + 10_001)
    backend.store.reschedule(cron_job(expr="7 * * * *"), 0, PlannedRun(T0 + 420_000, T0 + 420_000), T0 + 10_002)
    backend.store.run_finished(record(sent, 1), "succeeded", None, None, T0 + 10_003)
    states = {r.run_at_ms: r.state for r in backend.store.history("every-10s")}
    assert states[sent.run_at_ms] == "succeeded"


def test_reschedule_replaces_pending_runs(backend: Backend) -> None:
    backend.store.add_job(cron_job(), 0, 0, PlannedRun(T0 + 10_000, T0 + 10_000), T0)
    new = cron_job(expr="0 * * * *")
    rec = backend.store.reschedule(new, 0, PlannedRun(T0 + 3_600_000, T0 + 3_600_000), T0 + 1)
    assert rec.next_run == PlannedRun(T0 + 3_600_000, T0 + 3_600_000)
    assert [d for _, d in due(backend, T0 + 3_700_000, 1, T0)] == [T0 + 3_600_000]
    with pytest.raises(JobNotFound):
        backend.store.reschedule(cron_job("nope"), 0, None, T0)


def test_a_run_sent_but_not_finished_is_handed_on_by_the_next_leader(backend: Backend) -> None:
    backend.store.add_job(once_job("o", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    rows = backend.store.due_runs(every(1), T0 + 1_000, T0 + 100)
    # Published here; the leader dies before finish_dispatch: its successor
    # sends the run again.
    again = backend.store.due_runs(every(2), T0 + 1_000, T0 + 200)
    assert [r.run_id for r in again] == [rows[0].run_id]


def test_embedded_runs_of_an_older_fence_are_handed_on_again(backend: Backend) -> None:
    if backend.name != "sqlite":
        pytest.skip("the in-process queue dies with its leader; Kafka keeps what it acknowledged")
    backend.store.add_job(once_job("o", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    ((run_id, _),) = due(backend, T0 + 1_000, 1, T0)
    dispatch(backend, T0 + 1_000, 1, T0 + 100)
    assert due(backend, T0 + 1_000, 1, T0 + 200) == []  # same leader: already handed on
    assert due(backend, T0 + 1_000, 2, T0 + 200) == [(run_id, T0 + 100)]  # new term: queue was lost
    sent, _ = dispatch(backend, T0 + 1_000, 2, T0 + 300)
    assert sent[0].attempt == 2


def test_embedded_running_run_with_dead_lease_is_handed_on_again(backend: Backend) -> None:
    if backend.name != "sqlite":
        pytest.skip("on Kafka the unacknowledged record itself is delivered again")
    backend.store.add_job(once_job("o", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    ((run_id, _),) = due(backend, T0 + 1_000, 1, T0)
    (row,), _ = dispatch(backend, T0 + 1_000, 1, T0 + 100)
    assert backend.claims.claim(record(row, 1), "w1", T0 + 110, 30_000).outcome is ClaimOutcome.CLAIMED
    assert backend.store.run_started(record(row, 1), "w1", T0 + 110)
    assert due(backend, T0 + 1_000, 1, T0 + 20_000) == []  # lease alive
    assert due(backend, T0 + 1_000, 1, T0 + 40_000) == [(run_id, T0 + 100)]  # lease died


def _interrupted(backend: Backend) -> tuple[Run, DispatchRecord]:
    """A one-shot's run, started by w1 and interrupted when w1's node
    stopped: its claim let go of, then the run recorded interrupted."""
    store = backend.store
    store.add_job(once_job("o", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    (sent,), _ = dispatch(backend, T0 + 1_000, 1, T0 + 100)
    rec = record(sent, 1)
    assert backend.claims.claim(rec, "w1", T0 + 110, 30_000).outcome is ClaimOutcome.CLAIMED
    assert store.run_started(rec, "w1", T0 + 110) == 1
    backend.claims.complete(rec.idempotency_key, "w1", False, None, T0 + 200)
    store.run_interrupted(rec, "interrupted: the node stopped", T0 + 200)
    return sent, rec


def test_an_interrupted_run_starts_again_as_its_next_attempt(backend: Backend) -> None:
    store = backend.store
    versions = store.change_versions()
    _, rec = _interrupted(backend)
    if backend.name == "sqlite":
        # Owed again at once: its partition's leader reads it again now, not
        # at its next full read, half a minute on (Kafka delivers it again
        # on a cluster).
        assert store.change_versions()[rec.partition] > versions.get(rec.partition, 0) + 1
    (run,) = store.history("o")
    assert (run.state, run.attempt, run.ended_at_ms, run.error) == (
        "interrupted",
        1,
        T0 + 200,
        "interrupted: the node stopped",
    )
    assert store.last_runs(["o"])["o"].state == "interrupted"
    # Its claim was let go of: the next delivery takes it at once, well
    # within the lease the stopped worker held.
    assert backend.claims.claim(rec, "w2", T0 + 300, 30_000).outcome is ClaimOutcome.TAKEN_OVER
    # Kafka delivers the very record the stopped worker let go of; the start
    # is the next attempt all the same.
    assert store.run_started(rec, "w2", T0 + 300) == 2
    # Its end is the interrupted attempt's no more: a run that ends before it
    # starts would show a negative duration.
    assert [(r.state, r.attempt, r.error, r.started_at_ms, r.ended_at_ms) for r in store.history("o")] == [
        ("running", 2, None, T0 + 300, None)
    ]
    # Never pruned while it is owed.
    assert store.prune_history(range(4), T0 + 10_000_000, 0, 100, T0 + 70_000) == 0


def test_an_interrupted_run_reaches_a_new_leader_as_its_next_attempt(backend: Backend) -> None:
    store = backend.store
    sent, rec = _interrupted(backend)
    for p in range(4):
        store.raise_fence(p, 2)
    backend.claims.raise_fence(0, 2)
    # Its record, delivered again, is rejected for its fence and handed
    # back (the embedded store owes it anyway).
    assert backend.claims.claim(rec, "w2", T0 + 300, 30_000).outcome is ClaimOutcome.FENCED
    store.hand_back(rec, T0 + 300)
    again = [r for r in store.due_runs(every(2), T0 + 60_000, T0 + 400) if r.run_id == sent.run_id]
    assert [r.attempt for r in again] == [2]
    record_sent(store, again, every(2), {}, T0 + 400)
    assert store.run_started(record(again[0], 2), "w2", T0 + 500) == 2
    assert [(r.state, r.attempt) for r in store.history("o")] == [("running", 2)]


@pytest.mark.parametrize("delivered_by", ["leader", "kafka"])
def test_an_interrupted_run_is_the_attempt_interrupted_though_a_new_leader_sent_it_meanwhile(
    backend: Backend, delivered_by: str
) -> None:
    # A new leader hands on again a run sent shortly before it took over,
    # while the run still goes on (its claim keeps it to one execution).
    store = backend.store
    store.add_job(once_job("o", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    (sent,), _ = dispatch(backend, T0 + 1_000, 1, T0 + 100)
    rec = record(sent, 1)
    assert backend.claims.claim(rec, "w1", T0 + 110, 30_000).outcome is ClaimOutcome.CLAIMED
    assert store.run_started(rec, "w1", T0 + 110) == 1
    again = sent._replace(attempt=2)
    record_sent(store, [again], every(2), {}, T0 + 150)
    backend.claims.complete(rec.idempotency_key, "w1", False, None, T0 + 200)
    store.run_interrupted(rec, "interrupted: the node stopped", T0 + 200)
    assert [(r.state, r.attempt) for r in store.history("o")] == [("interrupted", 1)]
    # Either delivery starts it as attempt 2: the new leader's, or the
    # record the stopped worker let go of.
    delivered = record(again, 2) if delivered_by == "leader" else rec
    assert store.run_started(delivered, "w2", T0 + 300) == 2
    assert [(r.state, r.attempt) for r in store.history("o")] == [("running", 2)]


def test_only_a_running_run_is_interrupted(backend: Backend) -> None:
    store = backend.store
    store.add_job(once_job("o", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    (sent,), _ = dispatch(backend, T0 + 1_000, 1, T0 + 100)
    rec = record(sent, 1)
    # Claimed, not started: nothing in its history changes.
    store.run_interrupted(rec, "interrupted: the node stopped", T0 + 150)
    assert [(r.state, r.attempt) for r in store.history("o")] == [("dispatched", 1)]
    assert store.run_started(rec, "w1", T0 + 200) == 1
    store.run_finished(rec, "succeeded", None, "done", T0 + 300)
    store.run_interrupted(rec, "interrupted: the node stopped", T0 + 400)
    (run,) = store.history("o")
    assert (run.state, run.result, run.ended_at_ms) == ("succeeded", "done", T0 + 300)


def test_a_reschedule_cancels_an_interrupted_run(backend: Backend) -> None:
    # It would start again under the new spec, which the worker reads when
    # it starts it: like a run handed on and not started, it is cancelled.
    store = backend.store
    store.add_job(cron_job(), 0, 0, PlannedRun(T0 + 10_000, T0 + 10_000), T0)
    (sent,), _ = dispatch(backend, T0 + 60_000, 1, T0 + 10_000)
    rec = record(sent, 1)
    assert store.run_started(rec, "w1", T0 + 10_001) == 1
    store.run_interrupted(rec, "interrupted: the node stopped", T0 + 10_002)
    store.reschedule(cron_job(expr="7 * * * *"), 0, PlannedRun(T0 + 420_000, T0 + 420_000), T0 + 10_003)
    assert store.run_started(rec, "w2", T0 + 10_004) is None
    states = {r.run_at_ms: r.state for r in store.history("every-10s")}
    assert states[sent.run_at_ms] == "cancelled"


def test_embedded_interrupted_run_is_handed_on_again_once(backend: Backend) -> None:
    if backend.name != "sqlite":
        pytest.skip("on Kafka the record the stopped worker did not acknowledge is delivered again")
    sent, _ = _interrupted(backend)
    # Owed whatever the fence: the leader that sent it may lead still.
    (again,) = backend.store.due_runs(every(1), T0 + 60_000, T0 + 300)
    assert (again.run_id, again.attempt) == (sent.run_id, 2)
    record_sent(backend.store, [again], every(1), {}, T0 + 300)
    assert [(r.state, r.attempt) for r in backend.store.history("o")] == [("dispatched", 2)]
    assert due(backend, T0 + 60_000, 1, T0 + 400) == []


def test_outcomes_are_recorded(backend: Backend) -> None:
    backend.store.add_job(once_job("o", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    (row,), _ = dispatch(backend, T0 + 1_000, 1, T0 + 150)
    assert backend.store.run_started(record(row, 1), "w1", T0 + 160)
    backend.store.run_finished(record(row, 1), "failed", "exit status 3", "out", T0 + 200)
    (run,) = backend.store.history("o")
    assert (run.state, run.started_at_ms, run.ended_at_ms, run.error, run.result, run.worker) == (
        "failed",
        T0 + 160,
        T0 + 200,
        "exit status 3",
        "out",
        "w1",
    )
    assert run.dispatched_at_ms == T0 + 150 and run.due_ms == T0 + 100


def test_a_succeeded_run_keeps_its_record(backend: Backend) -> None:
    # A redelivery of a run whose claim succeeded records the outcome again
    # (its node may have died before its history had it): the first stands.
    backend.store.add_job(once_job("o", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    (sent,), _ = dispatch(backend, T0 + 1_000, 1, T0 + 100)
    assert backend.store.run_started(record(sent, 1), "w1", T0 + 200)
    backend.store.run_finished(record(sent, 1), "succeeded", None, "first", T0 + 300)
    backend.store.run_finished(record(sent, 1), "succeeded", None, None, T0 + 900)
    (run,) = backend.store.history("o")
    assert (run.state, run.result, run.ended_at_ms) == ("succeeded", "first", T0 + 300)


def test_the_last_run_is_the_newest_handed_on_whatever_became_of_it(backend: Backend) -> None:
    store = backend.store
    store.add_job(once_job("o", T0 + 100), 0, 0, PlannedRun(T0 + 100, T0 + 100), T0)
    store.add_job(cron_job(), 1, 0, PlannedRun(T0 + 10_000, T0 + 10_000), T0)
    store.add_job(once_job("later", T0 + 50_000), 2, 0, PlannedRun(T0 + 50_000, T0 + 50_000), T0)
    assert store.last_runs(["o", "every-10s", "later", "nope"]) == {}
    (row,), _ = dispatch(backend, T0 + 1_000, 1, T0 + 150)
    # Handed on: the job's schedule has ended, but the run has not.
    assert store.get_job("o").state == "completed"
    assert store.last_runs(["o"])["o"].state == "dispatched"
    assert store.run_started(record(row, 1), "w1", T0 + 160)
    assert store.last_runs(["o"])["o"].state == "running"
    store.run_finished(record(row, 1), "failed", "exit status 3", None, T0 + 200)
    # Two runs of the recurring job handed on; its next one waits.
    dispatch(backend, T0 + 20_000, 1, T0 + 10_000)
    dispatch(backend, T0 + 30_000, 1, T0 + 20_000)
    last = store.last_runs(["o", "every-10s", "later"])
    assert sorted(last) == ["every-10s", "o"]
    assert (last["o"].state, last["o"].error) == ("failed", "exit status 3")
    assert (last["every-10s"].run_at_ms, last["every-10s"].state) == (T0 + 20_000, "dispatched")


def test_claim_outcomes(backend: Backend) -> None:
    row = (7, "job", T0, T0, 1, 1, 0)
    c = backend.claims
    assert c.claim(record(row, 3), "w1", T0, 30_000).outcome is ClaimOutcome.CLAIMED
    busy = c.claim(record(row, 3), "w2", T0 + 1, 30_000)
    # It says when w1's lease ends: a worker that died is replaced then.
    assert (busy.outcome, busy.busy_until_ms) == (ClaimOutcome.BUSY, T0 + 30_000)
    assert c.claim(record(row, 3), "w2", T0 + 30_001, 30_000).outcome is ClaimOutcome.TAKEN_OVER
    c.complete(record(row, 3).idempotency_key, "w2", True, "42", T0 + 30_002)
    done = c.claim(record(row, 3), "w3", T0 + 30_003, 30_000)
    assert (done.outcome, done.result) == (ClaimOutcome.SUCCEEDED, "42")
    stale = c.claim(record((8, "job", T0 + 1, T0 + 1, 1, 1, 0), 2), "w1", T0, 30_000)
    assert (stale.outcome, stale.fence_floor) == (ClaimOutcome.FENCED, 3)


def test_a_failed_delivery_is_taken_over_by_a_later_delivery_only(backend: Backend) -> None:
    # Kafka may deliver a record again, or an older one, after its run
    # failed: that delivery is over (FAILED, with the failure the claim
    # kept), and the run's retry, a later delivery, takes the claim over.
    c = backend.claims
    delivered = (7, "job", T0, T0, 1, 2, 0)  # the run's second delivery
    key = record(delivered, 1).idempotency_key
    assert c.claim(record(delivered, 1), "w1", T0, 30_000).outcome is ClaimOutcome.CLAIMED
    c.complete(key, "w1", False, '{"kept": 1}', T0 + 100)
    assert c.failed_claim(key) == FailedClaim(2, '{"kept": 1}')
    for attempt in (2, 1):
        again = c.claim(record((*delivered[:5], attempt, 0), 1), "w2", T0 + 200, 30_000)
        assert (again.outcome, again.failure) == (ClaimOutcome.FAILED, '{"kept": 1}')
    retry = c.claim(record((*delivered[:5], 3, 0), 1), "w3", T0 + 300, 30_000)
    assert (retry.outcome, retry.failure) == (ClaimOutcome.TAKEN_OVER, '{"kept": 1}')
    assert c.failed_claim(key) is None
    assert c.claim(record((*delivered[:5], 3, 0), 1), "w4", T0 + 400, 30_000).outcome is ClaimOutcome.BUSY


def test_a_claim_let_go_of_is_taken_over_by_the_same_delivery(backend: Backend) -> None:
    # An interrupted run (or one parked) lets go of its claim with no
    # outcome: Kafka delivers the very record again, which takes it at once.
    c = backend.claims
    rec = record((7, "job", T0, T0, 1, 1, 0), 1)
    assert c.claim(rec, "w1", T0, 30_000).outcome is ClaimOutcome.CLAIMED
    c.complete(rec.idempotency_key, "w1", False, None, T0 + 100)
    assert c.failed_claim(rec.idempotency_key) is None
    taken = c.claim(rec, "w2", T0 + 200, 30_000)
    assert (taken.outcome, taken.failure) == (ClaimOutcome.TAKEN_OVER, None)


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
    assert backend.claims.heartbeat([record(row, 1).idempotency_key], ["w1"], T0 + 900, 1_000) == []
    assert backend.claims.claim(record(row, 1), "w2", T0 + 1_500, 1_000).outcome is ClaimOutcome.BUSY


def test_heartbeat_extends_only_the_claims_it_names(backend: Backend) -> None:
    # An execution that ended without an outcome is no longer named: its
    # claim must run out, or its run would never be handed on again.
    running, orphaned = (record((n, "job", T0 + n, T0 + n, 1, 1, 0), 1) for n in (7, 8))
    backend.claims.claim(running, "node-1", T0, 1_000)
    backend.claims.claim(orphaned, "node-1", T0, 1_000)
    assert backend.claims.heartbeat([running.idempotency_key], ["node-1"], T0 + 900, 1_000) == []
    assert backend.claims.claim(running, "node-2/1", T0 + 1_500, 1_000).outcome is ClaimOutcome.BUSY
    assert backend.claims.claim(orphaned, "node-2/1", T0 + 1_500, 1_000).outcome is ClaimOutcome.TAKEN_OVER


def test_a_holder_claiming_its_live_claim_again_keeps_it(backend: Backend) -> None:
    # A holder is one execution: claiming again is that execution trying
    # again after a timeout (its first claim may have landed), not a second
    # execution, so it must not wait out its own lease.
    row = (7, "job", T0, T0, 1, 1, 0)
    assert backend.claims.claim(record(row, 1), "node-1/1", T0, 30_000).outcome is ClaimOutcome.CLAIMED
    assert backend.claims.claim(record(row, 1), "node-1/1", T0 + 1, 30_000).outcome is ClaimOutcome.TAKEN_OVER
    assert backend.claims.claim(record(row, 1), "node-1/2", T0 + 2, 30_000).outcome is ClaimOutcome.BUSY


def test_a_raised_fence_rejects_older_dispatches(backend: Backend) -> None:
    backend.claims.raise_fence(2, 5)
    row = (9, "job", T0, T0, 2, 1, 0)
    assert backend.claims.claim(record(row, 4), "w", T0, 1_000).outcome is ClaimOutcome.FENCED
    assert backend.claims.claim(record(row, 5), "w", T0, 1_000).outcome is ClaimOutcome.CLAIMED
    backend.claims.raise_fence(2, 3)  # never lowers
    assert backend.claims.claim(record((10, "job", T0, T0, 2, 1, 0), 4), "w", T0, 1_000).outcome is (
        ClaimOutcome.FENCED
    )


def test_leadership_and_fences(backend: Backend) -> None:
    co = backend.coordinator
    a = co.poll("a", backend.clock_ms())
    assert a and set(a) == set(range(4))
    assert co.poll("a", backend.clock_ms()) == a  # renewed, same fences
    assert co.poll("b", backend.clock_ms()) == {}  # a holds them all for now
    assert {lease.holder for lease in co.leaders().values()} == {"a"}
    co.release("a")
    b = co.poll("b", backend.clock_ms())
    assert set(b) == set(a) and all(b[p] > a[p] for p in a)
    # The new fences are published: dispatches under the old ones are rejected.
    row = (1, "job", T0, T0, 3, 1, 0)
    assert backend.claims.claim(record(row, a[3]), "w", T0, 1_000).outcome is ClaimOutcome.FENCED


def forget_fast_path(backend: Backend) -> None:
    """Lose what the claims' fast path holds, as Redis does on a restart
    without persistence or a FLUSHALL. On the cluster only this test's
    keyspace's keys go: the database is shared with other test runs, and
    from this keyspace's side that is all a FLUSHALL takes."""
    if isinstance(backend.claims, MemoryClaims):
        backend.claims.tables.forget_fast_path()
        return
    claims: Any = backend.claims
    for key in claims.redis.scan_iter(match=f"{claims.prefix}:*", count=1_000):
        claims.redis.delete(key)


def test_a_raised_fence_survives_the_fast_path_forgetting(backend: Backend) -> None:
    if backend.name == "sqlite":
        pytest.skip("the embedded claims keep their floors in the database itself: no fast path to lose")
    backend.claims.raise_fence(2, 5)
    forget_fast_path(backend)
    stale = record((9, "job", T0, T0, 2, 1, 0), 4)
    for _ in range(2):  # the first rejection must not teach the fast path the stale fence
        outcome = backend.claims.claim(stale, "w", T0, 1_000)
        assert (outcome.outcome, outcome.fence_floor) == (ClaimOutcome.FENCED, 5)
    current = backend.claims.claim(record((9, "job", T0, T0, 2, 1, 0), 5), "w", T0, 1_000)
    assert (current.outcome, current.fence_floor) == (ClaimOutcome.CLAIMED, 5)


def test_the_authoritative_claim_refuses_a_stale_fence_the_fast_path_lets_through(backend: Backend) -> None:
    # A leader paused inside raise_fence resumes after the fast path forgot:
    # its late, lower raise is all the fast path now knows of partition 2.
    # The durable floor still decides.
    if backend.name == "sqlite":
        pytest.skip("the embedded claims keep their floors in the database itself: no fast path to lose")
    backend.claims.raise_fence(2, 5)
    forget_fast_path(backend)
    backend.claims.raise_fence(2, 4)
    stale = backend.claims.claim(record((9, "job", T0, T0, 2, 1, 0), 4), "w", T0, 1_000)
    assert (stale.outcome, stale.fence_floor) == (ClaimOutcome.FENCED, 5)


def _claim_state(backend: Backend, key: str) -> str | None:
    """The state of the claim's row as stored, None if there is none (on
    the cluster, Redis keeps its own 'done' marker for a week whatever
    happens here)."""
    store: Any = backend.store
    if isinstance(backend.claims, MemoryClaims):
        row = backend.claims.tables.claim_rows().get(key)
        return None if row is None else row.state
    if backend.name == "sqlite":
        found = store.db.connection().execute("SELECT state FROM claims WHERE idem_key = ?", (key,)).fetchone()
        return None if found is None else str(found[0])
    query = f"SELECT state FROM {store.keyspace}.claims WHERE idem_key = %s"
    stored = store.tables.execute(query, (key,)).one()
    return None if stored is None else str(stored.state)


def test_prune_history_drops_old_finished_runs_only(backend: Backend) -> None:
    for job_id, partition in (("every-10s", 0), ("all-done", 1), ("elsewhere", 2)):
        backend.store.add_job(cron_job(job_id), partition, 0, PlannedRun(T0 + 10_000, T0 + 10_000), T0)
    keys: dict[int, str] = {}
    handled: set[tuple[str, int]] = set()
    # Runs 1..6 of each job, ten seconds apart, succeeded a second after
    # their time; but for every-10s and elsewhere, run 1 is still running
    # and run 2 was sent but not started.
    for k in range(1, 7):
        now = T0 + 10_000 * k
        sent, _ = dispatch(backend, T0 + 60_000 * 60, 1, now)
        for row in sent:
            # A store may send a run again while its watermark trails.
            if (row.job_id, row.run_at_ms) in handled:
                continue
            handled.add((row.job_id, row.run_at_ms))
            if k == 2 and row.job_id != "all-done":
                continue
            rec = record(row, 1)
            backend.claims.claim(rec, "w1", now, 3_600_000)  # run 1 stays running
            backend.store.run_started(rec, "w1", now)
            if k >= 3 or row.job_id == "all-done":
                backend.claims.complete(rec.idempotency_key, "w1", True, None, now + 1_000)
                backend.store.run_finished(rec, "succeeded", None, None, now + 1_000)
            if row.job_id == "every-10s":
                keys[k] = rec.idempotency_key

    def runs(job_id: str = "every-10s") -> list[int]:
        return [(r.run_at_ms - T0) // 10_000 for r in backend.store.history(job_id, 100)]

    assert runs() == runs("all-done") == runs("elsewhere") == [6, 5, 4, 3, 2, 1]
    # By age: runs 3 and 4 ended before T0 + 50 s; the limit takes the
    # oldest first; only the partitions given are pruned.
    assert backend.store.prune_history([0], T0 + 50_000, None, 1, T0 + 70_000) == 1
    assert runs() == [6, 5, 4, 2, 1]
    assert backend.store.prune_history([0, 3], T0 + 50_000, None, 100, T0 + 70_000) == 1
    assert runs() == [6, 5, 2, 1]
    assert runs("all-done") == runs("elsewhere") == [6, 5, 4, 3, 2, 1]
    # Their claims are tombstones while a record of them may be delivered.
    assert _claim_state(backend, keys[3]) == _claim_state(backend, keys[4]) == PRUNED_STATE
    assert _claim_state(backend, keys[5]) == "succeeded"
    assert backend.store.prune_history([1], T0 + 50_000, None, 100, T0 + 70_000) == 4
    assert runs("all-done") == [6, 5]
    # By count: one finished run kept per job.
    assert backend.store.prune_history([0, 1], None, 1, 100, T0 + 70_000) == 2
    assert runs() == [6, 2, 1] and runs("all-done") == [6]
    # The newest finished run stays whatever the limits; then nothing is left.
    everything = [0, 1, 2, 3]
    assert backend.store.prune_history(everything, T0 + 10**9, 1, 100, T0 + 70_000) == 3
    assert runs() == [6, 2, 1] and runs("elsewhere") == [6, 2, 1] and runs("all-done") == [6]
    assert backend.store.prune_history(everything, T0 + 10**9, 1, 100, T0 + 70_000) == 0


def test_a_job_that_took_a_cancelled_job_s_id_keeps_the_runs_it_missed(backend: Backend) -> None:
    first = PlannedRun(T0 + 60_000, T0 + 60_000)
    backend.store.add_job(cron_job("x", "0 * * * * *"), 0, 0, first, T0)
    backend.store.cancel_job("x", T0 + 1)
    backend.store.add_job(cron_job("x", "0 * * * * *"), 0, 0, first, T0 + 2)
    backend.store.pause_job("x", T0 + 3)
    missed = MissedRuns("x", T0 + 60_000, T0 + 180_000, "paused")
    backend.store.resume_job("x", PlannedRun(T0 + 240_000, T0 + 240_000), missed, T0 + 200_000)
    assert backend.store.missed_runs(["x"]) == {"x": [missed]}
