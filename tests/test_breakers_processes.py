"""Done when: a downstream that fails every call, 2,000 runs against it on a
real `pysched up`. Its attempts stay within the breaker, runs are parked
(or dead-lettered once their own retries are spent, never by the retry
budget, which lets a job's stated retries through at this traffic) and
none is lost; when it recovers, the parked runs complete and a redrive
completes the dead letters, each effect once."""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from pathlib import Path

from pysched.registry import register_many
from pysched.stores.sqlite import SQLiteScheduleStore
from tests.helpers import cli, cli_json, start_node, stop_node, wait_for
from tests.http_downstream import Downstream, jobs_calling

RUNS = 2_000
WORKERS = 4
THRESHOLD = 5
OPEN_S = 2.0
OUTAGE_S = 8.0
# Retries of the first failures let through before the breaker opened.
RETRY_SLACK = 3


def _states(db: Path) -> Counter[str]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
        return Counter(dict(conn.execute("SELECT state, count(*) FROM runs GROUP BY state").fetchall()))


def _wait_settled(db: Path, log: Path) -> None:
    """Until every run has succeeded or failed for good (none parked,
    retrying or running); the states seen last said on timeout."""

    def settled() -> bool:
        states = _states(db)
        return set(states) <= {"succeeded", "failed"} and sum(states.values()) == RUNS

    try:
        wait_for(settled, 180, "every run to succeed or fail for good", log)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nrun states: {dict(_states(db))}") from None


def test_a_failing_downstream_is_held_to_the_budget_and_every_run_completes_once(
    tmp_path: Path, db_path: Path, downstream: Downstream
) -> None:
    # Registered before the node starts, due together in a few seconds.
    due_ms = time.time_ns() // 1_000_000 + 3_000
    jobs = jobs_calling(downstream.url, RUNS, due_ms)
    store = SQLiteScheduleStore(db_path)
    assert register_many(store, jobs, due_ms - 3_000) == []
    store.db.close()
    log = tmp_path / "node.log"
    started = time.monotonic()
    node = start_node(
        db_path, tmp_path, log, "--quiet", "--workers", str(WORKERS), "--breaker-open", str(OPEN_S),
        "--breaker-failures", str(THRESHOLD),
    )  # fmt: skip
    try:
        # The outage.
        wait_for(lambda: _states(db_path)["parked"] > 0, 60, "runs parked behind the open breaker", log)
        outage_began = time.monotonic()
        (breaker,) = cli_json("breakers", db=db_path)
        assert breaker["downstream"] == f"http:{downstream.url.split('/')[2]}"
        assert breaker["state"] in ("open", "half-open")
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - outage_began)))
        failed_calls = downstream.recover()
        outage_s = time.monotonic() - started  # from before the first call
        # Before the breaker opened: THRESHOLD failures, and a call in flight
        # on each other worker; then a probe per open period. Retries are
        # calls only when the breaker lets them through.
        bound = THRESHOLD + WORKERS + RETRY_SLACK + int(outage_s / OPEN_S) + 2
        print(f"failed calls during the outage: {failed_calls} (bound {bound}, of {RUNS} runs)")
        assert failed_calls <= bound
        # Recovery: the probe closes the breaker, the parked runs complete.
        # A failure answered before the recovery may still be on its way to
        # the store: the dead letters are counted once every run has ended.
        _wait_settled(db_path, log)
        dead_count = _states(db_path)["failed"]
        dead = cli_json("dlq", "ls", db=db_path)
        assert len(dead) == dead_count
        assert not any("retry budget" in d["error"] for d in dead)
        cli("dlq", "redrive", "--all", db=db_path)
        wait_for(lambda: _states(db_path) == Counter({"succeeded": RUNS}), 120, "the redriven runs", log)
        assert cli_json("breakers", db=db_path)[0]["state"] == "closed"
    finally:
        stop_node(node)
    # None lost, each effect once: every run's key got exactly one 200.
    with downstream.lock:
        answers = dict(downstream.answers)
    assert len(answers) == RUNS
    assert Counter(statuses.count(200) for statuses in answers.values()) == Counter({1: RUNS})
    assert downstream.count(503) == failed_calls  # nothing failed after the recovery


def test_runs_stopped_by_a_cancel_are_no_failures_of_their_downstream(tmp_path: Path, db_path: Path) -> None:
    """Cancelling a job stops its running command: the shell's SIGTERM exit
    is the cancel's doing, not the downstream's, whose breaker must not count
    it towards opening and parking the other jobs that call it."""
    log = tmp_path / "node.log"
    node = start_node(db_path, tmp_path, log, "--quiet", "--workers", "4", "--lease", "3")
    try:
        for job_id in ("long-a", "long-b"):
            cli("add", job_id, "--in", "1", "--shell", "sleep 30", "--downstream", "pg:orders", db=db_path)
        for job_id in ("long-a", "long-b"):
            wait_for(lambda j=job_id: _run_state(db_path, j) == "running", 60, f"{job_id} to run", log)
            cli("cancel", job_id, db=db_path)
        for job_id in ("long-a", "long-b"):
            wait_for(lambda j=job_id: _run_state(db_path, j) == "cancelled", 60, f"{job_id} to be stopped", log)
    finally:
        stop_node(node)
    breakers = {b["downstream"]: b for b in cli_json("breakers", db=db_path)}
    assert breakers.get("pg:orders", {}).get("consecutive_failures", 0) == 0, breakers


def test_runs_stopped_by_the_node_stopping_are_no_failures_of_their_downstream(tmp_path: Path, db_path: Path) -> None:
    """A node stopped past its grace SIGTERMs its running commands: their
    exits are the stop's doing, and two such must not open a breaker that
    opens after two failures."""
    log = tmp_path / "node.log"
    node = start_node(db_path, tmp_path, log, "--quiet", "--workers", "4", "--grace", "1", "--breaker-failures", "2")
    try:
        for job_id in ("long-a", "long-b"):
            cli("add", job_id, "--in", "1", "--shell", "sleep 30", "--downstream", "pg:orders", db=db_path)
        for job_id in ("long-a", "long-b"):
            wait_for(lambda j=job_id: _run_state(db_path, j) == "running", 60, f"{job_id} to run", log)
    finally:
        stop_node(node)
    assert [_run_state(db_path, j) for j in ("long-a", "long-b")] == ["interrupted", "interrupted"]
    breakers = {b["downstream"]: b for b in cli_json("breakers", db=db_path)}
    assert breakers.get("pg:orders", {}).get("consecutive_failures", 0) == 0, breakers


def _run_state(db: Path, job_id: str) -> str | None:
    runs = cli_json("history", job_id, db=db)
    return str(runs[0]["state"]) if runs else None
