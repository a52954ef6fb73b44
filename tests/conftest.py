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

# Profiles picked by environment: `fast` for the edit loop, `slow` for CI.
settings.register_profile("fast", max_examples=60, deadline=None)
settings.register_profile("slow", max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))

PYSCHED = [sys.executable, "-m", "pysched"]


@pytest.fixture
def db_path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "pysched.db"


SERVICES_STATE = Path(__file__).resolve().parent.parent / ".services" / "state.json"


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


def cluster_config_for(services: dict[str, Any], keyspace: str, **overrides: Any) -> Any:
    from pysched.config import ClusterConfig

    return ClusterConfig(
        etcd=services["etcd"]["endpoint"],
        cassandra=services["cassandra"]["contact"],
        kafka=services["kafka"]["bootstrap"],
        redis=services["redis"]["url"],
        keyspace=keyspace,
        topic=f"{keyspace}-dispatch",
        **overrides,
    )


@pytest.fixture
def keyspace() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"
