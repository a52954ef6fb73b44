"""A node's side of the circuit breakers and the retry budget: it asks the
store (the authority) and changes it by conditional writes, by the rules of
breakers.py.

The breaker rows are cached for at most ``CACHE_MS``, so that a run on a
healthy downstream costs no store read; every transition this node makes
updates its cache at once, so its own workers see a breaker it opened
without waiting. Calls and granted retries are counted here, per bucket,
and written (this node's own totals) at most once a ``CACHE_MS``, and
always before a retry is granted or refused.

The breaker is advice, not a correctness guard: a store error here is
logged and the run goes on as if the breaker were closed and the budget
unspent (the idempotency claim still holds the run to one effect).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from pysched.breakers import Admission, BreakerPolicy, admit, after_call, bucket_of, retry_allowed, window_start
from pysched.clock import Clock
from pysched.protocols import AttemptCount, BreakerRow, ScheduleStore

log = logging.getLogger("pysched.worker")

CACHE_MS = 1_000
# Conditional writes lost to another node in a row before giving up.
_SWAPS = 5


class DownstreamGuard:
    def __init__(self, store: ScheduleStore, clock: Clock, holder: str, policy: BreakerPolicy) -> None:
        self.store = store
        self.clock = clock
        self.holder = holder
        self.policy = policy
        self._lock = threading.Lock()
        # downstream -> (row, when it was read or written)
        self._rows: dict[str, tuple[BreakerRow, int]] = {}
        # (downstream, bucket) -> [calls, retries], this node's; and when
        # each downstream's counts were last written.
        self._counts: dict[tuple[str, int], list[int]] = {}
        self._written_ms: dict[str, int] = {}
        self._dirty: set[tuple[str, int]] = set()

    def admit(self, downstream: str) -> Admission:
        """Whether a run may call ``downstream`` now; a half-open breaker's
        probe is taken here, by a conditional write."""
        try:
            return self._change(downstream, lambda row, now: admit(row, now, self.policy))
        except Exception as exc:
            log.warning("circuit breaker of %s unreadable, letting the run through: %s", downstream, exc)
            return Admission(None)

    def called(self, downstream: str) -> None:
        """A run is about to call ``downstream``: one call more in the budget."""
        self._count(downstream)

    def ended(self, downstream: str, kind: str | None, succeeded: bool) -> None:
        """A call ended: the breaker learns of it."""
        try:
            self._change(
                downstream, lambda row, now: Admission(None, after_call(row, kind, succeeded, now, self.policy))
            )
        except Exception as exc:
            log.warning("could not update the circuit breaker of %s: %s", downstream, exc)

    def grant_retry(self, downstream: str) -> bool:
        """Whether the retry budget of ``downstream`` allows one retry more;
        if so, it is counted. One decision at a time in this node, so that
        its workers cannot together overdraw the budget."""
        with self._lock:
            now = self.clock.now_ms()
            start = window_start(now, self.policy)
            try:
                self._flush(downstream, now)
                others = [c for c in self.store.attempt_counts(downstream, start) if c.holder != self.holder]
            except Exception as exc:
                log.warning("retry budget of %s unreadable, granting the retry: %s", downstream, exc)
                return True
            own = [
                AttemptCount(downstream, self.holder, bucket, calls, retries)
                for (d, bucket), (calls, retries) in self._counts.items()
                if d == downstream and bucket >= start
            ]
            if not retry_allowed(others + own, self.policy):
                return False
            key = (downstream, bucket_of(now))
            self._counts.setdefault(key, [0, 0])[1] += 1
            self._dirty.add(key)
            try:
                self._flush(downstream, now)
            except Exception as exc:
                log.warning("could not record a retry of %s: %s", downstream, exc)
            return True

    def _change(self, downstream: str, decide: Callable[[BreakerRow, int], Admission]) -> Admission:
        """Decide on the breaker's row (cached, or read again when stale),
        and write what the decision asks, conditionally, deciding again on
        the row that won a lost write (a stale cache loses it too)."""
        now = self.clock.now_ms()
        with self._lock:
            cached = self._rows.get(downstream)
        fresh = cached is not None and now - cached[1] < CACHE_MS
        row = cached[0] if cached is not None and fresh else self._read(downstream, now)
        for _ in range(_SWAPS):
            decision = decide(row, now)
            if decision.write is None:
                return decision
            if self.store.swap_breaker(row.version, decision.write):
                self._remember(decision.write, now)
                return decision
            row = self._read(downstream, now)
        # Others keep moving it: a call's news is left out, and a run asking
        # for the probe is parked briefly.
        return Admission(now + CACHE_MS)

    def _read(self, downstream: str, now: int) -> BreakerRow:
        row = self.store.breaker(downstream)
        self._remember(row, now)
        return row

    def _remember(self, row: BreakerRow, now: int) -> None:
        with self._lock:
            self._rows[row.downstream] = (row, now)

    def _count(self, downstream: str) -> None:
        """One call more; written when the last write is CACHE_MS old."""
        now = self.clock.now_ms()
        with self._lock:
            key = (downstream, bucket_of(now))
            self._counts.setdefault(key, [0, 0])[0] += 1
            self._dirty.add(key)
            if now - self._written_ms.get(downstream, -CACHE_MS) < CACHE_MS:
                return
            try:
                self._flush(downstream, now)
            except Exception as exc:
                log.warning("could not record the calls to %s: %s", downstream, exc)

    def _flush(self, downstream: str, now: int) -> None:
        """Write this node's counts of ``downstream`` in the window (under
        the lock), and forget older ones."""
        start = window_start(now, self.policy)
        for key in [k for k in self._counts if k[1] < start]:
            del self._counts[key]
            self._dirty.discard(key)
        for key in sorted(k for k in self._dirty if k[0] == downstream):
            calls, retries = self._counts[key]
            self.store.record_attempts(AttemptCount(downstream, self.holder, key[1], calls, retries))
            self._dirty.discard(key)
        self._written_ms[downstream] = now
