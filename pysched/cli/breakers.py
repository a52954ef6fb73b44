"""`pysched breakers`: each downstream's circuit breaker and retry budget."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from pysched.breakers import BreakerPolicy, breaker_state, retries_allowed, window_start
from pysched.cli.common import (
    CLOCK,
    DEFAULT_DB,
    ConfigOption,
    DbOption,
    JsonOption,
    console,
    echo_json,
    open_store,
)
from pysched.protocols import BreakerRow, ScheduleStore
from pysched.views import iso


def budget_json(store: ScheduleStore, downstream: str, now_ms: int, policy: BreakerPolicy) -> dict[str, int]:
    """A downstream's retry budget over the last minute, as
    breakers.retry_allowed counts it (with ``policy``: the defaults, unless
    the nodes were given another)."""
    counts = store.attempt_counts(downstream, window_start(now_ms, policy))
    calls = sum(c.calls for c in counts)
    retries = sum(c.retries for c in counts)
    return {
        "calls_last_minute": calls,
        "retries_last_minute": retries,
        "retry_budget_last_minute": retries_allowed(max(0, calls - retries), policy),
    }


def _breaker_json(store: ScheduleStore, row: BreakerRow, now_ms: int, policy: BreakerPolicy) -> dict[str, Any]:
    return {
        "downstream": row.downstream,
        "state": breaker_state(row, now_ms),
        "consecutive_failures": row.failures,
        "opened_at": iso(row.opened_at_ms) if row.state == "open" else None,
        "reopens_at": iso(row.reopens_at_ms) if row.state == "open" else None,
        "probe_until": iso(row.probe_until_ms) if row.state == "open" else None,
        **budget_json(store, row.downstream, now_ms, policy),
    }


def breakers(db: DbOption = DEFAULT_DB, config: ConfigOption = None, as_json: JsonOption = False) -> None:
    """Each downstream's circuit breaker (closed, open or half-open; its
    failures in a row; when it opened and reopens) and its retry budget
    over the last minute (retries granted of those allowed)."""
    store = open_store(db, config, access="read")
    now = CLOCK.now_ms()
    policy = BreakerPolicy()
    rows = [_breaker_json(store, row, now, policy) for row in store.breakers()]
    if as_json:
        echo_json(rows)
        return
    if not rows:
        typer.echo("no breakers yet: no run has failed against a downstream")
        return
    table = Table("DOWNSTREAM", "STATE", "FAILURES", "OPENED", "REOPENS", "RETRIES/BUDGET", "CALLS (1 min)")
    for r in rows:
        table.add_row(
            r["downstream"],
            r["state"],
            str(r["consecutive_failures"]),
            r["opened_at"] or "-",
            r["reopens_at"] or "-",
            f"{r['retries_last_minute']}/{r['retry_budget_last_minute']}",
            str(r["calls_last_minute"]),
        )
    console().print(table)


def register_commands(root: typer.Typer) -> None:
    root.command()(breakers)
