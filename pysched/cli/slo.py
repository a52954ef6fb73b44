"""`pysched slo`: each job's fire-lag objective, attainment and burn rates."""

from __future__ import annotations

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
from pysched.protocols import JobNotFound
from pysched.views import iso, slo_json


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.3%}"


def _budget_left(value: float | None) -> str:
    """What is left of the error budget; spent past it, how many budgets'
    worth of late runs there were (-99 left is 100 budgets spent)."""
    if value is None or value >= 0:
        return _share(value)
    return f"none: {1 - value:.3g}x spent"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def slo(
    job_id: Annotated[
        str | None, typer.Argument(metavar="[ID]", help="One job (default: every job not cancelled).")
    ] = None,
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Fire-lag objectives: the share of each job's runs handed on within
    its target (--slo-fire-lag, default 1 s) against its objective
    (--slo-objective, default 0.99) over its window (default 30 days, within
    the history the store keeps), what is left of the error budget, and
    burn rates over the last 1 h, 6 h and 3 days (1: spent exactly by the
    window's end; above 1, faster)."""
    client = open_client(db, config, access="read")
    try:
        reports = [client.slo(job_id)] if job_id is not None else client.slos()
    except JobNotFound as exc:
        fail(str(exc), EXIT_NO_SUCH_JOB)
    if as_json:
        echo_json(slo_json(reports[0]) if job_id is not None else [slo_json(r) for r in reports])
        return
    table = Table(
        "job", "target", "objective", "runs since", "runs", "late", "attainment", "budget left", "burn 1h", "burn 6h",
        "burn 3d", "met",
    )  # fmt: skip
    for r in reports:
        burns = {b.window: b.rate for b in r.burn_rates}
        table.add_row(
            r.job_id,
            f"{r.fire_lag_ms / 1000:g} s",
            f"{r.objective:.3%} / {r.window_days} d",
            # How far back the store's history let the window reach.
            iso(r.oldest_due_ms) or "-",
            str(r.runs),
            str(r.late),
            _share(r.attainment),
            _budget_left(r.budget_remaining),
            _rate(burns["1h"]),
            _rate(burns["6h"]),
            _rate(burns["3d"]),
            {True: "yes", False: "NO", None: "-"}[r.met],
        )
    console().print(table)


def register_commands(app: typer.Typer) -> None:
    app.command()(slo)
