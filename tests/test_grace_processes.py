"""A stop signal to a real `pysched up`: running runs get the grace period,
then are stopped with everything they started and recorded interrupted, and
the next node runs them again as a new attempt, never beside the first."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers import PYSCHED, cli, cli_json, start_node, stop_node, wait_for

pytestmark = pytest.mark.slow

# About 25 s of work, which the test can cut short by creating `release`;
# each attempt leaves its shell's PID and its start and end markers.
LONG_JOB = (
    'a=$PYSCHED_ATTEMPT; echo $$ > "pid.$a"; date +%s%N > "start.$a";'
    " for i in $(seq 250); do [ -e release ] && break; sleep 0.1; done;"
    ' date +%s%N > "end.$a"'
)

SLOW_PYTHON = """
import time


def sleeps(ctx):
    time.sleep(25)
"""


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name; None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"  # a zombie has ended


def _group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
                members.append(int(entry.name))
    return members


def _read_pid(path: Path) -> int | None:
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text else None


def _log_says(log: Path, text: str) -> bool:
    return text in log.read_text()


def _runs(db: Path, job: str) -> list[tuple[str, int]]:
    return [(r["state"], r["attempt"]) for r in cli_json("history", job, db=db)]


def _kill_group(pgid: int | None) -> None:
    if pgid is not None and _group(pgid):
        os.killpg(pgid, signal.SIGKILL)


def test_a_run_past_the_grace_is_stopped_recorded_interrupted_and_run_again_as_attempt_2(
    tmp_path: Path, db_path: Path
) -> None:
    log = tmp_path / "a.log"
    node = start_node(db_path, tmp_path, log, "--grace", "2", "--workers", "1")
    second: subprocess.Popen[bytes] | None = None
    first_pid = None
    try:
        cli("add", "long", "--in", "1", "--shell", LONG_JOB, db=db_path, cwd=tmp_path)
        wait_for(lambda: _read_pid(tmp_path / "pid.1") is not None, 30, "the first attempt to start", log)
        first_pid = _read_pid(tmp_path / "pid.1")
        assert first_pid is not None and _alive(first_pid)
        os.kill(node.pid, signal.SIGTERM)
        # The grace (2 s), a short wait after SIGTERM, and the exit: well
        # within the bound, however slow the machine.
        assert node.wait(60) == 0
        # Gone with the node: the shell and whatever it started.
        wait_for(lambda: not _group(first_pid), 10, "the first attempt's processes to be gone")
        assert not (tmp_path / "end.1").exists()
        assert _runs(db_path, "long") == [("interrupted", 1)]
        (run,) = cli_json("history", "long", db=db_path)
        assert run["error"].startswith("interrupted"), run
        assert "interrupted long" in log.read_text()

        second = start_node(db_path, tmp_path, tmp_path / "b.log", "--grace", "2", "--workers", "1")
        wait_for(
            lambda: _read_pid(tmp_path / "pid.2") is not None, 60, "the second attempt to start", tmp_path / "b.log"
        )
        assert not _group(first_pid), "the first copy still ran when the second started"
        assert not (tmp_path / "end.1").exists()
        assert _runs(db_path, "long") == [("running", 2)]
        (tmp_path / "release").touch()
        wait_for(lambda: _runs(db_path, "long") == [("succeeded", 2)], 60, "the second attempt to succeed")
        assert (tmp_path / "end.2").exists() and not (tmp_path / "end.1").exists()
        assert sorted(p.name for p in tmp_path.glob("start.*")) == ["start.1", "start.2"]
    finally:
        (tmp_path / "release").touch()
        stop_node(node)
        if second is not None:
            stop_node(second)
        _kill_group(first_pid)


# Its shell ends at SIGTERM at once, leaving a process of its group that
# ignores it: the node's stop takes its 2 s to kill that one, well past a
# short lease.
TERM_IGNORED = (
    'echo $$ > "pid.$PYSCHED_ATTEMPT"; (trap "" TERM; exec sleep 30) >/dev/null 2>&1 &'
    " for i in $(seq 300); do [ -e release ] && break; sleep 0.1; done"
)


def test_an_interrupted_runs_claim_is_kept_until_it_is_recorded_however_short_the_lease(
    tmp_path: Path, db_path: Path
) -> None:
    # The claim went unrenewed from the end of the worker's thread to the
    # record, and a standby node took the run over, recording it lost.
    first = start_node(db_path, tmp_path, tmp_path / "a.log", "--grace", "0", "--lease", "0.5", "--workers", "1")
    second: subprocess.Popen[bytes] | None = None
    pids: list[int | None] = []
    try:
        cli("add", "stubborn", "--in", "1", "--shell", TERM_IGNORED, db=db_path, cwd=tmp_path)
        wait_for(lambda: _read_pid(tmp_path / "pid.1") is not None, 30, "the first attempt to start")
        pids.append(_read_pid(tmp_path / "pid.1"))
        second = start_node(db_path, tmp_path, tmp_path / "b.log", "--grace", "0", "--lease", "0.5")
        wait_for(lambda: _log_says(tmp_path / "b.log", "up on"), 30, "the standby node to start")
        os.kill(first.pid, signal.SIGTERM)
        assert first.wait(60) == 0
        wait_for(lambda: _read_pid(tmp_path / "pid.2") is not None, 60, "the next attempt", tmp_path / "b.log")
        pids.append(_read_pid(tmp_path / "pid.2"))
        (tmp_path / "release").touch()
        wait_for(lambda: _runs(db_path, "stubborn") == [("succeeded", 2)], 60, "the next attempt to succeed")
        # Recorded interrupted by its node, never found lost by another.
        assert "lost" not in (tmp_path / "b.log").read_text()
        assert "taking over" not in (tmp_path / "b.log").read_text()
    finally:
        (tmp_path / "release").touch()
        stop_node(first)
        if second is not None:
            stop_node(second)
        for pid in pids:
            _kill_group(pid)


def test_a_run_that_ends_within_the_grace_is_recorded_as_it_ended(tmp_path: Path, db_path: Path) -> None:
    log = tmp_path / "node.log"
    node = start_node(db_path, tmp_path, log, "--grace", "60")
    pid = None
    try:
        cli("add", "long", "--in", "1", "--shell", LONG_JOB, db=db_path, cwd=tmp_path)
        wait_for(lambda: _read_pid(tmp_path / "pid.1") is not None, 30, "the run to start")
        pid = _read_pid(tmp_path / "pid.1")
        os.kill(node.pid, signal.SIGTERM)
        wait_for(functools.partial(_log_says, log, "stopping on signal"), 20, "the graceful stop to begin")
        assert node.poll() is None  # waiting for the running run
        (tmp_path / "release").touch()
        assert node.wait(60) == 0
    finally:
        (tmp_path / "release").touch()
        stop_node(node)
        _kill_group(pid)
    assert _runs(db_path, "long") == [("succeeded", 1)]
    assert (tmp_path / "end.1").exists()
    assert "interrupted" not in log.read_text()


def test_a_python_run_past_the_grace_is_recorded_interrupted_before_the_node_exits(
    tmp_path: Path, db_path: Path
) -> None:
    # A thread cannot be stopped: the run is recorded, and the exit ends it.
    (tmp_path / "slow.py").write_text(SLOW_PYTHON)
    log = tmp_path / "node.log"
    node = start_node(db_path, tmp_path, log, "--grace", "1")
    try:
        cli("add", "slow", "--in", "1", "--python", "slow:sleeps", db=db_path, cwd=tmp_path)
        wait_for(lambda: _runs(db_path, "slow") == [("running", 1)], 30, "the run to start")
        os.kill(node.pid, signal.SIGTERM)
        assert node.wait(60) == 0
    finally:
        stop_node(node)
    assert _runs(db_path, "slow") == [("interrupted", 1)]


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "86401", "soon"])
def test_a_bad_grace_is_refused_naming_the_option(tmp_path: Path, db_path: Path, value: str) -> None:
    proc = subprocess.run(
        [*PYSCHED, "up", "--db", str(db_path), "--grace", value],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--grace" in proc.stderr
    assert not db_path.exists(), "a refused start creates no database"


@pytest.mark.parametrize("command", ["up", "worker"])
def test_a_bad_grace_in_the_cluster_config_is_refused_naming_the_key(tmp_path: Path, command: str) -> None:
    # Refused before any server is reached: these addresses answer nothing.
    config = tmp_path / "cluster.toml"
    config.write_text(
        '[cluster]\netcd = "127.0.0.1:1"\ncassandra = "127.0.0.1:1"\nkafka = "127.0.0.1:1"\n'
        'redis = "redis://127.0.0.1:1/0"\ngrace_s = -1\n'
    )
    proc = subprocess.run(
        [*PYSCHED, command, "--config", str(config)], capture_output=True, text=True, timeout=30, cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stderr
    assert "grace_s" in proc.stderr and str(config) in proc.stderr


TIMED_FOREVER = """
import os
import subprocess
import time


