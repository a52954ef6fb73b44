"""Done when: a downstream that fails every call, 2,000 runs against it on a
real `pysched up`. Its attempts stay within the breaker and the retry
budget, runs are parked or dead-lettered and none is lost; when it
recovers, the parked runs complete and a redrive completes the dead
letters, each effect once."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pysched.model import Job
from pysched.registry import register_many
from pysched.stores.sqlite import SQLiteScheduleStore
from tests.helpers import cli, cli_json, start_node, stop_node, wait_for

RUNS = 2_000
WORKERS = 4
THRESHOLD = 5
OPEN_S = 2.0
OUTAGE_S = 8.0
BUDGET_FLOOR = 3  # breakers.BreakerPolicy: at least 3 retries a minute


class Downstream:
    """A local HTTP server: 503 to every call while failing, else 200; it
    counts the answers per idempotency key."""

    def __init__(self) -> None:
        self.failing = True
        self.lock = threading.Lock()
        self.answers: dict[str, list[int]] = {}
        downstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                # Decided and counted under one lock: a call answered 503 is
                # counted before the recovery's count is taken, never after.
                with downstream.lock:
                    status = 503 if downstream.failing else 200
                    downstream.answers.setdefault(self.headers.get("Idempotency-Key", "?"), []).append(status)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def recover(self) -> int:
        """Answer 200 from now on; how many calls were answered 503."""
        with self.lock:
            self.failing = False
            return sum(answers.count(503) for answers in self.answers.values())

    def count(self, status: int) -> int:
        with self.lock:
            return sum(answers.count(status) for answers in self.answers.values())


@pytest.fixture
def downstream() -> Iterator[Downstream]:
    server = Downstream()
    yield server
    server.server.shutdown()
    server.server.server_close()


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
    jobs = [
        Job.model_validate(
            {
                "id": f"hook-{i:04d}",
                "schedule": {"kind": "once", "run_at_ms": due_ms},
                "target": {"kind": "http", "url": downstream.url, "timeout_s": 5},
                "retry": {"retries": 3, "backoff_base_s": 0.2, "backoff_cap_s": 1.0},
            }
        )
        for i in range(RUNS)
    ]
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
        # calls only when let through, and are held to the budget besides:
        # its floor, since first attempts are few.
        bound = THRESHOLD + WORKERS + BUDGET_FLOOR + int(outage_s / OPEN_S) + 2
        print(f"failed calls during the outage: {failed_calls} (bound {bound}, of {RUNS} runs)")
        assert failed_calls <= bound
        assert _states(db_path)["failed"] > 0
        # Recovery: the probe closes the breaker, the parked runs complete.
        # A failure answered before the recovery may still be on its way to
        # the store: the dead letters are counted once every run has ended.
        _wait_settled(db_path, log)
        dead_count = _states(db_path)["failed"]
        dead = cli_json("dlq", "ls", db=db_path)
        assert len(dead) == dead_count
        assert any(f"retry budget exhausted for {breaker['downstream']}" in d["error"] for d in dead)
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
