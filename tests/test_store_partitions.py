"""The partition count belongs to the store: written once when the database
or keyspace is created, read by every client that registers jobs or leads
partitions. A client that counted for itself would place jobs in partitions
no node leads, and they would never fire."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from pysched.node import open_embedded
from pysched.planning import partition_for
from tests.conftest import cluster_config_for
from tests.helpers import cli, cli_json

# In partition 24 of 64, but 8 of 16: a client counting 64 partitions on a
# store of 16 puts it where no node of the store leads.
JOB = "nightly-backup"
ADD = ("add", JOB, "--in", "3600", "--shell", "true")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_the_job_id_lands_outside_sixteen_partitions_when_counted_as_sixty_four() -> None:
    # What the tests below rely on to tell the two counts apart.
    assert partition_for(JOB, 64) >= 16
    assert partition_for(JOB, 16) != partition_for(JOB, 64)


def test_cli_add_places_a_job_where_the_database_s_node_leads(db_path: Path) -> None:
    node = open_embedded(db_path, partitions=16)
    try:
        led = set(node.coordinator.poll("node-a", now_ms()))
        assert led == set(range(16))
        added = cli_json(*ADD, db=db_path)
    finally:
        node.close()
    assert added["partition"] == partition_for(JOB, 16)
    assert added["partition"] in led


def test_a_database_keeps_the_partition_count_it_was_created_with(db_path: Path) -> None:
    open_embedded(db_path, partitions=16).close()
    node = open_embedded(db_path)
    try:
        assert node.store.partitions == 16
        assert set(node.coordinator.poll("node-a", now_ms())) == set(range(16))
    finally:
        node.close()
    read_only = open_embedded(db_path, access="read")
    try:
        assert read_only.store.partitions == 16
    finally:
        read_only.close()


def test_a_new_database_has_sixty_four_partitions_unless_told(db_path: Path) -> None:
    cli(*ADD, db=db_path)
    node = open_embedded(db_path)
    try:
        assert node.store.partitions == 64
        assert node.store.get_job(JOB).partition == partition_for(JOB, 64)
    finally:
        node.close()


def test_another_count_for_an_existing_database_is_refused_and_changes_nothing(db_path: Path) -> None:
    from pysched.protocols import PartitionsMismatch

    open_embedded(db_path, partitions=16).close()
    with pytest.raises(PartitionsMismatch) as refused:
        open_embedded(db_path, partitions=64)
    message = str(refused.value)
    assert "partitions" in message and "64" in message and "16" in message
    node = open_embedded(db_path)
    try:
        assert node.store.partitions == 16
    finally:
        node.close()


def test_a_database_from_before_the_count_was_stored_keeps_sixty_four(db_path: Path) -> None:
    # Every client of such a database placed and led jobs with 64 partitions.
    cli(*ADD, db=db_path)
    with sqlite3.connect(db_path) as conn:
        conn.execute("DELETE FROM meta WHERE key = 'partitions'")
    read_only = open_embedded(db_path, access="read")
    try:
        assert read_only.store.partitions == 64
    finally:
        read_only.close()
    node = open_embedded(db_path)
    try:
        assert node.store.partitions == 64
        assert node.store.get_job(JOB).partition in node.coordinator.poll("node-a", now_ms())
    finally:
        node.close()
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'partitions'").fetchone() == (64,)


# -- the cluster ----------------------------------------------------------------


def write_config(path: Path, services: dict[str, Any], keyspace: str, **extra: int) -> Path:
    config = cluster_config_for(services, keyspace)
    lines = ["[cluster]"]
    for name in ("etcd", "cassandra", "kafka", "redis", "keyspace", "topic"):
        lines.append(f'{name} = "{getattr(config, name)}"')
    lines += [f"{name} = {value}" for name, value in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.cluster
def test_cli_add_with_a_config_of_sixteen_partitions_places_the_job_where_a_node_leads(
    services: dict[str, Any], keyspace: str, tmp_path: Path
) -> None:
    from pysched.config import load
    from pysched.node import open_cluster

    config_path = write_config(tmp_path / "cluster.toml", services, keyspace, partitions=16, kafka_partitions=2)
    added = cli_json(*ADD, "--config", str(config_path), db=tmp_path / "unused.db")
    assert added["partition"] == partition_for(JOB, 16)
    # A node whose configuration names no count leads the keyspace's.
    bare = write_config(tmp_path / "bare.toml", services, keyspace, kafka_partitions=2)
    backends = open_cluster(load(bare))
    try:
        assert backends.store.partitions == 16
        led = backends.coordinator.poll("node-a", now_ms())
    finally:
        backends.coordinator.release("node-a")
        backends.close()
    assert set(led) == set(range(16))
    assert added["partition"] in led


@pytest.mark.cluster
def test_a_config_disagreeing_with_the_keyspace_is_refused_in_one_line(
    services: dict[str, Any], keyspace: str, tmp_path: Path
) -> None:
    created = write_config(tmp_path / "created.toml", services, keyspace, partitions=16, kafka_partitions=2)
    cli("ls", "--config", str(created), db=tmp_path / "unused.db")
    other = write_config(tmp_path / "other.toml", services, keyspace, partitions=64, kafka_partitions=2)
    proc = cli(*ADD, "--config", str(other), db=tmp_path / "unused.db", check=False)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --config: {other}: partitions"), proc.stderr
    assert "64" in lines[0] and "16" in lines[0]
    assert cli_json("ls", "--config", str(created), db=tmp_path / "unused.db") == []


@pytest.mark.cluster
def test_a_keyspace_from_before_the_count_was_stored_keeps_what_its_nodes_led(
    services: dict[str, Any], keyspace: str
) -> None:
    from pysched.stores.cassandra import connect, ensure_schema

    config = cluster_config_for(services, keyspace, partitions=16)
    tables = connect(config)
    try:
        assert ensure_schema(tables, config, time.time_ns() // 1_000_000) == 16
        # What a keyspace made before the count was stored looks like: its
        # watermarks, written for the partitions its nodes led, and no count.
        tables.execute(f"DELETE FROM {keyspace}.meta WHERE name = 'partitions'")
        unnamed = cluster_config_for(services, keyspace)
        assert ensure_schema(tables, unnamed, time.time_ns() // 1_000_000) == 16
        assert ensure_schema(tables, config, time.time_ns() // 1_000_000) == 16
    finally:
        tables.shutdown()
