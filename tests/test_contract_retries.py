"""Contract tests of retries and dead letters: every engine alike, the
store's and, at the end, a worker's (its executor on each engine's claims
and store)."""

from __future__ import annotations

import random
from typing import Any

import pytest

import tests.test_contract as contract
from pysched.clock import ManualClock
from pysched.leader.recording import record_sent
from pysched.model import Job
from pysched.protocols import (
    ClaimedFailure,
    ClaimOutcome,
    FailedAttempt,
    PlannedRun,
    Run,
    RunNotFound,
    ScheduleStore,
)
from pysched.records import DispatchRecord
from pysched.targets import RunContext
from pysched.worker import Executor, WorkerConfig
from tests.test_contract import Backend, _fresh_t0, backend, every, once_job, record

__all__ = ["_fresh_t0", "backend"]  # the shared fixtures, used by name


def _failure(attempt: int, at: int, dead: bool = False) -> FailedAttempt:
    return FailedAttempt(attempt, "w1", at - 50, at, f"exit status {attempt}", "exception", dead)


def _started_once(backend: Backend) -> Run:
    """A one-shot due at T0+100, handed on and started by w1 at T0+160."""
    t0 = contract.T0
    store = backend.store
    store.add_job(once_job("o", t0 + 100), 0, 0, PlannedRun(t0 + 100, t0 + 100), t0)
    (sent,) = store.due_runs(every(1), t0 + 60_000, t0 + 150)
    record_sent(store, [sent], every(1), {}, t0 + 150)
    assert store.run_started(record(sent, 1), "w1", t0 + 160) == 1
    return sent


def _failed_once(backend: Backend, retry_due: int | None) -> tuple[int, int]:
    """That run, failed once; its (run id, run_at)."""
    sent = _started_once(backend)
    backend.store.run_failed(record(sent, 1), _failure(1, contract.T0 + 200, retry_due is None), retry_due)
    return sent.run_id, sent.run_at_ms


def test_a_run_retrying_is_owed_again_at_its_retry_time_as_the_next_attempt(backend: Backend) -> None:
    t0 = contract.T0
    store = backend.store
    run_id, run_at = _failed_once(backend, t0 + 5_000)
    (run,) = store.history("o")
    assert (run.state, run.attempt, run.error) == ("retrying", 1, "exit status 1")
    # Due again at the retry's time, not at once (nothing was due before it).
    (again,) = store.due_runs(every(1), t0 + 60_000, t0 + 1_000)
    assert (again.run_id, again.run_at_ms, again.due_ms, again.attempt, again.attempt_group) == (
        run_id,
        run_at,
        t0 + 5_000,
        2,
        0,
    )
    record_sent(store, [again], every(1), {}, t0 + 5_000)
    # Handed on: owed no more (a store may return the reader's own send,
    # unchanged, which a leader skips).
    assert [r.attempt for r in store.due_runs(every(1), t0 + 60_000, t0 + 5_100)] in ([], [2])
    assert store.run_started(record(again, 1), "w2", t0 + 5_100) == 2
    store.run_finished(record(again, 1)._replace(attempt=2), "succeeded", None, "ok", t0 + 5_200)
    done = store.get_run("o", run_at)
    assert (done.state, done.attempt, done.result) == ("succeeded", 2, "ok")
    assert [(f.attempt, f.error, f.kind) for f in done.failures] == [(1, "exit status 1", "exception")]
    assert store.dead_letters() == []


def test_a_failure_recorded_twice_counts_once(backend: Backend) -> None:
    t0 = contract.T0
    _, run_at = _failed_once(backend, t0 + 5_000)
    (sent,) = backend.store.due_runs(every(1), t0 + 60_000, t0 + 1_000)
    # The worker's write is repeated whole after a timeout.
    backend.store.run_failed(record(sent, 1)._replace(attempt=1), _failure(1, t0 + 200), t0 + 5_000)
    assert [f.attempt for f in backend.store.get_run("o", run_at).failures] == [1]


