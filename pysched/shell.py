"""Running a shell command with bounded memory.

The command's output is streamed and only its tail is kept, so a job that
prints gigabytes costs the node a few kilobytes. Each command runs in its own
process group (a new session): a timeout, or a node that stops without
waiting, kills the command and everything it started.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

# Kept from each stream: well above the characters a run records, so that
# stripping trailing blank output still leaves enough text.
TAIL_BYTES = 64 * 1024
_READ_BYTES = 64 * 1024

_running: set[subprocess.Popen[bytes]] = set()
_running_lock = threading.Lock()


@dataclass(frozen=True)
class CommandResult:
    returncode: int | None  # None: killed at its timeout
    stdout_tail: str
    stderr_tail: str


class _Tail:
    """The last ``limit`` bytes of a stream."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buffer = bytearray()

    def add(self, chunk: bytes) -> None:
        self._buffer += chunk
        if len(self._buffer) > self._limit:
            del self._buffer[: len(self._buffer) - self._limit]

    def text(self) -> str:
        # The cut may split a character: it decodes as a replacement mark.
        return self._buffer.decode("utf-8", "replace")


def run_command(command: str, env: Mapping[str, str], timeout_s: float | None) -> CommandResult:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with subprocess.Popen(
        command,
        shell=True,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    ) as proc:
        with _running_lock:
            _running.add(proc)
        try:
            tails = _read_tails(proc, deadline)
            if tails is not None:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    return CommandResult(proc.wait(remaining), *tails)
                except subprocess.TimeoutExpired:
                    pass
            _kill_group(proc)
            proc.wait()
            return CommandResult(None, "", "")
        finally:
            with _running_lock:
                _running.discard(proc)


def kill_running() -> int:
    """Kill every command running now, with its children; how many."""
    with _running_lock:
        procs = list(_running)
    for proc in procs:
        _kill_group(proc)
    return len(procs)


def _read_tails(proc: subprocess.Popen[bytes], deadline: float | None) -> tuple[str, str] | None:
    """Both streams' tails once both are closed; None at the deadline."""
    assert proc.stdout is not None and proc.stderr is not None
    tails = {proc.stdout.fileno(): _Tail(TAIL_BYTES), proc.stderr.fileno(): _Tail(TAIL_BYTES)}
    with selectors.DefaultSelector() as selector:
        for fd in tails:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, _READ_BYTES)
                if chunk:
                    tails[key.fd].add(chunk)
                else:
                    selector.unregister(key.fd)
    return tails[proc.stdout.fileno()].text(), tails[proc.stderr.fileno()].text()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # Not reaped yet, so its pid is still the group's: no stranger is hit.
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
        os.killpg(proc.pid, signal.SIGKILL)
