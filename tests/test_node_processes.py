"""Real `pysched up` processes: the quick start, and failover after kill -9."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pysched.model import Job
from pysched.node import open_embedded
from pysched.registry import register
from tests.helpers import cli, cli_json, start_node, stop_node, wait_for

pytestmark = pytest.mark.slow


def test_quick_start_fires_once(tmp_path: Path, db_path: Path) -> None:
    node = start_node(db_path, tmp_path, tmp_path / "node.log")
    try:
        cli("add", "demo", "--in", "3", "--shell", "date >> fired.log", db=db_path, cwd=tmp_path)
        fired = tmp_path / "fired.log"
        wait_for(fired.exists, 15, "fired.log")
        time.sleep(1.5)  # would a second run appear?
        assert len(fired.read_text().splitlines()) == 1
        (run,) = cli_json("history", "demo", db=db_path)
        assert run["state"] == "succeeded"
        # Never early; how late is a benchmark's figure, not a check here.
        assert run["fire_lag_ms"] >= 0, run
        print(f"quick start: fire lag {run['fire_lag_ms']} ms")
        assert run["attempt"] == 1 and run["fence"] >= 1
    finally:
        stop_node(node)
    assert "fired demo" in (tmp_path / "node.log").read_text()


def test_standby_takes_over_after_kill_9_with_nothing_lost_or_doubled(tmp_path: Path, db_path: Path) -> None:
    backends = open_embedded(db_path)
    first = start_node(db_path, tmp_path, tmp_path / "a.log")
    second = None
    try:
        wait_for(lambda: backends.coordinator.current() is not None, 20, "a leader")
        second = start_node(db_path, tmp_path, tmp_path / "b.log")
        nodes = {first.pid: first, second.pid: second}
        wait_for(lambda: "standby: partitions led by" in (tmp_path / "b.log").read_text(), 20, "the second to stand by")
        lease = backends.coordinator.current()
        assert lease is not None
        leader_pid = int(lease.holder.split(":")[1])
        assert leader_pid == first.pid

        # 30 one-shot runs on the half second, from 2 s to 16.5 s ahead.
        now = time.time_ns() // 1_000_000
        base = (now // 1_000 + 2) * 1_000
        ledger = tmp_path / "ledger.txt"
        for k in range(30):
            job = Job.model_validate(
                {
                    "id": f"j{k:02d}",
                    "schedule": {"kind": "once", "run_at_ms": base + k * 500},
                    "target": {"kind": "shell", "command": f'echo "$PYSCHED_IDEMPOTENCY_KEY" >> "{ledger}"'},
                }
            )
            register(backends.store, job, now)

        # kill -9 the leader a quarter second between two runs, mid-schedule.
        kill_at = base + 5_250
        time.sleep(max(0.0, (kill_at - time.time_ns() // 1_000_000) / 1000))
        os.kill(leader_pid, signal.SIGKILL)
        nodes[leader_pid].wait(10)
        killed_at = time.monotonic()

        def new_leader() -> bool:
            cur = backends.coordinator.current()
            return cur is not None and cur.fence > lease.fence

        wait_for(new_leader, 60, "the standby to take over")
        takeover_s = time.monotonic() - killed_at
        new = backends.coordinator.current()
        assert new is not None and int(new.holder.split(":")[1]) == second.pid

        def all_ran() -> bool:
            return ledger.exists() and len(set(ledger.read_text().split())) == 30

        wait_for(all_ran, 40, "all 30 runs in the ledger")
        time.sleep(1.0)
        keys = Counter(ledger.read_text().split())
        assert len(keys) == 30, "a run was lost"
        assert max(keys.values()) == 1, f"a run ran twice: {keys.most_common(3)}"
        assert keys.keys() == {f"j{k:02d}:{base + k * 500}:0" for k in range(30)}
        fences = {r.fence for k in range(30) for r in backends.store.history(f"j{k:02d}")}
        assert fences == {lease.fence, new.fence}
        print(f"takeover after kill -9: {takeover_s:.2f} s")
    finally:
        for proc in (first, second):
            if proc is not None:
                stop_node(proc)


def test_status_lists_a_standby_until_it_stops_or_dies(tmp_path: Path, db_path: Path) -> None:
    def status() -> dict[str, Any]:
        shown: dict[str, Any] = cli_json("status", db=db_path)
        return shown

    def holder_of(proc: subprocess.Popen[bytes]) -> Callable[[str], bool]:
        return lambda holder: holder.split(":")[1] == str(proc.pid)

    first = start_node(db_path, tmp_path, tmp_path / "a.log")
    second = third = None
    try:
        # Read-only, status refuses a database the node has not made yet.
        wait_for(lambda: cli("status", db=db_path, check=False).returncode == 0, 20, "the database")
        wait_for(lambda: bool(status()["leaders"]), 20, "a leader", tmp_path / "a.log")
        (leader,) = status()["leaders"]
        assert holder_of(first)(leader) and status()["standby"] == []
        second = start_node(db_path, tmp_path, tmp_path / "b.log")
        third = start_node(db_path, tmp_path, tmp_path / "c.log")
        wait_for(lambda: len(status()["standby"]) == 2, 30, "two nodes standing by", tmp_path / "b.log")
        b, c = sorted(status()["standby"], key=holder_of(third))
        assert holder_of(second)(b) and holder_of(third)(c) and list(status()["leaders"]) == [leader]
        text = cli("status", db=db_path).stdout
        assert f"leader: {leader}: 64 partitions (0-63), fence 1" in text
        assert f"standby: {b}: up, leading no partitions" in text and f"standby: {c}:" in text
        for log in ("b.log", "c.log"):
            wait_for(lambda log=log: f"standby: partitions led by {leader}" in (tmp_path / log).read_text(), 20, log)
        # Stopped, a standby is gone at once; killed, once its row runs out.
        stop_node(second)
        assert status()["standby"] == [c]
        os.kill(third.pid, signal.SIGKILL)
        third.wait(10)
        wait_for(lambda: status()["standby"] == [], 30, "the killed standby to be gone")
        stop_node(first)
        assert status()["leaders"] == {}
        assert cli("status", db=db_path).stdout.strip() == "leader: none"
    finally:
        for proc in (first, second, third):
            if proc is not None:
                stop_node(proc)


def test_ls_tells_the_schedule_and_the_last_run_apart(tmp_path: Path, db_path: Path) -> None:
    node = start_node(db_path, tmp_path, tmp_path / "node.log")
    try:
        cli("add", "fails", "--in", "0.5", "--shell", "exit 3", "--retries", "0", db=db_path, cwd=tmp_path)
        # Runs until the test releases it (at most a minute).
        wait = "for i in $(seq 600); do [ -e release ] && exit 0; sleep 0.1; done"
        cli("add", "sleeps", "--in", "0.5", "--shell", wait, db=db_path, cwd=tmp_path)

        def settled() -> bool:
            last = {j["id"]: j["last_run"] for j in cli_json("ls", db=db_path)}
            return all(last.values()) and last["fails"]["state"] == "failed" and last["sleeps"]["state"] == "running"

        wait_for(settled, 30, "one run failed and one running")
        jobs = {j["id"]: j for j in cli_json("ls", db=db_path)}
        # Neither one-shot has runs to come; one failed, one still runs.
        assert jobs["fails"]["state"] == jobs["sleeps"]["state"] == "completed"
        assert jobs["fails"]["last_run"]["error"].startswith("exit status 3")
        table = cli("ls", db=db_path).stdout
        assert "last run" in table and "failed" in table and "running" in table
    finally:
        (tmp_path / "release").touch()
        stop_node(node)


HOSTILE_JOBS = """
import sys
import threading
import time