def test_a_run_that_failed_for_good_is_a_dead_letter_until_redriven(backend: Backend) -> None:
    t0 = contract.T0
    store = backend.store
    run_id, run_at = _failed_once(backend, None)
    (dead,) = store.dead_letters()
    assert (dead.run_id, dead.job_id, dead.run_at_ms, dead.state, dead.attempt_group) == (
        run_id,
        "o",
        run_at,
        "failed",
        0,
    )
    assert [(f.attempt, f.worker, f.started_at_ms, f.ended_at_ms, f.dead_lettered) for f in dead.failures] == [
        (1, "w1", t0 + 150, t0 + 200, True)
    ]
    # Owed no more (but for the reader's own send, unchanged, which a
    # leader skips).
    assert [r.attempt for r in store.due_runs(every(1), t0 + 60_000, t0 + 1_000)] in ([], [1])
    now = backend.clock_ms() if backend.name in ("memory", "cluster-memtables") else t0 + 1_000
    assert store.redrive("o", run_at, 0, now)
    assert not store.redrive("o", run_at, 0, now), "a run redriven is no dead letter any more"
    assert store.dead_letters() == []
    (again,) = store.due_runs(every(1), t0 + 60_000, now + 2_000)
    assert (again.run_id, again.attempt) == (run_id, 2)
    assert now <= again.due_ms <= now + 2_000
    assert store.get_run("o", run_at).state == "retrying"


def test_only_a_dead_letter_is_redriven(backend: Backend) -> None:
    t0 = contract.T0
    _failed_once(backend, t0 + 5_000)
    assert not backend.store.redrive("o", t0 + 100, 0, t0 + 1_000), "retrying, not dead"
    assert not backend.store.redrive("nope", t0 + 100, 0, t0 + 1_000)
    with pytest.raises(RunNotFound):
        backend.store.get_run("nope", t0 + 100)


def _started_cron_run(backend: Backend) -> Run:
    """The every-10s job's run due at T0+10s, handed on and started."""
    t0 = contract.T0
    store = backend.store
    store.add_job(contract.cron_job(), 0, 0, PlannedRun(t0 + 10_000, t0 + 10_000), t0)
    (sent,) = store.due_runs(every(1), t0 + 11_000, t0 + 10_000)
    record_sent(store, [sent], every(1), {}, t0 + 10_000)
    assert store.run_started(record(sent, 1), "w1", t0 + 10_001) == 1
    return sent


def test_a_run_whose_job_was_cancelled_is_not_retried(backend: Backend) -> None:
    t0 = contract.T0
    store = backend.store
    sent = _started_cron_run(backend)
    # Cancelled while it ran: it goes on, and its failure is its end.
    store.cancel_job("every-10s", t0 + 10_002)
    store.run_failed(record(sent, 1), _failure(1, t0 + 10_004), t0 + 15_000)
    run = store.get_run("every-10s", sent.run_at_ms)
    assert (run.state, run.error, [f.attempt for f in run.failures]) == ("cancelled", "exit status 1", [1])
    assert [r for r in store.due_runs(every(1), t0 + 60_000, t0 + 15_000) if r.attempt > 1] == []
    assert store.dead_letters() == []


def test_a_reschedule_cancels_a_run_retrying(backend: Backend) -> None:
    t0 = contract.T0
    store = backend.store
    sent = _started_cron_run(backend)
    store.run_failed(record(sent, 1), _failure(1, t0 + 10_002), t0 + 15_000)
    # Its retry would run the old spec's run under the new one.
    store.reschedule(contract.cron_job(expr="7 * * * *"), 0, PlannedRun(t0 + 420_000, t0 + 420_000), t0 + 10_003)
    assert store.get_run("every-10s", sent.run_at_ms).state == "cancelled"
    assert store.run_started(record(sent, 1)._replace(attempt=2), "w1", t0 + 15_000) is None


