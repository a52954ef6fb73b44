"""Contract tests of circuit breakers, parked runs and the retry budget's
counts: every engine alike."""

from __future__ import annotations

import tests.test_contract as contract
from pysched.breakers import BreakerPolicy, admit, after_call
from pysched.leader.recording import record_sent
from pysched.protocols import AttemptCount, BreakerRow, PlannedRun
from tests.test_contract import Backend, _fresh_t0, backend, every, once_job, record

__all__ = ["_fresh_t0", "backend"]  # the shared fixtures, used by name

POLICY = BreakerPolicy(failure_threshold=2, open_ms=5_000)


def test_a_breaker_never_written_is_closed(backend: Backend) -> None:
    assert backend.store.breaker("http:example.com") == BreakerRow("http:example.com")
    assert backend.store.breakers() == []


def test_a_breaker_changes_only_from_the_version_read(backend: Backend) -> None:
    store = backend.store
    t0 = contract.T0
    closed = store.breaker("http:a")
    once = after_call(closed, "5xx", False, t0, POLICY)
    assert once is not None
    assert store.swap_breaker(closed.version, once)
    # A second writer that read the same version loses.
    assert not store.swap_breaker(closed.version, once)
    opened = after_call(store.breaker("http:a"), "5xx", False, t0 + 1, POLICY)
    assert opened is not None and opened.state == "open"
    assert store.swap_breaker(1, opened)
    stored = store.breaker("http:a")
    assert (stored.version, stored.state, stored.failures, stored.reopens_at_ms) == (2, "open", 2, t0 + 5_001)
    assert [b.downstream for b in store.breakers()] == ["http:a"]


def test_a_half_open_breaker_lets_one_probe_through(backend: Backend) -> None:
    store = backend.store
    t0 = contract.T0
    opened = BreakerRow("python:jobs", 0, "open", 2, t0, t0 + 5_000)
    assert store.swap_breaker(0, opened)
    row = store.breaker("python:jobs")
    # Two workers see the half-open breaker at once: one wins the probe.
    first, second = admit(row, t0 + 5_000, POLICY), admit(row, t0 + 5_000, POLICY)
    assert first.write is not None and second.write is not None
    assert store.swap_breaker(row.version, first.write)
    assert not store.swap_breaker(row.version, second.write)
    again = admit(store.breaker("python:jobs"), t0 + 5_010, POLICY)
    assert not again.runs and again.write is None


def _dispatched(backend: Backend) -> tuple[int, int]:
    t0 = contract.T0
    store = backend.store
    store.add_job(once_job("o", t0 + 100), 0, 0, PlannedRun(t0 + 100, t0 + 100), t0)
    (sent,) = store.due_runs(every(1), t0 + 60_000, t0 + 150)
    record_sent(store, [sent], every(1), {}, t0 + 150)
    store.run_parked(record(sent, 1), t0 + 5_000, "parked: the circuit breaker of shell:true is open", t0 + 160)
    return sent.run_id, sent.run_at_ms


def test_a_parked_run_is_owed_again_when_parked_until_with_no_failure(backend: Backend) -> None:
    t0 = contract.T0
    store = backend.store
    run_id, run_at = _dispatched(backend)
    run = store.get_run("o", run_at)
    assert (run.state, run.failures, run.error) == ("parked", (), "parked: the circuit breaker of shell:true is open")
    assert [r.state for r in store.history("o")] == ["parked"]
    # Not before its time (but for the reader's own send, which a leader skips).
    assert [r.attempt for r in store.due_runs(every(1), t0 + 60_000, t0 + 1_000) if r.due_ms < t0 + 5_000] in (
        [],
        [1],
    )
    (again,) = [r for r in store.due_runs(every(1), t0 + 60_000, t0 + 5_000) if r.due_ms >= t0 + 5_000]
    assert (again.run_id, again.due_ms, again.attempt) == (run_id, t0 + 5_000, 2)
    record_sent(store, [again], every(1), {}, t0 + 5_000)
    # A park spends no attempt: its start is the first.
    assert store.run_started(record(again, 1), "w1", t0 + 5_010) == 1
    store.run_finished(record(again, 1)._replace(attempt=2), "succeeded", None, "ok", t0 + 5_020)
    done = store.get_run("o", run_at)
    assert (done.state, done.failures) == ("succeeded", ())
    assert store.dead_letters() == []


def test_a_run_of_a_job_cancelled_meanwhile_is_not_parked_but_cancelled(backend: Backend) -> None:
    t0 = contract.T0
    store = backend.store
    store.add_job(once_job("o", t0 + 100), 0, 0, PlannedRun(t0 + 100, t0 + 100), t0)
    (sent,) = store.due_runs(every(1), t0 + 60_000, t0 + 150)
    record_sent(store, [sent], every(1), {}, t0 + 150)
    store.cancel_job("o", t0 + 155)
    store.run_parked(record(sent, 1), t0 + 5_000, "parked", t0 + 160)
    assert store.get_run("o", sent.run_at_ms).state == "cancelled"
    assert [r for r in store.due_runs(every(1), t0 + 60_000, t0 + 5_000) if r.due_ms >= t0 + 5_000] == []


def test_attempt_counts_are_each_nodes_own_totals(backend: Backend) -> None:
    store = backend.store
    t0 = contract.T0
    store.record_attempts(AttemptCount("http:a", "n1", t0, 10, 1))
    store.record_attempts(AttemptCount("http:a", "n1", t0, 12, 1))  # the node's newer total
    store.record_attempts(AttemptCount("http:a", "n1", t0, 12, 1))  # repeated: harmless
    store.record_attempts(AttemptCount("http:a", "n2", t0 + 1_000, 5, 2))
    store.record_attempts(AttemptCount("http:b", "n1", t0, 99, 9))
    counts = sorted(store.attempt_counts("http:a", t0), key=lambda c: c.holder)
    assert [(c.holder, c.bucket_ms, c.calls, c.retries) for c in counts] == [
        ("n1", t0, 12, 1),
        ("n2", t0 + 1_000, 5, 2),
    ]
    assert [c.holder for c in store.attempt_counts("http:a", t0 + 1_000)] == ["n2"]
