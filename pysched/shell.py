"""Running a shell command with bounded memory.

The command's output is streamed and only its tail is kept, so a job that
prints gigabytes costs the node a few kilobytes. Each command runs in its own
process group (a new session): a timeout kills the command and everything it
started, and a node that stops its runs (``stop_commands``) asks them to end
with SIGTERM before it kills them.
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

# Each command running, with the events that stop it: its node's, and its
# own run's (set when the run is cancelled, as a replaced run is).
_running: dict[subprocess.Popen[bytes], tuple[threading.Event | None, ...]] = {}
_running_lock = threading.Lock()
# How often a stop looks whether the groups it signalled have ended.
_STOP_POLL_S = 0.05


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


def run_command(
    command: str,
    env: Mapping[str, str],
    timeout_s: float | None,
    stopping: threading.Event | None = None,
    cancelled: threading.Event | None = None,
) -> CommandResult:
    """Run ``command`` with ``sh -c``. ``stopping``: set by a caller about to
    stop its commands (stop_commands); a command that starts after it was
    set is killed at once, so none slips past the stop. ``cancelled``: the
    same for this command alone (its run was cancelled)."""
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
            _running[proc] = (stopping, cancelled)
            # Under the lock that stop_commands takes its list with: a
            # command is either on that list or sees the event set.
            late = any(event is not None and event.is_set() for event in (stopping, cancelled))
        if late:
            _signal_group(proc, signal.SIGKILL)
        try:
            tails = _read_tails(proc, deadline)
            if tails is not None:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    return CommandResult(proc.wait(remaining), *tails)
                except subprocess.TimeoutExpired:
                    pass
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
            return CommandResult(None, "", "")
        finally:
            with _running_lock:
                _running.pop(proc, None)


def stop_commands(stopping: threading.Event, wait_s: float) -> int:
    """Stop the commands started under ``stopping``, which the caller has
    set, with every process they started: SIGTERM to each one's process
    group, up to ``wait_s`` for the groups to end, then SIGKILL to what is
    left. How many commands were running."""
    with _running_lock:
        procs = [proc for proc, events in _running.items() if any(event is stopping for event in events)]
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while any(_group_alive(proc) for proc in procs) and time.monotonic() < deadline:
        time.sleep(_STOP_POLL_S)
    for proc in procs:
        if _group_alive(proc):
            _signal_group(proc, signal.SIGKILL)
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


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    # A pid stays taken while a group of that number has a member, so this
    # reaches the command's processes or none (pids are handed out in a
    # cycle of millions: not again within a stop's few seconds).
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
        os.killpg(proc.pid, signum)


def _group_alive(proc: subprocess.Popen[bytes]) -> bool:
    """Whether a process of the command's group is left (a zombie counts
    until its parent reaps it: the command's thread does so at once)."""
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
