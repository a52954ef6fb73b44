"""Jobs and runs as JSON: what `--json` prints and the HTTP API returns."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from pysched.downstream import downstream_of
from pysched.protocols import FailedAttempt, JobRecord, RunRecord, shows_an_earlier_dispatch
from pysched.slo import SloReport


def iso(ms: int | None) -> str | None:
    """A stored time in the machine's zone; any stored value can be shown,
    even one no date can express."""
    if ms is None:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000).astimezone().isoformat(timespec="milliseconds")
    except (ValueError, OverflowError, OSError):
        return f"{ms} ms after 1970-01-01T00:00Z"


def job_json(rec: JobRecord) -> dict[str, Any]:
    return {
        "id": rec.job.id,
        "state": rec.state,
        "schedule": rec.job.schedule.model_dump(),
        "target": rec.job.target.model_dump(),
        "payload": rec.job.payload,
        "critical": rec.job.critical,
        "retry": rec.job.retry.model_dump(),
        "catch_up": rec.job.catch_up,
        "max_delay_s": rec.job.max_delay_ms / 1000,
        "overlap": rec.job.overlap,
        "downstream": downstream_of(rec.job),
        "slo": rec.job.slo.model_dump(),
        "jitter_ms": rec.jitter_ms,
        "partition": rec.partition,
        "created_at": iso(rec.created_at_ms),
        "next_run_at": iso(rec.next_run.run_at_ms) if rec.next_run else None,
        "next_due_at": iso(rec.next_run.due_ms) if rec.next_run else None,
    }


def run_json(run: RunRecord) -> dict[str, Any]:
    if shows_an_earlier_dispatch(run):
        run = replace(run, dispatched_at_ms=None, started_at_ms=None)
    return {
        "run_id": run.run_id,
        "state": run.state,
        "run_at": iso(run.run_at_ms),
        "due_at": iso(run.due_ms),
        "dispatched_at": iso(run.dispatched_at_ms),
        "started_at": iso(run.started_at_ms),
        "ended_at": iso(run.ended_at_ms),
        # How late the run left the scheduler against its (jittered) target.
        "fire_lag_ms": None if run.dispatched_at_ms is None else run.dispatched_at_ms - run.due_ms,
        "start_lag_ms": None if run.started_at_ms is None else run.started_at_ms - run.due_ms,
        "duration_ms": None
        if run.started_at_ms is None or run.ended_at_ms is None
        else run.ended_at_ms - run.started_at_ms,
        "attempt": run.attempt,
        "fence": run.fence,
        "worker": run.worker,
        "error": run.error,
        "result": run.result,
    }


def last_run_json(run: RunRecord | None) -> dict[str, Any] | None:
    """A job's last run, or None before its first (`ls`, `show`, the API)."""
    return None if run is None else run_json(run)


def failure_json(failure: FailedAttempt) -> dict[str, Any]:
    return {
        "attempt": failure.attempt,
        "worker": failure.worker,
        "started_at": iso(failure.started_at_ms),
        "ended_at": iso(failure.ended_at_ms),
        "kind": failure.kind,
        "error": failure.error,
        "dead_lettered": failure.dead_lettered,
        "result": failure.result,
    }


def slo_json(report: SloReport) -> dict[str, Any]:
    return {
        "job_id": report.job_id,
        "target_fire_lag_ms": report.fire_lag_ms,
        "objective": report.objective,
        "window_days": report.window_days,
        "runs": report.runs,
        "late": report.late,
        "attainment": report.attainment,
        "met": report.met,
        "error_budget_remaining": report.budget_remaining,
        "burn_rates": {b.window: {"runs": b.runs, "late": b.late, "rate": b.rate} for b in report.burn_rates},
        "oldest_run_due_at": iso(report.oldest_due_ms),
    }


def dead_letter_json(run: RunRecord) -> dict[str, Any]:
    """A run that failed for good, with every failed attempt."""
    return {
        "key": run.idempotency_key,
        "job_id": run.job_id,
        **run_json(run),
        "failures": [failure_json(f) for f in run.failures],
    }
