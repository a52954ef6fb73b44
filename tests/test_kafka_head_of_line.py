"""A long run does not hold up the runs behind it on its Kafka partition:
a node on the real servers, with one Kafka partition, two worker threads,
a run that waits until the test lets it go, and short runs after it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pysched.clock import SystemClock
from pysched.leader import LeaderConfig
from pysched.model import Job
from pysched.node import Backends, Node, open_cluster
from pysched.registry import register
from pysched.targets import RunContext
from pysched.worker import WorkerConfig
from tests.conftest import cluster_config_for
from tests.helpers import wait_for

pytestmark = pytest.mark.cluster

_release = threading.Event()


def long_run(ctx: RunContext) -> str:
    # Bounded: a test that fails never leaves it waiting for good.
    return "released" if _release.wait(120) else "gave up"


def short_run(ctx: RunContext) -> None:
    pass


@pytest.fixture
def backends(services: dict[str, Any], keyspace: str) -> Iterator[Backends]:
    config = cluster_config_for(services, keyspace, partitions=4, kafka_partitions=1)
    opened = open_cluster(config)
    yield opened
    opened.close()


def _one_shot(job_id: str, func: str, at_ms: int) -> Job:
    return Job.model_validate(
        {
            "id": job_id,
            "schedule": {"kind": "once", "run_at_ms": at_ms},
            "target": {"kind": "python", "ref": f"{__name__}:{func}"},
        }
    )


def test_short_runs_behind_a_long_one_on_its_partition_run_while_it_runs(backends: Backends, tmp_path: Path) -> None:
    _release.clear()
    clock = SystemClock()
    now = clock.now_ms()
    store = backends.store
    register(store, _one_shot("long", "long_run", now + 2_000), now)
    for i in range(10):
        register(store, _one_shot(f"short-{i}", "short_run", now + 3_000 + i), now)
    node = Node(backends, clock, leader_config=LeaderConfig(), worker_config=WorkerConfig(concurrency=2))
    stop = threading.Event()
    running = threading.Thread(target=node.run, args=(stop,), daemon=True)
    running.start()
    try:

        def states() -> dict[str, str]:
            return {
                job_id: (h[0].state if (h := store.history(job_id)) else "-")
                for job_id in [f"short-{i}" for i in range(10)]
            }

        # One Kafka partition: every record is behind the long run's.
        wait_for(lambda: set(states().values()) == {"succeeded"}, 90, "the short runs to succeed")
        (long,) = store.history("long")
        assert long.state == "running", "the short runs went by while the long one ran"
        _release.set()
        wait_for(lambda: store.history("long")[0].state == "succeeded", 60, "the long run to end")
    finally:
        _release.set()
        stop.set()
        running.join(60)
        time.sleep(0)  # the node's threads are daemons; the backends close in the fixture