def exits(ctx):
    sys.exit(3)


def interrupts(ctx):
    raise KeyboardInterrupt


def behaves(ctx):
    return "still here"


def lingers(ctx):
    # Not a daemon: interpreter shutdown would wait for it.
    threading.Thread(target=time.sleep, args=(3600,), daemon=False).start()
"""


def finished(db: Path, job: str) -> bool:
    return [r["state"] for r in cli_json("history", job, db=db)] in (["succeeded"], ["failed"])


def test_a_job_that_exits_fails_its_run_and_not_the_worker(tmp_path: Path, db_path: Path) -> None:
    (tmp_path / "hostile.py").write_text(HOSTILE_JOBS)
    # One worker: had it died, nothing after it would run.
    node = start_node(db_path, tmp_path, tmp_path / "node.log", "--workers", "1")
    try:
        for job, at in (("exits", "1"), ("interrupts", "1"), ("behaves", "2")):
            cli("add", job, "--in", at, "--python", f"hostile:{job}", "--retries", "0", db=db_path, cwd=tmp_path)
        cli("add", "after", "--in", "2", "--shell", "touch after.txt", db=db_path, cwd=tmp_path)

        for job in ("exits", "interrupts", "behaves", "after"):
            wait_for(functools.partial(finished, db_path, job), 20, f"{job} to finish")
        runs = {job: cli_json("history", job, db=db_path) for job in ("exits", "interrupts", "behaves")}
        assert [(r["state"], r["error"]) for r in runs["exits"]] == [("failed", "SystemExit: 3")]
        assert [(r["state"], r["error"]) for r in runs["interrupts"]] == [("failed", "KeyboardInterrupt")]
        assert [r["state"] for r in runs["behaves"]] == ["succeeded"]
        assert (tmp_path / "after.txt").exists()
    finally:
        stop_node(node)
    log = (tmp_path / "node.log").read_text()
    assert " ERROR " not in log and "died" not in log, log


def _log_says(log: Path, text: str) -> bool:
    return text in log.read_text()


def _signal_storm(node: subprocess.Popen[bytes], seconds: float = 3.0) -> None:
    """SIGTERM and SIGINT in turn, half a millisecond apart, until the node
    ends (or for ``seconds``): signals keep coming while it stops."""
    deadline = time.monotonic() + seconds
    n = 0
    # poll() reaps only an ended node: until it does, the pid is still ours.
    while node.poll() is None and time.monotonic() < deadline:
        os.kill(node.pid, signal.SIGTERM if n % 2 == 0 else signal.SIGINT)
        n += 1
        time.sleep(0.0005)


def test_a_storm_of_stop_signals_always_stops_up(tmp_path: Path, db_path: Path) -> None:
    # A handler that took a lock deadlocked when a second signal came while
    # the first was handled; a storm makes that overlap likely.
    for round_ in range(1, 6):
        log = tmp_path / f"node-{round_}.log"
        node = start_node(db_path, tmp_path, log)
        try:
            wait_for(functools.partial(_log_says, log, " up on "), 20, "the node to be up")
            _signal_storm(node)
            try:
                status = node.wait(20)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"round {round_}: up still running 20 s after a signal storm") from None
        finally:
            if node.poll() is None:
                os.kill(node.pid, signal.SIGKILL)
                node.wait(5)
        # The second signal of the storm stops it now: 128 + its number.
        assert status in (128 + signal.SIGINT, 128 + signal.SIGTERM), (status, log.read_text())
        assert "Traceback" not in log.read_text()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_second_signal_interrupts_the_run_now(tmp_path: Path, db_path: Path) -> None:
    log = tmp_path / "node.log"
    node = start_node(db_path, tmp_path, log)
    shell_pid = None
    try:
        cli("add", "long", "--in", "1", "--shell", "echo $$ > started.pid; sleep 60", db=db_path, cwd=tmp_path)
        started = tmp_path / "started.pid"
        wait_for(lambda: started.exists() and started.read_text().strip() != "", 20, "the job to start")
        shell_pid = pid = int(started.read_text())
        os.kill(node.pid, signal.SIGTERM)
        wait_for(functools.partial(_log_says, log, "stopping on signal"), 10, "the graceful stop to begin")
        assert node.poll() is None  # waiting for the running job
        os.kill(node.pid, signal.SIGINT)
        assert node.wait(15) == 128 + signal.SIGINT
        # The job and what it started are killed with the stop, not left behind.
        wait_for(lambda: not _alive(pid), 10, "the job's shell to be killed")
    finally:
        stop_node(node)
        if shell_pid is not None and _alive(shell_pid):
            os.killpg(shell_pid, signal.SIGKILL)
    # Recorded interrupted, its claim let go of: the next node runs it
    # again at once, as its next attempt.
    assert [r["state"] for r in cli_json("history", "long", db=db_path)] == ["interrupted"]
    assert "interrupted 1 runs (1 processes stopped" in log.read_text()


def test_a_thread_a_job_left_running_does_not_keep_up_from_stopping(tmp_path: Path, db_path: Path) -> None:
    (tmp_path / "hostile.py").write_text(HOSTILE_JOBS)
    node = start_node(db_path, tmp_path, tmp_path / "node.log")
    try:
        cli("add", "lingers", "--in", "1", "--python", "hostile:lingers", db=db_path, cwd=tmp_path)
        wait_for(functools.partial(finished, db_path, "lingers"), 20, "the run to finish")
        assert [r["state"] for r in cli_json("history", "lingers", db=db_path)] == ["succeeded"]
        os.kill(node.pid, signal.SIGTERM)
        assert node.wait(20) == 0
    finally:
        if node.poll() is None:
            os.kill(node.pid, signal.SIGKILL)
            node.wait(5)
