"""Make a store hold the jobs a module declares (`pysched sync MODULE`).

Every declaration is checked before anything is written. A declared job not
stored is added; one stored with another definition is given the new one
(its pending runs replaced, as a reschedule does); one the same is left
alone, so a sync run again changes nothing. A sync changes only the
module's own jobs (those whose target is one of its functions): an id held
by another job, a paused, cancelled or completed job whose declaration
changed, and a new one-shot whose time has passed are skipped, each with
its reason. With ``prune``, the module's jobs it no longer declares are
cancelled; their history stays. A cancelled job of the module that is
declared again is added anew (a new job with a new history), so a sync
after the declaration is restored undoes a prune.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from pysched.declare import declared_jobs
from pysched.model import Job, OnceSchedule, PythonTarget
from pysched.protocols import JobNotFound, JobRecord

if TYPE_CHECKING:
    from pysched.client import Client


@dataclass(frozen=True, slots=True)
class Skipped:
    """A declared job sync could not apply, and why."""

    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class SyncReport:
    module: str
    added: tuple[str, ...]
    updated: tuple[str, ...]
    unchanged: tuple[str, ...]
    # Cancelled by prune: no longer declared.
    pruned: tuple[str, ...]
    skipped: tuple[Skipped, ...]
    # Nothing was written: what a sync would do.
    dry_run: bool

    @property
    def declared(self) -> int:
        return len(self.added) + len(self.updated) + len(self.unchanged) + len(self.skipped)


def import_declarations(module: ModuleType | str) -> ModuleType:
    """The module, imported if given by name (its import errors propagate)."""
    return importlib.import_module(module) if isinstance(module, str) else module


def sync_module(client: Client, module: ModuleType | str, *, prune: bool, dry_run: bool) -> SyncReport:
    mod = import_declarations(module)
    jobs = [client.check(job, allow_past=True) for job in declared_jobs(mod)]
    now = client.clock.now_ms()
    added: list[str] = []
    updated: list[str] = []
    unchanged: list[str] = []
    skipped: list[Skipped] = []
    for job in jobs:
        try:
            current: JobRecord | None = client.get(job.id)
        except JobNotFound:
            current = None
        if current is not None and current.state == "cancelled" and _owned(current.job, mod.__name__):
            # Declared again after a prune (or a cancel): a new job takes
            # the id, with a history of its own.
            current = None
        if current is None:
            if isinstance(job.schedule, OnceSchedule) and job.schedule.run_at_ms < now:
                skipped.append(Skipped(job.id, "its one run's time has passed"))
                continue
            if not dry_run:
                client.add(job)
            added.append(job.id)
        elif not _owned(current.job, mod.__name__):
            skipped.append(Skipped(job.id, f"a job of that id exists that is not one of {mod.__name__}'s functions"))
        elif current.job == job:
            unchanged.append(job.id)
        elif current.state != "active":
            skipped.append(Skipped(job.id, _why_not_updated(current)))
        else:
            if not dry_run:
                client.replace(job)
            updated.append(job.id)
    pruned = _prune(client, mod.__name__, {job.id for job in jobs}, dry_run) if prune else []
    return SyncReport(
        mod.__name__, tuple(added), tuple(updated), tuple(unchanged), tuple(pruned), tuple(skipped), dry_run
    )


def _why_not_updated(current: JobRecord) -> str:
    return {
        "paused": "paused: resume it, then sync, to give it the new definition",
        "completed": "completed: it has no runs to come; declare the job under another id",
    }.get(current.state, f"{current.state}: not updated")


def _prune(client: Client, module: str, declared: set[str], dry_run: bool) -> list[str]:
    stale = [
        rec.job.id
        for rec in client.ls()
        if rec.state in ("active", "paused") and rec.job.id not in declared and _owned(rec.job, module)
    ]
    if not dry_run:
        for job_id in stale:
            client.cancel(job_id)
    return stale


def _owned(job: Job, module: str) -> bool:
    """Whether a stored job is one of ``module``'s declarations' (its target
    is a function of the module): sync changes or prunes no other."""
    return isinstance(job.target, PythonTarget) and job.target.ref.partition(":")[0] == module
