from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

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