def test_a_dead_letter_goes_with_its_run_when_pruned(backend: Backend) -> None:
    t0 = contract.T0
    store = backend.store
    store.add_job(contract.cron_job(), 0, 0, PlannedRun(t0 + 10_000, t0 + 10_000), t0)
    done: set[int] = set()
    for k in (1, 2):
        now = t0 + 10_000 * k
        sent, _ = contract.dispatch(backend, t0 + 3_600_000, 1, now)
        for row in sent:
            # A store may send a run again while its watermark trails.
            if row.run_at_ms in done:
                continue
            done.add(row.run_at_ms)
            assert store.run_started(record(row, 1), "w1", now) == 1
            if k == 1:
                store.run_failed(record(row, 1), _failure(1, now + 100, True), None)
            else:
                store.run_finished(record(row, 1), "succeeded", None, None, now + 100)
    assert [r.run_at_ms for r in store.dead_letters()] == [t0 + 10_000]
    # The newer run, which succeeded, stays; the dead one goes, and with it
    # its dead letter.
    assert store.prune_history(range(4), t0 + 10**9, None, 100, t0 + 30_000) == 1
    assert store.dead_letters() == []
    assert not store.redrive("every-10s", t0 + 10_000, 0, t0 + 30_000)
    with pytest.raises(RunNotFound):
        store.get_run("every-10s", t0 + 10_000)


def test_a_late_record_of_the_failed_attempts_dispatch_leaves_its_retry_owed(backend: Backend) -> None:
    # The in-process queue hands a run to a worker before the leader records
    # it sent: the worker can run it, fail it and schedule its retry first.
    t0 = contract.T0
    store = backend.store
    store.add_job(once_job("o", t0 + 100), 0, 0, PlannedRun(t0 + 100, t0 + 100), t0)
    (sent,) = store.due_runs(every(1), t0 + 60_000, t0 + 150)
    assert store.run_started(record(sent, 1), "w1", t0 + 160) == 1
    store.run_failed(record(sent, 1), _failure(1, t0 + 200), t0 + 5_000)
    record_sent(store, [sent], every(1), {}, t0 + 150)
    assert store.get_run("o", sent.run_at_ms).state == "retrying"
    (again,) = [r for r in store.due_runs(every(1), t0 + 60_000, t0 + 5_000) if r.attempt > 1]
    assert (again.run_id, again.due_ms, again.attempt) == (sent.run_id, t0 + 5_000, 2)


def test_a_run_started_again_after_its_worker_died_is_the_same_attempt(backend: Backend) -> None:
    # The "attempt unchanged": a worker that dies mid-run ended no
    # attempt, so the execution that takes the run over (a leader's later
    # delivery embedded, the very record again on Kafka) is the same one;
    # a failure after it makes the retry the next.
    t0 = contract.T0
    store = backend.store
    sent = _started_once(backend)
    assert store.run_started(record(sent, 1)._replace(attempt=2), "w2", t0 + 40_000) == 1
    assert store.run_started(record(sent, 1), "w3", t0 + 80_000) == 1
    (run,) = store.history("o")
    assert (run.state, run.attempt, run.worker) == ("running", 1, "w3")
    store.run_failed(record(sent, 1)._replace(attempt=2), _failure(1, t0 + 80_100), t0 + 85_000)
    (again,) = store.due_runs(every(1), t0 + 160_000, t0 + 81_000)
    # Later than every delivery the run met, so no leader takes it for one
    # it has sent already.
    assert again.attempt == 3
    record_sent(store, [again], every(1), {}, t0 + 85_000)
    assert store.run_started(record(again, 1), "w4", t0 + 85_010) == 2
    assert [(r.state, r.attempt) for r in store.history("o")] == [("running", 2)]


# The attempts the target below was called for.
_calls: list[int] = []


def always_fails(ctx: RunContext) -> None:
    _calls.append(ctx.attempt)
    raise RuntimeError(f"attempt {ctx.attempt} fails")


@pytest.fixture
def _no_calls_yet() -> None:
    _calls.clear()


def _failing_run_sent(backend: Backend, retries: int) -> DispatchRecord:
    """A one-shot whose target always fails, due at T0+100 and handed on
    under fence 1: its record."""
    t0 = contract.T0
    job = Job.model_validate(
        {
            "id": "f",
            "schedule": {"kind": "once", "run_at_ms": t0 + 100},
            "target": {"kind": "python", "ref": f"{__name__}:always_fails"},
            "retry": {"retries": retries},
        }
    )
    backend.store.add_job(job, 0, 0, PlannedRun(t0 + 100, t0 + 100), t0)
    (sent,) = backend.store.due_runs(every(1), t0 + 60_000, t0 + 150)
    record_sent(backend.store, [sent], every(1), {}, t0 + 150)
    return record(sent, 1)


