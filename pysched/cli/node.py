"""Node commands: up (the embedded scheduler and workers) and status."""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pysched.breakers import BreakerPolicy
from pysched.cli.api import ApiHostOption, ApiPortOption, serve_api_on
from pysched.cli.common import (
    CLOCK,
    DEFAULT_DB,
    ConfigOption,
    DbOption,
    JsonOption,
    cluster_config,
    echo_json,
    fail,
    listening,
    open_client,
)
from pysched.cli.signals import StopSignals
from pysched.client import led_together
from pysched.config import DEFAULT_CATCH_UP_RATE, MAX_BUDGET_FLOOR, MAX_CATCH_UP_RATE, MAX_GRACE_S
from pysched.demo import register_demo_jobs
from pysched.leader import LeaderConfig, RunDispatched
from pysched.node import Backends, Node, open_cluster, open_embedded
from pysched.protocols import PartitionsMismatch
from pysched.stores.sqlite_db import Access, DatabaseUnusable
from pysched.views import iso
from pysched.worker import WorkerConfig

if TYPE_CHECKING:
    from pysched.api.serve import ApiServer
    from pysched.metrics import NodeMetrics

log = logging.getLogger("pysched")

# After a second signal, how long the node may take to let go of its leases
# once its runs are interrupted.
_STOP_NOW_S = 3.0


def _log_fire(event: RunDispatched) -> None:
    log.info(
        # The delivery: how many times the run was handed on (its attempt,
        # what ctx.attempt says, is known when it starts).
        "fired %s run_at=%s lag=%d ms fence=%d delivery=%d",
        event.job_id,
        iso(event.run_at_ms),
        event.dispatched_at_ms - event.due_ms,
        event.fence,
        event.attempt,
    )


WorkersOption = Annotated[int, typer.Option("--workers", min=0, max=256, help="Worker threads (0 only with --config).")]
QuietOption = Annotated[bool, typer.Option("--quiet", help="Do not log each fire and run.")]
GraceOption = Annotated[
    float | None,
    typer.Option(
        "--grace",
        help="Seconds running jobs may take to finish after a stop signal before they are interrupted"
        " (default 30; with --config, grace_s in the file).",
    ),
]

LeaseOption = Annotated[
    float | None,
    typer.Option(
        "--lease",
        help="Seconds a running run's lease lasts without a heartbeat; heartbeats come every third of it"
        " (default 30: renewed every 10 s). A worker that dies leaves its runs to others after this long.",
    ),
]


MetricsPortOption = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        min=0,
        max=65_535,
        help="Serve Prometheus metrics at http://HOST:PORT/metrics (0: a free port, logged).",
    ),
]
MetricsHostOption = Annotated[
    str, typer.Option("--metrics-host", help="The address --metrics-port listens on (default 127.0.0.1).")
]


def _metrics(host: str, port: int | None) -> NodeMetrics | None:
    """The node's metrics, served on ``host``:``port``; None without
    --metrics-port. Served before the store is opened: an address that
    cannot be had changes nothing."""
    if port is None:
        return None
    # Imported here: the other commands need not load the exporter.
    from pysched.metrics import NodeMetrics

    metrics = NodeMetrics()
    with listening("--metrics-host", "--metrics-port", host, port):
        metrics.serve(host, port)
    return metrics


def _lease(lease: float | None) -> tuple[int, int]:
    """The run lease and heartbeat, in ms: --lease, else 30 s and 10 s."""
    if lease is None:
        return WorkerConfig.lease_ms, WorkerConfig.heartbeat_ms
    if not (math.isfinite(lease) and 0.3 <= lease <= MAX_GRACE_S):
        fail(f"--lease: seconds, a number from 0.3 to {MAX_GRACE_S:,}; got {lease}")
    return round(lease * 1000), round(lease * 1000 / 3)


BreakerFailuresOption = Annotated[
    int | None,
    typer.Option(
        "--breaker-failures",
        min=1,
        max=1_000,
        help="A downstream's failures in a row (timeout, connect, 5xx, exception) that open its circuit breaker"
        " (default 5; with --config, breaker_failures in the file).",
    ),
]
BreakerOpenOption = Annotated[
    float | None,
    typer.Option(
        "--breaker-open",
        help="Seconds an open breaker parks its downstream's runs before one probe"
        " (default 30; with --config, breaker_open_s in the file).",
    ),
]

RetryBudgetOption = Annotated[
    str | None,
    typer.Option(
        "--retry-budget",
        metavar="RATIO:FLOOR",
        help="Retries of a downstream's failures allowed over a sliding minute: RATIO of its first attempts plus"
        " FLOOR (default 0.2:600; with --config, retry_budget_ratio and retry_budget_floor in the file). A retry"
        " beyond it waits a minute.",
    ),
]


