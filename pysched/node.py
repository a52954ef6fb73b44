"""Assembling a node: backends, a partition leader and a worker pool."""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pysched.claims.sqlite import SQLiteClaims
from pysched.clock import Clock, SystemClock
from pysched.config import ClusterConfig
from pysched.coord.local import SQLiteLeaseCoordinator
from pysched.dispatch.inprocess import InProcessDispatcher
from pysched.leader import LeaderConfig, PartitionLeader, RunDispatched
from pysched.protocols import Coordinator, DeadLetterSink, Dispatcher, IdempotencyClaims, Lease, ScheduleStore
from pysched.retention import HistoryPruner, Retention
from pysched.stores.sqlite import SQLiteScheduleStore
from pysched.stores.sqlite_db import Access, SQLiteDatabase
from pysched.worker import WorkerConfig, WorkerPool

if TYPE_CHECKING:
    # Only a cluster node needs the drivers (see open_cluster).
    from pysched.metrics import NodeMetrics
    from pysched.stores.cql_tables import DriverTables

log = logging.getLogger("pysched.node")

# How long a stopping node waits for a pruning pass to see the stop: its
# deletes are transactions, so one cut short by the exit costs nothing.
_PRUNING_JOIN_S = 10.0


def node_id() -> str:
    """host:pid:random: unique per process, readable in `pysched status`."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass
class Backends:
    store: ScheduleStore
    claims: IdempotencyClaims
    coordinator: Coordinator
    dispatcher: Dispatcher
    close: Callable[[], None]
    # How long the history the node prunes is kept: the cluster's comes
    # with its configuration.
    retention: Retention = field(default_factory=Retention, kw_only=True)
    # Where runs that failed for good are announced besides the store: the
    # cluster's Kafka topic; the embedded engine has its store alone.
    dead_letters: DeadLetterSink | None = field(default=None, kw_only=True)


@dataclass
class EmbeddedBackends(Backends):
    db: SQLiteDatabase


def open_embedded(
    path: str | Path,
    partitions: int | None = None,
    lease_ttl_ms: int = 5_000,
    *,
    access: Access = "create",
    clock: Clock | None = None,
) -> EmbeddedBackends:
    """The embedded engine on one database file. ``partitions`` is the count
    a new database gets (default 64); an existing one keeps its own, and
    naming another raises PartitionsMismatch. Raises DatabaseUnusable."""
    db = SQLiteDatabase(path, access=access, partitions=partitions)
    return EmbeddedBackends(
        store=SQLiteScheduleStore(db),
        claims=SQLiteClaims(db),
        coordinator=SQLiteLeaseCoordinator(db, ttl_ms=lease_ttl_ms),
        dispatcher=InProcessDispatcher(clock),
        close=db.close,
        db=db,
    )


def open_cluster(config: ClusterConfig, coordinator: bool = True, *, clock: Clock | None = None) -> Backends:
    """Connect to the servers, creating the keyspace and topic if missing.
    An unreachable server raises ConnectionError naming it and its address;
    a partition count other than the keyspace's, PartitionsMismatch."""
    # Imported here: only a cluster node needs the drivers.
    from pysched.claims.redis_cassandra import RedisCassandraClaims, connect_redis
    from pysched.coord.etcd_connection import EtcdConnection
    from pysched.coord.run_leases import EtcdRunLeases
    from pysched.dispatch.dead_letters import KafkaDeadLetters
    from pysched.dispatch.kafka import KafkaDispatcher, ensure_topic
    from pysched.stores.cassandra import CassandraScheduleStore, connect

    tables = connect(config)
    _ensure_schema_or_shut_down(tables, config, clock or SystemClock())
    # Each connection is closed again if a later one fails: a driver left
    # running at exit (Cassandra's scheduler thread) prints a traceback
    # after the error that names the unreachable server.
    with ExitStack() as opened:
        opened.callback(tables.shutdown)
        redis_client = connect_redis(config.redis)
        opened.callback(redis_client.close)
        ensure_topic(config)
        run_etcd = EtcdConnection(config.etcd, name="pysched-etcd-runs")
        opened.callback(run_etcd.close)
        run_leases = EtcdRunLeases(run_etcd, f"/pysched/{config.keyspace}")
        claims = RedisCassandraClaims(redis_client, tables, config, run_leases)
        # The leader's sweep asks etcd whether a running run's worker lives.
        store = CassandraScheduleStore(tables, config, clock, run_held=run_leases.held_for_ms)

        def publish_fence(partition: int, fence: int) -> None:
            # The store first: a worker that rejects an older leader's run (the
            # claims' fence) implies the store refuses that leader's watermark
            # move, so the run stays ahead of where the new leader reads.
            store.raise_fence(partition, fence)
            claims.raise_fence(partition, fence)

        coord: Coordinator
        if coordinator:
            from pysched.coord.etcd import EtcdCoordinator

            etcd = EtcdCoordinator(config, partitions=store.partitions, publish_fence=publish_fence)
            opened.callback(etcd.close)
            coord = etcd
        else:
            coord = _NoCoordinator()
        dispatcher = KafkaDispatcher(config)
        opened.callback(dispatcher.close)
        if coordinator:
            dispatcher.warm_up()
        dead_letters = KafkaDeadLetters(config)
        opened.callback(dead_letters.close)
        # Everything is open: from here on the node's close() closes it all,
        # the last opened first.
        close = opened.pop_all().close

    retention = Retention(days=config.history_days, keep_per_job=config.history_keep)
    return Backends(store, claims, coord, dispatcher, close, retention=retention, dead_letters=dead_letters)


