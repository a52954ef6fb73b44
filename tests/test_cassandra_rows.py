"""Cassandra rows read through pysched's row factory: the same named tuples
as the driver's, a class made once per column list, and the outcome of a
lightweight transaction read without the driver's ``was_applied``."""

from __future__ import annotations

import keyword
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cassandra.query import named_tuple_factory
from hypothesis import given
from hypothesis import strategies as st

from pysched.stores.cassandra import connect, ensure_schema
from pysched.stores.cassandra_rows import NotConditional, applied, clean_column_name, named_rows
from pysched.stores.cql_tables import DriverTables, Rows
from tests.conftest import cluster_config_for

COLUMN_NAMES = st.lists(
    st.one_of(
        st.sampled_from(["[applied]", "count(*)", "system.now()", "job_id", "spec", "_x", "a__b", "in", "1st"]),
        st.text("ab_[]()*.1 ", min_size=1, max_size=6),
    ),
    min_size=1,
    max_size=6,
)


def test_a_row_class_is_made_once_per_column_list() -> None:
    first = named_rows(["job_id", "state"], [("a", "active"), ("b", "paused")])
    again = named_rows(["job_id", "state"], [("c", "cancelled")])
    assert type(first[0]) is type(again[0])
    assert [row.state for row in first] == ["active", "paused"]
    assert again[0].job_id == "c"


@given(COLUMN_NAMES)
def test_rows_read_as_the_driver_s_own_factory_reads_them(names: list[str]) -> None:
    cleaned = [clean_column_name(name) for name in names]
    if len(set(cleaned)) != len(cleaned) or any(not n.isidentifier() or keyword.iskeyword(n) for n in cleaned):
        # The driver falls back to names of its own there; no query of
        # pysched's selects such columns.
        return
    values = tuple(range(len(names)))
    ours = named_rows(names, [values])[0]
    theirs = named_tuple_factory(names, [values])[0]
    assert ours._fields == theirs._fields
    assert tuple(ours) == tuple(theirs) == values


@pytest.fixture
def tables(services: dict[str, Any], keyspace: str) -> Iterator[DriverTables]:
    config = cluster_config_for(services, keyspace, partitions=2, kafka_partitions=2)
    tables = connect(config)
    ensure_schema(tables, config, time.time_ns() // 1_000_000)
    tables.execute(f"CREATE TABLE IF NOT EXISTS {keyspace}.kv (k text, c int, v text, PRIMARY KEY ((k), c))")
    tables.session.set_keyspace(keyspace)
    yield tables
    tables.shutdown()


@pytest.mark.cluster
def test_a_lightweight_transaction_s_outcome_is_read(tables: DriverTables) -> None:
    insert = tables.prepare("INSERT INTO kv (k, c, v) VALUES (?, ?, ?) IF NOT EXISTS")
    assert applied(tables.execute(insert, ("a", 1, "first")))
    refused = tables.execute(insert, ("a", 1, "second"))
    assert not applied(refused)
    # The row in the way comes back by name, as the driver's factory gives it.
    assert refused.one().v == "first"
    update = tables.prepare("UPDATE kv SET v = ? WHERE k = ? AND c = ? IF v = ?")
    assert applied(tables.execute(update, ("third", "a", 1, "first")))
    assert not applied(tables.execute(update, ("fourth", "a", 1, "first")))


@pytest.mark.cluster
def test_a_conditional_batch_s_outcome_is_read(tables: DriverTables) -> None:
    insert = tables.prepare("INSERT INTO kv (k, c, v) VALUES (?, ?, ?) IF NOT EXISTS")

    def batch(*clusterings: int) -> Rows:
        return tables.batch([(insert, ("b", c, f"v{c}")) for c in clusterings], logged=True)

    assert applied(batch(1, 2))
    refused = batch(2, 3)
    assert not applied(refused)
    assert [row.c for row in refused.current_rows] == [2]


@pytest.mark.cluster
def test_a_result_no_transaction_gave_is_refused(tables: DriverTables) -> None:
    tables.execute("INSERT INTO kv (k, c, v) VALUES ('c', 1, 'x')")
    tables.execute("INSERT INTO kv (k, c, v) VALUES ('c', 2, 'y')")
    with pytest.raises(NotConditional):
        applied(tables.execute("SELECT * FROM kv WHERE k = 'c'"))
    with pytest.raises(NotConditional):  # one row, but no [applied] column
        applied(tables.execute("SELECT * FROM kv WHERE k = 'c' AND c = 1"))
    with pytest.raises(NotConditional):
        applied(tables.batch([("INSERT INTO kv (k, c, v) VALUES ('c', 3, 'z')", None)], logged=True))
