"""On a cluster, a run that failed for good is also announced on a Kafka
topic, keyed by its idempotency key, with its failed attempts: the real
servers of scripts/services."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer

from pysched import native
from pysched.clock import SystemClock
from pysched.dispatch.dead_letters import dead_letter_topic
from pysched.leader.recording import record_sent
from pysched.model import Job
from pysched.node import Backends, open_cluster
from pysched.registry import register
from pysched.targets import RunContext
from pysched.worker import Executor, WorkerConfig
from tests.conftest import cluster_config_for

pytestmark = pytest.mark.cluster


def fails(ctx: RunContext) -> None:
    raise RuntimeError(f"no luck for {ctx.idempotency_key}")


@pytest.fixture
def cluster(services: dict[str, Any], keyspace: str) -> Iterator[tuple[Backends, Any]]:
    config = cluster_config_for(services, keyspace, partitions=4, kafka_partitions=2)
    backends = open_cluster(config)
    yield backends, config
    backends.close()


def _read_topic(config: Any, want: int, timeout_s: float = 60) -> list[Any]:
    consumer = Consumer(
        {"bootstrap.servers": config.kafka, "group.id": "dead-letter-reader", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([dead_letter_topic(config)])
    got = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg)
    finally:
        consumer.close()
    return got


def test_a_dead_letter_is_announced_on_the_topic_with_its_attempts(cluster: tuple[Backends, Any]) -> None:
    backends, config = cluster
    clock = SystemClock()
    now = clock.now_ms()
    job = Job.model_validate(
        {
            "id": "doomed",
            "schedule": {"kind": "once", "run_at_ms": now},
            "target": {"kind": "python", "ref": f"{__name__}:fails"},
            "retry": {"retries": 0},
        }
    )
    register(backends.store, job, now)
    fences = backends.coordinator.poll("leader", now)  # all four, their fences published
    (row,) = backends.store.due_runs(fences, now + 60_000, now)
    record_sent(backends.store, [row], fences, {}, now)
    record = native.decode(native.encode_batch([row], fences[row.partition], now)[0])
    assert backends.dead_letters is not None
    executor = Executor(
        backends.claims, backends.store, clock, "w1", WorkerConfig(), dead_letters=backends.dead_letters
    )
    executor.attempt([executor.new_execution(record)])
    assert backends.store.get_run("doomed", row.run_at_ms).state == "failed"
    (msg,) = _read_topic(config, 1)
    assert msg.key().decode() == record.idempotency_key
    value = json.loads(msg.value())
    assert (value["job_id"], value["run_at_ms"], value["attempt_group"]) == ("doomed", row.run_at_ms, 0)
    (failure,) = value["failures"]
    assert failure["kind"] == "exception" and "no luck" in failure["error"] and failure["dead_lettered"]
