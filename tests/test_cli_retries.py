"""The retry policy and the dead letters from the command line, against a
real `pysched up`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pysched.protocols import RunRecord
from pysched.views import run_json
from tests.helpers import cli, cli_json, start_node, stop_node, wait_for

# Fails its first two calls (counted in a file beside the database), then succeeds.
FLAKY = (
    "n=$(cat calls 2>/dev/null || echo 0); n=$((n+1)); echo $n > calls;"
    ' [ "$n" -gt 2 ] || { echo "call $n" >&2; exit 4; }'
)


def test_add_keeps_the_policy_and_show_prints_it(db_path: Path) -> None:
    cli(
        "add", "p", "--in", "600", "--shell", "true", "--retries", "5", "--backoff", "2:60",
        "--retry-on", "timeout,exception:KeyError", "--timeout", "30", db=db_path,
    )  # fmt: skip
    job = cli_json("show", "p", db=db_path)
    assert job["retry"] == {
        "retries": 5,
        "backoff_base_s": 2.0,
        "backoff_cap_s": 60.0,
        "retry_on": ["timeout", "exception:KeyError"],
    }
    assert job["target"]["timeout_s"] == 30.0
    text = cli("show", "p", db=db_path).stdout
    assert "up to 5 retries on timeout, exception:KeyError" in text
    assert cli_json("show", "p", db=db_path)["retry"]["retries"] == 5
    cli("add", "d", "--in", "600", "--shell", "true", db=db_path)
    assert cli_json("show", "d", db=db_path)["retry"] == {
        "retries": 3,
        "backoff_base_s": 10.0,
        "backoff_cap_s": 600.0,
        "retry_on": ["timeout", "connect", "5xx", "exception"],
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--retries", "-1"), "--retries:"),
        (("--retries", "101"), "--retries:"),
        (("--backoff", "10"), "--backoff: BASE_S:CAP_S"),
        (("--backoff", "a:b"), "--backoff: BASE_S:CAP_S"),
        (("--backoff", "60:10"), "--backoff:"),
        (("--retry-on", "exceptions"), "--retry-on: 'exceptions' is not one of"),
        (("--timeout", "0"), "--timeout:"),
        (("--timeout", "inf"), "--timeout:"),
        (("--retry-on", ""), "--retry-on: name at least one kind"),
        (("--retry-on", " , "), "--retry-on: name at least one kind"),
    ],
)
def test_a_bad_policy_is_refused_naming_its_option_and_nothing_is_written(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    db = tmp_path / "none.db"
    proc = cli("add", "p", "--in", "60", "--shell", "true", *args, db=db, check=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not db.exists()


def test_dlq_commands_refuse_bad_input(db_path: Path) -> None:
    cli("add", "p", "--in", "600", "--shell", "true", db=db_path)
    for args, code, message in (
        (("dlq", "show", "nope"), 2, "RUN: a run's key"),
        (("dlq", "show", "p:1:0"), 3, "no run"),
        (("dlq", "redrive"), 2, "give run keys, or --all"),
        (("dlq", "redrive", "p:1:0", "--all"), 2, "not both"),
        (("dlq", "redrive", "--target", "shell:true"), 2, "give run keys"),
        (("dlq", "redrive", "p:1:0"), 3, "not a dead letter"),
        # Past the store's 64-bit integers: a bad key, not a crash.
        (("dlq", "show", "p:99999999999999999999999:0"), 2, "RUN: a run's key"),
        (("dlq", "redrive", "p:1:99999999999"), 2, "RUN: a run's key"),
        (("dlq", "show", "p:\u00b2:0"), 2, "RUN: a run's key"),
    ):
        proc = cli(*args, db=db_path, check=False)
        assert (proc.returncode, message in proc.stderr, "Traceback" in proc.stderr) == (code, True, False), (
            args,
            proc.stderr,
        )


def test_redrive_all_with_no_dead_letters_says_so(db_path: Path) -> None:
    cli("add", "p", "--in", "600", "--shell", "true", db=db_path)
    assert cli("dlq", "ls", db=db_path).stdout == "no dead letters\n"
    assert cli("dlq", "ls", "--target", "shell:nope", db=db_path).stdout == "no dead letters of shell:nope\n"
    assert cli_json("dlq", "ls", db=db_path) == []
    proc = cli("dlq", "redrive", "--all", db=db_path)
    assert proc.stdout.strip() == "no dead letters to redrive"
    proc = cli("dlq", "redrive", "--all", "--target", "shell:nope", db=db_path)
    assert proc.stdout.strip() == "no dead letters to redrive of shell:nope"


def _history(db: Path, job: str) -> list[tuple[str, int]]:
    return [(r["state"], r["attempt"]) for r in cli_json("history", job, db=db)]


def test_a_failing_job_is_retried_then_dead_lettered_then_redriven(tmp_path: Path, db_path: Path) -> None:
    node = start_node(db_path, tmp_path, tmp_path / "node.log")
    try:
        cli(
            "add", "flaky", "--in", "0.5", "--shell", FLAKY, "--retries", "1", "--backoff", "0.2:0.5",
            db=db_path, cwd=tmp_path,
        )  # fmt: skip
        wait_for(lambda: _history(db_path, "flaky") == [("failed", 2)], 30, "two attempts, then a dead letter")
        (dead,) = cli_json("dlq", "ls", db=db_path)
        assert [(f["attempt"], f["kind"], f["error"], f["dead_lettered"]) for f in dead["failures"]] == [
            (1, "exception", "exit status 4: call 1", False),
            (2, "exception", "exit status 4: call 2", True),
        ]
        assert cli_json("dlq", "ls", "--target", "job:flaky", db=db_path) == [dead]
        assert cli_json("dlq", "ls", "--target", "http:elsewhere", db=db_path) == []
        assert cli_json("dlq", "show", dead["key"], db=db_path)["state"] == "failed"
        assert "redriven " + dead["key"] in cli("dlq", "redrive", dead["key"], db=db_path).stdout
        wait_for(lambda: _history(db_path, "flaky") == [("succeeded", 3)], 30, "the redrive")
        assert cli_json("dlq", "ls", db=db_path) == []
        assert (tmp_path / "calls").read_text().strip() == "3"
    finally:
        stop_node(node)


def test_a_failed_runs_output_is_kept_with_it(tmp_path: Path, db_path: Path) -> None:
    node = start_node(db_path, tmp_path, tmp_path / "node.log")
    try:
        cli(
            "add", "outerr", "--in", "0.5", "--shell", "echo to-stdout; echo to-stderr >&2; exit 1", "--retries", "0",
            db=db_path,
        )  # fmt: skip
        wait_for(lambda: _history(db_path, "outerr") == [("failed", 1)], 30, "the run to fail")
        (run,) = cli_json("history", "outerr", db=db_path)
        assert (run["result"], run["error"]) == ("to-stdout", "exit status 1: to-stderr")
        (dead,) = cli_json("dlq", "ls", db=db_path)
        assert dead["failures"][0]["result"] == "to-stdout"
    finally:
        stop_node(node)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("dlq", "ls", "--target", "two words"), "--target: a downstream"),
        (("dlq", "ls", "--target", ""), "--target: a downstream"),
        (("dlq", "redrive", "--all", "--target", "x" * 201), "--target: a downstream"),
    ],
)
def test_a_bad_downstream_is_refused(db_path: Path, args: tuple[str, ...], message: str) -> None:
    cli("add", "p", "--in", "600", "--shell", "true", db=db_path)
    proc = cli(*args, db=db_path, check=False)
    assert (proc.returncode, message in proc.stderr) == (2, True), proc.stderr


def test_a_run_waiting_for_its_retry_shows_no_lag_against_the_retrys_time() -> None:
    waiting = RunRecord(1, "j", 1_000, 20_000, "retrying", 1, 1, 1_001, 1_002, 1_050, "w", "exit status 1", None)
    shown = run_json(waiting)
    assert (shown["fire_lag_ms"], shown["start_lag_ms"], shown["duration_ms"]) == (None, None, None)
    assert shown["due_at"] is not None and shown["error"] == "exit status 1"


def test_a_run_cancelled_while_waiting_for_its_retry_shows_no_lag_and_counts_for_no_slo(
    tmp_path: Path, db_path: Path
) -> None:
    node = start_node(db_path, tmp_path, tmp_path / "node.log")
    try:
        cli(
            "add", "doomed", "--in", "0.5", "--shell", "exit 3", "--retries", "2", "--backoff", "600:600",
            db=db_path,
        )  # fmt: skip
        wait_for(lambda: _history(db_path, "doomed") == [("retrying", 1)], 30, "the first attempt to fail")
        cli("cancel", "doomed", db=db_path)
        (run,) = cli_json("history", "doomed", db=db_path)
    finally:
        stop_node(node)
    # Its retry was due ten minutes on: the first delivery's times, kept in
    # the row, are no lag against that due time, which it never reached.
    assert run["state"] == "cancelled"
    assert (run["fire_lag_ms"], run["start_lag_ms"], run["duration_ms"]) == (None, None, None)
    assert run["due_at"] is not None and run["ended_at"] is not None
    table = cli("history", "doomed", db=db_path).stdout
    assert "cancelled" in table and not re.search(r"│ -\d", table), table
    assert cli_json("slo", "doomed", db=db_path)["runs"] == 0
