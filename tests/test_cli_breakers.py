"""`pysched breakers` as a user meets it."""

from __future__ import annotations

from pathlib import Path

from pysched.stores.sqlite_db import SQLiteDatabase
from tests.helpers import cli, cli_json


def test_breakers_lists_none_on_a_new_database_and_refuses_bad_input(tmp_path: Path, db_path: Path) -> None:
    SQLiteDatabase(db_path).close()
    assert cli_json("breakers", db=db_path) == []
    assert "no breakers yet" in cli("breakers", db=db_path).stdout
    missing = cli("breakers", db=tmp_path / "nope.db", check=False)
    assert missing.returncode == 2 and "no such file" in missing.stderr and "Traceback" not in missing.stderr
    bad = cli("breakers", "--limit", "3", db=db_path, check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    up = cli("up", "--breaker-open", "0", db=db_path, check=False)
    assert up.returncode == 2 and "--breaker-open" in up.stderr
