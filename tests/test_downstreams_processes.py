"""Breakers and retry budgets as a user meets them on a real `pysched up`:
a Python or shell job's downstream is the job itself unless it names one,
so one failing function does not park its module's healthy jobs, and
unrelated jobs that each fail on a quiet machine get every retry they
state."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import cli, cli_json, start_node, stop_node, wait_for

pytestmark = pytest.mark.slow

MYJOBS = """
def boom(ctx):
    raise RuntimeError("boom")


def report(ctx):
    return "report"
"""


def _states(db: Path, job: str) -> list[str]:
    return [r["state"] for r in cli_json("history", job, db=db)]


def test_a_failing_function_does_not_park_its_modules_healthy_job(tmp_path: Path, db_path: Path) -> None:
    (tmp_path / "myjobs.py").write_text(MYJOBS)
    log = tmp_path / "node.log"
    node = start_node(db_path, tmp_path, log, "--breaker-failures", "1")
    try:
        cli("add", "boom", "--in", "1", "--python", "myjobs:boom", "--retries", "0", db=db_path, cwd=tmp_path)
        wait_for(lambda: _states(db_path, "boom") == ["failed"], 60, "boom to fail", log)
        (breaker,) = cli_json("breakers", db=db_path)
        assert (breaker["downstream"], breaker["state"]) == ("job:boom", "open")
        cli("add", "report", "--in", "1", "--python", "myjobs:report", db=db_path, cwd=tmp_path)
        wait_for(lambda: _states(db_path, "report") == ["succeeded"], 60, "report to run, not parked", log)
        # Jobs that share what they call say so, and share a breaker.
        cli("add", "a", "--in", "1", "--python", "myjobs:boom", "--downstream", "pg:orders", db=db_path, cwd=tmp_path)
        cli(
            "add",
            "b",
            "--in",
            "600",
            "--python",
            "myjobs:report",
            "--downstream",
            "pg:orders",
            db=db_path,
            cwd=tmp_path,
        )
        wait_for(lambda: _states(db_path, "a") != [], 60, "a to run", log)
        assert cli_json("show", "b", db=db_path)["downstream"] == "pg:orders"
    finally:
        stop_node(node)


def test_unrelated_jobs_that_each_fail_on_a_quiet_machine_get_every_retry_they_state(
    tmp_path: Path, db_path: Path
) -> None:
    log = tmp_path / "node.log"
    node = start_node(db_path, tmp_path, log)
    jobs = [f"once-{i}" for i in range(6)]
    try:
        for job in jobs:
            cli(
                "add",
                job,
                "--in",
                "1",
                "--shell",
                "echo no; exit 1",
                "--retries",
                "3",
                "--backoff",
                "0.2:0.5",
                db=db_path,
            )
        wait_for(
            lambda: all(_states(db_path, job) == ["failed"] for job in jobs), 120, "every job to fail for good", log
        )
        letters = cli_json("dlq", "ls", db=db_path)
        assert sorted(d["job_id"] for d in letters) == jobs
        for letter in letters:
            assert [f["attempt"] for f in letter["failures"]] == [1, 2, 3, 4]
            assert "retry budget" not in letter["error"]
    finally:
        stop_node(node)