def _breaker(failures: int | None, open_s: float | None, budget: str | None, config: str | None) -> BreakerPolicy:
    """The breakers' and the retry budget's policy: the options, else the
    cluster config's, else the defaults."""
    default = BreakerPolicy()
    ratio, floor = (None, None) if budget is None else _retry_budget(budget)
    if config is not None:
        cluster = cluster_config(config)
        failures = cluster.breaker_failures if failures is None else failures
        open_s = cluster.breaker_open_s if open_s is None else open_s
        ratio = cluster.retry_budget_ratio if ratio is None else ratio
        floor = cluster.retry_budget_floor if floor is None else floor
    if open_s is not None and not (math.isfinite(open_s) and 0 < open_s <= MAX_GRACE_S):
        fail(f"--breaker-open: seconds, a number above 0 and up to {MAX_GRACE_S:,}; got {open_s}")
    return replace(
        default,
        failure_threshold=default.failure_threshold if failures is None else failures,
        open_ms=default.open_ms if open_s is None else round(open_s * 1000),
        budget_ratio=default.budget_ratio if ratio is None else ratio,
        budget_floor=default.budget_floor if floor is None else floor,
    )


def _retry_budget(text: str) -> tuple[float, int]:
    """RATIO:FLOOR, a ratio from 0 to 1 and a whole number of retries a
    minute from 0 to 100,000."""
    ratio_text, sep, floor_text = text.partition(":")
    try:
        ratio, floor = float(ratio_text), int(floor_text)
    except ValueError:
        ratio, floor = math.nan, -1
    if not sep or not (math.isfinite(ratio) and 0 <= ratio <= 1) or not 0 <= floor <= MAX_BUDGET_FLOOR:
        fail(
            "--retry-budget: RATIO:FLOOR, a ratio of first attempts from 0 to 1 and the retries a minute always"
            f" allowed, a whole number from 0 to {MAX_BUDGET_FLOOR:,} (e.g. 0.2:600); got {text!r}"
        )
    return ratio, floor


def _grace(grace: float | None, config: str | None) -> float:
    """The grace period: --grace, else the cluster config's, else 30 s."""
    if grace is None:
        return cluster_config(config).grace_s if config is not None else WorkerConfig.grace_s
    if not math.isfinite(grace) or not 0 <= grace <= MAX_GRACE_S:
        fail(f"--grace: seconds, a number from 0 to {MAX_GRACE_S:,}; got {grace}")
    return grace


def _open(db: str, config: str | None, coordinator: bool = True, access: Access = "create") -> Backends:
    try:
        if config is None:
            return open_embedded(db, access=access, clock=CLOCK)
        return open_cluster(cluster_config(config), coordinator=coordinator, clock=CLOCK)
    except DatabaseUnusable as exc:
        fail(f"--db {exc}")
    except PartitionsMismatch as exc:
        fail(f"--config: {config}: {exc}")
    except (OSError, ConnectionError) as exc:
        fail(str(exc))


def _temporal_address(config: str | None) -> str | None:
    """The cluster's Temporal server (its file's temporal_address, or
    PYSCHED_TEMPORAL_ADDRESS); None for the embedded engine, whose workers
    read PYSCHED_TEMPORAL_ADDRESS themselves."""
    return cluster_config(config).temporal_address if config is not None else None


def _serve(
    backends: Backends,
    workers: int,
    grace_s: float,
    quiet: bool,
    lead: bool,
    where: str,
    leader_config: LeaderConfig | None = None,
    temporal_address: str | None = None,
    breaker: BreakerPolicy | None = None,
    batch: int = WorkerConfig.batch,
    lease: tuple[int, int] = (WorkerConfig.lease_ms, WorkerConfig.heartbeat_ms),
    metrics: NodeMetrics | None = None,
    api: ApiServer | None = None,
) -> None:
    # A long-running node outlives whatever reads its logs: a closed pipe is
    # an error on a write, not the end of the node.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Python targets named module:function resolve against the working directory.
    sys.path.insert(0, str(Path.cwd()))
    config = WorkerConfig(
        concurrency=workers,
        batch=batch,
        lease_ms=lease[0],
        heartbeat_ms=lease[1],
        grace_s=grace_s,
        temporal_address=temporal_address,
        breaker=breaker or BreakerPolicy(),
    )
    node = Node(
        backends,
        leader_config=leader_config,
        worker_config=config,
        on_dispatch=None if quiet else _log_fire,
        metrics=metrics,
    )
    signals = StopSignals()
    log.info("pysched %s %s up on %s", "node" if lead else "worker", node.holder, where)
    # Printed whatever the log level (--quiet): with port 0 they are the
    # one place that says where the node serves.
    if metrics is not None and metrics.server is not None:
        typer.echo(f"metrics on {metrics.server.url}", err=True)
    if api is not None:
        api.start()
        typer.echo(f"API on {api.url} (docs: {api.url}/docs)", err=True)
    try:
        forced = _run_until_stopped(node, signals, lead=lead, work=workers > 0)
    except BaseException:
        backends.close()
        raise
    finally:
        if metrics is not None:
            metrics.close()
        if api is not None:
            api.stop()
    if forced is None:
        backends.close()
    # Exit here, whether stopped gracefully or now: interpreter shutdown would
    # wait for every non-daemon thread, and a job may have left one running
    # (after a stop now, also for the server drivers); the exit also ends the
    # thread of a Python job interrupted, which is recorded so already. What
    # the node acknowledged is in the store already.
    logging.shutdown()
    sys.stdout.flush()
    os._exit(forced or 0)


