"""Seeded fault injection for the in-memory backends.

Every operation of a memory backend runs between two checks, ``before`` (a
failure there means the call took no effect) and ``after`` (it took effect,
but the caller sees a failure: the ambiguous outcome of a timed-out write).
An operation the server it models does as several requests has ``midway``
checks between them: a failure there leaves the first writes and not the
rest, as a client that died or timed out half-way through would.
What fails is decided here only, from a seeded ``random.Random`` or an
explicit script, so a simulator's seed replays the same faults.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, Protocol

Phase = Literal["before", "midway", "after"]


class SimulatedFault(ConnectionError, TimeoutError):
    """An injected failure. Both a ConnectionError and a TimeoutError: the
    code under test must treat it as it treats a server that is unreachable
    or slow to answer."""


@dataclass(frozen=True, slots=True)
class FaultPoint:
    role: str  # store | claims | dispatcher | coordinator
    op: str  # the method's name
    phase: Phase


@dataclass(frozen=True, slots=True)
class ScriptedFault:
    """Fail the ``occurrence``-th check of this point, phase included
    (counted from 1): a call that failed before never reaches its after."""

    point: FaultPoint
    occurrence: int = 1


class FaultHook(Protocol):
    def check(self, role: str, op: str, phase: Phase) -> None:
        """Raise SimulatedFault if this call is to fail at this phase."""
        ...


class NoFaults:
    def check(self, role: str, op: str, phase: Phase) -> None:
        pass


class FaultInjector:
    """Fails calls by script, then by chance.

    ``rates`` maps (role, op) to the probability that each of a call's two
    checks fails; op ``"*"`` stands for every op of the role. Every check
    draws from ``rng`` in the order calls arrive, so under one thread a seed
    replays exactly.
    """

    def __init__(
        self,
        rng: random.Random | None = None,
        rates: Mapping[tuple[str, str], float] | None = None,
        script: Iterable[ScriptedFault] = (),
    ) -> None:
        if rates and rng is None:
            raise ValueError("fault rates need a seeded random.Random")
        self._rng = rng
        self._rates = dict(rates or {})
        self._script = {(s.point, s.occurrence) for s in script}
        self._seen: Counter[FaultPoint] = Counter()
        self._lock = threading.Lock()
        self.injected: list[FaultPoint] = []

    def check(self, role: str, op: str, phase: Phase) -> None:
        point = FaultPoint(role, op, phase)
        with self._lock:
            self._seen[point] += 1
            fail = (point, self._seen[point]) in self._script
            rate = self._rates.get((role, op), self._rates.get((role, "*"), 0.0))
            if not fail and rate > 0 and self._rng is not None:
                fail = self._rng.random() < rate
            if fail:
                self.injected.append(point)
        if fail:
            raise SimulatedFault(f"injected fault: {role}.{op} ({phase})")


class Guard:
    """One backend's lock and fault hook: each operation runs under the lock,
    between its two fault checks."""

    def __init__(self, role: str, faults: FaultHook | None, lock: threading.RLock) -> None:
        self.role = role
        self.faults: FaultHook = faults if faults is not None else NoFaults()
        self.lock = lock

    def __call__(self, op: str) -> _Operation:
        return _Operation(self, op)

    def midway(self, op: str) -> None:
        """Between two requests of ``op`` (called under the lock): a failure
        here ends the call with what it wrote so far standing."""
        self.faults.check(self.role, op, "midway")


class _Operation:
    """One operation under its Guard: a plain context manager rather than a
    generator one, as every call of every backend goes through it."""

    __slots__ = ("_guard", "_op")

    def __init__(self, guard: Guard, op: str) -> None:
        self._guard = guard
        self._op = op

    def __enter__(self) -> None:
        guard = self._guard
        guard.lock.acquire()
        try:
            guard.faults.check(guard.role, self._op, "before")
        except BaseException:
            guard.lock.release()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        guard = self._guard
        try:
            if exc_type is None:
                # Reached only when the operation returned: its effect stands.
                guard.faults.check(guard.role, self._op, "after")
        finally:
            guard.lock.release()
