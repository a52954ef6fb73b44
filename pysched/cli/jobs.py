"""Job commands: add, ls, show, history, cancel, reschedule."""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from pysched import cron
from pysched.cli.common import (
    DEFAULT_DB,
    ConfigOption,
    DbOption,
    JsonOption,
    echo_json,
    fail,
    fail_validation,
    iso,
    job_json,
    open_store,
    run_json,
    warn_without_scheduler,
)
from pysched.model import CronSchedule, Job, OnceSchedule
from pysched.protocols import JobExists, JobNotActive, JobNotFound, JobRecord
from pysched.registry import register, reschedule


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _parse_at(value: str, tz: str | None) -> int:
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        fail(f"--at: not an ISO 8601 time: {value!r}")
    if when.tzinfo is None:
        try:
            when = when.replace(tzinfo=cron.zone(tz)) if tz else when.astimezone()
        except cron.CronError as exc:
            fail(f"--tz: {exc}")
    return int(when.timestamp() * 1000)


def _schedule(cron_expr: str | None, tz: str | None, at: str | None, in_s: float | None) -> dict[str, Any]:
    given = [name for name, v in (("--cron", cron_expr), ("--at", at), ("--in", in_s)) if v is not None]
    if len(given) != 1:
        fail("give exactly one of --cron, --at, --in" + (f" (got {', '.join(given)})" if given else ""))
    if cron_expr is not None:
        return {"kind": "cron", "expr": cron_expr, "tz": tz or "UTC"}
    now = _now_ms()
    if in_s is not None:
        if in_s < 0:
            fail(f"--in: must not be negative, got {in_s}")
        return {"kind": "once", "run_at_ms": now + round(in_s * 1000)}
    assert at is not None
    run_at = _parse_at(at, tz)
    if run_at < now - 1_000:
        fail(f"--at: {iso(run_at)} is in the past")
    return {"kind": "once", "run_at_ms": run_at}


def _target(shell: str | None, python: str | None, http: str | None, method: str) -> dict[str, Any]:
    given = [name for name, v in (("--shell", shell), ("--python", python), ("--http", http)) if v is not None]
    if len(given) != 1:
        fail("give exactly one of --shell, --python, --http" + (f" (got {', '.join(given)})" if given else ""))
    if shell is not None:
        return {"kind": "shell", "command": shell}
    if python is not None:
        return {"kind": "python", "ref": python}
    return {"kind": "http", "url": http, "method": method.upper()}


def _describe(rec: JobRecord) -> str:
    sched = rec.job.schedule
    if isinstance(sched, CronSchedule):
        return f"cron {sched.expr!r} {sched.tz}"
    return f"once at {iso(sched.run_at_ms)}"


def _print_job(rec: JobRecord, as_json: bool, verb: str) -> None:
    if as_json:
        echo_json(job_json(rec))
        return
    nxt = f"next run {iso(rec.next_run.due_ms)}" if rec.next_run else "no further runs"
    jitter = f" (+{rec.jitter_ms} ms jitter)" if rec.jitter_ms else ""
    typer.echo(f"{verb} {rec.job.id}: {_describe(rec)}; {nxt}{jitter}")


