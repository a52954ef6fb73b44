"""Circuit breakers and the retry budget, per downstream: the pure rules.

A downstream (downstream.downstream_of: an HTTP host, a job's own
``downstream``, or the job itself) that keeps failing is left alone for a while
instead of being called by every run due, and retries of its failures are
held to a share of its traffic, so that a failing downstream's retries
cannot multiply its load. The store keeps the state (one breaker row per
downstream, per-node counts of calls and retries); these functions decide
what it becomes, and the worker writes it conditionally.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import NamedTuple

from pysched.protocols import AttemptCount, BreakerRow

# Failures that say the downstream is unwell: they count towards opening
# its breaker. A 4xx says it answered (the request was wrong), so it counts
# as a call that went through; a target that cannot be imported or a job
# that no longer validates never reached it, and counts as neither.
BREAKER_KINDS = frozenset({"timeout", "connect", "5xx", "exception"})
ANSWERED_KINDS = frozenset({"4xx"})

# A run that meets a half-open breaker whose probe is out is parked this
# long, at most: when the probe closes the breaker, the runs parked behind
# it resume within it.
HALF_OPEN_RECHECK_MS = 1_000

# The retry budget counts in buckets of this length; its window is the
# BUDGET_WINDOW_MS of buckets ending with the current one.
BUCKET_MS = 1_000


@dataclass(frozen=True)
class BreakerPolicy:
    """The defaults of resilience4j and Hystrix-style breakers, scaled to a
    scheduler: open after 5 failures in a row, for 30 s, then let one probe
    through. Retries over a sliding minute: 20% of first attempts plus 600
    (Finagle's default budget: 20% of requests plus 10 retries a second),
    so that at low traffic every retry a job states goes through, and only
    a storm of retries against a busy downstream is held back."""

    failure_threshold: int = 5
    open_ms: int = 30_000
    budget_ratio: float = 0.2
    budget_floor: int = 600
    budget_window_ms: int = 60_000


def breaker_state(row: BreakerRow, now_ms: int) -> str:
    """closed, open, or half-open (open past its reopening time)."""
    if row.state != "open":
        return "closed"
    if row.reopens_at_ms is not None and now_ms >= row.reopens_at_ms:
        return "half-open"
    return "open"


class Admission(NamedTuple):
    """Whether a run may call its downstream now. ``park_until_ms``: not
    now, it is parked until then. ``write``: the breaker row to write
    (conditionally) for the admission to hold: the probe's claim."""

    park_until_ms: int | None
    write: BreakerRow | None = None

    @property
    def runs(self) -> bool:
        return self.park_until_ms is None


def admit(row: BreakerRow, now_ms: int, policy: BreakerPolicy) -> Admission:
    """Closed: the run goes. Open: parked until the breaker reopens.
    Half-open: the first run takes the probe (holding it for ``open_ms``:
    a probe that never reports is taken for lost); the others are parked
    until the probe's hold ends, and at most HALF_OPEN_RECHECK_MS."""
    state = breaker_state(row, now_ms)
    if state == "closed":
        return Admission(None)
    if state == "open":
        assert row.reopens_at_ms is not None
        return Admission(row.reopens_at_ms)
    if row.probe_until_ms is not None and now_ms < row.probe_until_ms:
        return Admission(min(row.probe_until_ms, now_ms + HALF_OPEN_RECHECK_MS))
    return Admission(None, replace(row, version=row.version + 1, probe_until_ms=now_ms + policy.open_ms))


def after_call(
    row: BreakerRow, kind: str | None, succeeded: bool, now_ms: int, policy: BreakerPolicy
) -> BreakerRow | None:
    """The breaker after a call ended (``kind``: the failure's, None on
    success), or None when it stays as it is.

    - A success (or a 4xx) closes a half-open breaker (the probe came
      back well) and ends a closed one's run of failures. While the breaker
      is open, a call that started before it opened changes nothing.
    - A failure of BREAKER_KINDS adds to a closed breaker's run of
      failures and opens it at ``failure_threshold``; on a half-open one
      (the probe's) it opens it again for ``open_ms``.
    """
    state = breaker_state(row, now_ms)
    bumped = row.version + 1
    if succeeded or kind in ANSWERED_KINDS:
        if state == "half-open":
            return BreakerRow(row.downstream, bumped)
        if state == "closed" and row.failures:
            return replace(row, version=bumped, failures=0)
        return None
    if kind not in BREAKER_KINDS:
        return None
    if state == "open":
        return None
    failures = row.failures + 1
    if state == "half-open" or failures >= policy.failure_threshold:
        return BreakerRow(row.downstream, bumped, "open", failures, now_ms, now_ms + policy.open_ms, None)
    return replace(row, version=bumped, failures=failures)


def bucket_of(now_ms: int) -> int:
    return now_ms - now_ms % BUCKET_MS


def window_start(now_ms: int, policy: BreakerPolicy) -> int:
    """The first bucket of the sliding window that ends with ``now_ms``'s."""
    return bucket_of(now_ms) - policy.budget_window_ms + BUCKET_MS


def retries_allowed(first_attempts: int, policy: BreakerPolicy) -> int:
    """The retries the budget allows over its window, given the first
    attempts (calls that were not retries) made in it:
    ``budget_floor + floor(budget_ratio * first_attempts)``."""
    return policy.budget_floor + math.floor(policy.budget_ratio * first_attempts)


def retry_allowed(counts: Iterable[AttemptCount], policy: BreakerPolicy) -> bool:
    """The retry budget. Over the window, with ``calls`` the calls made to
    the downstream (every attempt that reached it) and ``retries`` the
    retries granted for it, a retry more is granted while ``retries`` is
    below ``retries_allowed(calls - retries)``. Counted across nodes
    through the store; two nodes deciding at the same moment may each grant
    the last one. A retry refused is not dropped: it waits a window."""
    calls = retries = 0
    for count in counts:
        calls += count.calls
        retries += count.retries
    return retries < retries_allowed(max(0, calls - retries), policy)
