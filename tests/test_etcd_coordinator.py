"""The etcd coordinator on the real server: what happens when publishing a
fence fails half-way through a poll."""

from __future__ import annotations

from typing import Any

import pytest

from pysched.coord.etcd import EtcdCoordinator
from tests.conftest import cluster_config_for

pytestmark = pytest.mark.cluster


def test_a_partition_whose_fence_failed_to_publish_is_led_after_the_next_poll(
    services: dict[str, Any], keyspace: str
) -> None:
    published: list[tuple[int, int]] = []
    failures = {"left": 1}

    def publish(partition: int, fence: int) -> None:
        # The first publish fails, as a store or Redis timeout would.
        if failures["left"]:
            failures["left"] -= 1
            raise TimeoutError("publishing the fence timed out")
        published.append((partition, fence))

    config = cluster_config_for(services, keyspace, kafka_partitions=2)
    coordinator = EtcdCoordinator(config, partitions=4, publish_fence=publish)
    try:
        with pytest.raises(TimeoutError):
            coordinator.poll("node-1", 0)
        led = coordinator.poll("node-1", 0)
        assert sorted(led) == [0, 1, 2, 3]
        # Each fence is published before it is used, the failed one again.
        assert sorted(published) == sorted(led.items())
        assert {p: lease.fence for p, lease in coordinator.leaders().items()} == led
    finally:
        coordinator.release("node-1")
        coordinator.close()
