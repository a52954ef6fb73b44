"""`pysched breakers` as a user meets it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pysched.stores.sqlite_db import SQLiteDatabase
from tests.helpers import cli, cli_json, start_node, stop_node, wait_for


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


@pytest.mark.parametrize("value", ["0.1", "2:3", "0.1:-1", "x:3", "0.1:1.5", "nan:3", "0.1:100001"])
def test_a_bad_retry_budget_is_refused_naming_the_option(db_path: Path, value: str) -> None:
    up = cli("up", "--retry-budget", value, db=db_path, check=False)
    assert up.returncode == 2, up.stderr
    assert up.stderr.startswith("error: --retry-budget: RATIO:FLOOR") and "Traceback" not in up.stderr


def test_a_spent_retry_budget_holds_a_retry_back_a_minute_and_never_drops_it(tmp_path: Path, db_path: Path) -> None:
    # --retries 3 would retry it within a second; a budget of 0:0 allows no
    # retry now, and the run waits rather than becoming a dead letter.
    node = start_node(db_path, tmp_path, tmp_path / "node.log", "--retry-budget", "0:0", "--workers", "1")
    try:
        cli("add", "flaky", "--in", "1", "--shell", "false", "--retries", "3", "--backoff", "1:1", db=db_path)
        wait_for(
            lambda: [r["state"] for r in cli_json("history", "flaky", db=db_path)] == ["retrying"],
            60,
            "the run to wait for its retry",
            tmp_path / "node.log",
        )
        (run,) = cli_json("history", "flaky", db=db_path)
        assert "(the retry budget of job:flaky is spent: retried in 60 s)" in run["error"]
        assert cli_json("dlq", "ls", db=db_path) == []
        shown = cli_json("show", "flaky", db=db_path)
        assert shown["downstream"] == "job:flaky"
        assert shown["retry_budget"]["retries_last_minute"] == 0
    finally:
        stop_node(node)