def _run_until_stopped(node: Node, signals: StopSignals, lead: bool, work: bool) -> int | None:
    """Run the node in a thread while this, the main thread, waits for
    signals. The first stops gracefully: the leader hands its partitions
    on, running jobs get the grace period to finish, then are interrupted.
    The second interrupts them now. An interrupted run's shell command is
    stopped with what it started, and the run recorded interrupted: it runs
    again as a new attempt. None after a graceful stop; after a forced one,
    the exit status (128 + the signal's number)."""
    stop = threading.Event()
    failures: list[BaseException] = []

    def run() -> None:
        try:
            node.run(stop, lead=lead, work=work)
        except BaseException as exc:
            failures.append(exc)

    running = threading.Thread(target=run, name="pysched-node")
    running.start()
    received = 0
    while running.is_alive():
        for signum in signals.wait(0.5):
            received += 1
            if received == 1:
                log.info("stopping on signal %d: running jobs may finish; a second signal interrupts them", signum)
                stop.set()
            elif received == 2:
                log.warning("stopping now on signal %d: running jobs are interrupted and run again later", signum)
                node.stop_now()
                # A moment to hand leadership on cleanly; then go regardless.
                running.join(_STOP_NOW_S)
                return 128 + signum
    running.join()
    if failures:
        raise failures[0]
    return None


def up(
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    workers: WorkersOption = 4,
    demo: Annotated[bool, typer.Option("--demo", help="Register a few demo jobs that fire within seconds.")] = False,
    quiet: QuietOption = False,
    history_days: Annotated[
        int | None,
        typer.Option("--history-days", min=0, max=36_500, help="Days finished runs are kept (default 7; 0: no limit)."),
    ] = None,
    history_keep: Annotated[
        int | None,
        typer.Option(
            "--history-keep", min=0, max=10_000_000, help="Finished runs kept per job (default 1000; 0: no limit)."
        ),
    ] = None,
    grace: GraceOption = None,
    catch_up_rate: Annotated[
        int | None,
        typer.Option(
            "--catch-up-rate",
            min=1,
            max=MAX_CATCH_UP_RATE,
            help=f"Runs found long overdue handed on a second, after those due now (default {DEFAULT_CATCH_UP_RATE};"
            " with --config, catch_up_rate in the file).",
        ),
    ] = None,
    breaker_failures: BreakerFailuresOption = None,
    breaker_open: BreakerOpenOption = None,
    retry_budget: RetryBudgetOption = None,
    lease: LeaseOption = None,
    batch: Annotated[
        int,
        typer.Option(
            "--batch",
            min=1,
            max=1_000,
            help="Runs a worker thread takes at once from the queue in a burst, claimed, started and recorded"
            f" together (default {WorkerConfig.batch}; never more than its share of what is queued, nor than"
            " --workers has free). Their targets start at once, each on a thread of its own.",
        ),
    ] = WorkerConfig.batch,
    api_port: ApiPortOption = None,
    api_host: ApiHostOption = "127.0.0.1",
    metrics_port: MetricsPortOption = None,
    metrics_host: MetricsHostOption = "127.0.0.1",
) -> None:
    """Run the scheduler and a worker pool in this process.

    Embedded (--db): a second `pysched up` on the same database stands by and
    takes over, with a higher fence, when the first stops or dies. Cluster
    (--config): every node leads its share of the partitions. Each prunes
    the history of what it leads (--history-days, --history-keep; on the
    cluster also history_days, history_keep in the configuration).

    Ctrl-C or SIGTERM stops it, letting running jobs finish within the
    grace period (--grace, 30 s); then, or on a second signal, they are
    interrupted (shell jobs: SIGTERM, 2 s, SIGKILL), recorded interrupted,
    and run again as their next attempt by the next node."""
    if workers == 0 and config is None:
        # The embedded engine hands runs on through a queue inside this
        # process: with no worker here, nothing would ever run them.
        fail("--workers: 0 only makes sense with --config and separate `pysched worker` processes")
    grace_s = _grace(grace, config)
    breaker = _breaker(breaker_failures, breaker_open, retry_budget, config)
    metrics = _metrics(metrics_host, metrics_port)
    # Every flag checked before the database is opened (and perhaps made).
    run_lease = _lease(lease)
    api = None
    if api_port is not None:
        from pysched.api.serve import ApiServer

        api = ApiServer(
            *serve_api_on(api_host, api_port, db, config, host_flag="--api-host", port_flag="--api", access="create")
        )
    backends = _open(db, config)
    backends.retention = replace(
        backends.retention,
        days=backends.retention.days if history_days is None else history_days,
        keep_per_job=backends.retention.keep_per_job if history_keep is None else history_keep,
    )
    if demo:
        register_demo_jobs(backends.store, CLOCK.now_ms())
    if catch_up_rate is None:
        catch_up_rate = cluster_config(config).catch_up_rate if config is not None else DEFAULT_CATCH_UP_RATE
    leading = LeaderConfig(catch_up_rate=catch_up_rate)
    _serve(
        backends,
        workers,
        grace_s,
        quiet,
        lead=True,
        where=config or db,
        leader_config=leading,
        temporal_address=_temporal_address(config),
        breaker=breaker,
        lease=run_lease,
        batch=batch,
        metrics=metrics,
        api=api,
    )


