"""Running the real `pysched` command in tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PYSCHED = [sys.executable, "-m", "pysched"]


def cli(
    *args: str, db: Path | str, cwd: Path | None = None, check: bool = True, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [*PYSCHED, *args, "--db", str(db)], capture_output=True, text=True, timeout=timeout_s, cwd=cwd
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"pysched {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def cli_json(*args: str, db: Path) -> Any:
    return json.loads(cli(*args, "--json", db=db).stdout)


def start_node(db: Path, cwd: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([*PYSCHED, "up", "--db", str(db), *args], cwd=cwd, stdout=out, stderr=out)


def stop_node(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM by PID, then SIGKILL if it lingers: only our own process."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str, log: Path | None = None) -> None:
    """Poll ``predicate`` until it holds; on timeout, say what was awaited
    and show the end of the node's ``log``, which says why."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    tail = ""
    if log is not None and log.exists():
        tail = "\n--- end of " + log.name + " ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-60:])
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{tail}")
