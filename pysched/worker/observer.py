"""What a worker tells observers of the runs it handles (metrics count it),
without knowing who listens: the core imports no metrics library.

The calls come from the worker threads, one per event, where the executor
counts it already (``Executor.counts``): each must be cheap and safe to call
from several threads at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

from pysched.protocols import ClaimOutcome

# How an execution's run ended, as the executor counts it: "waiting" is a
# run parked for its job's previous run (overlap), "parked" one parked by
# its downstream's breaker; "cancelled" also counts a run replaced (overlap
# replace) or rescheduled away.
RunOutcome = Literal["succeeded", "failed", "missed", "parked", "waiting", "cancelled", "interrupted"]
RUN_OUTCOMES: tuple[RunOutcome, ...] = (
    "succeeded",
    "failed",
    "missed",
    "parked",
    "waiting",
    "cancelled",
    "interrupted",
)


class RunObserver(Protocol):
    def claimed(self, outcomes: Sequence[ClaimOutcome]) -> None:
        """A batch of claims was answered (one write for the batch)."""

    def started(self, due_ms: int, started_at_ms: int) -> None:
        """A run's target is about to be called."""

    def ended(self, outcome: RunOutcome, retried: bool = False) -> None:
        """A run's end was recorded; a failure ``retried`` has a next attempt
        planned, one not is a dead letter."""


class NoObserver:
    """The default: nobody listens."""

    def claimed(self, outcomes: Sequence[ClaimOutcome]) -> None:
        pass

    def started(self, due_ms: int, started_at_ms: int) -> None:
        pass

    def ended(self, outcome: RunOutcome, retried: bool = False) -> None:
        pass
