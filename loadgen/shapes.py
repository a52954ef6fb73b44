"""Load shapes: which jobs, due when.

Spikes:
- ``instant``: every run at the same millisecond, no jitter (critical jobs).
- ``jittered``: every run on the instant, each job spread by its own
  deterministic jitter over ``window``.
- ``realistic``: 80% critical on the boundary, 20% with jitter over the window.

Sustained load:
- ``once``: one one-shot job per run, evenly spaced.
- ``recurring``: rate x 60 jobs that each run every minute, spread over the
  minute by their own jitter: how 100M runs a day really arrive, and each
  fire also plans the job's next run.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import overload

from pysched import native
from pysched.model import Job, OnceSchedule
from pysched.records import idempotency_key

SHAPES = ("instant", "jittered", "realistic")
SUSTAIN_SHAPES = ("once", "recurring")
MINUTE_MS = 60_000


class CompactJobs(Sequence[Job]):
    """Jobs kept as their JSON, made into models when read (a chunk at a
    time, as registration reads them): 50,000 job models weigh about 145 MB,
    which the load generator, sharing its process with the embedded node it
    measures, would add to the node's peak RSS; their JSON weighs 20 MB."""

    def __init__(self, jobs: Iterable[Job] = ()) -> None:
        self._specs = [job.model_dump_json().encode() for job in jobs]

    def append(self, job: Job) -> None:
        self._specs.append(job.model_dump_json().encode())

    def __len__(self) -> int:
        return len(self._specs)

    @overload
    def __getitem__(self, index: int) -> Job: ...

    @overload
    def __getitem__(self, index: slice) -> list[Job]: ...

    def __getitem__(self, index: int | slice) -> Job | list[Job]:
        if isinstance(index, slice):
            return [Job.model_validate_json(spec) for spec in self._specs[index]]
        return Job.model_validate_json(self._specs[index])


@dataclass(frozen=True)
class Load:
    """Jobs to register, and the runs they must make: idempotency key -> the
    due time pysched should fire it at."""

    jobs: CompactJobs
    expected: dict[str, int]
    # Recurring jobs go on firing after the measured window: cancel them then.
    recurring: bool = False

    @classmethod
    def one_shots(cls, pairs: Iterable[tuple[Job, int]]) -> Load:
        jobs = CompactJobs()
        expected: dict[str, int] = {}
        for job, due in pairs:
            assert isinstance(job.schedule, OnceSchedule)
            jobs.append(job)
            expected[idempotency_key(job.id, job.schedule.run_at_ms, 0)] = due
        return cls(jobs, expected)


def ledger_job(job_id: str, schedule: dict[str, object], ledger: Path, due_ms: int | None, **policy: object) -> Job:
    """A job whose run appends a line to the ledger (pysched_loadgen.target)."""
    payload: dict[str, object] = {"ledger": str(ledger)}
    if due_ms is not None:
        payload["due_ms"] = due_ms
    return Job.model_validate(
        {
            "id": job_id,
            "schedule": schedule,
            "target": {"kind": "python", "ref": "pysched_loadgen.target:append"},
            "payload": payload,
            **policy,
        }
    )


def spike_jobs(
    n: int, instant_ms: int, shape: str, window_s: float, ledger: Path, prefix: str
) -> Iterator[tuple[Job, int]]:
    """(job, the due time pysched should fire it at) for each of n runs."""
    window_ms = round(window_s * 1000)
    for k in range(n):
        job_id = f"{prefix}{k:07d}"
        jittered = shape == "jittered" or (shape == "realistic" and k % 5 == 4)
        due = instant_ms + (native.jitter_offset(job_id, window_ms) if jittered and window_ms else 0)
        policy = {"jitter_window_s": window_s} if jittered else {"critical": True}
        yield ledger_job(job_id, {"kind": "once", "run_at_ms": instant_ms}, ledger, due, **policy), due


def sustain_jobs(rate: float, duration_s: float, start_ms: int, ledger: Path, prefix: str) -> Iterator[tuple[Job, int]]:
    """rate runs a second for duration_s, evenly spaced, no jitter."""
    n = int(rate * duration_s)
    for k in range(n):
        due = start_ms + round(k * 1000 / rate)
        yield ledger_job(f"{prefix}{k:07d}", {"kind": "once", "run_at_ms": due}, ledger, due, critical=True), due


def sustain_recurring(rate: float, minutes: int, start_ms: int, ledger: Path, prefix: str) -> Load:
    """rate x 60 every-minute jobs; the runs of ``minutes`` minutes from
    ``start_ms`` (a minute boundary) are the ones measured."""
    if start_ms % MINUTE_MS:
        raise ValueError("start_ms must be a minute boundary")
    jobs = CompactJobs()
    expected: dict[str, int] = {}
    for k in range(round(rate * 60)):
        job_id = f"{prefix}{k:07d}"
        jobs.append(ledger_job(job_id, {"kind": "cron", "expr": "* * * * *"}, ledger, None, jitter_window_s=60))
        offset = native.jitter_offset(job_id, MINUTE_MS)
        for m in range(minutes):
            run_at = start_ms + m * MINUTE_MS
            expected[idempotency_key(job_id, run_at, 0)] = run_at + offset
    return Load(jobs, expected, recurring=True)
