"""What the simulated jobs did: each execution, written by the job itself.

The jobs are Python targets (``pysched.sim.ledger:record``) that find their
world's ledger by the id in their payload: one process may hold several
worlds (the tests run many seeds)."""

from __future__ import annotations

import hashlib
import random
import threading
from collections import Counter
from dataclasses import dataclass
from typing import cast

from pysched.clock import Clock
from pysched.python_child import KILL_AFTER_S
from pysched.sim.fibers import Fiber, current_fiber
from pysched.targets import RunContext

TARGET = "pysched.sim.ledger:record"
# A call stopped by its worker (its ctx.cancelled set) is killed this long
# after, as a Python target with a --timeout is: SIGTERM, then SIGKILL.
KILL_AFTER_MS = int(KILL_AFTER_S * 1000)


@dataclass(frozen=True, slots=True)
class Execution:
    key: str  # the run's idempotency key
    at_ms: int  # true (world) time the job started


@dataclass(eq=False, slots=True)
class CallInFlight:
    """A call that takes time (a world with --target-time): made at
    ``start_ms``, its effect lands at ``end_ms``; ``owner``: the node
    process whose target made it, on ``fiber``; ``stopped``: its run's
    ``ctx.cancelled``, and ``killed_at_ms`` when its process is killed
    for it (``Ledger.land``)."""

    key: str
    attempt: int
    start_ms: int
    end_ms: int
    fails: bool
    fiber: Fiber
    stopped: threading.Event
    killed_at_ms: int | None = None

    @property
    def owner(self) -> object:
        return self.fiber.owner

    @property
    def killed(self) -> bool:
        """Whether its process is killed before its effect lands."""
        return self.killed_at_ms is not None and self.killed_at_ms < self.end_ms


