"""The pure rules of circuit breakers and the retry budget, and a node's
guard over them on the memory engine with a manual clock."""

from __future__ import annotations

from pysched.breakers import (
    HALF_OPEN_RECHECK_MS,
    BreakerPolicy,
    admit,
    after_call,
    breaker_state,
    retry_allowed,
    window_start,
)
from pysched.clock import ManualClock
from pysched.memory import open_memory
from pysched.protocols import AttemptCount, BreakerRow
from pysched.worker.downstreams import DownstreamGuard

T0 = 1_700_000_000_000
POLICY = BreakerPolicy(failure_threshold=3, open_ms=10_000, budget_ratio=0.1, budget_floor=3)


def _fail(row: BreakerRow, kind: str, at: int) -> BreakerRow:
    nxt = after_call(row, kind, False, at, POLICY)
    return row if nxt is None else nxt


def test_the_defaults() -> None:
    policy = BreakerPolicy()
    # Finagle's default budget: 20% of requests plus 10 retries a second.
    assert (policy.failure_threshold, policy.open_ms, policy.budget_ratio, policy.budget_floor) == (5, 30_000, 0.2, 600)
    assert policy.budget_window_ms == 60_000


def test_consecutive_retryable_failures_open_it_and_a_success_resets_the_count() -> None:
    row = BreakerRow("http:a")
    row = _fail(_fail(row, "5xx", T0), "timeout", T0)
    assert (row.state, row.failures) == ("closed", 2)
    reset = after_call(row, None, True, T0, POLICY)
    assert reset is not None and reset.failures == 0
    for kind in ("connect", "exception", "5xx"):
        row = _fail(row, kind, T0 + 1)
    assert (breaker_state(row, T0 + 1), row.opened_at_ms, row.reopens_at_ms) == ("open", T0 + 1, T0 + 10_001)


def test_what_is_not_the_downstreams_fault_does_not_count() -> None:
    row = _fail(BreakerRow("http:a"), "5xx", T0)
    for kind in ("import", "invalid"):
        assert after_call(row, kind, False, T0, POLICY) is None
    # A 4xx: the downstream answered.
    answered = after_call(row, "4xx", False, T0, POLICY)
    assert answered is not None and answered.failures == 0


def test_open_parks_until_it_reopens_then_one_probe() -> None:
    row = BreakerRow("http:a", 3, "open", 3, T0, T0 + 10_000)
    assert admit(row, T0 + 5_000, POLICY).park_until_ms == T0 + 10_000
    assert breaker_state(row, T0 + 10_000) == "half-open"
    probe = admit(row, T0 + 10_000, POLICY)
    assert probe.runs and probe.write is not None and probe.write.probe_until_ms == T0 + 20_000
    # Others while the probe is out: parked briefly, to resume soon after it closes.
    other = admit(probe.write, T0 + 10_500, POLICY)
    assert other.park_until_ms == T0 + 10_500 + HALF_OPEN_RECHECK_MS
    # A probe that never reported: another run probes.
    assert admit(probe.write, T0 + 20_000, POLICY).write is not None


def test_the_probe_closes_or_reopens_it_and_a_straggler_changes_nothing() -> None:
    half_open = BreakerRow("http:a", 4, "open", 3, T0, T0 + 10_000, T0 + 20_000)
    closed = after_call(half_open, None, True, T0 + 10_100, POLICY)
    assert closed is not None and (closed.state, closed.failures, closed.version) == ("closed", 0, 5)
    reopened = after_call(half_open, "5xx", False, T0 + 10_100, POLICY)
    assert reopened is not None
    assert (reopened.state, reopened.opened_at_ms, reopened.reopens_at_ms) == ("open", T0 + 10_100, T0 + 20_100)
    # A call that began before it opened, ending while open.
    assert after_call(half_open, "5xx", False, T0 + 5_000, POLICY) is None
    assert after_call(half_open, None, True, T0 + 5_000, POLICY) is None


def _counts(calls: int, retries: int) -> list[AttemptCount]:
    return [AttemptCount("http:a", "n1", T0, calls, retries)]


def test_the_budget_is_a_share_of_first_attempts_plus_a_floor() -> None:
    policy = BreakerPolicy(budget_ratio=0.1, budget_floor=3)
    assert retry_allowed(_counts(0, 2), policy)
    assert not retry_allowed(_counts(3, 3), policy)  # the floor
    assert retry_allowed(_counts(100 + 12, 12), policy)  # 12 < 3 + 10% of 100 first attempts
    assert not retry_allowed(_counts(100 + 13, 13), policy)
    # The default lets a quiet downstream's stated retries through.
    assert retry_allowed(_counts(6 + 599, 599), BreakerPolicy())
    assert not retry_allowed(_counts(1000 + 800, 800), BreakerPolicy())  # 600 + 20% of 1000
    assert window_start(T0 + 59_999, policy) == T0
    assert window_start(T0 + 60_000, policy) == T0 + 1_000


class _Store:
    def __init__(self) -> None:
        self.clock = ManualClock(T0)
        self.store = open_memory(2, self.clock).node().store

    def guard(self, holder: str) -> DownstreamGuard:
        return DownstreamGuard(self.store, self.clock, holder, POLICY)


def test_a_node_sees_the_breaker_it_opened_at_once_and_another_within_the_cache() -> None:
    world = _Store()
    one, two = world.guard("n1"), world.guard("n2")
    assert two.admit("http:a").runs  # cached closed from here
    for _ in range(3):
        assert one.admit("http:a").runs
        one.ended("http:a", "5xx", False)
    assert one.admit("http:a").park_until_ms == T0 + 10_000
    assert world.store.breaker("http:a").state == "open"
    world.clock.advance(1_000)
    assert two.admit("http:a").park_until_ms == T0 + 10_000
    # Half-open: one probe across both nodes.
    world.clock.advance(T0 + 10_000 - world.clock.now_ms())
    assert one.admit("http:a").runs
    assert not two.admit("http:a").runs
    one.ended("http:a", None, True)
    world.clock.advance(1_000)
    assert two.admit("http:a").runs
    assert world.store.breaker("http:a").state == "closed"


def test_the_budget_holds_across_nodes() -> None:
    world = _Store()
    one, two = world.guard("n1"), world.guard("n2")
    for _ in range(40):
        one.called("http:a")
    for _ in range(20):
        two.called("http:a")
    # 60 calls: retries r while r < 3 + 10% of (60 - r), 8, whichever node
    # asks (a retry granted and not yet made is no first attempt).
    granted = [g.grant_retry("http:a") for g in (one, two) * 5]
    assert granted.count(True) == 8
    world.clock.advance(60_000)
    assert [one.grant_retry("http:a") for _ in range(4)] == [True, True, True, False]  # the floor