def _worker(backend: Backend, holder: str, store: ScheduleStore | None = None) -> Executor:
    clock = ManualClock(contract.T0 + 200)
    config = WorkerConfig(lease_ms=30_000)
    return Executor(backend.claims, store or backend.store, clock, holder, config, rng=random.Random(1))


@pytest.mark.usefixtures("_no_calls_yet")
@pytest.mark.parametrize("retries", [3, 0], ids=["retrying", "dead-letter"])
def test_a_failed_delivery_delivered_again_is_not_run_again(backend: Backend, retries: int) -> None:
    # Kafka delivers a record again when its acknowledgement was not
    # committed: a delivery that failed must not run a second time, ahead
    # of its retry's backoff (or, a dead letter, without a redrive), under
    # the attempt number it already used.
    rec = _failing_run_sent(backend, retries)
    first = _worker(backend, "node-1")
    assert first.attempt([first.new_execution(rec)]) == [ClaimOutcome.CLAIMED]
    failed = backend.store.get_run("f", rec.run_at_ms)
    assert (failed.state, [f.attempt for f in failed.failures]) == ("retrying" if retries else "failed", [1])
    again = _worker(backend, "node-2")
    assert again.attempt([again.new_execution(rec)]) == [ClaimOutcome.FAILED]
    assert _calls == [1]
    after = backend.store.get_run("f", rec.run_at_ms)
    assert (after.state, after.due_ms, after.failures) == (failed.state, failed.due_ms, failed.failures)


class _AnswerLostOnce:
    """A store whose first run_failed lands and then times out, its answer
    lost."""

    def __init__(self, store: ScheduleStore) -> None:
        self._store = store
        self.lost = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def run_failed(self, record: DispatchRecord, failure: FailedAttempt, retry_due_ms: int | None) -> None:
        self._store.run_failed(record, failure, retry_due_ms)
        if not self.lost:
            self.lost = True
            raise TimeoutError("run_failed timed out")


@pytest.mark.usefixtures("_no_calls_yet")
def test_a_failure_recorded_again_after_a_lost_answer_is_retried_once(backend: Backend) -> None:
    # The worker repeats the attempt, which only records: the retry it
    # writes is the one the first write scheduled, not a second one drawn
    # again (each schedule row is a delivery of its own).
    t0 = contract.T0
    rec = _failing_run_sent(backend, 3)
    worker = _worker(backend, "node-1", _AnswerLostOnce(backend.store))  # type: ignore[arg-type]
    execution = worker.new_execution(rec)
    with pytest.raises(TimeoutError):
        worker.attempt([execution])
    assert worker.attempt([execution]) == [ClaimOutcome.CLAIMED]
    assert _calls == [1]
    run = backend.store.get_run("f", rec.run_at_ms)
    owed = [r for r in backend.store.due_runs(every(1), t0 + 60_000, t0 + 300) if r.run_id == rec.run_id]
    assert [(r.due_ms, r.attempt) for r in owed] == [(run.due_ms, 2)]