class Ledger:
    """Every execution, folded as it arrives: a day of a hundred thousand
    jobs is millions of executions, so the ledger keeps each run's first
    start and the repeats, not the list, and hashes the sequence as it goes
    (the same digest as hashing the whole list at the end)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock  # the world's true clock, not a node's
        self.first_start: dict[str, int] = {}  # run key -> its first start
        self.repeats: Counter[str] = Counter()  # run key -> executions past the first
        self.executed = 0
        self._digest = hashlib.sha256()
        # Failed attempts of each run so far (a flaky job's, or any call
        # while the downstream is down), and the first one's start.
        self.failed: Counter[str] = Counter()
        self.first_try: dict[str, int] = {}
        # [down, up) in world time: the downstream fails every call; and
        # when each call made while it was down came.
        self.down_ms: tuple[int, int] | None = None
        self.calls_while_down: list[int] = []
        # The calls of each run that failed once, in order: (attempt, world
        # time it started), so that a retry is seen to wait for its time.
        self.tries: dict[str, list[tuple[int, int]]] = {}
        # Calls that take time and have not ended, in the order made; and
        # those that ended whose node has not heard yet.
        self.in_flight: list[CallInFlight] = []
        self.unheard: list[CallInFlight] = []
        # Executions by calls whose node died before they returned, or
        # before it recorded how they ended: their runs are rightly run
        # again (delivery is at least once; the idempotency key is what
        # makes the effect once at a downstream).
        self.orphaned: Counter[str] = Counter()
        # Runs whose call was still under way when the world ended.
        self.under_way_at_end: set[str] = set()
        # The jobs none of whose runs may be under way beside another (an
        # overlap policy but allow), and each of their calls that took
        # time: (start, end or its node's death, run key), by job.
        self.exclusive: frozenset[str] = frozenset()
        # Every call counted, and the first call of each run of the jobs
        # ``numbered`` numbered by that count: a change is ordered against
        # them by the count when it came (changes.py).
        self.calls = 0
        self.numbered: frozenset[str] = frozenset()
        self.first_call: dict[str, int] = {}
        self.spans: dict[str, list[tuple[int, int, str]]] = {}
        # Runs a call of which was killed after its worker stopped it, and
        # that call's start: one whose job's change stopped it is recorded
        # cancelled with no effect (invariants.stopped_by_change).
        self.killed: dict[str, int] = {}

    def _span(self, call: CallInFlight, end_ms: int) -> None:
        job_id = call.key.rsplit(":", 2)[0]
        if job_id in self.exclusive:
            self.spans.setdefault(job_id, []).append((call.start_ms, end_ms, call.key))

    def tried(self, key: str, attempt: int, now_ms: int, fails: bool) -> None:
        """A call of the run of ``key`` starts: kept once one of its calls
        fails (a day's runs are millions; a retried run's are few)."""
        self.calls += 1
        if self.numbered and key.rsplit(":", 2)[0] in self.numbered:
            self.first_call.setdefault(key, self.calls)
        if fails or key in self.tries:
            self.tries.setdefault(key, []).append((attempt, now_ms))

    def land(self, now_ms: int) -> None:
        """The effects of the calls in flight that end by ``now_ms``, in the
        order they end (then made); and the calls killed by ``now_ms``,
        which never land."""
        self._kill_stopped(now_ms)
        killed = [c for c in self.in_flight if c.killed and cast(int, c.killed_at_ms) <= now_ms]
        due = sorted((c for c in self.in_flight if c.end_ms <= now_ms and not c.killed), key=lambda c: c.end_ms)
        if not due and not killed:
            return
        ended = {id(c) for c in (*due, *killed)}
        self.in_flight = [c for c in self.in_flight if id(c) not in ended]
        for call in killed:
            self._kill(call)
            call.fiber.wake_at_ms = call.killed_at_ms  # its worker hears of the kill now
        for call in due:
            self._land(call)
            self._span(call, call.end_ms)
        self.unheard += due

    def _kill(self, call: CallInFlight) -> None:
        """``call``'s process is killed before it ended: an attempt that
        failed with no effect, as the worker that stopped it records it
        (taken over, the taker records it lost; stopped by its job's
        change, it is recorded cancelled). Kept among the run's tries, so
        that its next attempt is held to the retry it was given."""
        self._span(call, cast(int, call.killed_at_ms))
        self.killed.setdefault(call.key, call.start_ms)
        tries = self.tries.setdefault(call.key, [])
        if (call.attempt, call.start_ms) not in tries:
            tries.append((call.attempt, call.start_ms))
        self.fail(call.key, call.start_ms)

    def _kill_stopped(self, now_ms: int) -> None:
        """The calls whose run was stopped since the last look (its lease
        lost, its job cancelled, a newer run replacing it) are killed
        ``KILL_AFTER_MS`` on, as the real executor kills a Python target's
        child process: the world's target ignores ``ctx.cancelled``, so one
        that has not ended by its kill never lands. A target in a thread
        could not be killed, and would land beside the run's next
        execution once its lease was lost (README: a Python target checks
        ``ctx.cancelled``, or is given a --timeout); the world judges the
        scheduler, not a target that ignores its stop. Seen a round late at
        most: the stop is made within a node's round, after the landing."""
        for call in self.in_flight:
            if call.killed_at_ms is None and call.stopped.is_set():
                call.killed_at_ms = now_ms + KILL_AFTER_MS

    def heard(self, call: CallInFlight) -> None:
        """The node that made ``call`` has its answer (its fiber goes on)."""
        self.unheard.remove(call)

    def _land(self, call: CallInFlight) -> None:
        if call.fails:
            self.fail(call.key, call.start_ms)
        else:
            self.add(Execution(call.key, call.start_ms))

    def abandon(self, owner: object, rng: random.Random) -> None:
        """``owner``'s process died with these calls in flight: no answer
        ever comes back. A call that succeeds may have taken effect before
        the death (drawn, each way as likely); a failing one counts no
        failure, since nobody recorded it (the run's next attempt finds it
        lost)."""
        gone = [c for c in self.in_flight if c.owner is owner]
        self.in_flight = [c for c in self.in_flight if c.owner is not owner]
        for call in gone:
            self._span(call, self.clock.now_ms())
            if not call.fails and rng.random() < 0.5:
                self._land(call)
                self.orphaned[call.key] += 1
        # Ended, but the node died before it heard (its call's fiber had not
        # gone on since): the effect is there, and nobody recorded it.
        for call in [c for c in self.unheard if c.owner is owner]:
            self.unheard.remove(call)
            if not call.fails:
                self.orphaned[call.key] += 1

    def orphan(self, key: str) -> None:
        """An execution of the run of ``key`` whose node died before its end
        was recorded (its write refused, then the death): the effect is
        there, and nothing durable says so."""
        self.orphaned[key] += 1

    def finish(self) -> None:
        """The world ends: a call still under way counts as the execution it
        will be (its run started, and is not lost), unless it is to be
        killed before it ends; one failing, or to be killed, counts no
        failure yet, as none is recorded yet."""
        self._kill_stopped(self.clock.now_ms())
        for call in self.in_flight:
            if call.killed:
                self._span(call, cast(int, call.killed_at_ms))
                continue
            self._span(call, call.end_ms)
            self.under_way_at_end.add(call.key)
            if not call.fails:
                self._land(call)
        self.in_flight = []

    def is_down(self, now_ms: int) -> bool:
        return self.down_ms is not None and self.down_ms[0] <= now_ms < self.down_ms[1]

    def fail(self, key: str, now_ms: int) -> int:
        """An attempt of the run of ``key`` fails, with no effect: how many
        of its attempts have failed now."""
        self.first_try.setdefault(key, now_ms)
        self.failed[key] += 1
        return self.failed[key]

    def add(self, execution: Execution) -> None:
        line = f"{execution.key} {execution.at_ms}"
        self._digest.update((line if self.executed == 0 else "\n" + line).encode())
        self.executed += 1
        if execution.key in self.first_start:
            self.repeats[execution.key] += 1
        else:
            self.first_start[execution.key] = execution.at_ms

    def count(self, key: str) -> int:
        """How many times the run of ``key`` executed."""
        return 0 if key not in self.first_start else 1 + self.repeats.get(key, 0)

    def counted(self, key: str) -> int:
        """How many times the run of ``key`` executed, but for the calls
        orphaned by their node's death before a later one: those may repeat."""
        n = self.count(key)
        return max(min(n, 1), n - self.orphaned.get(key, 0))

    def digest(self) -> str:
        """Of every execution and its time, in order: the same seed gives the
        same digest."""
        return self._digest.hexdigest()[:16]