def add(
    job_id: Annotated[str, typer.Argument(metavar="ID", help="Job id: letters, digits, '.', '_', '-'.")],
    cron_expr: Annotated[
        str | None, typer.Option("--cron", help="Cron expression, 5 fields or 6 with seconds first.")
    ] = None,
    tz: Annotated[str | None, typer.Option("--tz", help="Time zone of --cron (and of a naive --at).")] = None,
    at: Annotated[str | None, typer.Option("--at", help="One run at this ISO 8601 time.")] = None,
    in_s: Annotated[float | None, typer.Option("--in", help="One run this many seconds from now.")] = None,
    shell: Annotated[str | None, typer.Option("--shell", help="Shell command to run.")] = None,
    python: Annotated[str | None, typer.Option("--python", help="module:function to call with a RunContext.")] = None,
    http: Annotated[str | None, typer.Option("--http", help="URL to call, with an Idempotency-Key header.")] = None,
    method: Annotated[str, typer.Option("--method", help="HTTP method for --http.")] = "POST",
    payload: Annotated[str | None, typer.Option("--payload", help="JSON object handed to the target.")] = None,
    jitter: Annotated[
        float | None, typer.Option("--jitter", help="Jitter window in seconds (cron default 60).")
    ] = None,
    critical: Annotated[bool, typer.Option("--critical", help="Time-critical: no jitter.")] = False,
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Register a job; acknowledged once it is committed."""
    spec: dict[str, Any] = {
        "id": job_id,
        "schedule": _schedule(cron_expr, tz, at, in_s),
        "target": _target(shell, python, http, method),
        "critical": critical,
    }
    if jitter is not None:
        spec["jitter_window_s"] = jitter
    if payload is not None:
        try:
            spec["payload"] = json.loads(payload)
        except json.JSONDecodeError as exc:
            fail(f"--payload: not JSON: {exc}")
    try:
        job = Job.model_validate(spec)
    except ValidationError as exc:
        fail_validation(exc)
    store = open_store(db, config, access="create")
    try:
        rec = register(store, job, _now_ms())
    except JobExists as exc:
        fail(f"id: {exc}")
    _print_job(rec, as_json, "added")
    warn_without_scheduler(store, db)


def ls(db: DbOption = DEFAULT_DB, config: ConfigOption = None, as_json: JsonOption = False) -> None:
    """List jobs."""
    records = open_store(db, config, access="read").list_jobs()
    if as_json:
        echo_json([job_json(r) for r in records])
        return
    table = Table("id", "state", "schedule", "target", "next run")
    for r in records:
        table.add_row(r.job.id, r.state, _describe(r), r.job.target.kind, iso(r.next_run.due_ms) if r.next_run else "-")
    Console().print(table)


def show(
    job_id: Annotated[str, typer.Argument(metavar="ID")],
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one job."""
    store = open_store(db, config, access="read")
    try:
        rec = store.get_job(job_id)
    except JobNotFound as exc:
        fail(str(exc), 1)
    data = job_json(rec)
    last = store.history(job_id, 1)
    data["last_run"] = run_json(last[0]) if last else None
    if as_json:
        echo_json(data)
        return
    for key, value in data.items():
        typer.echo(f"{key:>14}: {json.dumps(value) if isinstance(value, dict) else value}")


def history(
    job_id: Annotated[str, typer.Argument(metavar="ID")],
    limit: Annotated[int, typer.Option("--limit", min=1, help="Newest runs to show.")] = 50,
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Runs of a job, newest first, with their fire lag."""
    try:
        runs = open_store(db, config, access="read").history(job_id, limit)
    except JobNotFound as exc:
        fail(str(exc), 1)
    if as_json:
        echo_json([run_json(r) for r in runs])
        return
    table = Table("run_at", "state", "fire lag ms", "duration ms", "attempt", "fence", "error")
    for r in runs:
        j = run_json(r)
        table.add_row(
            j["run_at"],
            j["state"],
            str(j["fire_lag_ms"]),
            str(j["duration_ms"]),
            str(j["attempt"]),
            str(j["fence"]),
            j["error"] or "",
        )
    Console().print(table)


def cancel(
    job_id: Annotated[str, typer.Argument(metavar="ID")],
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a job's pending runs; its history stays."""
    try:
        rec = open_store(db, config, access="write").cancel_job(job_id, _now_ms())
    except JobNotFound as exc:
        fail(str(exc), 1)
    except JobNotActive as exc:
        fail(str(exc))
    _print_job(rec, as_json, "cancelled")


def reschedule_cmd(
    job_id: Annotated[str, typer.Argument(metavar="ID")],
    cron_expr: Annotated[str | None, typer.Option("--cron", help="New cron expression.")] = None,
    tz: Annotated[str | None, typer.Option("--tz", help="Time zone of --cron.")] = None,
    at: Annotated[str | None, typer.Option("--at", help="New one-shot ISO 8601 time.")] = None,
    in_s: Annotated[float | None, typer.Option("--in", help="New one-shot delay in seconds.")] = None,
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Give a job a new schedule; pending runs are replaced."""
    spec = _schedule(cron_expr, tz, at, in_s)
    try:
        schedule: CronSchedule | OnceSchedule = (
            CronSchedule.model_validate(spec) if spec["kind"] == "cron" else OnceSchedule.model_validate(spec)
        )
    except ValidationError as exc:
        fail_validation(exc)
    try:
        rec = reschedule(open_store(db, config, access="write"), job_id, schedule, _now_ms())
    except JobNotFound as exc:
        fail(str(exc), 1)
    except JobNotActive as exc:
        fail(str(exc))
    _print_job(rec, as_json, "rescheduled")


def register_commands(app: typer.Typer) -> None:
    app.command()(add)
    app.command()(ls)
    app.command()(show)
    app.command()(history)
    app.command()(cancel)
    app.command("reschedule")(reschedule_cmd)
