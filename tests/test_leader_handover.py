"""A partition changing hands, on the real Cassandra store and Kafka, with
the order of the leader's threads forced where a process test only
sometimes hits it. Each test here reproduced a run lost in the failover
process tests (tests/test_cluster_processes.py) before its fix."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from pysched.clock import SystemClock
from pysched.leader import LeaderConfig, PartitionLeader, RunDispatched
from pysched.model import Job
from pysched.node import Backends, open_cluster
from pysched.protocols import ClaimOutcome, Lease, PlannedRun
from pysched.records import DispatchRecord
from tests.conftest import cluster_config_for
from tests.helpers import wait_for

pytestmark = pytest.mark.cluster


class AheadClock(SystemClock):
    """The system clock, ``ahead_ms`` later: a leader for which the test's
    runs are long overdue, without the test waiting for them."""

    def __init__(self, ahead_ms: int) -> None:
        self.ahead_ms = ahead_ms

    def now_ms(self) -> int:
        return super().now_ms() + self.ahead_ms


@dataclass
class ScriptedCoordinator:
    """Grants what the test says, publishing each new fence first as the
    etcd coordinator does."""

    backends: Backends
    owned: dict[int, int] = field(default_factory=dict)
    answer_valid_ms: int = 3_600_000

    def grant(self, owned: dict[int, int]) -> None:
        for p, fence in owned.items():
            self.backends.store.raise_fence(p, fence)
            self.backends.claims.raise_fence(p, fence)
        self.owned = dict(owned)

    def poll(self, holder: str, now_ms: int) -> dict[int, int]:
        return dict(self.owned)

    def release(self, holder: str) -> None:
        pass

    def leaders(self) -> dict[int, Lease]:
        return {p: Lease("leader", f, 0) for p, f in self.owned.items()}

    def giving_up(self, holder: str) -> dict[int, int]:
        return {}


class FirstReadAfterARecord:
    """The store, except that the leader's first read waits until it has
    recorded something (at most ``wait_s``): the order in which a newly won
    partition's first read is slower than the leader's next record."""

    def __init__(self, backends: Backends, wait_s: float) -> None:
        self._store = backends.store
        self._recorded = threading.Event()
        self._wait_s = wait_s
        self._first = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def finish_dispatch(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._store.finish_dispatch(*args, **kwargs)
        finally:
            self._recorded.set()

    def due_runs(self, *args: Any, **kwargs: Any) -> Any:
        if self._first:
            self._first = False
            self._recorded.wait(self._wait_s)
        return self._store.due_runs(*args, **kwargs)


@pytest.fixture
def backends(services: dict[str, Any], keyspace: str) -> Iterator[Backends]:
    config = cluster_config_for(services, keyspace, partitions=4, kafka_partitions=2)
    opened = open_cluster(config, coordinator=False)
    yield opened
    opened.close()


def once(job_id: str, at_ms: int) -> Job:
    return Job.model_validate(
        {"id": job_id, "schedule": {"kind": "once", "run_at_ms": at_ms}, "target": {"kind": "shell", "command": "true"}}
    )


class LeaderThread:
    def __init__(self, leader: PartitionLeader) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=leader.run, args=(self.stop,), daemon=True)

    def __enter__(self) -> LeaderThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def test_a_partition_is_not_marked_handed_on_before_its_first_read(backends: Backends) -> None:
    # Seen as runs never sent after a kill -9 moved partitions: the new
    # leader's periodic "nothing left unsent" record moved the watermark of a
    # partition it had won but not yet read, past runs its predecessor never
    # sent, and its first read then started beyond them.
    wall = SystemClock().now_ms()
    backends.store.add_job(once("owed", wall), 1, 0, PlannedRun(wall, wall), wall)
    coordinator = ScriptedCoordinator(backends)
    coordinator.grant({1: 7})
    sent: list[RunDispatched] = []
    leader = PartitionLeader(
        FirstReadAfterARecord(backends, wait_s=5.0),  # type: ignore[arg-type]
        coordinator,
        backends.dispatcher,
        AheadClock(20_000),  # the run is 20 s overdue: its predecessor died before sending it
        "new-leader",
        LeaderConfig(watermark_every_ms=50),
        sent.append,
    )
    with LeaderThread(leader):
        wait_for(lambda: any(e.job_id == "owed" for e in sent), 30, "the owed run to be sent")


def test_a_run_handed_back_to_a_leader_that_sent_it_under_an_older_fence_is_sent_again(
    backends: Backends,
) -> None:
    # Seen after a leader paused past its lease woke up: it sent its due runs
    # under its old fence (the workers rejected them and handed them back),
    # won the partitions again under a new fence, and took the handed-back
    # runs for its own earlier sends.
    wall = SystemClock().now_ms()
    backends.store.add_job(once("back", wall + 1_500), 0, 0, PlannedRun(wall + 1_500, wall + 1_500), wall)
    coordinator = ScriptedCoordinator(backends)
    coordinator.grant({0: 5})
    sent: list[RunDispatched] = []
    leader = PartitionLeader(
        backends.store, coordinator, backends.dispatcher, SystemClock(), "woken-leader", LeaderConfig(), sent.append
    )
    with LeaderThread(leader):
        wait_for(lambda: any(e.job_id == "back" for e in sent), 30, "the run's first send")
        (first,) = [e for e in sent if e.job_id == "back"]
        coordinator.grant({0: 9})
        # What a worker does with the first send, now below the fence.
        stale = DispatchRecord(first.run_id, "back", first.run_at_ms, first.due_ms, 0, first.attempt, 0, 5, wall)
        claim = backends.claims.claim(stale, "worker", SystemClock().now_ms(), 30_000)
        assert claim.outcome is ClaimOutcome.FENCED
        assert backends.store.hand_back(stale, SystemClock().now_ms())
        wait_for(lambda: any(e.job_id == "back" and e.fence == 9 for e in sent), 30, "the run sent under fence 9")
