"""pysched: a distributed job scheduler for Python.

    import pysched

    @pysched.job(cron="0 9 * * 1-5", tz="Europe/Paris")
    def report(ctx: pysched.RunContext) -> None: ...

    pysched.Client().sync(__name__)       # or: pysched sync MODULE

The names below are imported on first use: a worker's child process that
imports a job's module pays only for what it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pysched.admission import JobRejected
    from pysched.client import AddedMany, Client, Fire, Preview, Redriven, RunKey
    from pysched.declare import InvalidDeclaration, job
    from pysched.model import (
        CronSchedule,
        HttpTarget,
        IntervalSchedule,
        Job,
        OnceSchedule,
        PythonTarget,
        RetryPolicy,
        ShellTarget,
        SloPolicy,
        TemporalTarget,
    )
    from pysched.problems import InvalidJob, Problem
    from pysched.protocols import JobExists, JobNotActive, JobNotFound, JobRecord, RunNotFound, RunRecord
    from pysched.scheduler import Scheduler, SchedulerStopped
    from pysched.slo import SloReport
    from pysched.stores.sqlite_db import DatabaseUnusable
    from pysched.sync import Skipped, SyncReport
    from pysched.targets import RunContext

# Each public name and the module it lives in.
_HOMES = {
    "Client": "pysched.client",
    "AddedMany": "pysched.client",
    "Fire": "pysched.client",
    "Preview": "pysched.client",
    "Redriven": "pysched.client",
    "RunKey": "pysched.client",
    "job": "pysched.declare",
    "InvalidDeclaration": "pysched.declare",
    "Scheduler": "pysched.scheduler",
    "SchedulerStopped": "pysched.scheduler",
    "SyncReport": "pysched.sync",
    "Skipped": "pysched.sync",
    "RunContext": "pysched.targets",
    "Job": "pysched.model",
    "CronSchedule": "pysched.model",
    "IntervalSchedule": "pysched.model",
    "OnceSchedule": "pysched.model",
    "ShellTarget": "pysched.model",
    "PythonTarget": "pysched.model",
    "HttpTarget": "pysched.model",
    "TemporalTarget": "pysched.model",
    "RetryPolicy": "pysched.model",
    "SloPolicy": "pysched.model",
    "SloReport": "pysched.slo",
    "JobRecord": "pysched.protocols",
    "RunRecord": "pysched.protocols",
    "JobExists": "pysched.protocols",
    "JobNotFound": "pysched.protocols",
    "JobNotActive": "pysched.protocols",
    "RunNotFound": "pysched.protocols",
    "InvalidJob": "pysched.problems",
    "Problem": "pysched.problems",
    "JobRejected": "pysched.admission",
    "DatabaseUnusable": "pysched.stores.sqlite_db",
}

__all__ = [
    "AddedMany",
    "Client",
    "CronSchedule",
    "DatabaseUnusable",
    "Fire",
    "HttpTarget",
    "IntervalSchedule",
    "InvalidDeclaration",
    "InvalidJob",
    "Job",
    "JobExists",
    "JobNotActive",
    "JobNotFound",
    "JobRecord",
    "JobRejected",
    "OnceSchedule",
    "Preview",
    "Problem",
    "PythonTarget",
    "Redriven",
    "RetryPolicy",
    "RunContext",
    "RunKey",
    "RunNotFound",
    "RunRecord",
    "Scheduler",
    "SchedulerStopped",
    "ShellTarget",
    "Skipped",
    "SloPolicy",
    "SloReport",
    "SyncReport",
    "TemporalTarget",
    "job",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'pysched' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
