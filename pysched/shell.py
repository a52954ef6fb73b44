"""Running a shell command with bounded memory.

The command's output is streamed and only its tail is kept, so a job that
prints gigabytes costs the node a few kilobytes. Each command runs in its own
process group (a new session): a timeout kills the command and everything it
started, and a node that stops its runs (``stop_commands``) asks them to end
with SIGTERM before it kills them; so does a worker that stops one run (its
lease was lost, its job cancelled), under that run's own event.
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

# Each process group running (a command's, a Python target's child), by its
# leader's pid, with the events under which it is stopped: its node's, and
# its run's.
_running: dict[int, tuple[threading.Event, ...]] = {}
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
    """Run ``command`` with ``sh -c``. ``stopping`` (the node's) and
    ``cancelled`` (the run's): each set by a caller about to stop the
    commands started under it (stop_commands); a command that starts after
    one was set is killed at once, so none slips past the stop."""
    events = tuple(e for e in (stopping, cancelled) if e is not None)
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
        if not track(proc.pid, events):
            signal_group(proc.pid, signal.SIGKILL)
        try:
            tails = _read_tails(proc, deadline)
            if tails is not None:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    return CommandResult(proc.wait(remaining), *tails)
                except subprocess.TimeoutExpired:
                    pass
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
            return CommandResult(None, "", "")
        finally:
            untrack(proc.pid)


def track(pid: int, events: tuple[threading.Event, ...]) -> bool:
    """Stop the process group ``pid`` leads with the others started under
    ``events`` (stop_commands); False when one is set already: the caller
    kills it at once, so none slips past a stop."""
    with _running_lock:
        _running[pid] = events
        # Under the lock that stop_commands takes its list with: a group is
        # either on that list or sees the event set.
        return not any(e.is_set() for e in events)


def untrack(pid: int) -> None:
    with _running_lock:
        _running.pop(pid, None)


def stop_commands(stopping: threading.Event, wait_s: float) -> int:
    """Stop the commands started under ``stopping``, which the caller has
    set, with every process they started: SIGTERM to each one's process
    group, up to ``wait_s`` for the groups to end, then SIGKILL to what is
    left. How many commands were running."""
    with _running_lock:
        pids = [pid for pid, events in _running.items() if any(e is stopping for e in events)]
    for pid in pids:
        signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while any(_group_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(_STOP_POLL_S)
    for pid in pids:
        if _group_alive(pid):
            signal_group(pid, signal.SIGKILL)
    return len(pids)


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


def signal_group(pid: int, signum: int) -> None:
    # A pid stays taken while a group of that number has a member, so this
    # reaches the group's processes or none (pids are handed out in a cycle
    # of millions: not again within a stop's few seconds). A Python
    # target's child that has not yet made its group is signalled alone.
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
    except PermissionError:
        pass


def _group_alive(pid: int) -> bool:
    """Whether a process of the group is left (a zombie counts until its
    parent reaps it: the thread that started it does so at once)."""
    for probe in (os.killpg, os.kill):
        try:
            probe(pid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            return True
        return True
    return False
    return True
