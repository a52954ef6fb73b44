"""A real `pysched up` killed with SIGKILL mid-run: a second node runs the
run again from its last checkpoint, under the same idempotency key, and
its effect is committed once. The issue's numbers are a 30 s lease renewed
every 10 s and a 2-minute job; here the lease is 3 s (``--lease 3``,
heartbeats every second) and the job about 10 s, so the test takes
seconds, not minutes; the bounds below only guard against a hang."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers import cli, cli_json, start_node, stop_node, wait_for

pytestmark = pytest.mark.slow

# Counts to 20, one step every 0.25 s, saving each step; the run's single
# effect is committed at the end, to a file named by its idempotency key.
COUNTER = """
import json
import os
import time
from pathlib import Path


def count(ctx):
    start = (ctx.checkpoint_state or {}).get("n", 0)
    started = {"from": start, "key": ctx.idempotency_key, "attempt": ctx.attempt}
    Path(f"started.{os.getpid()}").write_text(json.dumps(started))
    for n in range(start + 1, 21):
        if ctx.cancelled.is_set():
            return "cancelled"
        time.sleep(0.25)
        ctx.checkpoint({"n": n})
        Path("progress").write_text(str(n))
    effect = Path("effects") / ctx.idempotency_key.replace(":", "_")
    effect.parent.mkdir(exist_ok=True)
    with effect.open("a") as f:
        f.write(json.dumps({"resumed_from": start}) + "\\n")
    return start
"""


def _progress(tmp_path: Path) -> int:
    path = tmp_path / "progress"
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text else 0


def test_a_run_whose_node_is_killed_resumes_from_its_checkpoint_on_the_next_node(tmp_path: Path, db_path: Path) -> None:
    (tmp_path / "counter.py").write_text(COUNTER)
    lease = ("--lease", "3", "--workers", "1")
    first = start_node(db_path, tmp_path, tmp_path / "a.log", *lease)
    second: subprocess.Popen[bytes] | None = None
    try:
        cli("add", "count", "--in", "1", "--python", "counter:count", db=db_path, cwd=tmp_path)
        wait_for(lambda: _progress(tmp_path) >= 4, 60, "the run to checkpoint a few steps", tmp_path / "a.log")
        os.kill(first.pid, signal.SIGKILL)
        first.wait(30)
        killed_at = _progress(tmp_path)
        assert killed_at < 20, "the run ended before the kill: nothing to resume"
        second = start_node(db_path, tmp_path, tmp_path / "b.log", *lease)
        effects = tmp_path / "effects"
        committed = lambda: effects.exists() and any(effects.iterdir())  # noqa: E731
        wait_for(committed, 60, "the resumed run's effect", tmp_path / "b.log")
        wait_for(
            lambda: [r["state"] for r in cli_json("history", "count", db=db_path)] == ["succeeded"],
            30,
            "the run to be recorded succeeded",
            tmp_path / "b.log",
        )
        starts = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("started.*"), key=os.path.getmtime)]
        assert len(starts) == 2, starts
        assert starts[0]["from"] == 0
        # Resumed where the checkpoints got to (one step may have been
        # saved between the read of `progress` and the kill), same key.
        assert starts[1]["from"] >= killed_at > 0
        assert starts[1]["key"] == starts[0]["key"]
        # Its worker died: that attempt is lost, and the run resumed as the next.
        assert (starts[0]["attempt"], starts[1]["attempt"]) == (1, 2)
        (effect,) = effects.iterdir()
        assert effect.name == starts[0]["key"].replace(":", "_")
        assert [json.loads(line) for line in effect.read_text().splitlines()] == [{"resumed_from": starts[1]["from"]}]
    finally:
        stop_node(first)
        if second is not None:
            stop_node(second)


# Runs ~12 s, four times the 3 s lease, on a node that stays alive.
LONG = """
import os
import time
from pathlib import Path


def long(ctx):
    Path(f"started.{os.getpid()}.{time.monotonic_ns()}").touch()
    for n in range(48):
        time.sleep(0.25)
        ctx.checkpoint({"n": n})
    Path("done").touch()
"""


def test_a_run_on_a_live_node_outlasting_its_lease_several_times_is_never_dispatched_again(
    tmp_path: Path, db_path: Path
) -> None:
    (tmp_path / "longjob.py").write_text(LONG)
    node = start_node(db_path, tmp_path, tmp_path / "a.log", "--lease", "3", "--workers", "2")
    try:
        cli("add", "long", "--in", "1", "--python", "longjob:long", db=db_path, cwd=tmp_path)
        wait_for(lambda: (tmp_path / "done").exists(), 90, "the long run to end", tmp_path / "a.log")
        wait_for(
            lambda: [r["state"] for r in cli_json("history", "long", db=db_path)] == ["succeeded"],
            30,
            "the run to be recorded succeeded",
            tmp_path / "a.log",
        )
        assert len(list(tmp_path.glob("started.*"))) == 1
        (run,) = cli_json("history", "long", db=db_path)
        assert run["attempt"] == 1
        # Its lease was never lost: nothing stopped it.
        assert "stopping long" not in (tmp_path / "a.log").read_text()
    finally:
        stop_node(node)
