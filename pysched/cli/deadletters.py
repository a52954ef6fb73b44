"""Dead letters: runs that failed for good, to look at and run again."""

from __future__ import annotations

import re
from typing import Annotated

import typer
from rich.table import Table

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
from pysched.client import RunKey
from pysched.downstream import downstream_of
from pysched.protocols import JobNotFound, RunNotFound, ScheduleStore
from pysched.views import dead_letter_json, iso

app = typer.Typer(no_args_is_help=True, help="Dead letters: runs that failed for good.")

RUN_HELP = "The run's key, JOB:RUN_AT_MS:GROUP, as `pysched dlq ls` shows it."
_LIMIT = 100_000
_TARGET = re.compile(r"^(http|python|shell):\S.*$")


def _run_key(value: str) -> tuple[str, int, int]:
    try:
        key = RunKey.parse(value)
    except ValueError as exc:
        fail(f"RUN: {exc}")
    return key.job_id, key.run_at_ms, key.attempt_group


def _target(value: str | None) -> str | None:
    if value is not None and not _TARGET.match(value):
        fail(f"--target: a downstream, http:HOST[:PORT], python:MODULE or shell:PROGRAM; got {value!r}")
    return value


def _downstream(store: ScheduleStore, job_id: str) -> str | None:
    try:
        return downstream_of(store.get_job(job_id).job.target)
    except JobNotFound:
        return None


@app.command("ls")
def ls(
    target: Annotated[
        str | None,
        typer.Option(
            "--target",
            help="Only runs whose job calls this downstream: http:HOST[:PORT], python:MODULE or shell:PROGRAM.",
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=_LIMIT, help="Newest dead letters to show.")] = 1000,
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """List dead letters, newest failure first."""
    target = _target(target)
    store = open_store(db, config, access="read")
    runs = store.dead_letters(limit)
    if target is not None:
        runs = [r for r in runs if _downstream(store, r.job_id) == target]
    if as_json:
        echo_json([dead_letter_json(r) for r in runs])
        return
    table = Table("run", "failed at", "attempts", "last error")
    for r in runs:
        table.add_row(r.idempotency_key, iso(r.ended_at_ms) or "-", str(len(r.failures)), r.error or "-")
    console().print(table)


@app.command("show")
def show(
    run: Annotated[str, typer.Argument(metavar="RUN", help=RUN_HELP)],
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """One run with every failed attempt: when, where, and why."""
    job_id, run_at, group = _run_key(run)
    store = open_store(db, config, access="read")
    try:
        record = store.get_run(job_id, run_at, group)
    except RunNotFound as exc:
        fail(str(exc), EXIT_NO_SUCH_JOB)
    data = dead_letter_json(record)
    if as_json:
        echo_json(data)
        return
    typer.echo(f"{record.idempotency_key}: {record.state}, attempt {record.attempt}, due {iso(record.due_ms)}")
    table = Table("attempt", "worker", "started", "ended", "kind", "error")
    for f in data["failures"]:
        table.add_row(
            str(f["attempt"]),
            f["worker"] or "-",
            f["started_at"] or "-",
            f["ended_at"] or "-",
            f["kind"] or "-",
            f["error"] or "-",
        )
    console().print(table)


@app.command("redrive")
def redrive(
    runs: Annotated[list[str] | None, typer.Argument(metavar="[RUN]...", help=RUN_HELP)] = None,
    all_runs: Annotated[bool, typer.Option("--all", help="Every dead letter (of --target, if given).")] = False,
    target: Annotated[str | None, typer.Option("--target", help="With --all: only this downstream's.")] = None,
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run dead letters again, at once, as their next attempt (same
    idempotency key: an effect that did commit is not repeated)."""
    if bool(runs) == all_runs:
        fail("RUN: give run keys or --all, not both" if runs else "RUN: give run keys, or --all")
    if target is not None and not all_runs:
        fail("--target: applies only with --all")
    target = _target(target)
    keys = [_run_key(r) for r in runs or []]
    store = open_store(db, config, access="write")
    if all_runs:
        dead = store.dead_letters(_LIMIT)
        if target is not None:
            dead = [r for r in dead if _downstream(store, r.job_id) == target]
        keys = [(r.job_id, r.run_at_ms, r.attempt_group) for r in dead]
    now = CLOCK.now_ms()
    done = [f"{j}:{t}:{g}" for j, t, g in keys if store.redrive(j, t, g, now)]
    missed = [f"{j}:{t}:{g}" for j, t, g in keys if f"{j}:{t}:{g}" not in done]
    if as_json:
        echo_json({"redriven": done, "not_dead_letters": missed})
    else:
        if all_runs and not keys:
            typer.echo("no dead letters to redrive" + ("" if target is None else f" of {target}"))
        for key in done:
            typer.echo(f"redriven {key}")
        for key in missed:
            typer.echo(f"error: not a dead letter (none of that key, or not failed for good): {key}", err=True)
    if missed and not all_runs:
        raise typer.Exit(EXIT_NO_SUCH_JOB)


def register_commands(root: typer.Typer) -> None:
    root.add_typer(app, name="dlq")
