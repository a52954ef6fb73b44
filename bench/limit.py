"""`python -m bench limit`: the practical floor on this machine. A bare
confluent-kafka producer sends 50k pre-built dispatch payloads to the same
broker and topic; its lag is each record's LogAppendTime minus the moment it
started. pysched's cluster fire path (an instant burst, same n) is reported
as a ratio to it."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Producer

from pysched import native
from pysched.config import ClusterConfig
from pysched.config import load as load_config
from pysched.dispatch.kafka import ensure_topic, producer_settings
from pysched.node import open_cluster_store
from pysched_loadgen.measure import percentiles
from pysched_loadgen.runner import appended, watch_topic


def bare_producer(config_path: str, n: int) -> dict[str, Any]:
    config = load_config(config_path)
    ensure_topic(config)
    # Records of the keyspace's partitions, as its leaders send them.
    store, close = open_cluster_store(config)
    partitions = store.partitions
    close()
    prefix = f"bench-limit-{uuid.uuid4().hex[:6]}-"
    rows = [(k, f"{prefix}{k:07d}", 0, 0, k % partitions, 1, 0) for k in range(n)]
    payloads = native.encode_batch(rows, 0, 0)  # fence 0: every worker rejects them
    # The same settings as pysched's own producer: the comparison is of
    # everything around the producer, not of its configuration.
    producer = Producer(producer_settings(config))
    # Warm, as pysched's node is by the time a burst falls due: connected, its
    # producer id taken, a record already sent to every partition.
    producer.list_topics(config.topic, timeout=10)
    warm = native.encode_batch([(0, f"warm-{prefix}", 0, 0, 0, 1, 0)], 0, 0)[0]
    for partition in range(config.kafka_partitions):
        producer.produce(config.topic, warm, partition=partition)
    producer.flush(30)
    failed: list[str] = []
    start = time.time_ns() // 1_000_000
    for k, payload in enumerate(payloads):
        while True:
            try:
                producer.produce(
                    config.topic,
                    payload,
                    partition=k % config.kafka_partitions,
                    on_delivery=lambda err, _msg: failed.append(str(err)),
                )
                break
            except BufferError:
                producer.poll(0.01)
    remaining = producer.flush(60)
    # Read back, as loadgen reads pysched's records: the broker's append time.
    appended = _appended_at(config, prefix, n - remaining - len(failed))
    return {"n": n, "acknowledged": len(appended), **percentiles([a - start for a in appended])}


def _appended_at(config: ClusterConfig, prefix: str, expected: int, timeout_s: float = 60) -> list[int]:
    consumer = watch_topic(config, from_start=True)
    times: list[int] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(times) < expected and time.monotonic() < deadline:
            times.extend(at for record, at in appended(consumer, 0.5) if record.job_id.startswith(prefix))
    finally:
        consumer.close()
    return times


def limit(config_path: str, n: int, nodes: int, workers: int) -> dict[str, Any]:
    from bench.burst import burst

    bare = bare_producer(config_path, n)
    fire_path = burst(n, 1, config_path, nodes, workers)
    out: dict[str, Any] = {
        "n": n,
        "bare_producer": bare,
        "pysched_cluster": {k: v for k, v in fire_path.items() if k != "runs"},
    }
    if bare.get("p99_ms") and fire_path.get("p99_ms") is not None:
        out["p99_ratio"] = round(fire_path["p99_ms"] / max(bare["p99_ms"], 1.0), 2)
    return out
