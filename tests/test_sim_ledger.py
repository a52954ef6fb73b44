"""The simulated downstream's calls that take time: a call whose run its
worker stopped lands only if it ends before its process is killed."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest

from pysched.clock import ManualClock
from pysched.sim.calls import NodeFibers
from pysched.sim.judge import STEP_MS
from pysched.sim.ledger import KILL_AFTER_MS, Ledger, SimulatedFailure, close_ledger, open_ledger, record
from pysched.targets import RunContext

START_MS = 1_800_000_000_000
KEY = "hourly-000078:1799021340000:0"


def _context(world: str, duration_ms: int, cancelled: threading.Event) -> RunContext:
    return RunContext(
        "hourly-000078",
        1,
        datetime.fromtimestamp(START_MS / 1000, UTC),
        1,
        7,
        KEY,
        {"world": world, "duration_ms": duration_ms},
        cancelled=cancelled,
    )


def _call_stopped_after(stop_after_ms: int, duration_ms: int) -> tuple[Ledger, list[BaseException]]:
    """One call taking ``duration_ms``, its run stopped ``stop_after_ms``
    after it began, the world's rounds run until it returned."""
    world = f"ledger-test-{stop_after_ms}-{duration_ms}"
    clock = ManualClock(START_MS)
    ledger = open_ledger(world, clock)
    fibers = NodeFibers("node-1.0")
    cancelled = threading.Event()
    raised: list[BaseException] = []
    returned: list[bool] = []

    def calling() -> None:
        try:
            record(_context(world, duration_ms, cancelled))
        except SimulatedFailure as exc:
            raised.append(exc)
        returned.append(True)

    try:
        fibers.start_call(calling)
        while not returned:
            clock.advance(STEP_MS)
            now = clock.now_ms()
            ledger.land(now)  # as World.round: the landings first, then the nodes
            fibers.resume_calls(now)
            if now - START_MS >= stop_after_ms:
                cancelled.set()  # the worker's stop (executor.stop), in its node's round
        return ledger, raised
    finally:
        fibers.kill()
        close_ledger(world)


def test_a_call_not_ended_when_its_process_is_killed_never_lands() -> None:
    # Its lease lost mid-call, the run is stopped; a Python target given a
    # --timeout is killed 2 s later, and its effect can land no more beside
    # the execution that takes the run over.
    ledger, raised = _call_stopped_after(stop_after_ms=35_000, duration_ms=55_000)
    assert ledger.count(KEY) == 0
    assert ledger.failed[KEY] == 1  # as the worker, or the run's taker, records it
    assert len(raised) == 1 and "killed" in str(raised[0])
    assert ledger.in_flight == [] and ledger.unheard == []


@pytest.mark.parametrize("ends_after_stop_ms", [0, KILL_AFTER_MS - 2 * STEP_MS])
def test_a_call_that_ends_before_its_kill_lands(ends_after_stop_ms: int) -> None:
    ledger, raised = _call_stopped_after(stop_after_ms=10_000, duration_ms=10_000 + ends_after_stop_ms)
    assert ledger.count(KEY) == 1
    assert ledger.failed[KEY] == 0
    assert raised == []
