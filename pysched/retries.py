"""Whether, and when, a failed attempt is tried again.

A retry is the next attempt of the same logical run (same schedule time and
idempotency key), scheduled through the store and fired by the leader's
wheel like any run: nothing waits in a worker.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pysched.model import RetryPolicy
from pysched.protocols import FailedAttempt

# Failures that would fail again, whatever a policy lists.
NEVER_RETRIED = frozenset({"4xx", "import", "invalid"})

# An attempt that ended with its worker's process: its node died (killed,
# out of memory, power), or the job itself ended it (os._exit, a crash in
# native code), which no except clause catches. Found when another
# execution takes the run over, and tried again at once while the run has
# retries left, whatever ``retry_on`` lists (it is no failure of the job's
# kinds); but a run that has ended its worker's process LOST_LIMIT times is
# not run again, or it would take every node down in turn.
LOST = "lost"
LOST_LIMIT = 2


def retryable(policy: RetryPolicy, kind: str | None, exception_names: Sequence[str]) -> bool:
    """Whether ``policy.retry_on`` covers a failure of ``kind``; an
    ``exception:Name`` entry covers an exception of that class or of a
    subclass of it (``exception_names``: the class and its bases)."""
    if kind is None or kind in NEVER_RETRIED:
        return False
    for entry in policy.retry_on:
        name, _, cls = entry.partition(":")
        if name == kind and (not cls or cls in exception_names):
            return True
    return False


def retries_so_far(failures: Sequence[FailedAttempt], attempt: int) -> int:
    """The retries a run has had: its failed attempts since it last became
    a dead letter (a redrive starts the count again), not counting
    ``attempt`` itself, which may be recorded already by an earlier try of
    the same write."""
    count = 0
    for failure in failures:
        if failure.attempt == attempt:
            continue
        count = 0 if failure.dead_lettered else count + 1
    return count


def lost_so_far(failures: Sequence[FailedAttempt], attempt: int) -> int:
    """The attempts that ended with their worker's process since the run
    last became a dead letter, ``attempt`` itself included."""
    count = 0
    for failure in failures:
        if failure.attempt == attempt:
            continue
        count = 0 if failure.dead_lettered else count + (failure.kind == LOST)
    return count + 1


def lost_not_retried(policy: RetryPolicy, failures: Sequence[FailedAttempt], attempt: int) -> str | None:
    """Why an attempt lost with its worker's process is not tried again
    (None: it is, at once)."""
    lost = lost_so_far(failures, attempt)
    if lost >= LOST_LIMIT:
        return (
            f"it ended its worker's process {lost} times: not run again (a job that exits or crashes its"
            " process runs safely in a child process of its own: give it a timeout)"
        )
    if retries_so_far(failures, attempt) >= policy.retries:
        return f"no retries left (retries {policy.retries})"
    return None


def backoff_ms(policy: RetryPolicy, retry: int, rng: random.Random) -> int:
    """Full jitter (``random(0, min(cap, base * 2**retry))``, ``retry`` from
    0): retries of one failing downstream spread out instead of arriving
    together."""
    ceiling_s = min(policy.backoff_cap_s, policy.backoff_base_s * 2.0 ** min(retry, 64))
    return rng.randint(0, round(ceiling_s * 1000))


def retry_delay_ms(
    policy: RetryPolicy,
    kind: str | None,
    exception_names: Sequence[str],
    failures: Sequence[FailedAttempt],
    attempt: int,
    rng: random.Random,
) -> int | None:
    """How long after it failed ``attempt`` is tried again, or None: it is
    not retryable, or its retries are spent, and it becomes a dead letter."""
    if kind == LOST:
        return None if lost_not_retried(policy, failures, attempt) else 0
    if not retryable(policy, kind, exception_names):
        return None
    done = retries_so_far(failures, attempt)
    if done >= policy.retries:
        return None
    return backoff_ms(policy, done, rng)
