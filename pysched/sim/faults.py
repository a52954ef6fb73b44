"""The faults of a simulated world, drawn from its seed before it starts.

Each fault happens to one node at a time, inside the first part of the run
(the rest is the settling period, in which every owed run must catch up).
Kinds, as named on the command line:

- ``crash``: the node dies without a word (no hand-over) and a new process
  starts in its place a while later;
- ``pause``: the node stops longer than its lease (a GC pause) and wakes
  with its state as it was;
- ``coordinator``: its coordinator calls fail for a while;
- ``publish``: its dispatcher refuses records for a while;
- ``store``, ``claims``: a share of its calls fail, before or after taking
  effect, for a while;
- ``rebalance``: a worker's consumer dies without acknowledging, and the
  dispatcher's group moves its partitions;
- ``redis``: the claims' fast path (Redis) loses everything it held; the
  durable fence floors and claims (Cassandra) stay;
- ``cassandra``: Cassandra out of the node's reach, or too slow: its store
  and claims calls both fail, most of them, for up to a minute, past a
  worker's lease (its heartbeats fail with its writes);
- ``skew``: the nodes' clocks differ by up to ``MAX_SKEW_MS`` (for the whole
  run).

Four outages are asked for by name rather than drawn (``Outage``): the
whole cluster down at once (every node, no hand-over); the jobs' downstream
failing every call; the leaders unable to record what they sent (the
store refuses every ``finish_dispatch`` while its reads and every other call
work: a dispatch table overloaded, a write path timing out), so that what
was sent is recorded long after it went; and the workers unable to record
how their runs ended (the store refuses every ``run_failed``,
``run_parked``, ``run_finished`` and ``run_missed``: a brownout of the
runs table), so that a retry or a parking is written long after the time
it is due. No drawn fault overlaps the cluster's outage.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

from pysched.memory.faults import Phase, SimulatedFault

KINDS = ("crash", "pause", "coordinator", "publish", "store", "claims", "rebalance", "redis", "cassandra", "skew")
MAX_SKEW_MS = 500
# What the history outage refuses: the store's writes of how a run ended.
RUN_END_WRITES = frozenset({"run_failed", "run_parked", "run_finished", "run_missed"})


@dataclass(frozen=True, slots=True)
class FaultEvent:
    kind: str
    node: int
    at_ms: int  # world time
    duration_ms: int
    rate: float = 1.0  # the share of calls that fail, for the call faults


@dataclass(frozen=True, slots=True)
class Outage:
    """A window of a world's time, counted from its start: when something
    is down, and for how long."""

    at_s: float
    for_s: float

    def window_ms(self, start_ms: int, step_ms: int) -> tuple[int, int]:
        """[down, up) in world time, on the world's round boundaries."""
        down = start_ms + round(self.at_s * 1000 / step_ms) * step_ms
        return down, down + max(step_ms, round(self.for_s * 1000 / step_ms) * step_ms)

    def spec(self) -> str:
        """As the command line takes it: AT+FOR, in seconds."""
        return f"{self.at_s:g}+{self.for_s:g}"


@dataclass(frozen=True, slots=True)
class FaultPlan:
    events: tuple[FaultEvent, ...]
    skews_ms: tuple[int, ...]  # per node: its clock's offset from world time
    quiet_from_ms: int  # no fault is active from here on
    # [down, up): every node down at once, and started again; None: never.
    blackout_ms: tuple[int, int] | None = None


