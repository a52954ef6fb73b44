"""The etcd coordinator on the real server: what happens when publishing a
fence fails half-way through a poll."""

from __future__ import annotations

import time
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


def test_a_failed_poll_keeps_the_lease_it_had(services: dict[str, Any], keyspace: str) -> None:
    # A failed poll threw the lease away: the next poll took a new one, the
    # partitions won under the old one vanished with it a TTL later and were
    # won again under new fences (every run of the window sent again).
    failures = {"left": 1}

    def publish(partition: int, fence: int) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise TimeoutError("publishing the fence timed out")

    config = cluster_config_for(services, keyspace, partitions=4, kafka_partitions=2, lease_ttl_s=2)
    coordinator = EtcdCoordinator(config, partitions=4, publish_fence=publish)
    try:
        with pytest.raises(TimeoutError):
            coordinator.poll("node-1", 0)
        led = coordinator.poll("node-1", 0)
        deadline = time.monotonic() + 3 * config.lease_ttl_s
        while time.monotonic() < deadline:  # past the TTL of a lease left behind
            assert coordinator.poll("node-1", 0) == led
            time.sleep(0.2)
    finally:
        coordinator.release("node-1")
        coordinator.close()


def test_a_partition_won_by_a_failed_poll_and_no_longer_its_own_is_handed_over(
    services: dict[str, Any], keyspace: str
) -> None:
    # The poll that won partition 0 failed publishing its fence; before the
    # next, a node sorting first joined, whose share partition 0 is. The
    # key was neither led nor handed over: held under a lease that lived
    # on, nobody led partition 0 while its holder lived.
    failures = {"left": 1}

    def publish(partition: int, fence: int) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise TimeoutError("publishing the fence timed out")

    config = cluster_config_for(services, keyspace, kafka_partitions=2)
    late, joining = (EtcdCoordinator(config, partitions=2, publish_fence=publish) for _ in range(2))
    try:
        with pytest.raises(TimeoutError):
            late.poll("node-2", 0)
        assert joining.poll("node-1", 0) == {}  # partition 0 still held by node-2
        assert sorted(late.poll("node-2", 0)) == [1]
        assert sorted(joining.poll("node-1", 0)) == [0]
    finally:
        late.release("node-2")
        joining.release("node-1")
        late.close()
        joining.close()
