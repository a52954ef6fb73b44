"""`pysched preview`: the next fires of an expression, an interval or a
registered job, with what the DST rule did to each."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from pysched import cron, recurrence
from pysched.cli.common import (
    CLOCK,
    DEFAULT_DB,
    EXIT_NO_SUCH_JOB,
    ConfigOption,
    DbOption,
    JsonOption,
    console,
    echo_json,
    every_seconds,
    fail,
    fail_invalid,
    open_store,
    unopened_client,
)
from pysched.client import Fire, coming_fires
from pysched.model import CronSchedule
from pysched.problems import InvalidJob
from pysched.protocols import JobNotFound

MAX_COUNT = 1_000


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _local(ms: int, tz: str) -> str:
    return datetime.fromtimestamp(ms / 1000, cron.zone(tz)).isoformat(timespec="seconds")


def _time_ms(value: str, tz: str, flag: str) -> int:
    """--from or --start as epoch ms (a naive time is read in the zone)."""
    try:
        when = datetime.fromisoformat(value)
        if when.tzinfo is None:
            when = when.replace(tzinfo=cron.zone(tz))
        at_ms = int(when.timestamp() * 1000)
    except (ValueError, OverflowError, OSError):
        fail(f"{flag}: not an ISO 8601 time: {value!r}")
    # Schedules are evaluated from 1970 to 9000 (and a hundred years on).
    if not 0 <= at_ms < _YEAR_9000_MS:
        fail(f"{flag}: {value!r} is outside 1970-01-01 to 9000-01-01")
    return at_ms


_YEAR_9000_MS = int(datetime(9000, 1, 1, tzinfo=UTC).timestamp() * 1000)


def _rows(fires: tuple[Fire, ...], tz: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for fire in fires:
        row: dict[str, Any] = {"local": _local(fire.at_ms, tz), "utc": _utc(fire.at_ms)}
        if fire.due_ms is not None:
            row["due_utc"] = _utc(fire.due_ms)
        row["dst"] = fire.dst
        out.append(row)
    return out


def preview(
    job_id: Annotated[
        str | None, typer.Argument(metavar="[ID]", help="A registered job (else give --cron or --every).")
    ] = None,
    cron_expr: Annotated[str | None, typer.Option("--cron", help="Cron expression to preview.")] = None,
    every: Annotated[
        str | None, typer.Option("--every", metavar="DURATION", help="Interval to preview, such as 90s, 5m, 1h30m.")
    ] = None,
    tz: Annotated[
        str | None, typer.Option("--tz", help="Time zone of --cron, and of the times shown (default UTC).")
    ] = None,
    count: Annotated[int, typer.Option("--count", min=1, max=MAX_COUNT, help="How many fires.")] = 10,
    after: Annotated[
        str | None, typer.Option("--from", help="ISO 8601 time to start after (naive: in the zone); default now.")
    ] = None,
    start: Annotated[
        str | None,
        typer.Option("--start", help="ISO 8601 time of --every's first run (naive: in the zone), as `add` takes it."),
    ] = None,
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """The next fires as local and UTC times (and a job's jittered due
    times), marking those the DST rule moved, merged or repeated."""
    jitter_ms: int | None = None
    # As `add` says it: --start alone is no schedule of its own.
    if start is not None and every is None:
        fail("--start: goes with --every")
    given = [name for name, value in (("ID", job_id), ("--cron", cron_expr), ("--every", every)) if value]
    if len(given) != 1:
        fail("give one of a job ID, --cron and --every" + (f" (got {', '.join(given)})" if given else ""))
    schedule: recurrence.Recurring
    if job_id is not None:
        if tz is not None:
            fail("--tz: a registered job has its own zone")
        try:
            rec = open_store(db, config, access="read").get_job(job_id)
        except JobNotFound as exc:
            fail(str(exc), EXIT_NO_SUCH_JOB)
        sched = rec.job.schedule
        if not recurrence.is_recurring(sched):
            fail(f"{job_id}: a one-shot job, not a recurring schedule: its one run is {_utc(sched.run_at_ms)}")
        if rec.state in ("cancelled", "completed"):
            # Its schedule would go on; the job does not.
            if as_json:
                echo_json({**_schedule_json(sched), "state": rec.state, "fires": []})
            else:
                typer.echo(f"{job_id} is {rec.state}: it fires no more")
            return
        schedule, jitter_ms = sched, rec.jitter_ms
        zone_name = sched.tz if isinstance(sched, CronSchedule) else "UTC"
    else:
        zone_name = tz or "UTC"
        try:
            cron.zone(zone_name)
        except cron.CronError as exc:
            fail(f"--tz: {exc}")
        if every is not None:
            # The interval as Client.preview counts it; it needs no database.
            every_s = every_seconds(every)
            start_ms = None if start is None else _time_ms(start, zone_name, "--start")
            try:
                shown = unopened_client(db, config, access="read").preview(
                    every=every_s, start_ms=start_ms, count=count, after_ms=_after_ms(after, zone_name)
                )
            except InvalidJob as exc:
                fail_invalid(exc)
            rows = _rows(shown.fires, zone_name)
            _show(shown.schedule, None, zone_name, rows, as_json)
            return
        assert cron_expr is not None
        try:
            cron.validate(cron_expr, zone_name)
        except cron.CronError as exc:
            fail(f"--cron: {exc}")
        schedule = CronSchedule(expr=cron_expr, tz=zone_name)
    rows = _rows(coming_fires(schedule, _after_ms(after, zone_name), count, jitter_ms), zone_name)
    _show(schedule, jitter_ms, zone_name, rows, as_json)


def _after_ms(after: str | None, tz: str) -> int:
    return CLOCK.now_ms() if after is None else _time_ms(after, tz, "--from")


def _show(
    schedule: recurrence.Recurring, jitter_ms: int | None, zone_name: str, rows: list[dict[str, Any]], as_json: bool
) -> None:
    if as_json:
        echo_json({**_schedule_json(schedule), "jitter_ms": jitter_ms, "fires": rows})
        return
    columns = [f"local ({zone_name})", "UTC"] + (["due (UTC)"] if jitter_ms is not None else []) + ["DST"]
    table = Table(*columns)
    for row in rows:
        table.add_row(*(row[k] for k in ("local", "utc", "due_utc") if k in row), row["dst"] or "-")
    console().print(table)
    if not rows:
        typer.echo("no fires within the next 100 years")


def _schedule_json(schedule: recurrence.Recurring) -> dict[str, Any]:
    if isinstance(schedule, CronSchedule):
        return {"expr": schedule.expr, "tz": schedule.tz}
    return {"every_s": schedule.every_s, "start_utc": None if schedule.start_ms is None else _utc(schedule.start_ms)}


def register_commands(app: typer.Typer) -> None:
    app.command()(preview)