def plan_faults(
    rng: random.Random,
    kinds: frozenset[str],
    nodes: int,
    start_ms: int,
    end_ms: int,
    count: int,
    blackout_ms: tuple[int, int] | None = None,
) -> FaultPlan:
    """``count`` faults drawn from ``kinds`` over the first two thirds of
    [start, end), none overlapping on one node, nor the cluster's outage
    (``blackout_ms``: a fault drawn across it is dropped, after its draw, so
    that the rest of the plan is the one drawn without it). The quiet
    period begins no earlier than the cluster's return."""
    quiet_from = start_ms + (end_ms - start_ms) * 2 // 3
    skews = tuple(rng.randint(-MAX_SKEW_MS, MAX_SKEW_MS) if "skew" in kinds else 0 for _ in range(nodes))
    drawable = sorted(kinds - {"skew"})
    events: list[FaultEvent] = []
    busy_until = [start_ms] * nodes
    for _ in range(count if drawable else 0):
        kind = rng.choice(drawable)
        node = rng.randrange(nodes)
        at = max(busy_until[node], start_ms + rng.randrange(max(1, quiet_from - start_ms)))
        duration = {
            "crash": rng.randrange(5_000, 60_000),
            "pause": rng.randrange(11_000, 30_000),
            "coordinator": rng.randrange(2_000, 40_000),
            "publish": rng.randrange(1_000, 30_000),
            "store": rng.randrange(1_000, 30_000),
            "claims": rng.randrange(1_000, 30_000),
            "rebalance": 0,
            "redis": 0,
            # Drawn apart: a draw in this dict is made whatever the kind,
            # and one more would change every world drawn before it.
            "cassandra": 0,
        }[kind]
        if kind == "cassandra":
            duration = rng.randrange(20_000, 60_000)
        if at + duration >= quiet_from:
            continue
        rate = rng.choice((0.05, 0.2, 0.5)) if kind in ("store", "claims") else 1.0
        if kind == "cassandra":
            rate = rng.choice((0.5, 0.8, 1.0))
        if blackout_ms is not None and at < blackout_ms[1] and at + duration + 1_000 > blackout_ms[0]:
            continue
        events.append(FaultEvent(kind, node, at, duration, rate))
        busy_until[node] = at + duration + 1_000
    events.sort(key=lambda e: (e.at_ms, e.node))
    if blackout_ms is not None:
        quiet_from = max(quiet_from, blackout_ms[1])
    return FaultPlan(tuple(events), skews, quiet_from, blackout_ms)


# The roles whose calls each call fault fails.
_ROLES_OF = {
    "coordinator": ("coordinator",),
    "publish": ("dispatcher",),
    "store": ("store",),
    "claims": ("claims",),
    "cassandra": ("store", "claims"),
}


class NodeFaults:
    """A node's fault hook (pysched.memory.faults.FaultHook): fails its calls
    while one of its call faults is active, at that fault's rate."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._active: list[FaultEvent] = []
        self._lock = threading.Lock()
        self.injected = 0
        # The recording outage (see above): every finish_dispatch fails.
        self.recording_down = False
        # The history outage (see above): every write of a run's end fails.
        self.history_down = False
        # What the world does between a leader's read of its plans and its
        # write of them (a workload's change racing the recording): called
        # once the read has returned its rows, before the caller sees them.
        self.between_plan_and_write: Callable[[], None] | None = None

    def start(self, event: FaultEvent) -> None:
        with self._lock:
            self._active.append(event)

    def stop(self, event: FaultEvent) -> None:
        with self._lock:
            self._active.remove(event)

    def check(self, role: str, op: str, phase: Phase) -> None:
        if phase == "after" and op == "planning_state":
            self.planned()
        self.refuse(role, op, phase)
        if role == "dispatcher" and op != "publish":
            return  # consumers fail by ``rebalance``
        if self.fails(role):
            self.injected += 1
            raise SimulatedFault(f"injected fault: {role}.{op} ({phase})")

    def planned(self) -> None:
        """A leader's read of its plans returned, its write not begun."""
        if self.between_plan_and_write is not None:
            self.between_plan_and_write()

    def refuse(self, role: str, op: str, phase: Phase) -> None:
        """Raise if a named outage refuses this call (recording, history)."""
        if self.recording_down and role == "store" and op == "finish_dispatch":
            self.injected += 1
            raise SimulatedFault(f"injected fault: {role}.{op} ({phase}): recording is down")
        if self.history_down and role == "store" and op in RUN_END_WRITES:
            self.injected += 1
            raise SimulatedFault(f"injected fault: {role}.{op} ({phase}): the runs' history is down")

    def fails(self, role: str) -> bool:
        """Whether a call of ``role`` fails now: drawn at the highest rate
        of the call faults active on ``role``; no draw while none is."""
        if not self._active:
            return False
        with self._lock:
            rates = [e.rate for e in self._active if role in _ROLES_OF.get(e.kind, ())]
        return bool(rates) and self._rng.random() < max(rates)
