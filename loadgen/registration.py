"""Register a load before it falls due, however long registration takes.

A load's instant is planned a margin after now plus the time registration is
expected to take: at first from an assumed rate, afterwards from the rate an
attempt measured. An attempt whose rate cannot finish in time (a cold or busy
machine) is given up as soon as that shows, its jobs withdrawn before they
fall due, and another is planned: a slower machine takes longer but does not
fail. An instant the user fixed (--at, --in) is kept, and a lead too short
for it is an error.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import Progress

from pysched.model import Job
from pysched_loadgen.measure import Observed, report
from pysched_loadgen.shapes import Load

# Jobs a second each engine registers in bulk, with room to spare: only the
# first attempt's guess. The cluster's rate is bound by the logged batches
# of job rows and first runs (ids are claimed a bucket at a time).
ASSUMED_RATE = {"embedded": 20_000, "cluster": 800}
MARGIN_S = 3.0
# Registration must end this long before the first run falls due, or the
# figures would time registration, not firing.
SLACK_MS = 500
# Each retry allows twice the time the last attempt's rate needs: more
# attempts than this means the machine keeps getting slower, and the figures
# would mean little.
ATTEMPTS = 4


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def registration_lead_s(n: int, embedded: bool) -> float:
    """Seconds to allow for registering n jobs before the first run, at the assumed rate."""
    return MARGIN_S + n / ASSUMED_RATE["embedded" if embedded else "cluster"]


def retry_lead_s(needs_s: float) -> float:
    """Seconds to allow for a registration the last attempt measured at needs_s."""
    return MARGIN_S + 2 * needs_s


class RegisteredLate(RuntimeError):
    """Registration was still going when the runs fell due: the figures would
    time registration, not firing."""


@dataclass(frozen=True)
class LoadPlan:
    """A load whose instant is chosen when it is registered."""

    jobs: int  # how many jobs the load registers: sets the first attempt's lead
    build: Callable[[Path, str, int], Load]  # (ledger, job id prefix, instant ms) -> the load
    fixed_ms: int | None = None  # the user's instant: kept, and too short a lead is an error
    boundary_ms: int = 1  # the instant is rounded up to a multiple of this

    def instant(self, earliest_ms: int) -> int:
        return -(-earliest_ms // self.boundary_ms) * self.boundary_ms


@dataclass
class Attempt:
    """One try at registering a load before it falls due."""

    number: int
    folder: Path
    load: Load
    observed: Observed
    build_s: float
    written: int = 0  # jobs registered so far
    register_s: float = 0.0
    # Of register_s, the time in the scheduler's registration calls (with
    # opening the attempt's database, once): the rest is the load generator
    # making job models out of its stored JSON.
    write_s: float = 0.0

    @property
    def ledger(self) -> Path:
        return self.folder / "ledger.txt"

    @property
    def first_due_ms(self) -> int:
        return min(self.load.expected.values())

    @property
    def needs_s(self) -> float:
        """Building and registering every job, at the rate measured."""
        return self.build_s + self.register_s * len(self.load.jobs) / max(1, self.written)

    def figures(self, extra: dict[str, Any]) -> dict[str, Any]:
        return report(
            self.observed,
            self.ledger,
            self.register_s,
            {**extra, "register_write_s": round(self.write_s, 2), "attempts": self.number},
        )


WriteJobs = Callable[[Attempt, list[Job]], None]


def register_before_due(
    plan: LoadPlan,
    embedded: bool,
    chunk_size: int,
    write: WriteJobs,
    discard: Callable[[Attempt], None],
    progress: Progress,
) -> Attempt:
    """Register the plan's load, chunk by chunk through ``write``, all of it
    before its first run falls due; the attempt that managed it. ``discard``
    withdraws the jobs an attempt given up on has written."""
    lead_s = registration_lead_s(plan.jobs, embedded)
    for number in range(1, ATTEMPTS + 1):
        earliest = now_ms() + round(lead_s * 1000) if plan.fixed_ms is None else plan.fixed_ms
        attempt = _new_attempt(plan, number, earliest)
        try:
            _write_while_in_time(attempt, chunk_size, write, progress)
        except BaseException:
            discard(attempt)
            raise
        late_s = (now_ms() - attempt.first_due_ms) / 1000
        jobs = len(attempt.load.jobs)
        if attempt.written == jobs and late_s <= -SLACK_MS / 1000:
            return attempt
        discard(attempt)
        if plan.fixed_ms is not None:
            got = "finished" if attempt.written == jobs else f"could not finish ({attempt.written:,} of {jobs:,} in)"
            raise RegisteredLate(
                f"registration {got} {late_s:+.1f} s from the first due time; start the runs later (--in, --at)"
            )
        lead_s = retry_lead_s(attempt.needs_s)
    raise RegisteredLate(
        f"registration was too slow {ATTEMPTS} times; the last would have taken {attempt.needs_s:.0f} s"
    )


def _new_attempt(plan: LoadPlan, number: int, earliest_ms: int) -> Attempt:
    folder = Path(tempfile.mkdtemp(prefix="pysched-loadgen-"))
    started = time.monotonic()
    # A fresh id prefix each attempt: a discarded one's runs are never counted.
    load = plan.build(folder / "ledger.txt", f"lg{uuid.uuid4().hex[:6]}-", plan.instant(earliest_ms))
    return Attempt(number, folder, load, Observed(dict(load.expected)), time.monotonic() - started)


def _write_while_in_time(attempt: Attempt, chunk_size: int, write: WriteJobs, progress: Progress) -> None:
    """Write the attempt's jobs until done, or until the rate measured so far
    cannot finish before its deadline."""
    jobs = attempt.load.jobs
    label = "registering" if attempt.number == 1 else f"registering, try {attempt.number}"
    task = progress.add_task(label, total=len(jobs))
    deadline_ms = attempt.first_due_ms - SLACK_MS
    started = time.monotonic()
    while attempt.written < len(jobs):
        chunk = jobs[attempt.written : attempt.written + chunk_size]
        writing = time.monotonic()
        write(attempt, chunk)
        attempt.write_s += time.monotonic() - writing
        attempt.written += len(chunk)
        attempt.register_s = time.monotonic() - started
        progress.update(task, completed=attempt.written)
        rest_s = attempt.register_s * (len(jobs) - attempt.written) / attempt.written
        if now_ms() + rest_s * 1000 > deadline_ms:
            break
    if attempt.written < len(jobs):
        progress.update(task, description="too slow: withdrawn")
