"""Dead letters: runs that failed for good, to look at and run again."""

from __future__ import annotations

import re
from typing import Annotated

import typer
from rich.table import Table

from pysched.cli.common import (
    DEFAULT_DB,
    EXIT_NO_SUCH_JOB,
    ConfigOption,
    DbOption,
    JsonOption,
    console,
    echo_json,
    fail,
    open_client,
)
from pysched.client import Client, RunKey
from pysched.downstream import downstream_of
from pysched.protocols import JobNotFound, RunNotFound
from pysched.views import dead_letter_json, iso

app = typer.Typer(no_args_is_help=True, rich_markup_mode="markdown", help="Dead letters: runs that failed for good.")

RUN_HELP = "The run's key, JOB:RUN_AT_MS:GROUP, as `pysched dlq ls` shows it."
_LIMIT = 100_000
_TARGET = re.compile(r"^[!-~]{1,200}$")


def _run_key(value: str) -> RunKey:
    try:
        return RunKey.parse(value)
    except ValueError as exc:
        fail(f"RUN: {exc}")


def _target(value: str | None) -> str | None:
    if value is not None and not _TARGET.match(value):
        fail(f"--target: a downstream: a job's --downstream, http:HOST[:PORT] or job:ID; got {value!r}")
    return value


def _downstream(client: Client, job_id: str) -> str | None:
    try:
        return downstream_of(client.get(job_id).job)
    except JobNotFound:
        return None


@app.command("ls")
def ls(
    target: Annotated[
        str | None,
        typer.Option(
            "--target",
            help="Only runs whose job calls this downstream: a job's --downstream, http:HOST[:PORT] or job:ID.",
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=_LIMIT, help="Newest dead letters to show.")] = 1000,
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """List dead letters, newest failure first."""
    target = _target(target)
    client = open_client(db, config, access="read")
    runs = client.dead_letters(limit)
    if target is not None:
        runs = [r for r in runs if _downstream(client, r.job_id) == target]
    if as_json:
        echo_json([dead_letter_json(r) for r in runs])
        return
    if not runs:
        # An empty table's header reads as a broken listing.
        typer.echo("no dead letters" + ("" if target is None else f" of {target}"))
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
    key = _run_key(run)
    client = open_client(db, config, access="read")
    try:
        record = client.get_run(key)
    except RunNotFound as exc:
        fail(str(exc), EXIT_NO_SUCH_JOB)
    data = dead_letter_json(record)
    if as_json:
        echo_json(data)
        return
    typer.echo(f"{record.idempotency_key}: {record.state}, attempt {record.attempt}, due {iso(record.due_ms)}")
    if not data["failures"]:
        typer.echo("no failed attempts")
        return
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
    client = open_client(db, config, access="write")
    if all_runs:
        dead = client.dead_letters(_LIMIT)
        if target is not None:
            dead = [r for r in dead if _downstream(client, r.job_id) == target]
        keys = [RunKey.of(r) for r in dead]
    outcome = client.redrive(keys)
    done = [str(k) for k in outcome.redriven]
    missed = [str(k) for k in outcome.not_dead_letters]
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
