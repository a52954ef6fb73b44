from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from pysched.node import Backends, open_cluster, open_embedded
from tests.helpers import Cluster, stop_node, write_config
from tests.http_downstream import Downstream

# Profiles picked by environment: `fast` for the edit loop, `slow` for CI.
settings.register_profile("fast", max_examples=60, deadline=None)
settings.register_profile("slow", max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The cron oracle's long form: tests/test_cron_oracle.py runs 10,000 cases.
settings.register_profile("oracle", max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))

PYSCHED = [sys.executable, "-m", "pysched"]


@pytest.fixture
def db_path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "pysched.db"


# Where scripts/services writes it (PYSCHED_SERVICES_DIR moves it there too).
SERVICES_STATE = (
    Path(os.environ.get("PYSCHED_SERVICES_DIR") or Path(__file__).resolve().parent.parent / ".services") / "state.json"
)


@pytest.fixture
def backends(tmp_path: Path) -> Iterator[Backends]:
    """The embedded engine's backends on a fresh database (the cluster's
    tests have their own)."""
    opened = open_embedded(tmp_path / "pysched.db")
    yield opened
    opened.close()


@pytest.fixture
def downstream() -> Iterator[Downstream]:
    """A local HTTP server answering 503 until it is told to recover."""
    server = Downstream()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture(scope="session")
def services() -> dict[str, Any]:
    """The servers scripts/services started. CI (PYSCHED_REQUIRE_SERVICES=1)
    fails without them; a local run skips the tests that need them."""
    try:
        state = json.loads(SERVICES_STATE.read_text())
    except FileNotFoundError:
        state = {}
    missing = [name for name in ("etcd", "redis", "kafka", "cassandra") if name not in state]
    if missing:
        message = f"servers not running ({', '.join(missing)}): start them with scripts/services up"
        if os.environ.get("PYSCHED_REQUIRE_SERVICES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return dict(state)


@pytest.fixture(scope="session")
def temporal_address() -> str:
    """The Temporal dev server scripts/services started, host:port; as
    ``services``, a failure under PYSCHED_REQUIRE_SERVICES=1, else a skip."""
    try:
        state = json.loads(SERVICES_STATE.read_text())
    except FileNotFoundError:
        state = {}
    if "temporal" not in state:
        message = "the Temporal server is not running: start it with scripts/services up temporal"
        if os.environ.get("PYSCHED_REQUIRE_SERVICES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return str(state["temporal"]["address"])


def cluster_config_for(services: dict[str, Any], keyspace: str, **overrides: Any) -> Any:
    from pysched.config import ClusterConfig

    return ClusterConfig(
        etcd=services["etcd"]["endpoint"],
        cassandra=services["cassandra"]["contact"],
        kafka=services["kafka"]["bootstrap"],
        redis=services["redis"]["url"],
        keyspace=keyspace,
        **{
            "topic": f"{keyspace}-dispatch",
            # A group of its own: tests sharing the broker share no rebalance.
            "consumer_group": f"{keyspace}-workers",
            **overrides,
        },
    )


class _KeyspaceDropper:
    """Drops the keyspaces tests made, on one connection for the session: a
    Cassandra holding hundreds of test keyspaces runs out of heap."""

    def __init__(self) -> None:
        self._cluster: Any = None
        self._session: Any = None

    def drop(self, keyspace: str) -> None:
        try:
            state = json.loads(SERVICES_STATE.read_text())
            if self._session is None:
                from cassandra.cluster import Cluster

                host, _, port = state["cassandra"]["contact"].rpartition(":")
                self._cluster = Cluster([host], port=int(port), connect_timeout=5)
                self._session = self._cluster.connect()
            self._session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
        except Exception:
            # No servers, or a test that stopped Cassandra: nothing to drop,
            # or nothing that can be dropped now.
            self.close()

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.shutdown()
        self._cluster = self._session = None


@pytest.fixture(scope="session")
def _keyspace_dropper() -> Iterator[_KeyspaceDropper]:
    dropper = _KeyspaceDropper()
    yield dropper
    dropper.close()


@pytest.fixture
def keyspace(_keyspace_dropper: _KeyspaceDropper) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    _keyspace_dropper.drop(name)


def running_cluster(services: dict[str, Any], keyspace: str, tmp_path: Path, **overrides: Any) -> Iterator[Cluster]:
    """A cluster's config on the servers, its keyspace and topic made, and
    the processes the test starts stopped at the end (a fixture's body)."""
    config = cluster_config_for(services, keyspace, **{"partitions": 32, "kafka_partitions": 8, **overrides})
    path = write_config(tmp_path / "cluster.toml", config.model_dump())
    # Create the keyspace and topic once, before the processes race to.
    open_cluster(config, coordinator=False).close()
    c = Cluster(config, path, tmp_path, tmp_path / "ledger.txt")
    yield c
    for proc in c.procs.values():
        stop_node(proc)


@pytest.fixture
def cluster(services: dict[str, Any], keyspace: str, tmp_path: Path) -> Iterator[Cluster]:
    yield from running_cluster(services, keyspace, tmp_path)
