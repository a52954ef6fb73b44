"""The /metrics endpoint: a real embedded node counts a run from its fire to
its success, on a registry of its own, under conventional names; and
`pysched up --metrics-port` refuses what it cannot serve on, changing
nothing."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from pysched.clock import SystemClock
from pysched.leader import LeaderConfig
from pysched.metrics import NodeMetrics
from pysched.model import Job
from pysched.node import Node, open_embedded
from pysched.registry import register
from pysched.worker import WorkerConfig
from tests.helpers import PYSCHED, start_node, stop_node, wait_for

# How long a run due in a second may take to be counted on a loaded machine.
_COUNTED_WITHIN_S = 60


def scrape(url: str) -> dict[str, Metric]:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(families: dict[str, Metric], sample: str, **labels: str) -> float:
    """The value of the sample named ``sample`` with ``labels``; 0 if absent."""
    for family in families.values():
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def assert_conventional(families: dict[str, Metric]) -> None:
    """pysched_ names; counters' samples end in _total (their _created
    beside); histograms carry a unit suffix; no label names a job."""
    ours = {name: f for name, f in families.items() if name.startswith("pysched_")}
    assert ours, "no pysched_ metric served"
    for name, family in ours.items():
        assert re.fullmatch(r"pysched(_[a-z]+)+", name), name
        if family.type == "counter":
            assert {s.name for s in family.samples} <= {f"{name}_total", f"{name}_created"}, family.samples
            assert not name.endswith("_total")
        elif family.type == "histogram":
            assert name.endswith("_seconds"), name
        else:
            assert family.type == "gauge", (name, family.type)
            assert not name.endswith("_total"), name
        for s in family.samples:
            assert set(s.labels) <= {"outcome", "call", "partition", "le"}, (name, s.labels)


@pytest.fixture
def served_node(tmp_path: Path) -> Iterator[tuple[Node, str]]:
    """An embedded node leading every partition, its metrics on a free port."""
    backends = open_embedded(tmp_path / "pysched.db", partitions=8)
    metrics = NodeMetrics()
    server = metrics.serve("127.0.0.1", 0)
    node = Node(
        backends,
        leader_config=LeaderConfig(coordinate_every_ms=200, standby_poll_ms=50),
        worker_config=WorkerConfig(concurrency=2),
        metrics=metrics,
    )
    stop = threading.Event()
    running = threading.Thread(target=node.run, args=(stop,), name="test-node", daemon=True)
    running.start()
    try:
        yield node, server.url
    finally:
        stop.set()
        running.join(30)
        metrics.close()
        backends.close()


def test_a_node_counts_a_run_from_fire_to_success(served_node: tuple[Node, str]) -> None:
    node, url = served_node
    now = SystemClock().now_ms()
    job = Job.model_validate(
        {
            "id": "counted",
            "schedule": {"kind": "once", "run_at_ms": now + 1_000},
            "target": {"kind": "shell", "command": "true"},
        }
    )
    register(node.backends.store, job, now)

    seen: dict[str, Metric] = {}

    def counted() -> bool:
        seen.update(scrape(url))
        return value(seen, "pysched_runs_executed_total", outcome="succeeded") >= 1

    wait_for(counted, _COUNTED_WITHIN_S, "the run to be counted succeeded")
    assert value(seen, "pysched_fire_lag_seconds_count") >= 1
    assert value(seen, "pysched_start_lag_seconds_count") >= 1
    assert value(seen, "pysched_runs_dispatched_total") >= 1
    assert value(seen, "pysched_claims_total", outcome="claimed") >= 1
    assert value(seen, "pysched_partitions_led") == 8
    assert value(seen, "pysched_partition_fence", partition="7") >= 1
    # The leader's reads and the worker's writes went through the timed store.
    assert value(seen, "pysched_store_call_seconds_count", call="due_runs") >= 1
    assert value(seen, "pysched_store_call_seconds_count", call="run_started") >= 1
    # Each bucket counts no more than the next (cumulative), and +Inf all.
    lags = [s for s in seen["pysched_fire_lag_seconds"].samples if s.name.endswith("_bucket")]
    assert [s.value for s in lags] == sorted(s.value for s in lags)
    assert lags[-1].labels["le"] == "+Inf" and lags[-1].value == value(seen, "pysched_fire_lag_seconds_count")
    assert_conventional(seen)


def test_two_nodes_in_one_process_keep_their_metrics_apart() -> None:
    # Each owns its registry: the second does not collide with the first.
    first, second = NodeMetrics(), NodeMetrics()
    first.ended("succeeded")
    assert first.registry.get_sample_value("pysched_runs_executed_total", {"outcome": "succeeded"}) == 1
    assert second.registry.get_sample_value("pysched_runs_executed_total", {"outcome": "succeeded"}) == 0


def test_a_failure_counts_as_retried_or_dead_lettered() -> None:
    metrics = NodeMetrics()
    metrics.ended("failed", retried=True)
    metrics.ended("failed", retried=False)
    metrics.ended("succeeded", retried=False)
    sample = metrics.registry.get_sample_value
    assert sample("pysched_runs_executed_total", {"outcome": "failed"}) == 2
    assert (sample("pysched_runs_retried_total"), sample("pysched_runs_dead_lettered_total")) == (1, 1)


def _up(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PYSCHED, "up", "--db", str(db), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("port", ["nope", "-1", "65536"])
def test_a_bad_metrics_port_is_refused(tmp_path: Path, port: str) -> None:
    db = tmp_path / "pysched.db"
    proc = _up(db, "--metrics-port", port)
    assert proc.returncode == 2, proc.stderr
    assert "--metrics-port" in proc.stderr
    assert not db.exists()


def test_a_metrics_port_in_use_is_a_clear_error_that_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "pysched.db"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _up(db, "--metrics-port", str(port))
    assert proc.returncode == 2, proc.stderr
    assert f"--metrics-port: cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not db.exists()


@pytest.mark.slow
def test_up_serves_metrics_on_the_port_it_logs(tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    node = start_node(tmp_path / "pysched.db", tmp_path, log, "--metrics-port", "0")
    try:
        url: list[str] = []

        def logged() -> bool:
            url[:] = re.findall(r"metrics on (http://\S+/metrics)", log.read_text(errors="replace"))
            return bool(url)

        wait_for(logged, 30, "the metrics address in the log", log)

        def leading() -> bool:
            return value(scrape(url[0]), "pysched_partitions_led") > 0

        wait_for(leading, 30, "the node to lead partitions", log)
    finally:
        stop_node(node)


@pytest.mark.cluster
def test_a_workers_kafka_consumer_lag_is_served_by_partition(services: dict[str, object], keyspace: str) -> None:
    from prometheus_client import generate_latest

    from pysched.dispatch.kafka import KafkaDispatcher, ensure_topic
    from tests.conftest import cluster_config_for

    config = cluster_config_for(services, keyspace, partitions=4, kafka_partitions=2)
    ensure_topic(config)
    dispatcher = KafkaDispatcher(config, group=f"{keyspace}-lag")
    metrics = NodeMetrics()
    metrics.watch_consumer_lag(dispatcher.consumer_lag)
    try:
        assert dispatcher.consumer_lag() == {}  # no member yet
        dispatcher.publish([0] * 5, [b"x"] * 5)
        consumer = dispatcher.consumer()
        taken: list[object] = []
        wait_for(lambda: taken.append(consumer.next(1.0)) or taken[-1] is not None, 60, "the first record")
        # One taken of five in partition 0 (fetched ahead: its end is known).
        wait_for(lambda: dispatcher.consumer_lag().get(0) == 4, 60, "partition 0's lag to read 4")
        families = {f.name: f for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())}
        assert_conventional(families)
        assert value(families, "pysched_kafka_consumer_lag_records", partition="0") == 4
        consumer.close()
    finally:
        dispatcher.close()