def worker(
    config: Annotated[str, typer.Option("--config", envvar="PYSCHED_CONFIG", help="TOML file naming the servers.")],
    workers: Annotated[int, typer.Option("--workers", min=1, max=256, help="Worker threads.")] = 4,
    quiet: QuietOption = False,
    grace: GraceOption = None,
    breaker_failures: BreakerFailuresOption = None,
    breaker_open: BreakerOpenOption = None,
    retry_budget: RetryBudgetOption = None,
    lease: LeaseOption = None,
    metrics_port: MetricsPortOption = None,
    metrics_host: MetricsHostOption = "127.0.0.1",
) -> None:
    """Run executors only, consuming the cluster's dispatch topic.

    Ctrl-C or SIGTERM stops it, letting running jobs finish within the
    grace period (--grace, 30 s); then, or on a second signal, they are
    interrupted, recorded interrupted, and delivered again as their next
    attempt."""
    grace_s = _grace(grace, config)
    breaker = _breaker(breaker_failures, breaker_open, retry_budget, config)
    metrics = _metrics(metrics_host, metrics_port)
    backends = _open(DEFAULT_DB, config, coordinator=False)
    _serve(
        backends,
        workers,
        grace_s,
        quiet,
        lead=False,
        where=config,
        temporal_address=_temporal_address(config),
        breaker=breaker,
        lease=_lease(lease),
        metrics=metrics,
    )


def status(db: DbOption = DEFAULT_DB, config: ConfigOption = None, as_json: JsonOption = False) -> None:
    """Who leads which partitions, with which fence, which nodes stand by,
    and the watermarks."""
    # The store and the coordinator alone: no producer or consumer.
    client = open_client(db, config, access="read")
    groups = led_together(client.leaders())
    leading = [g for g in groups if g.holder is not None]
    # Nobody leads these (an embedded lease that ran out, a cluster node gone).
    unled = next((g for g in groups if g.holder is None), None)
    standing_by = client.standing_by()
    by_holder: dict[str, dict[str, list[int]]] = {}
    for group in leading:
        for partition, fence in zip(group.partitions, group.fences, strict=True):
            by_holder.setdefault(str(group.holder), {}).setdefault(str(fence), []).append(partition)
    data = {
        "leaders": {
            str(g.holder): {
                "fences": by_holder[str(g.holder)],
                "partitions": len(g.partitions),
                "ranges": g.partition_ranges,
            }
            for g in leading
        },
        "standby": standing_by,
        "unled": unled.partition_ranges if unled else "",
        "watermarks": {str(p): iso(t) for p, t in sorted(client.store.watermarks().items())},
    }
    if as_json:
        echo_json(data)
        return
    if not leading:
        typer.echo("leader: none")
    for group in leading:
        fences = "fence" if len(set(group.fences)) == 1 else "fences"
        typer.echo(
            f"leader: {group.holder}: {len(group.partitions)} partitions ({group.partition_ranges}),"
            f" {fences} {group.fence_span}"
        )
    for holder in standing_by:
        typer.echo(f"standby: {holder}: up, leading no partitions")
    if unled is not None and leading:
        typer.echo(f"unled: {len(unled.partitions)} partitions ({unled.partition_ranges})")


def register_commands(app: typer.Typer) -> None:
    app.command()(up)
    app.command()(worker)
    app.command()(status)
