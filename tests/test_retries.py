"""Retries and dead letters, end to end on the memory engine and a manual
clock: a failed attempt comes back through the store and a leader's send as
the next attempt of the same key, after its backoff; the last one is a dead
letter, which a redrive runs again."""

from __future__ import annotations

import random

import pytest

from pysched import native
from pysched.clock import ManualClock
from pysched.leader.recording import record_sent
from pysched.memory import open_memory
from pysched.model import Job, RetryPolicy
from pysched.protocols import FailedAttempt
from pysched.registry import register
from pysched.retries import backoff_ms, retries_so_far, retry_delay_ms, retryable
from pysched.targets import RunContext
from pysched.worker import DeliveryWorker, Executor, WorkerConfig

T0 = 1_700_000_040_000
CONFIG = WorkerConfig(lease_ms=30_000, retry_base_s=0.2, retry_max_s=10.0, busy_wait_ms=5_000)

# Each call of the target below: (attempt, idempotency key); it fails while
# _fail_first is above the calls made.
_calls: list[tuple[int, str]] = []
_fail_first: list[int] = [0]


class Flaky(Exception):
    pass


def flaky(ctx: RunContext) -> str:
    _calls.append((ctx.attempt, ctx.idempotency_key))
    if len(_calls) <= _fail_first[0]:
        raise Flaky(f"call {len(_calls)}")
    return "ok"


@pytest.fixture(autouse=True)
def _reset() -> None:
    _calls.clear()
    _fail_first[0] = 0


class Node:
    """A leader's sends and one worker, stepped by hand."""

    def __init__(self, retry: RetryPolicy) -> None:
        self.clock = ManualClock(T0)
        self.cluster = open_memory(4, self.clock, dispatcher_partitions=1)
        self.node = self.cluster.node()
        self.executor = Executor(self.node.claims, self.node.store, self.clock, "node-1", CONFIG, rng=random.Random(7))
        self.worker = DeliveryWorker(self.node.dispatcher.consumer(), self.executor, random.Random(5))
        job = Job.model_validate(
            {
                "id": "flaky",
                "schedule": {"kind": "once", "run_at_ms": T0 + 1_000},
                "target": {"kind": "python", "ref": f"{__name__}:flaky"},
                "retry": retry.model_dump(),
            }
        )
        register(self.node.store, job, T0)
        self.fences = self.node.coordinator.poll("leader", T0)

    def send_due(self) -> int:
        """One leader send of what is due now; how many runs."""
        now = self.clock.now_ms()
        rows = [r for r in self.node.store.due_runs(self.fences, now + 60_000, now) if r.due_ms <= now]
        rows = [r for r in rows if self._not_sent(r.run_id, r.attempt)]
        if rows:
            payloads = [native.encode_batch([r], self.fences[r.partition], now)[0] for r in rows]
            self.node.dispatcher.publish([r.partition for r in rows], payloads)
            record_sent(self.node.store, rows, self.fences, {}, now)
        return len(rows)

    _sent: set[tuple[int, int]]

    def _not_sent(self, run_id: int, attempt: int) -> bool:
        sent = self.__dict__.setdefault("_sent", set())
        if (run_id, attempt) in sent:
            return False
        sent.add((run_id, attempt))
        return True

    def run_until(self, end_ms: int) -> None:
        """Step leader and worker every 100 ms of the clock up to end_ms."""
        while self.clock.now_ms() < end_ms:
            self.send_due()
            while self.worker.step(self.clock.now_ms()):
                pass
            self.clock.advance(100)

    def run(self) -> tuple[str, int, tuple[FailedAttempt, ...]]:
        (record,) = self.node.store.history("flaky")[:1]
        full = self.node.store.get_run("flaky", record.run_at_ms)
        return full.state, full.attempt, full.failures