class _DiesBeforeTheHistory:
    """A store whose node dies after a failed run's claim is completed,
    before the run's history has the failure."""

    def __init__(self, store: ScheduleStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def run_failed(self, record: DispatchRecord, failure: FailedAttempt, retry_due_ms: int | None) -> None:
        raise ConnectionError("the node died")


@pytest.mark.usefixtures("_no_calls_yet")
@pytest.mark.parametrize("new_leader", [True, False], ids=["fenced", "same-fence"])
def test_a_failure_whose_history_write_was_lost_reaches_the_history(backend: Backend, new_leader: bool) -> None:
    # The worker completed the failed claim, then died before the history
    # write. Its record comes again, to another worker: rejected for its
    # fence if a new leader took the partition meanwhile. Either way the
    # run must not stay "running" for ever, nor be run again at once: the
    # failure the claim kept is recorded, and the retry it chose is owed.
    if backend.name == "sqlite":
        pytest.skip("the embedded engine writes the claim and the history in one commit")
    t0 = contract.T0
    rec = _failing_run_sent(backend, 3)
    dying = _worker(backend, "node-1", _DiesBeforeTheHistory(backend.store))  # type: ignore[arg-type]
    with pytest.raises(ConnectionError):
        dying.attempt([dying.new_execution(rec)])
    assert backend.store.get_run("f", rec.run_at_ms).state == "running"
    fence = 2 if new_leader else 1
    for partition in range(4):
        backend.claims.raise_fence(partition, fence)
        backend.store.raise_fence(partition, fence)
    successor = _worker(backend, "node-2")
    outcome = ClaimOutcome.FENCED if new_leader else ClaimOutcome.FAILED
    assert successor.attempt([successor.new_execution(rec)]) == [outcome]
    assert _calls == [1]
    run = backend.store.get_run("f", rec.run_at_ms)
    assert (run.state, [(f.attempt, f.kind, f.worker) for f in run.failures]) == (
        "retrying",
        [(1, "exception", "node-1")],
    )
    owed = [r for r in backend.store.due_runs(every(fence), t0 + 60_000, t0 + 300) if r.run_id == rec.run_id]
    assert [(r.due_ms, r.attempt) for r in owed] == [(run.due_ms, 2)]


@pytest.mark.parametrize("how", ["retry", "park"])
def test_a_run_owed_again_after_a_hand_back_is_due_when_its_retry_or_parking_says(backend: Backend, how: str) -> None:
    # A stale leader's record, rejected for its fence, is handed back (on
    # the cluster a second schedule row, due a moment later); the new leader
    # hands the run on, and that delivery fails (or is parked) with the run
    # owed again 40 s later. The write deletes the row its delivery came
    # from, not the hand-back's: the run is due when the write says, never
    # at the hand-back row's time ahead of its backoff.
    t0 = contract.T0
    store = backend.store
    store.add_job(once_job("o", t0 + 100), 0, 0, PlannedRun(t0 + 100, t0 + 100), t0)
    (sent,) = store.due_runs(every(1), t0 + 60_000, t0 + 150)
    record_sent(store, [sent], every(1), {}, t0 + 150)
    for p in range(4):
        store.raise_fence(p, 2)
        backend.claims.raise_fence(p, 2)
    assert store.hand_back(record(sent, 1), t0 + 200) or backend.name == "sqlite"
    (handed,) = store.due_runs(every(2), t0 + 60_000, t0 + 1_300)
    assert handed.attempt == 2
    record_sent(store, [handed], every(2), {}, t0 + 1_300)
    rec = record(handed, 2)
    assert backend.claims.claim(rec, "w1", t0 + 1_300, 30_000).outcome is ClaimOutcome.CLAIMED
    owed_at = t0 + 41_500
    if how == "retry":
        assert store.run_started(rec, "w1", t0 + 1_310) == 1
        failure = _failure(1, t0 + 1_500)
        kept = ClaimedFailure(failure, owed_at, rec.attempt, rec.due_ms).to_json()
        assert backend.claims.complete(rec.idempotency_key, "w1", False, kept, t0 + 1_500)
        store.run_failed(rec, failure, owed_at)
    else:
        assert backend.claims.complete(rec.idempotency_key, "w1", False, None, t0 + 1_400)
        store.run_parked(rec, owed_at, "parked: the circuit breaker is open", t0 + 1_400)
    (owed,) = [r for r in store.due_runs(every(2), t0 + 60_000, t0 + 1_600) if r.run_id == sent.run_id]
    assert (owed.due_ms, owed.attempt) == (owed_at, 3)
    assert store.get_run("o", sent.run_at_ms).due_ms == owed_at
    if how == "retry":
        # Read short of the retry, the hand-back's row alone is the delivery
        # that failed, which its claim refuses.
        early = [r for r in store.due_runs(every(2), t0 + 30_000, t0 + 1_600) if r.run_id == sent.run_id]
        for run in early:
            assert backend.claims.claim(record(run, 2), "w2", t0 + 1_600, 30_000).outcome is ClaimOutcome.FAILED
