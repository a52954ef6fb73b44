"""`pysched sync MODULE`: the store made to hold the module's declared jobs."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Annotated

import typer

from pysched.cli.common import (
    DEFAULT_DB,
    ConfigOption,
    DbOption,
    JsonOption,
    echo_json,
    fail,
    open_client,
    warn_without_scheduler,
)
from pysched.cli.jobs import describe_next_run
from pysched.client import Client
from pysched.declare import InvalidDeclaration, declared_jobs
from pysched.problems import InvalidJob
from pysched.protocols import JobExists
from pysched.sync import SyncReport, import_declarations


def sync(
    module: Annotated[
        str, typer.Argument(metavar="MODULE", help="Python module whose @pysched.job functions are the jobs.")
    ],
    prune: Annotated[
        bool, typer.Option("--prune", help="Cancel the jobs of MODULE's functions that it no longer declares.")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would change; change nothing.")] = False,
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Add the jobs MODULE declares with @pysched.job, update those whose
    declaration changed, and leave the rest; run again, it changes nothing."""
    if module.endswith(".py") or "/" in module:
        # A path would be imported as a (relative) name, and fail obscurely.
        hint = _as_module_hint(module) or "; give the module's dotted name"
        fail(f"MODULE: {module!r} is a file's path{hint}")
    # As the workers do: a module named by its dotted name, found from here.
    sys.path.insert(0, str(Path.cwd()))
    try:
        imported = import_declarations(module)
    except InvalidDeclaration as exc:
        fail(str(exc))
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module + ".").startswith(exc.name + "."):
            fail(f"MODULE: no module named {module!r} (from {Path.cwd()}){_as_module_hint(module)}")
        fail(f"MODULE: importing {module} failed: {type(exc).__name__}: {exc}")
    except Exception as exc:
        fail(f"MODULE: importing {module} failed: {type(exc).__name__}: {exc}")
    if config is None and not Path(db).exists() and (dry_run or not declared_jobs(imported)):
        # Nothing stored yet: what a sync would do is add every declaration;
        # with none to add, it creates no database either.
        with tempfile.TemporaryDirectory() as empty:
            _report(
                _synced(
                    open_client(str(Path(empty) / "empty.db"), None, access="create"),
                    module,
                    imported,
                    prune=prune,
                    dry_run=dry_run,
                ),
                as_json,
            )
        return
    client = open_client(db, config, access="read" if dry_run else "create")
    report = _synced(client, module, imported, prune=prune, dry_run=dry_run)
    _report(report, as_json, client)
    if not dry_run and report.added:
        warn_without_scheduler(client.store, db)


def _as_module_hint(module: str) -> str:
    """A file's name given for a module's (`myjobs.py`, `jobs/nightly.py`):
    the dotted name the workers import it by."""
    if not module.endswith(".py"):
        return ""
    dotted = ".".join(Path(module.removesuffix(".py")).parts)
    return f"; give the module's name, without .py: {dotted}"


def _synced(client: Client, module: str, imported: ModuleType, *, prune: bool, dry_run: bool) -> SyncReport:
    try:
        return client.sync(imported, prune=prune, dry_run=dry_run)
    except InvalidJob as exc:
        fail(f"{module}: {'; '.join(str(p) for p in exc.problems)}")
    except JobExists as exc:
        # Added by someone else between the read and the write.
        fail(f"id: {exc}; run sync again")


def _report(report: SyncReport, as_json: bool, client: Client | None = None) -> None:
    """``client``: where the jobs added or updated are, to say when each
    next runs."""
    if as_json:
        echo_json(_report_json(report))
    else:
        _print_report(report, client)


def _report_json(report: SyncReport) -> dict[str, object]:
    return {
        "module": report.module,
        "dry_run": report.dry_run,
        "added": list(report.added),
        "updated": list(report.updated),
        "unchanged": list(report.unchanged),
        "pruned": list(report.pruned),
        "skipped": [{"id": s.job_id, "reason": s.reason} for s in report.skipped],
    }


def _print_report(report: SyncReport, client: Client | None) -> None:
    would = "would be " if report.dry_run else ""
    for verb, ids in (("added", report.added), ("updated", report.updated), ("cancelled", report.pruned)):
        for job_id in ids:
            when = ""
            if client is not None and not report.dry_run and verb != "cancelled":
                when = f": {describe_next_run(client.get(job_id))}"
            typer.echo(f"{would}{verb} {job_id}{when}")
    for skipped in report.skipped:
        typer.echo(f"skipped {skipped.job_id}: {skipped.reason}")
    # Each declaration counted once; a cancellation is of a job no longer declared.
    counts = [
        f"{len(report.added)} {would}added",
        f"{len(report.updated)} {would}updated",
        f"{len(report.unchanged)} unchanged",
    ]
    if report.skipped:
        counts.append(f"{len(report.skipped)} skipped")
    pruned = f"; {len(report.pruned)} no longer declared {would}cancelled" if report.pruned else ""
    typer.echo(f"{report.module}: {report.declared} declared: {', '.join(counts)}{pruned}")


def register_commands(app: typer.Typer) -> None:
    app.command()(sync)
