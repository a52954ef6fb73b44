"""Spike shapes: which jobs, due when.

- ``instant``: every run at the same millisecond, no jitter (critical jobs).
- ``jittered``: every run on the instant, each job spread by its own
  deterministic jitter over ``window``.
- ``realistic``: 80% critical on the boundary, 20% with jitter over the window.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pysched import native
from pysched.model import Job

SHAPES = ("instant", "jittered", "realistic")


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
