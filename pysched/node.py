"""Assembling a node: backends, a partition leader and a worker pool."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pysched.claims.sqlite import SQLiteClaims
from pysched.clock import Clock, SystemClock
from pysched.coord.local import SQLiteLeaseCoordinator
from pysched.dispatch.inprocess import InProcessDispatcher
from pysched.leader import LeaderConfig, PartitionLeader, RunDispatched
from pysched.planning import DEFAULT_PARTITIONS
from pysched.stores.sqlite import SQLiteScheduleStore
from pysched.stores.sqlite_db import SQLiteDatabase
from pysched.worker import WorkerConfig, WorkerPool


def node_id() -> str:
    """host:pid:random: unique per process, readable in `pysched status`."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass
class EmbeddedBackends:
    db: SQLiteDatabase
    store: SQLiteScheduleStore
    claims: SQLiteClaims
    coordinator: SQLiteLeaseCoordinator
    dispatcher: InProcessDispatcher


def open_embedded(
    path: str | Path, partitions: int = DEFAULT_PARTITIONS, lease_ttl_ms: int = 5_000
) -> EmbeddedBackends:
    db = SQLiteDatabase(path)
    return EmbeddedBackends(
        db=db,
        store=SQLiteScheduleStore(db),
        claims=SQLiteClaims(db),
        coordinator=SQLiteLeaseCoordinator(db, partitions, ttl_ms=lease_ttl_ms),
        dispatcher=InProcessDispatcher(),
    )


class EmbeddedNode:
    """`pysched up`: a leader (or standby) and a worker pool in one process."""

    def __init__(
        self,
        backends: EmbeddedBackends,
        clock: Clock | None = None,
        holder: str | None = None,
        leader_config: LeaderConfig | None = None,
        worker_config: WorkerConfig | None = None,
        on_dispatch: Callable[[RunDispatched], None] | None = None,
    ) -> None:
        self.backends = backends
        self.clock = clock or SystemClock()
        self.holder = holder or node_id()
        self.leader = PartitionLeader(
            backends.store,
            backends.coordinator,
            backends.dispatcher,
            self.clock,
            self.holder,
            leader_config,
            on_dispatch,
        )
        self.workers = WorkerPool(
            backends.dispatcher, backends.claims, backends.store, self.clock, self.holder, worker_config
        )

    def run(self, stop: threading.Event, drain_s: float = 10.0) -> None:
        self.workers.start(stop)
        try:
            self.leader.run(stop)
        finally:
            stop.set()
            self.backends.dispatcher.close()
            self.workers.join(drain_s)
