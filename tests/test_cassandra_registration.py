"""Registering on a cold or busy Cassandra: a lightweight transaction that
times out may have applied, and the registration must neither fail nor call
its own job a duplicate."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from pysched.model import Job
from pysched.protocols import JobExists, PlannedRun
from pysched.registry import register_many
from pysched.stores.cassandra import CassandraScheduleStore, connect, ensure_schema
from tests.conftest import cluster_config_for

pytestmark = pytest.mark.cluster


class TimingOutFirst:
    """The real session, but its next ``n`` requests give up on the client
    side at once: sent to the server, which may apply them, with the answer
    never read — what a timed-out lightweight transaction looks like."""

    def __init__(self, session: Any, n: int) -> None:
        self._session = session
        self.n = n

    def execute_async(self, *args: Any, **kwargs: Any) -> Any:
        if self.n > 0:
            self.n -= 1
            kwargs["timeout"] = 0.000_01
        return self._session.execute_async(*args, **kwargs)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        return self.execute_async(*args, **kwargs).result()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


@pytest.fixture
def session_and_config(services: dict[str, Any], keyspace: str) -> Iterator[tuple[Any, Any]]:
    config = cluster_config_for(services, keyspace, partitions=4, kafka_partitions=2)
    session = connect(config)
    ensure_schema(session, config, time.time_ns() // 1_000_000)
    yield session, config
    session.cluster.shutdown()


def job(job_id: str) -> Job:
    return Job.model_validate(
        {
            "id": job_id,
            "schedule": {"kind": "once", "run_at_ms": 4_000_000_000_000},
            "target": {"kind": "shell", "command": "true"},
        }
    )


def test_timed_out_registrations_are_tried_again_and_their_own_rows_recognised(
    session_and_config: tuple[Any, Any],
) -> None:
    session, config = session_and_config
    flaky = TimingOutFirst(session, n=0)
    store = CassandraScheduleStore(flaky, config)  # type: ignore[arg-type]
    flaky.n = 40
    now = 1_900_000_000_000
    jobs = [job(f"j{k:03d}") for k in range(100)]
    assert register_many(store, jobs, now) == []
    assert flaky.n == 0, "the first requests should have timed out"
    assert sorted(r.job.id for r in store.list_jobs()) == [j.id for j in jobs]
    assert {r.state for r in store.list_jobs()} == {"active"}
    flaky.n = 1
    rec = store.add_job(job("single"), 0, 0, PlannedRun(4_000_000_000_000, 4_000_000_000_000), now)
    assert rec.state == "active" and store.get_job("single").state == "active"
    # A real duplicate is still one.
    assert register_many(store, [job("j000")], now + 1) == ["j000"]
    with pytest.raises(JobExists):
        store.add_job(job("single"), 0, 0, PlannedRun(4_000_000_000_000, 4_000_000_000_000), now + 1)
