"""A simulated world on the cluster's own store (``--store tables``): the
world's faults reach the real store and claims as the driver's and Redis's
failures, and its judge reads what the tables hold."""

from __future__ import annotations

import random
from collections.abc import Iterator

import fakeredis
import pytest
import redis
from cassandra import ReadTimeout, WriteTimeout, WriteType
from cassandra.cluster import NoHostAvailable

from pysched.clock import ManualClock
from pysched.memory.cql import TableCall
from pysched.model import Job
from pysched.protocols import NextRuns
from pysched.registry import register_many
from pysched.sim.cluster_tables import REDIS_DOWN_MS, TableServers, driver_failure
from pysched.sim.faults import FaultEvent, NodeFaults
from pysched.sim.runner import simulate
from pysched.sim.world import NodeClock
from pysched.sim.worlds import tables_recording_outage_world

T0 = 1_800_000_000_000


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def servers(clock: ManualClock) -> Iterator[TableServers]:
    made = TableServers(2, clock, 2)
    yield made
    made.close()


def once_job(job_id: str) -> Job:
    return Job.model_validate(
        {
            "id": job_id,
            "schedule": {"kind": "once", "run_at_ms": T0 + 3_600_000},
            "target": {"kind": "shell", "command": "true"},
        }
    )


def test_a_store_fault_fails_the_node_s_store_calls_as_the_driver_does_and_its_claims_not(
    clock: ManualClock, servers: TableServers
) -> None:
    faults = NodeFaults(random.Random(1))
    node = servers.node(faults, NodeClock(clock, 0), "node-0.0")
    other = servers.node(NodeFaults(random.Random(2)), NodeClock(clock, 0), "node-1.0")
    register_many(other.store, [once_job("j")], T0)
    faults.start(FaultEvent("store", 0, T0, 10_000, rate=1.0))
    with pytest.raises(NoHostAvailable):  # failed before its effect: no host took it
        node.store.get_job("j")
    assert other.store.get_job("j").state == "active"  # another node's calls go on
    assert node.claims.unfinished_claim("j:0:0", T0) is None  # the claims' calls too
    assert faults.injected == 1


@pytest.mark.parametrize(
    ("phase", "cql", "raised", "write_type"),
    [
        ("before", "INSERT INTO ks.t (k) VALUES (?) IF NOT EXISTS", NoHostAvailable, None),
        ("after", "SELECT v FROM ks.t WHERE k = ?", ReadTimeout, None),
        ("after", "INSERT INTO ks.t (k) VALUES (?) IF NOT EXISTS", WriteTimeout, WriteType.CAS),
        ("after", "UPDATE ks.t SET v = ? WHERE k = ?", WriteTimeout, WriteType.SIMPLE),
        ("between", "DELETE FROM ks.t WHERE k = ?", WriteTimeout, WriteType.UNLOGGED_BATCH),
    ],
)
def test_a_failed_table_call_raises_what_the_driver_raises_there(
    phase: str, cql: str, raised: type[Exception], write_type: int | None
) -> None:
    # Before its effect, no host took it; after it (an LWT's included) or
    # between two statements, a timeout the store reads as "may have applied".
    failure = driver_failure(TableCall("node-0.0/store", phase, cql))
    assert type(failure) is raised
    assert write_type is None or getattr(failure, "write_type", None) == write_type


def test_redis_goes_down_and_comes_back_empty(clock: ManualClock, servers: TableServers) -> None:
    fast = fakeredis.FakeRedis(server=servers.servers.redis)
    fast.set("marker", "held")
    servers.lose_fast_path(T0, back_by_ms=T0 + 10 * REDIS_DOWN_MS)
    with pytest.raises(redis.ConnectionError):
        fast.get("marker")
    servers.round(T0 + REDIS_DOWN_MS - 1)
    with pytest.raises(redis.ConnectionError):
        fast.get("marker")
    servers.round(T0 + REDIS_DOWN_MS)
    assert fast.get("marker") is None  # back, and it kept nothing


