"""The contracts every backend implements, embedded and distributed alike.

The scheduler core (leader, worker, planning) speaks only to these; a
backend module is imported only where a node is assembled.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pysched.model import Job
from pysched.records import DispatchRecord


class JobExists(ValueError):
    """A job with this id is already registered."""


class JobNotFound(LookupError):
    """No job with this id."""


class JobNotActive(ValueError):
    """The job was cancelled or has completed."""


@dataclass(frozen=True, slots=True)
class PlannedRun:
    run_at_ms: int  # the schedule's time: part of the idempotency key
    due_ms: int  # run_at plus the job's deterministic jitter: when it fires


@dataclass(frozen=True, slots=True)
class JobRecord:
    job: Job
    state: str  # active | cancelled | completed
    partition: int
    jitter_ms: int
    created_at_ms: int
    next_run: PlannedRun | None


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: int
    job_id: str
    run_at_ms: int
    due_ms: int
    state: str  # scheduled | dispatched | running | succeeded | failed | cancelled
    attempt: int
    fence: int | None
    dispatched_at_ms: int | None
    started_at_ms: int | None
    ended_at_ms: int | None
    worker: str | None
    error: str | None
    result: str | None


# (run_id, job_id, run_at_ms, due_ms, partition, attempt, attempt_group): the
# row shape the dispatch codec encodes.
DispatchRow = tuple[int, str, int, int, int, int, int]
# (run_id, due_ms): the row shape the bucket loader takes.
DueRow = tuple[int, int]
# Given a job, the run_at just dispatched and now: the job's next run, if any.
PlanNext = Callable[[Job, int, int, int], PlannedRun | None]


@dataclass(frozen=True, slots=True)
class Dispatched:
    rows: list[DispatchRow]  # the runs this call handed on, now marked dispatched
    next_runs: list[DueRow]  # runs the call planned for recurring jobs


class ScheduleStore(Protocol):
    """Job definitions, the schedule of runs, and their history."""

    def add_job(self, job: Job, partition: int, jitter_ms: int, first: PlannedRun | None, now_ms: int) -> JobRecord:
        """Register a job and its first run; durable when this returns.
        Raises JobExists."""
        ...

    def get_job(self, job_id: str) -> JobRecord: ...

    def list_jobs(self) -> list[JobRecord]: ...

    def cancel_job(self, job_id: str, now_ms: int) -> JobRecord:
        """Stop a job: its pending runs are cancelled, history is kept."""
        ...

    def reschedule(self, job: Job, jitter_ms: int, first: PlannedRun | None, now_ms: int) -> JobRecord:
        """Replace an active job's schedule; pending runs are cancelled and
        ``first`` becomes the next run. Raises JobNotFound, JobNotActive."""
        ...

    def history(self, job_id: str, limit: int = 50) -> list[RunRecord]:
        """Runs of a job, newest first."""
        ...

    def change_token(self) -> int:
        """A number that changes whenever jobs are added, cancelled or
        rescheduled: the leader polls it to reload early."""
        ...

    def due_runs(self, horizon_ms: int, fence: int, now_ms: int) -> list[DueRow]:
        """Runs due before ``horizon_ms`` that a leader holding ``fence``
        must hand on: scheduled ones, ones dispatched under an older fence,
        and running ones whose worker's lease has died."""
        ...

    def dispatch(self, run_ids: Sequence[int], fence: int, now_ms: int, plan_next: PlanNext) -> Dispatched:
        """Mark the runs dispatched under ``fence``, plan each recurring
        job's next run, and move the watermarks, in one durable step. Runs
        no longer eligible (cancelled, already handed on) are left out."""
        ...

    def run_started(self, run_id: int, attempt: int, worker: str, now_ms: int) -> None: ...

    def run_finished(
        self, run_id: int, attempt: int, succeeded: bool, error: str | None, result: str | None, now_ms: int
    ) -> None: ...

    def watermarks(self) -> dict[int, int]:
        """Per partition, the latest due time handed on."""
        ...


@dataclass(frozen=True, slots=True)
class Lease:
    holder: str
    fence: int  # strictly increasing across terms
    expires_at_ms: int


class Coordinator(Protocol):
    """Leadership of the schedule partitions, leases and fences."""

    def acquire(self, holder: str, now_ms: int) -> Lease | None:
        """Become leader, or renew; None while another holder's lease lives.
        A new term publishes its fence before this returns."""
        ...

    def renew(self, lease: Lease, now_ms: int) -> Lease | None:
        """Extend a lease; None when another holder has taken over."""
        ...

    def release(self, lease: Lease) -> None: ...

    def current(self) -> Lease | None: ...


class Dispatcher(Protocol):
    """Carries encoded dispatch records from leaders to workers."""

    def publish(self, payloads: Sequence[bytes]) -> None:
        """Returns once the payloads are durably handed on."""
        ...

    def consume(self, timeout_s: float) -> bytes | None: ...

    def close(self) -> None: ...


class ClaimOutcome(enum.Enum):
    CLAIMED = "claimed"  # first delivery: run it
    TAKEN_OVER = "taken_over"  # a previous holder's lease died: run it again
    SUCCEEDED = "succeeded"  # already done: replay the stored result, do not run
    BUSY = "busy"  # another worker runs it under a live lease: back off
    FENCED = "fenced"  # dispatched under a fence older than the partition's


@dataclass(frozen=True, slots=True)
class Claim:
    outcome: ClaimOutcome
    result: str | None = None
    fence_floor: int = 0


class IdempotencyClaims(Protocol):
    """The executing side's guard: fence check plus a conditional claim."""

    def claim(self, record: DispatchRecord, holder: str, now_ms: int, lease_ms: int) -> Claim: ...

    def heartbeat(self, holder: str, now_ms: int, lease_ms: int) -> int:
        """Extend every live claim of ``holder``: one write per worker, not
        one per run. Returns how many were extended."""
        ...

    def complete(self, key: str, holder: str, succeeded: bool, result: str | None, now_ms: int) -> None: ...
