"""Node commands: up (the embedded scheduler and workers) and status."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Annotated

import typer

from pysched.cli.common import DEFAULT_DB, DbOption, JsonOption, echo_json, fail, iso
from pysched.demo import register_demo_jobs
from pysched.leader import RunDispatched
from pysched.node import EmbeddedNode, open_embedded
from pysched.worker import WorkerConfig

log = logging.getLogger("pysched")


def _log_fire(event: RunDispatched) -> None:
    log.info(
        "fired %s run_at=%s lag=%d ms fence=%d attempt=%d",
        event.job_id,
        iso(event.run_at_ms),
        event.dispatched_at_ms - event.due_ms,
        event.fence,
        event.attempt,
    )


def up(
    db: DbOption = DEFAULT_DB,
    workers: Annotated[int, typer.Option("--workers", min=1, max=256, help="Worker threads.")] = 4,
    demo: Annotated[bool, typer.Option("--demo", help="Register a few demo jobs that fire within seconds.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="Do not log each fire.")] = False,
) -> None:
    """Run the embedded scheduler and a worker pool in this process.

    A second `pysched up` on the same database stands by and takes over,
    with a higher fence, when the first stops or dies."""
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Python targets named module:function resolve against the working directory.
    sys.path.insert(0, str(Path.cwd()))
    try:
        backends = open_embedded(db)
    except OSError as exc:
        fail(str(exc))
    if demo:
        register_demo_jobs(backends.store, time.time_ns() // 1_000_000)
    node = EmbeddedNode(backends, worker_config=WorkerConfig(concurrency=workers), on_dispatch=_log_fire)
    stop = threading.Event()

    def _stop(signum: int, _frame: object) -> None:
        log.info("stopping on signal %d", signum)
        stop.set()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    log.info("pysched node %s up on %s", node.holder, db)
    node.run(stop)


def status(db: DbOption = DEFAULT_DB, as_json: JsonOption = False) -> None:
    """Who leads, with which fence, and the per-partition watermarks."""
    try:
        backends = open_embedded(db)
    except OSError as exc:
        fail(str(exc))
    lease = backends.coordinator.current()
    now = time.time_ns() // 1_000_000
    counts = dict(backends.db.connection().execute("SELECT state, count(*) FROM runs GROUP BY state").fetchall())
    data = {
        "leader": lease.holder if lease and lease.expires_at_ms > now else None,
        "fence": lease.fence if lease else None,
        "lease_expires_at": iso(lease.expires_at_ms) if lease else None,
        "runs": counts,
        "watermarks": {str(p): iso(t) for p, t in sorted(backends.store.watermarks().items())},
    }
    if as_json:
        echo_json(data)
        return
    typer.echo(f"leader: {data['leader'] or 'none'} (fence {data['fence']})")
    typer.echo("runs: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))


def register_commands(app: typer.Typer) -> None:
    app.command()(up)
    app.command()(status)