def test_the_judge_reads_the_runs_the_tables_hold(clock: ManualClock, servers: TableServers) -> None:
    node = servers.node(NodeFaults(random.Random(1)), NodeClock(clock, 0), "node-0.0")
    register_many(node.store, [once_job("j")], T0)
    rows = servers.rows()
    (row,) = rows.runs["j"].values()
    assert (row.run_at_ms, row.attempt_group, row.state) == (T0 + 3_600_000, 0, "scheduled")
    assert rows.dead_letters == {} and rows.missed == {}


def test_redis_keys_expire_by_the_world_s_clock(clock: ManualClock, servers: TableServers) -> None:
    fast = fakeredis.FakeRedis(server=servers.servers.redis)
    fast.set("marker", "held", px=60_000)
    clock.advance(59_999)
    assert fast.get("marker") == b"held"
    clock.advance(2)
    assert fast.get("marker") is None
    servers.close()  # the machine's clock again
    fast.set("marker", "held", px=60_000)
    clock.advance(120_000)
    assert fast.get("marker") == b"held"


def _issue_fence(servers: TableServers, partition: int, holder: str) -> int:
    """etcd issues ``holder`` the next fence of ``partition`` (its previous
    leader key deleted, as a hand-over does)."""
    election = servers.election
    with election.lock:
        for other in list(election.nodes):
            election.delete_leader_key(partition, other)
        lease = election.grant_lease(holder, 10_000)
        election.put_node(holder, lease)
        fence = election.create_leader_key(partition, holder, lease)
    assert fence is not None
    return fence


def test_a_watermark_moved_under_a_superseded_fence_is_seen_at_the_tables(
    clock: ManualClock, servers: TableServers
) -> None:
    old = servers.node(NodeFaults(random.Random(1)), NodeClock(clock, 0), "node-0.0")
    first = _issue_fence(servers, 0, "node-0.0")
    old.store.raise_fence(0, first)
    old.store.finish_dispatch([], {0: first}, {0: T0 + 60_000}, T0, NextRuns([], []))
    assert servers.fence_violation() is None  # its own fence, the highest issued
    # A successor is issued a fence and has not yet raised the stored one:
    # the table's condition (IF fence <= first) lets the old leader's
    # watermark move through, and the check at the tables sees it.
    _issue_fence(servers, 0, "node-1.0")
    old.store.finish_dispatch([], {0: first}, {0: T0 + 120_000}, T0, NextRuns([], []))
    seen = servers.fence_violation()
    assert seen is not None and seen.kind == "fence-superseded"


def test_a_stored_fence_written_lower_is_seen_and_a_run_owed_again_under_its_old_fence_is_not(
    clock: ManualClock, servers: TableServers
) -> None:
    node = servers.node(NodeFaults(random.Random(1)), NodeClock(clock, 0), "node-0.0")
    fence = _issue_fence(servers, 1, "node-0.0")
    node.store.raise_fence(1, fence)
    tables = servers.servers.tables.client(clock, "a writer", servers.servers.config.keyspace)
    # A schedule row inserted with an older fence: a run owed again keeps
    # the fence it was handed on under, a worker's write, not a leader's.
    tables.execute(
        "INSERT INTO schedule (time_bucket, shard, due_ms, run_id, job_id, run_at_ms, attempt_group, attempt, fence)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (0, 1, T0, 7, "j", T0, 0, 1, fence - 1),
    )
    assert servers.fence_violation() is None
    clock.advance(1)  # a later write timestamp: last write wins, and it is this one
    tables.execute("UPDATE watermarks SET fence = %s WHERE partition = %s", (fence - 1, 1))
    kinds = {v.kind for v in servers.fences.violations}
    assert kinds == {"fence-superseded", "fence-lowered"}


def test_a_recording_outage_on_the_tables_writes_nothing_under_a_superseded_fence() -> None:
    # The world that catches fence-check-dropped (sim/mutants.py) holds
    # with the store's fence check in: the catch is the mutant's.
    report = simulate(tables_recording_outage_world(4))
    assert report.ok, f"{report.violations[:3]}\nreplay: {report.config.replay_line()}"
