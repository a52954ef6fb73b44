"""The workers' Kafka consumer group is the configuration's, so clusters
sharing a broker can keep their rebalances apart."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from pysched.dispatch.kafka import KafkaDispatcher, ensure_topic
from tests.conftest import cluster_config_for

pytestmark = pytest.mark.cluster


def test_workers_consume_in_the_configured_group(services: dict[str, Any], keyspace: str) -> None:
    config = cluster_config_for(services, keyspace, kafka_partitions=1, consumer_group=f"{keyspace}-own-group")
    ensure_topic(config)
    dispatcher = KafkaDispatcher(config)
    consumer = dispatcher.consumer()
    try:
        dispatcher.publish([0], [b"payload"])
        delivery = None
        for _ in range(60):  # bounded: a minute of one-second polls
            delivery = consumer.next(1.0)
            if delivery is not None:
                break
        assert delivery is not None, "the record published was not consumed within a minute"
        consumer.ack(delivery)
        admin = AdminClient({"bootstrap.servers": config.kafka, "log_level": 0})
        (described,) = admin.describe_consumer_groups([config.consumer_group]).values()
        group = described.result(30)
        assert group.group_id == f"{keyspace}-own-group"
        assert len(group.members) == 1
    finally:
        consumer.close()
        dispatcher.close()
