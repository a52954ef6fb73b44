"""What the command groups share: the --db option, time formatting, errors."""

from __future__ import annotations

import atexit
import errno
import json
import os
import shlex
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from pysched import durations
from pysched.client import Client
from pysched.clock import SystemClock
from pysched.config import ClusterConfig, ConfigError
from pysched.config import load as load_config
from pysched.coord.local import scheduler_seen
from pysched.problems import InvalidJob
from pysched.protocols import (
    PartitionsMismatch,
    ScheduleStore,
)
from pysched.stores.sqlite import SQLiteScheduleStore
from pysched.stores.sqlite_db import Access, DatabaseUnusable

DbOption = Annotated[
    str,
    typer.Option("--db", envvar="PYSCHED_DB", help="SQLite database of the embedded scheduler."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
ConfigOption = Annotated[
    str | None,
    typer.Option(
        "--config", envvar="PYSCHED_CONFIG", help="TOML file naming the cluster's servers; without it, the --db file."
    ),
]
DEFAULT_DB = "pysched.db"

# The CLI's one source of time: every command reads "now" from it.
CLOCK = SystemClock()


# Exit codes: 0 done, 1 an unexpected failure, 2 bad input (nothing changed),
# 3 no such job.
EXIT_BAD_INPUT = 2
EXIT_NO_SUCH_JOB = 3

# The model's field names as the user typed them.
FLAG_FOR_FIELD = {
    "expr": "--cron",
    "tz": "--tz",
    "schedule.expr": "--cron",
    "schedule.tz": "--tz",
    "schedule.run_at_ms": "--at",
    "schedule.every_s": "--every",
    "schedule.start_ms": "--start",
    "target.command": "--shell",
    "target.ref": "--python",
    "target.url": "--http",
    "target.method": "--method",
    "payload": "--payload",
    "jitter_window_s": "--jitter",
    "retry.retries": "--retries",
    "retry.backoff_base_s": "--backoff",
    "retry.backoff_cap_s": "--backoff",
    "retry": "--backoff",
    "retry.retry_on": "--retry-on",
    "target.timeout_s": "--timeout",
    "max_delay_s": "--max-delay",
    "catch_up": "--catch-up",
    "overlap": "--overlap",
    "target.workflow": "--temporal",
    "target.task_queue": "--task-queue",
    "target.args": "--temporal-args",
    "target.namespace": "--temporal-namespace",
    "slo.fire_lag_s": "--slo-fire-lag",
    "slo.objective": "--slo-objective",
    "slo.window_days": "--slo-window",
    "downstream": "--downstream",
}


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def flag_for(field: str) -> str:
    return FLAG_FOR_FIELD.get(field, field)


def fail_invalid(exc: InvalidJob) -> NoReturn:
    """Name each field as the user gave it: '--cron: Bad minute in ...'."""
    fail("; ".join(f"{flag_for(p.field)}: {p.message}" if p.field else p.message for p in exc.problems))


def cluster_config(path: str) -> ClusterConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        fail(f"--config: {exc}")


@contextmanager
def listening(host_flag: str, port_flag: str, host: str, port: int) -> Iterator[None]:
    """Exit 2 for an address a server cannot listen on, naming the flag at
    fault: the host's for a name that resolves to none of this machine's
    addresses, the port's for a port taken or not allowed."""
    try:
        yield
    except socket.gaierror as exc:
        fail(f"{host_flag}: {host!r} is not an address of this machine: {exc.strerror or exc}")
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            fail(f"{host_flag}: {host!r} is not an address of this machine: {exc.strerror or exc}")
        fail(f"{port_flag}: cannot listen on {host}:{port}: {exc.strerror or exc}")


def unopened_client(db: str, config: str | None = None, *, access: Access) -> Client:
    """A client whose store is not opened yet: a job can be checked first,
    and a refused one creates no file."""
    return Client(None if config is not None else db, config=config, clock=CLOCK, access=access)


def open_client(db: str, config: str | None = None, *, access: Access) -> Client:
    """The embedded database, or the cluster's store when --config is given,
    opened now. Only a command that can start a database (access "create")
    makes a file; an unusable file or an unreachable server is an error
    naming it, not a traceback, and so is a configuration whose partition
    count is not the keyspace's."""
    return opened(unopened_client(db, config, access=access))


def opened(client: Client) -> Client:
    try:
        client.store  # noqa: B018  (opens it)
    except DatabaseUnusable as exc:
        fail(f"--db {exc}")
    except ConfigError as exc:
        fail(f"--config: {exc}")
    except PartitionsMismatch as exc:
        fail(f"--config: {client.config}: {exc}")
    except (OSError, ConnectionError) as exc:
        fail(str(exc))
    atexit.register(client.close)
    return client


def open_store(db: str, config: str | None = None, *, access: Access) -> ScheduleStore:
    return open_client(db, config, access=access).store


def warn_without_scheduler(store: ScheduleStore, db: str) -> None:
    """A job added where no scheduler runs waits silently: say so."""
    if isinstance(store, SQLiteScheduleStore) and not scheduler_seen(store.db, CLOCK.now_ms()):
        typer.echo(
            f"warning: no scheduler has run on {shlex.quote(db)} in the last minute;"
            f" the job fires only while `pysched up --db {shlex.quote(db)}` runs",
            err=True,
        )


def console() -> Console:
    """Where tables go: a terminal's width, or wide enough that nothing is
    cut when the output is piped or saved."""
    return Console() if sys.stdout.isatty() else Console(width=1_000)


def echo_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2))


def db_default() -> str:
    return os.environ.get("PYSCHED_DB", DEFAULT_DB)


def every_seconds(text: str) -> float:
    """--every's interval in seconds, or a failure naming the flag."""
    try:
        seconds = durations.parse_seconds(text)
    except ValueError as exc:
        fail(f"--every: {exc}")
    if not durations.MIN_INTERVAL_S <= seconds <= durations.MAX_INTERVAL_S:
        shortest, longest = (durations.format_seconds(s) for s in (durations.MIN_INTERVAL_S, durations.MAX_INTERVAL_S))
        fail(f"--every: from {shortest} to {longest}; got {text}")
    return seconds