def forever(ctx):
    open("forever.pid", "w").write(str(os.getpid()))
    subprocess.Popen(["sleep", "300"])  # what it started goes with it
    while True:  # deaf to ctx.cancelled
        time.sleep(0.2)
"""


@pytest.mark.parametrize("how", ["stop", "kill -9"])
def test_a_timed_python_target_ends_with_its_node(tmp_path: Path, db_path: Path, how: str) -> None:
    (tmp_path / "timed_forever.py").write_text(TIMED_FOREVER)
    log = tmp_path / "node.log"
    node = start_node(db_path, tmp_path, log, "--grace", "1", "--workers", "1")
    child = None
    try:
        cli("add", "t", "--in", "1", "--python", "timed_forever:forever", "--timeout", "600", db=db_path, cwd=tmp_path)
        wait_for(lambda: _read_pid(tmp_path / "forever.pid") is not None, 60, "the target to start", log)
        child = _read_pid(tmp_path / "forever.pid")
        assert child is not None and len(_group(child)) == 2  # the target and its sleep
        if how == "stop":
            os.kill(node.pid, signal.SIGTERM)
            assert node.wait(60) == 0
        else:
            os.kill(node.pid, signal.SIGKILL)
            node.wait(60)
        # Gone with the node, group and all, within the grace and the 2 s a
        # target has after SIGTERM (or, after kill -9, its watch's second).
        wait_for(lambda: not _group(child), 30, "the target's processes to be gone")
    finally:
        stop_node(node)
        _kill_group(child)
