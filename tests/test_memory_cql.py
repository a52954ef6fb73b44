"""The in-memory tables answer as Cassandra does: each semantic test runs the
same statements on both (Cassandra's with the servers, skipped without them
like every cluster test), then the faults and clocks only memory has."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from cassandra import WriteTimeout, WriteType

from pysched.clock import ManualClock
from pysched.memory.cql import CqlCluster, CqlError, MemoryTables, TableCall, UnsupportedStatement
from pysched.stores.cassandra_rows import applied
from pysched.stores.cql_tables import CqlTables
from tests.conftest import cluster_config_for

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS {ks}.kv (k text, c int, v text, n bigint, PRIMARY KEY ((k), c))",
    "CREATE TABLE IF NOT EXISTS {ks}.log (k text, at bigint, seq int, v text,"
    " PRIMARY KEY ((k), at, seq)) WITH CLUSTERING ORDER BY (at DESC, seq ASC)",
    "CREATE TABLE IF NOT EXISTS {ks}.hits (k int, p int, n counter, PRIMARY KEY (k, p))",
    "CREATE TABLE IF NOT EXISTS {ks}.runs (id text PRIMARY KEY, failures map<int, text>, state text)",
]


@dataclass
class Engine:
    name: str
    tables: CqlTables
    ks: str
    wait: Callable[[float], None]

    def run(self, cql: str, params: tuple[Any, ...] | None = None) -> Any:
        return self.tables.execute(cql.format(ks=self.ks), params)

    def rows(self, cql: str, params: tuple[Any, ...] | None = None) -> list[dict[str, Any]]:
        return [dict(r._asdict()) for r in self.run(cql, params)]


def _create(tables: CqlTables, ks: str) -> None:
    tables.execute(
        f"CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}"
    )
    for statement in SCHEMA:
        tables.execute(statement.format(ks=ks), timeout=60)
    tables.agree_on_schema()


@pytest.fixture(params=["memory", pytest.param("cassandra", marks=pytest.mark.cluster)])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    if request.param == "memory":
        clock = ManualClock(1_900_000_000_000)
        tables = CqlCluster(clock).client(clock)
        _create(tables, "mem")
        yield Engine("memory", tables, "mem", clock.sleep)
        return
    from pysched.stores.cassandra import connect

    services = request.getfixturevalue("services")
    ks = request.getfixturevalue("keyspace")
    driver = connect(cluster_config_for(services, ks))
    _create(driver, ks)
    yield Engine("cassandra", driver, ks, time.sleep)
    driver.shutdown()


def test_an_update_of_a_missing_row_creates_it_and_a_null_column_reads_none(engine: Engine) -> None:
    engine.run("UPDATE {ks}.kv SET v = 'x' WHERE k = 'a' AND c = 1")
    assert engine.rows("SELECT k, c, v, n FROM {ks}.kv WHERE k = 'a'") == [{"k": "a", "c": 1, "v": "x", "n": None}]


def test_a_row_lives_while_a_cell_or_its_insert_marker_does(engine: Engine) -> None:
    engine.run("UPDATE {ks}.kv SET v = 'x' WHERE k = 'u' AND c = 1")
    engine.run("UPDATE {ks}.kv SET v = null WHERE k = 'u' AND c = 1")
    assert engine.rows("SELECT * FROM {ks}.kv WHERE k = 'u'") == []  # updated only: gone with its cell
    engine.run("INSERT INTO {ks}.kv (k, c, v) VALUES ('i', 1, 'x')")
    engine.run("UPDATE {ks}.kv SET v = null WHERE k = 'i' AND c = 1")
    assert engine.rows("SELECT * FROM {ks}.kv WHERE k = 'i'") == [{"k": "i", "c": 1, "n": None, "v": None}]


def test_the_last_write_by_timestamp_wins_not_the_last_to_arrive(engine: Engine) -> None:
    engine.run("INSERT INTO {ks}.kv (k, c, v) VALUES ('t', 1, 'late') USING TIMESTAMP 2000")
    engine.run("UPDATE {ks}.kv USING TIMESTAMP 1000 SET v = 'early' WHERE k = 't' AND c = 1")
    assert engine.rows("SELECT v FROM {ks}.kv WHERE k = 't' AND c = 1") == [{"v": "late"}]
    # A tombstone hides what is older than it, arriving before or after.
    engine.run("DELETE FROM {ks}.kv USING TIMESTAMP 3000 WHERE k = 't' AND c = 1")
    engine.run("UPDATE {ks}.kv USING TIMESTAMP 2500 SET v = 'older' WHERE k = 't' AND c = 1")
    assert engine.rows("SELECT v FROM {ks}.kv WHERE k = 't'") == []
    engine.run("UPDATE {ks}.kv USING TIMESTAMP 3500 SET v = 'newer' WHERE k = 't' AND c = 1")
    assert engine.rows("SELECT v FROM {ks}.kv WHERE k = 't'") == [{"v": "newer"}]
    # A tie: of two values the greater, and a tombstone over a value.
    engine.run("UPDATE {ks}.kv USING TIMESTAMP 4000 SET v = 'b' WHERE k = 't' AND c = 2")
    engine.run("UPDATE {ks}.kv USING TIMESTAMP 4000 SET v = 'a' WHERE k = 't' AND c = 2")
    assert engine.rows("SELECT v FROM {ks}.kv WHERE k = 't' AND c = 2") == [{"v": "b"}]
    engine.run("DELETE FROM {ks}.kv USING TIMESTAMP 4000 WHERE k = 't' AND c = 2")
    assert engine.rows("SELECT v FROM {ks}.kv WHERE k = 't' AND c = 2") == []


def test_a_transaction_not_applied_answers_with_the_row_in_its_way(engine: Engine) -> None:
    insert = engine.tables.prepare(f"INSERT INTO {engine.ks}.kv (k, c, v) VALUES (?, ?, ?) IF NOT EXISTS")
    assert applied(engine.tables.execute(insert, ("l", 1, "first")))
    refused = engine.tables.execute(insert, ("l", 1, "second"))
    assert not applied(refused)
    assert refused.one()._asdict() == {"applied": False, "k": "l", "c": 1, "n": None, "v": "first"}
    update = engine.tables.prepare(f"UPDATE {engine.ks}.kv SET v = ? WHERE k = ? AND c = ? IF v = ?")
    assert applied(engine.tables.execute(update, ("third", "l", 1, "first")))
    refused = engine.tables.execute(update, ("fourth", "l", 1, "first"))
    assert refused.one()._asdict() == {"applied": False, "v": "third"}
    missing = engine.tables.execute(update, ("x", "l", 9, "first"))
    assert [r._asdict() for r in missing] == [{"applied": False}]
    gone = engine.run("DELETE FROM {ks}.kv WHERE k = 'l' AND c = 9 IF EXISTS")
    assert [r._asdict() for r in gone] == [{"applied": False}]
    # A comparison with a null cell holds for '=' null alone.
    assert not applied(engine.run("UPDATE {ks}.kv SET v = 'y' WHERE k = 'l' AND c = 1 IF n < 5"))
    assert applied(engine.run("UPDATE {ks}.kv SET v = 'y' WHERE k = 'l' AND c = 1 IF n = null"))


def test_a_conditional_batch_applies_whole_or_answers_with_the_rows_found(engine: Engine) -> None:
    insert = engine.tables.prepare(f"INSERT INTO {engine.ks}.kv (k, c, v) VALUES (?, ?, ?) IF NOT EXISTS")
    assert applied(engine.tables.batch([(insert, ("b", c, f"v{c}")) for c in (1, 2)], logged=False))
    refused = engine.tables.batch([(insert, ("b", c, f"w{c}")) for c in (2, 3)], logged=False)
    assert not applied(refused)
    assert [(r.c, r.v) for r in refused.current_rows] == [(2, "v2")]
    assert [r.c for r in engine.run("SELECT c FROM {ks}.kv WHERE k = 'b'")] == [1, 2]


def test_rows_come_in_clustering_order_and_ranges_in_and_limit_select_them(engine: Engine) -> None:
    insert = engine.tables.prepare(f"INSERT INTO {engine.ks}.log (k, at, seq, v) VALUES (?, ?, ?, ?)")
    for at, seq in [(20, 1), (10, 0), (30, 0), (20, 0)]:
        engine.tables.execute(insert, ("o", at, seq, f"{at}.{seq}"))
    assert [r.v for r in engine.run("SELECT v FROM {ks}.log WHERE k = 'o'")] == ["30.0", "20.0", "20.1", "10.0"]
    ranged = engine.run("SELECT v FROM {ks}.log WHERE k = %s AND at > %s AND at <= %s", ("o", 10, 30))
    assert [r.v for r in ranged] == ["30.0", "20.0", "20.1"]
    assert [r.v for r in engine.run("SELECT v FROM {ks}.log WHERE k = 'o' LIMIT 2")] == ["30.0", "20.0"]
    assert [r.v for r in engine.run("SELECT v FROM {ks}.log WHERE k = 'o' AND at IN (10, 30)")] == ["30.0", "10.0"]
    asc = engine.run("SELECT v FROM {ks}.log WHERE k = 'o' ORDER BY at ASC")
    assert [r.v for r in asc] == ["10.0", "20.1", "20.0", "30.0"]
    # A range delete, then the partition's.
    engine.run("DELETE FROM {ks}.log WHERE k = 'o' AND at >= 20 AND at <= 30")
    assert [r.v for r in engine.run("SELECT v FROM {ks}.log WHERE k = 'o'")] == ["10.0"]
    engine.run("DELETE FROM {ks}.log WHERE k = 'o'")
    assert engine.rows("SELECT v FROM {ks}.log WHERE k = 'o'") == []


def test_counters_add(engine: Engine) -> None:
    bump = engine.tables.prepare(f"UPDATE {engine.ks}.hits SET n = n + ? WHERE k = 0 AND p = ?")
    for p, by in [(1, 1), (1, 1), (2, 5), (1, 3)]:
        engine.tables.execute(bump, (by, p))
    engine.run("UPDATE {ks}.hits SET n = n + 1 WHERE k = 0 AND p = 2")
    assert engine.rows("SELECT p, n FROM {ks}.hits WHERE k = 0") == [{"p": 1, "n": 5}, {"p": 2, "n": 6}]


def test_map_elements_are_written_one_by_one(engine: Engine) -> None:
    put = engine.tables.prepare(f"UPDATE {engine.ks}.runs SET failures[?] = ? WHERE id = ?")
    engine.tables.execute(put, (2, "second", "r"))
    engine.tables.execute(put, (1, "first", "r"))
    engine.tables.execute(put, (2, "second again", "r"))
    (row,) = engine.run("SELECT failures, state FROM {ks}.runs WHERE id = 'r'")
    assert dict(row.failures) == {1: "first", 2: "second again"} and row.state is None
    assert list(dict(row.failures)) == [1, 2]


def test_a_ttl_expires(engine: Engine) -> None:
    engine.run("INSERT INTO {ks}.kv (k, c, v) VALUES ('e', 1, 'short') USING TTL 1")
    engine.run("INSERT INTO {ks}.kv (k, c, v) VALUES ('e', 2, 'long') USING TTL 100")
    assert [r.c for r in engine.run("SELECT c FROM {ks}.kv WHERE k = 'e'")] == [1, 2]
    engine.wait(2.5)
    assert [r.c for r in engine.run("SELECT c FROM {ks}.kv WHERE k = 'e'")] == [2]


# -- memory's own: statements outside the subset, clocks, faults -------------------


@pytest.fixture
def cluster() -> CqlCluster:
    clock = ManualClock(1_900_000_000_000)
    cluster = CqlCluster(clock)
    _create(cluster.client(clock), "mem")
    return cluster


@pytest.mark.parametrize(
    "cql",
    [
        "SELECT v FROM mem.kv WHERE k = 'a' ALLOW FILTERING",
        "SELECT v FROM mem.kv WHERE k = 'a' PER PARTITION LIMIT 1",
        "TRUNCATE mem.kv",
        "DELETE v FROM mem.kv WHERE k = 'a' AND c = 1",
        "UPDATE mem.kv SET v = v + 'x' WHERE k = 'a' AND c = 1 IF v IN ('a')",
        "CREATE TABLE IF NOT EXISTS mem.t (k text PRIMARY KEY, at timestamp)",
        "SELECT count(*) FROM mem.kv",
    ],
)
def test_a_statement_outside_the_subset_is_refused(cluster: CqlCluster, cql: str) -> None:
    tables = cluster.client(cluster.clock)
    with pytest.raises((UnsupportedStatement, CqlError)):
        tables.execute(cql)


@pytest.mark.parametrize(
    "cql",
    [
        "SELECT v FROM mem.kv WHERE v = 'a'",  # Cassandra: ALLOW FILTERING
        "SELECT v FROM mem.kv WHERE c = 1",
        "UPDATE mem.kv SET v = 'a' WHERE k = 'a'",  # no clustering key
        "SELECT nothing FROM mem.kv WHERE k = 'a'",
        "INSERT INTO mem.kv (k, c, v) VALUES ('a', 'one', 'x')",
        "UPDATE mem.kv SET v = ? WHERE k = 'a' AND c = 1",  # a value not bound
    ],
)
def test_a_statement_cassandra_refuses_is_refused(cluster: CqlCluster, cql: str) -> None:
    with pytest.raises(CqlError):
        cluster.client(cluster.clock).execute(cql)


def test_each_client_writes_with_its_own_clock(cluster: CqlCluster) -> None:
    ahead = cluster.client(ManualClock(1_900_000_010_000), "ahead")
    behind = cluster.client(ManualClock(1_900_000_000_000), "behind")
    ahead.execute("UPDATE mem.kv SET v = 'from the node ahead' WHERE k = 's' AND c = 1")
    behind.execute("UPDATE mem.kv SET v = 'written later, stamped earlier' WHERE k = 's' AND c = 1")
    assert behind.execute("SELECT v FROM mem.kv WHERE k = 's'").one().v == "from the node ahead"
    # A transaction's write is stamped past the partition's last one,
    # whatever its client's clock.
    assert applied(behind.execute("UPDATE mem.kv SET v = 'cas' WHERE k = 's' AND c = 2 IF EXISTS")) is False
    behind.execute("INSERT INTO mem.kv (k, c, v) VALUES ('s', 3, 'x') IF NOT EXISTS")
    ahead.execute("INSERT INTO mem.kv (k, c, v) VALUES ('s', 4, 'x') IF NOT EXISTS")
    assert applied(behind.execute("UPDATE mem.kv SET v = 'behind' WHERE k = 's' AND c = 4 IF v = 'x'"))
    assert behind.execute("SELECT v FROM mem.kv WHERE k = 's' AND c = 4").one().v == "behind"


def _fail_at(phase: str, index: int = 0) -> Callable[[TableCall], None]:
    def hook(call: TableCall) -> None:
        if call.phase == phase and call.index == index:
            raise WriteTimeout(f"timed out {phase} {call.cql}", write_type=WriteType.CAS)

    return hook


def test_a_fault_before_the_call_leaves_nothing_and_after_it_leaves_the_write(cluster: CqlCluster) -> None:
    tables = cluster.client(cluster.clock)
    cluster.fault_hook = _fail_at("before")
    with pytest.raises(WriteTimeout):
        tables.execute("INSERT INTO mem.kv (k, c, v) VALUES ('f', 1, 'x') IF NOT EXISTS")
    cluster.fault_hook = None
    assert tables.execute("SELECT v FROM mem.kv WHERE k = 'f'").one() is None
    cluster.fault_hook = _fail_at("after")
    with pytest.raises(WriteTimeout):  # timed out, and applied all the same
        tables.execute("INSERT INTO mem.kv (k, c, v) VALUES ('f', 1, 'x') IF NOT EXISTS")
    cluster.fault_hook = None
    assert tables.execute("SELECT v FROM mem.kv WHERE k = 'f'").one().v == "x"


def test_an_unlogged_batch_may_land_in_part_and_a_logged_one_lands_whole(cluster: CqlCluster) -> None:
    tables = cluster.client(cluster.clock)
    insert = tables.prepare("INSERT INTO mem.kv (k, c, v) VALUES (?, 1, 'x')")
    cluster.fault_hook = _fail_at("between", 1)
    with pytest.raises(WriteTimeout):
        tables.batch([(insert, ("p1",)), (insert, ("p2",))], logged=False)
    calls: list[TableCall] = []
    cluster.fault_hook = calls.append
    tables.batch([(insert, ("q1",)), (insert, ("q2",))], logged=True)
    assert [c.phase for c in calls] == ["before", "after"]
    cluster.fault_hook = None
    found = {k for k in ("p1", "p2", "q1", "q2") if tables.execute("SELECT v FROM mem.kv WHERE k = %s", (k,)).one()}
    assert found == {"p1", "q1", "q2"}


def test_a_fault_between_calls_is_the_next_call_s_outcome(cluster: CqlCluster) -> None:
    tables: MemoryTables = cluster.client(cluster.clock)
    insert = tables.prepare("INSERT INTO mem.kv (k, c, v) VALUES (?, 1, 'x')")
    cluster.fault_hook = _fail_at("between", 1)
    outcomes = tables.execute_many([(insert, ("m1",)), (insert, ("m2",))], raise_on_first_error=False)
    assert [ok for ok, _ in outcomes] == [True, False] and isinstance(outcomes[1][1], WriteTimeout)
    with pytest.raises(WriteTimeout):
        tables.execute_many([(insert, ("m3",)), (insert, ("m4",))])
