"""What the simulated jobs did: each execution, written by the job itself.

The jobs are Python targets (``pysched.sim.ledger:record``) that find their
world's ledger by the id in their payload: one process may hold several
worlds (the tests run many seeds)."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from pysched.clock import Clock
from pysched.targets import RunContext

TARGET = "pysched.sim.ledger:record"


@dataclass(frozen=True, slots=True)
class Execution:
    key: str  # the run's idempotency key
    at_ms: int  # true (world) time the job started


@dataclass
class Ledger:
    clock: Clock  # the world's true clock, not a node's
    executions: list[Execution] = field(default_factory=list)

    def counts(self) -> Counter[str]:
        return Counter(e.key for e in self.executions)


_LEDGERS: dict[str, Ledger] = {}
_LOCK = threading.Lock()


def open_ledger(world_id: str, clock: Clock) -> Ledger:
    with _LOCK:
        _LEDGERS[world_id] = ledger = Ledger(clock)
    return ledger


def close_ledger(world_id: str) -> None:
    with _LOCK:
        _LEDGERS.pop(world_id, None)


def record(ctx: RunContext) -> None:
    ledger = _LEDGERS[str(ctx.payload["world"])]
    ledger.executions.append(Execution(ctx.idempotency_key, ledger.clock.now_ms()))
