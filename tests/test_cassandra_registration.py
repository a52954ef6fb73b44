"""Registering on a cold or busy Cassandra: a lightweight transaction that
times out may have applied, and the registration must neither fail nor call
its own job a duplicate."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from pysched.model import Job
from pysched.protocols import JobExists, PlannedRun
from pysched.registry import register_many
from pysched.stores.cassandra import CassandraScheduleStore, connect, ensure_schema
from pysched.stores.cassandra_job_ids import REGISTERING_GRACE_MS, bucket_of
from pysched.stores.cql_tables import DriverTables
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
def tables_and_config(services: dict[str, Any], keyspace: str) -> Iterator[tuple[Any, Any]]:
    config = cluster_config_for(services, keyspace, partitions=4, kafka_partitions=2)
    tables = connect(config)
    ensure_schema(tables, config, time.time_ns() // 1_000_000)
    yield tables, config
    tables.shutdown()


def job(job_id: str) -> Job:
    return Job.model_validate(
        {
            "id": job_id,
            "schedule": {"kind": "once", "run_at_ms": 4_000_000_000_000},
            "target": {"kind": "shell", "command": "true"},
        }
    )


def test_timed_out_registrations_are_tried_again_and_their_own_rows_recognised(
    tables_and_config: tuple[Any, Any],
) -> None:
    tables, config = tables_and_config
    flaky = TimingOutFirst(tables.session, n=0)
    store = CassandraScheduleStore(DriverTables(flaky), config)
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


def far_run() -> PlannedRun:
    return PlannedRun(4_000_000_000_000, 4_000_000_000_000)


def test_two_bulk_registrations_racing_on_the_same_ids_register_each_once(
    tables_and_config: tuple[Any, Any],
) -> None:
    tables, config = tables_and_config
    store = CassandraScheduleStore(tables, config)
    now = 1_900_000_000_000
    first = [job(f"race-{k:04d}") for k in range(0, 600)]
    second = [job(f"race-{k:04d}") for k in range(300, 900)]
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda jobs: register_many(store, jobs, now), [first, second])
    overlap = {j.id for j in first} & {j.id for j in second}
    # Each id of both lists is refused to exactly one of them.
    assert set(a) | set(b) == overlap and not set(a) & set(b)
    assert len(store.list_jobs()) == 900


def test_an_id_listed_twice_in_one_call_is_registered_once(tables_and_config: tuple[Any, Any]) -> None:
    tables, config = tables_and_config
    store = CassandraScheduleStore(tables, config)
    assert register_many(store, [job("twice"), job("once"), job("twice")], 1_900_000_000_000) == ["twice"]
    assert sorted(r.job.id for r in store.list_jobs()) == ["once", "twice"]


def test_an_id_held_by_a_registration_that_died_is_taken_over_after_the_grace(
    tables_and_config: tuple[Any, Any],
) -> None:
    tables, config = tables_and_config
    store = CassandraScheduleStore(tables, config)
    now = 1_900_000_000_000
    claim = tables.prepare(
        f"INSERT INTO {config.keyspace}.job_ids (bucket, job_id, owner, claimed_at_ms) VALUES (?, ?, 'dead', ?)"
    )
    # Claimed, its job never written: one just now, one past the grace.
    tables.execute(claim, (bucket_of("recent"), "recent", now - 1_000))
    tables.execute(claim, (bucket_of("stale"), "stale", now - REGISTERING_GRACE_MS - 1))
    with pytest.raises(JobExists):
        store.add_job(job("recent"), 0, 0, far_run(), now)
    assert register_many(store, [job("recent"), job("stale")], now) == ["recent"]
    assert store.get_job("stale").state == "active"
    assert [r.job.id for r in store.list_jobs()] == ["stale"]


def test_jobs_registered_before_ids_were_claimed_keep_their_ids(tables_and_config: tuple[Any, Any]) -> None:
    """A keyspace whose jobs predate the id table: ensure_schema claims
    their ids once, so that none is registered a second time."""
    tables, config = tables_and_config
    ks = config.keyspace
    tables.execute(
        f"INSERT INTO {ks}.jobs (job_id, spec, state, partition, jitter_ms, created_at_ms, updated_at_ms)"
        " VALUES ('older', %s, 'active', 0, 0, 1, 1)",
        (job("older").model_dump_json(),),
    )
    tables.execute(f"DELETE FROM {ks}.meta WHERE name = 'job_ids_backfilled'")
    ensure_schema(tables, config, 1_900_000_000_000)
    store = CassandraScheduleStore(tables, config)
    assert register_many(store, [job("older"), job("newer")], 1_900_000_000_000) == ["older"]
    with pytest.raises(JobExists):
        store.add_job(job("older"), 0, 0, far_run(), 1_900_000_000_000)


def test_a_cancelled_id_another_registration_has_just_taken_is_not_taken_from_it(
    tables_and_config: tuple[Any, Any],
) -> None:
    """Two clients register a cancelled job's id at once: the first has
    taken the id's claim and not yet written its job (the row still says
    cancelled); the second must be refused, not take the claim over and
    delete what the first is writing. Past the grace, a first that died is
    taken over."""
    tables, config = tables_and_config
    store = CassandraScheduleStore(tables, config)
    now = 1_900_000_000_000
    for job_id in ("busy", "died"):
        register_many(store, [job(job_id)], now - 10 * REGISTERING_GRACE_MS)
        store.cancel_job(job_id, now - 10 * REGISTERING_GRACE_MS)
    take = tables.prepare(
        f"UPDATE {config.keyspace}.job_ids SET owner = 'first', claimed_at_ms = ? WHERE bucket = ? AND job_id = ?"
    )
    tables.execute(take, (now - 1_000, bucket_of("busy"), "busy"))
    tables.execute(take, (now - REGISTERING_GRACE_MS - 1, bucket_of("died"), "died"))
    with pytest.raises(JobExists, match="being registered by another client"):
        store.add_job(job("busy"), 0, 0, far_run(), now)
    assert store.get_job("busy").state == "cancelled"
    assert register_many(store, [job("died")], now) == []
    assert store.get_job("died").state == "active"
