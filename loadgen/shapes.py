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

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pysched import native
from pysched.model import Job, OnceSchedule

SHAPES = ("instant", "jittered", "realistic")
SUSTAIN_SHAPES = ("once", "recurring")
MINUTE_MS = 60_000


@dataclass(frozen=True)
class Load:
    """Jobs to register, and the runs they must make: idempotency key -> the
    due time pysched should fire it at."""

    jobs: list[Job]
    expected: dict[str, int]
    # Recurring jobs go on firing after the measured window: cancel them then.
    recurring: bool = False

    @classmethod
    def one_shots(cls, pairs: Iterable[tuple[Job, int]]) -> Load:
        jobs: list[Job] = []
        expected: dict[str, int] = {}
        for job, due in pairs:
            assert isinstance(job.schedule, OnceSchedule)
            jobs.append(job)
            expected[f"{job.id}:{job.schedule.run_at_ms}:0"] = due
        return cls(jobs, expected)


def spike_jobs(
    n: int, instant_ms: int, shape: str, window_s: float, ledger: Path, prefix: str
) -> Iterator[tuple[Job, int]]:
    """(job, the due time pysched should fire it at) for each of n runs."""
    window_ms = round(window_s * 1000)
    for k in range(n):
        job_id = f"{prefix}{k:07d}"
        jittered = shape == "jittered" or (shape == "realistic" and k % 5 == 4)
        due = instant_ms + (native.jitter_offset(job_id, window_ms) if jittered and window_ms else 0)
        spec: dict[str, object] = {
            "id": job_id,
            "schedule": {"kind": "once", "run_at_ms": instant_ms},
            "target": {"kind": "python", "ref": "loadgen.target:append"},
            "payload": {"ledger": str(ledger), "due_ms": due},
        }
        if jittered:
            spec["jitter_window_s"] = window_s
        else:
            spec["critical"] = True
        yield Job.model_validate(spec), due


def sustain_jobs(rate: float, duration_s: float, start_ms: int, ledger: Path, prefix: str) -> Iterator[tuple[Job, int]]:
    """rate runs a second for duration_s, evenly spaced, no jitter."""
    n = int(rate * duration_s)
    for k in range(n):
        due = start_ms + round(k * 1000 / rate)
        job = Job.model_validate(
            {
                "id": f"{prefix}{k:07d}",
                "schedule": {"kind": "once", "run_at_ms": due},
                "target": {"kind": "python", "ref": "loadgen.target:append"},
                "payload": {"ledger": str(ledger), "due_ms": due},
                "critical": True,
            }
        )
        yield job, due


def sustain_recurring(rate: float, minutes: int, start_ms: int, ledger: Path, prefix: str) -> Load:
    """rate x 60 every-minute jobs; the runs of ``minutes`` minutes from
    ``start_ms`` (a minute boundary) are the ones measured."""
    if start_ms % MINUTE_MS:
        raise ValueError("start_ms must be a minute boundary")
    jobs: list[Job] = []
    expected: dict[str, int] = {}
    for k in range(round(rate * 60)):
        job_id = f"{prefix}{k:07d}"
        jobs.append(
            Job.model_validate(
                {
                    "id": job_id,
                    "schedule": {"kind": "cron", "expr": "* * * * *"},
                    "target": {"kind": "python", "ref": "loadgen.target:append"},
                    "payload": {"ledger": str(ledger)},
                    "jitter_window_s": 60,
                }
            )
        )
        offset = native.jitter_offset(job_id, MINUTE_MS)
        for m in range(minutes):
            run_at = start_ms + m * MINUTE_MS
            expected[f"{job_id}:{run_at}:0"] = run_at + offset
    return Load(jobs, expected, recurring=True)
