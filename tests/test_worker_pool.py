"""The worker pool keeps its size: a worker thread that dies is replaced."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from pysched.clock import SystemClock
from pysched.dispatch.inprocess import InProcessConsumer, InProcessDispatcher
from pysched.node import open_embedded
from pysched.protocols import Delivery
from pysched.worker import WorkerConfig, WorkerPool
from tests.helpers import wait_for


class _DyingConsumer(InProcessConsumer):
    """Ends its thread the way hostile code can: SystemExit, which a thread
    swallows without a word."""

    def next(self, timeout_s: float) -> Delivery | None:
        raise SystemExit(3)


class _FirstConsumerDies(InProcessDispatcher):
    def __init__(self) -> None:
        super().__init__()
        self.consumers = 0

    def consumer(self) -> InProcessConsumer:
        self.consumers += 1
        return _DyingConsumer(self) if self.consumers == 1 else InProcessConsumer(self)


def test_a_worker_thread_that_dies_is_replaced_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    backends = open_embedded(tmp_path / "pysched.db")
    dispatcher = _FirstConsumerDies()
    config = WorkerConfig(concurrency=1, supervise_s=0.05)
    pool = WorkerPool(dispatcher, backends.claims, backends.store, SystemClock(), "test-holder", config)
    stop = threading.Event()
    caplog.set_level(logging.INFO, logger="pysched.worker")
    pool.start(stop)
    try:
        wait_for(lambda: pool.counts["replaced"] == 1, 10, "the dead worker to be replaced")
        assert pool.alive() == ["pysched-heartbeat", "pysched-worker-0"]
        # The replacement consumes: an undecodable record reaches a worker.
        dispatcher.publish([0], [b"not a dispatch record"])
        wait_for(lambda: pool.counts["errors"] == 1, 10, "the replacement to take the record")
        assert dispatcher.qsize() == 0
    finally:
        stop.set()
        pool.join(5)
        backends.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors[:2] == ["pysched-worker-0 died", "pysched-worker-0 is not running: starting a replacement"]
