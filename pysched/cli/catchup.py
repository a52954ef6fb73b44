"""`pysched catch-up --dry-run`: what a leader starting now would replay,
per job, by each job's catch-up policy."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from pysched.catchup import replay
from pysched.cli.common import (
    CLOCK,
    DEFAULT_DB,
    ConfigOption,
    DbOption,
    JsonOption,
    console,
    echo_json,
    fail,
    open_store,
)
from pysched.views import iso


def catch_up(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would be replayed; nothing is changed (the only mode).")
    ] = False,
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """The active jobs whose next run is overdue (no leader has fired it),
    and what their catch-up policies make of it when a leader comes: runs
    handed on (through the catch-up lane) and schedule times missed."""
    if not dry_run:
        fail("catch-up: a leader catches up by itself when it starts; --dry-run shows what it would replay")
    store = open_store(db, config, access="read")
    now = CLOCK.now_ms()
    rows: list[dict[str, Any]] = []
    for rec in store.list_jobs():
        if rec.state != "active" or rec.next_run is None or rec.next_run.due_ms >= now:
            continue
        plan = replay(rec.job, rec.jitter_ms, rec.next_run, now)
        rows.append(
            {
                "id": rec.job.id,
                "catch_up": rec.job.catch_up,
                "overdue_since": iso(rec.next_run.due_ms),
                "runs": plan.runs,
                "missed": plan.missed,
                "missed_reason": plan.reason if plan.missed else None,
            }
        )
    if as_json:
        echo_json(rows)
        return
    if not rows:
        typer.echo("nothing overdue: a leader starting now replays nothing")
        return
    table = Table("ID", "CATCH-UP", "OVERDUE SINCE", "RUNS", "MISSED")
    for r in rows:
        missed = f"{r['missed']} {r['missed_reason'].replace('_', ' ')}" if r["missed"] else "0"
        table.add_row(r["id"], r["catch_up"], r["overdue_since"], str(r["runs"]), missed)
    console().print(table)


def register_commands(app: typer.Typer) -> None:
    app.command("catch-up")(catch_up)