def test_a_failed_run_is_retried_after_its_backoff_as_the_next_attempt_of_the_same_key() -> None:
    _fail_first[0] = 2
    node = Node(RetryPolicy(retries=3, backoff_base_s=2, backoff_cap_s=4))
    node.run_until(T0 + 1_100)
    assert [a for a, _ in _calls] == [1]
    state, _, failures = node.run()
    assert state == "retrying"
    (first,) = failures
    retry_due = node.node.store.get_run("flaky", T0 + 1_000).due_ms
    # Full jitter: random(0, min(cap, base * 2**0)) after the failure.
    assert first.ended_at_ms <= retry_due <= first.ended_at_ms + 2_000
    node.run_until(T0 + 30_000)
    state, attempt, failures = node.run()
    assert (state, attempt) == ("succeeded", 3)
    assert [a for a, _ in _calls] == [1, 2, 3]
    assert len({key for _, key in _calls}) == 1, "one idempotency key for every attempt"
    assert [(f.attempt, f.kind, f.error) for f in failures] == [
        (1, "exception", "Flaky: call 1"),
        (2, "exception", "Flaky: call 2"),
    ]
    assert node.node.store.dead_letters() == []
    assert node.executor.counts["retried"] == 2


def test_the_last_failure_is_a_dead_letter_and_a_redrive_runs_it_again() -> None:
    _fail_first[0] = 3
    node = Node(RetryPolicy(retries=2, backoff_base_s=1, backoff_cap_s=1))
    node.run_until(T0 + 20_000)
    state, attempt, failures = node.run()
    assert (state, attempt, len(_calls)) == ("failed", 3, 3)
    assert [f.dead_lettered for f in failures] == [False, False, True]
    (dead,) = node.node.store.dead_letters()
    assert dead.idempotency_key == _calls[0][1]
    node.run_until(T0 + 40_000)
    assert len(_calls) == 3, "a dead letter is not retried"
    assert node.node.store.redrive("flaky", T0 + 1_000, 0, node.clock.now_ms())
    node.run_until(T0 + 45_000)
    state, attempt, _ = node.run()
    assert (state, attempt, len(_calls)) == ("succeeded", 4, 4)
    assert node.node.store.dead_letters() == []


def test_a_failure_not_in_retry_on_is_a_dead_letter_at_once() -> None:
    _fail_first[0] = 1
    node = Node(RetryPolicy(retries=3, retry_on=("timeout", "exception:KeyError")))
    node.run_until(T0 + 30_000)
    state, _, failures = node.run()
    assert (state, len(_calls), [f.dead_lettered for f in failures]) == ("failed", 1, [True])


def test_what_is_retried() -> None:
    policy = RetryPolicy()
    assert retryable(policy, "exception", ("ValueError", "Exception", "BaseException"))
    assert retryable(policy, "5xx", ()) and retryable(policy, "timeout", ()) and retryable(policy, "connect", ())
    for never in ("4xx", "import", "invalid", None):
        assert not retryable(policy, never, ())
    named = RetryPolicy(retry_on=("exception:LookupError",))
    assert retryable(named, "exception", ("KeyError", "LookupError", "Exception"))
    assert not retryable(named, "exception", ("ValueError", "Exception"))
    assert not retryable(named, "timeout", ())
    assert retry_delay_ms(RetryPolicy(retries=0), "exception", (), (), 1, random.Random(1)) is None


def test_retries_count_from_the_last_dead_letter_and_not_the_attempt_being_recorded() -> None:
    def failed(attempt: int, dead: bool = False) -> FailedAttempt:
        return FailedAttempt(attempt, "w", 0, 1, "e", "exception", dead)

    assert retries_so_far([], 1) == 0
    assert retries_so_far([failed(1), failed(2)], 3) == 2
    assert retries_so_far([failed(1), failed(2)], 2) == 1
    assert retries_so_far([failed(1), failed(2), failed(3, dead=True), failed(4)], 5) == 1


def test_the_backoff_is_full_jitter_capped() -> None:
    policy = RetryPolicy(backoff_base_s=1, backoff_cap_s=5)
    rng = random.Random(3)
    for retry, ceiling in ((0, 1_000), (1, 2_000), (2, 4_000), (3, 5_000), (40, 5_000), (10_000, 5_000)):
        draws = [backoff_ms(policy, retry, rng) for _ in range(200)]
        assert min(draws) >= 0 and max(draws) <= ceiling
        assert max(draws) > ceiling * 0.8, "spread over the whole window"


@pytest.mark.parametrize(
    ("retry", "message"),
    [
        ({"retries": -1}, "retries"),
        ({"backoff_base_s": 10, "backoff_cap_s": 5}, "below the base"),
        ({"retry_on": ["exceptions"]}, "not one of"),
        ({"retry_on": ["exception:"]}, "not one of"),
    ],
)
def test_a_bad_policy_is_refused(retry: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryPolicy.model_validate(retry)