def open_cluster_store(
    config: ClusterConfig, *, clock: Clock | None = None
) -> tuple[ScheduleStore, Callable[[], None]]:
    """Just the schedule store, for commands that only read or register."""
    from pysched.stores.cassandra import CassandraScheduleStore, connect

    tables = connect(config)
    _ensure_schema_or_shut_down(tables, config, clock or SystemClock())
    return CassandraScheduleStore(tables, config), tables.shutdown


def _ensure_schema_or_shut_down(tables: DriverTables, config: ClusterConfig, clock: Clock) -> None:
    """ensure_schema; a configuration it refuses (another partition count
    than the keyspace's) leaves no driver threads behind to delay the exit."""
    from pysched.stores.cassandra import ensure_schema

    try:
        ensure_schema(tables, config, clock.now_ms())
    except BaseException:
        tables.shutdown()
        raise


class _NoCoordinator:
    """For processes that only read or register (CLI) or only execute (workers)."""

    answer_valid_ms = 0  # it never grants anything

    def poll(self, holder: str, now_ms: int) -> dict[int, int]:
        return {}

    def release(self, holder: str) -> None:
        pass

    def leaders(self) -> dict[int, Lease]:
        return {}

    def giving_up(self, holder: str) -> dict[int, int]:
        return {}


class Node:
    """`pysched up`: a leader (or standby) and a worker pool in one process;
    `pysched worker`: the worker pool alone."""

    def __init__(
        self,
        backends: Backends,
        clock: Clock | None = None,
        holder: str | None = None,
        leader_config: LeaderConfig | None = None,
        worker_config: WorkerConfig | None = None,
        on_dispatch: Callable[[RunDispatched], None] | None = None,
        metrics: NodeMetrics | None = None,
    ) -> None:
        """``on_dispatch`` hears of each run handed on (the CLI logs it);
        ``metrics``, when given, is told of what the leader and the workers
        do and times the store's calls (its server is its owner's to start)."""
        self.backends = backends
        self.clock = clock or SystemClock()
        self.holder = holder or node_id()
        store = backends.store if metrics is None else metrics.timed(backends.store)
        self.leader = PartitionLeader(
            store,
            backends.coordinator,
            backends.dispatcher,
            self.clock,
            self.holder,
            leader_config,
            on_dispatch,
            on_batch=None if metrics is None else metrics.dispatched,
        )
        self.workers = WorkerPool(
            backends.dispatcher,
            backends.claims,
            store,
            self.clock,
            self.holder,
            worker_config,
            dead_letters=backends.dead_letters,
            observer=metrics,
        )
        self.pruner = HistoryPruner(store, self.clock, backends.retention)
        if metrics is not None:
            metrics.watch(self.leader)
            consumer_lag = getattr(backends.dispatcher, "consumer_lag", None)
            if consumer_lag is not None:
                metrics.watch_consumer_lag(consumer_lag)

    def run(self, stop: threading.Event, lead: bool = True, work: bool = True) -> None:
        """Lead and work until ``stop``; then hand the partitions on, give
        running runs the workers' grace period to finish, and interrupt
        those that have not."""
        if work:
            self.workers.start(stop)
        pruning = None
        if lead:
            # Each node prunes the partitions it leads, off the tick thread.
            pruning = threading.Thread(
                target=self.pruner.run,
                args=(lambda: list(self.leader.fences), stop),
                name="pysched-pruner",
                daemon=True,
            )
            pruning.start()
        try:
            if lead:
                self.leader.run(stop)
            else:
                stop.wait()
        finally:
            stop.set()
            grace_s = self.workers.config.grace_s
            if not self.workers.join(grace_s) and not self.workers.abandoned:
                log.warning("runs still running after the %g s grace period: interrupting them", grace_s)
                self.workers.interrupt(f"the node stopped and its {grace_s:g} s grace period ran out")
            if pruning is not None:
                pruning.join(_PRUNING_JOIN_S)
            self.backends.dispatcher.close()

    def stop_now(self) -> None:
        """Interrupt the running runs without waiting out the grace period
        (another thread calls this): their runs are recorded interrupted and
        run again as new attempts."""
        self.workers.interrupt("the node was stopped now")
