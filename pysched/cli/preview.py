"""`pysched preview`: the next fires of an expression or a registered job,
with what the DST rule did to each."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from pysched import cron
from pysched.cli.common import (
    CLOCK,
    DEFAULT_DB,
    EXIT_NO_SUCH_JOB,
    ConfigOption,
    DbOption,
    JsonOption,
    console,
    echo_json,
    fail,
    open_store,
)
from pysched.client import coming_fires
from pysched.model import CronSchedule
from pysched.protocols import JobNotFound

MAX_COUNT = 1_000


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _local(ms: int, tz: str) -> str:
    return datetime.fromtimestamp(ms / 1000, cron.zone(tz)).isoformat(timespec="seconds")


def _start(value: str | None, tz: str) -> int:
    """--from as epoch ms (a naive time is read in the schedule's zone), or now."""
    if value is None:
        return CLOCK.now_ms()
    try:
        when = datetime.fromisoformat(value)
        if when.tzinfo is None:
            when = when.replace(tzinfo=cron.zone(tz))
        at_ms = int(when.timestamp() * 1000)
    except (ValueError, OverflowError, OSError):
        fail(f"--from: not an ISO 8601 time: {value!r}")
    # Schedules are evaluated from 1970 to 9000 (and a hundred years on).
    if not 0 <= at_ms < _YEAR_9000_MS:
        fail(f"--from: {value!r} is outside 1970-01-01 to 9000-01-01")
    return at_ms


_YEAR_9000_MS = int(datetime(9000, 1, 1, tzinfo=UTC).timestamp() * 1000)


def _fires(expr: str, tz: str, after_ms: int, count: int, jitter_ms: int | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for fire in coming_fires(expr, tz, after_ms, count, jitter_ms):
        row: dict[str, Any] = {"local": _local(fire.at_ms, tz), "utc": _utc(fire.at_ms)}
        if fire.due_ms is not None:
            row["due_utc"] = _utc(fire.due_ms)
        row["dst"] = fire.dst
        out.append(row)
    return out


def preview(
    job_id: Annotated[str | None, typer.Argument(metavar="[ID]", help="A registered job (else give --cron).")] = None,
    cron_expr: Annotated[str | None, typer.Option("--cron", help="Cron expression to preview.")] = None,
    tz: Annotated[str | None, typer.Option("--tz", help="Time zone of --cron (default UTC).")] = None,
    count: Annotated[int, typer.Option("--count", min=1, max=MAX_COUNT, help="How many fires.")] = 10,
    start: Annotated[
        str | None, typer.Option("--from", help="ISO 8601 time to start after (naive: in the zone); default now.")
    ] = None,
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """The next fires as local and UTC times (and a job's jittered due
    times), marking those the DST rule moved, merged or repeated."""
    jitter_ms: int | None = None
    if (job_id is None) == (cron_expr is None):
        fail("give a job ID or --cron, not both" if job_id else "give a job ID or --cron")
    if job_id is not None:
        if tz is not None:
            fail("--tz: a registered job has its own zone")
        try:
            rec = open_store(db, config, access="read").get_job(job_id)
        except JobNotFound as exc:
            fail(str(exc), EXIT_NO_SUCH_JOB)
        if rec.state in ("cancelled", "completed") and isinstance(rec.job.schedule, CronSchedule):
            # Its schedule would go on; the job does not.
            if as_json:
                echo_json({"expr": rec.job.schedule.expr, "tz": rec.job.schedule.tz, "state": rec.state, "fires": []})
            else:
                typer.echo(f"{job_id} is {rec.state}: it fires no more")
            return
        if not isinstance(rec.job.schedule, CronSchedule):
            fail(f"{job_id}: a one-shot job, not a cron schedule: its one run is {_utc(rec.job.schedule.run_at_ms)}")
        cron_expr, zone_name, jitter_ms = rec.job.schedule.expr, rec.job.schedule.tz, rec.jitter_ms
    else:
        assert cron_expr is not None
        zone_name = tz or "UTC"
        try:
            cron.zone(zone_name)
        except cron.CronError as exc:
            fail(f"--tz: {exc}")
        try:
            cron.validate(cron_expr, zone_name)
        except cron.CronError as exc:
            fail(f"--cron: {exc}")
    rows = _fires(cron_expr, zone_name, _start(start, zone_name), count, jitter_ms)
    if as_json:
        echo_json({"expr": cron_expr, "tz": zone_name, "jitter_ms": jitter_ms, "fires": rows})
        return
    columns = [f"local ({zone_name})", "UTC"] + (["due (UTC)"] if jitter_ms is not None else []) + ["DST"]
    table = Table(*columns)
    for row in rows:
        table.add_row(*(row[k] for k in ("local", "utc", "due_utc") if k in row), row["dst"] or "-")
    console().print(table)
    if not rows:
        typer.echo("no fires within the next 100 years")


def register_commands(app: typer.Typer) -> None:
    app.command()(preview)