_LEDGERS: dict[str, Ledger] = {}
_LOCK = threading.Lock()


def open_ledger(world_id: str, clock: Clock, down_ms: tuple[int, int] | None = None) -> Ledger:
    """``down_ms``: when the world's downstream fails every call."""
    with _LOCK:
        _LEDGERS[world_id] = ledger = Ledger(clock)
    ledger.down_ms = down_ms
    return ledger


def close_ledger(world_id: str) -> None:
    with _LOCK:
        _LEDGERS.pop(world_id, None)


class SimulatedFailure(Exception):
    """A flaky job's attempt, or a call while the downstream is down,
    failing with no effect."""


def record(ctx: RunContext) -> None:
    """The downstream: while it is down every call fails; a flaky job's run
    fails its first ``fail_first`` attempts, whatever made them fail. A job
    whose payload gives ``duration_ms`` (a world with --target-time) takes
    that long, in world time: its effect, or its failure, lands when it
    ends (``Ledger.land``), at the time it started, and then it returns."""
    ledger = _LEDGERS[str(ctx.payload["world"])]
    key = ctx.idempotency_key
    now_ms = ledger.clock.now_ms()
    down = ledger.is_down(now_ms)
    if down:
        ledger.calls_while_down.append(now_ms)
    fail_first = int(ctx.payload.get("fail_first", 0))
    if fail_first:
        ledger.first_try.setdefault(key, now_ms)
    fails = down or ledger.failed[key] < fail_first
    ledger.tried(key, ctx.attempt, now_ms, fails)
    duration_ms = ctx.payload.get("duration_ms")
    fiber = current_fiber()
    if duration_ms is not None and fiber is not None:
        end_ms = now_ms + int(duration_ms)
        call = CallInFlight(key, ctx.attempt, now_ms, end_ms, fails, fiber, ctx.cancelled)
        ledger.in_flight.append(call)
        fiber.suspend(end_ms)  # the world lands it at end_ms, or kills it, before this goes on
        if call.killed:
            raise SimulatedFailure(
                f"attempt {ctx.attempt} stopped: its process killed {KILL_AFTER_S:g} s after ctx.cancelled"
            )
        ledger.heard(call)
    elif fails:
        ledger.fail(key, now_ms)
    else:
        ledger.add(Execution(key, now_ms))
    if down:
        raise SimulatedFailure(f"attempt {ctx.attempt} fails: the downstream is down ({ledger.failed[key]} failed)")
    if fails:
        raise SimulatedFailure(f"attempt {ctx.attempt} fails, {ledger.failed[key]} of {fail_first}")
