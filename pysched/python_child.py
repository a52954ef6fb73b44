"""A Python target with a --timeout runs in a child process of its own, so
that it can be stopped: cooperatively first (SIGTERM sets its
``ctx.cancelled``), then for good (SIGKILL, ``KILL_AFTER_S`` later). A thread
cannot be killed; a target that ignored its cancel event would run on in
the node's process, holding what it holds, long after its run failed.

Children come from a fork server: a small process started once, before any
worker thread could hold a lock in it, so a child never inherits a lock
held mid-operation by another thread of the node (forking the node itself
could). ``ctx.checkpoint`` in the child asks the parent over the pipe, which
saves it under the run's claim. A target without a timeout runs in its
worker's thread, as before: no process per run for the common case."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pysched.shell import signal_group, track, untrack
from pysched.targets import Outcome, RunContext, failure_outcome, python_outcome, resolve

# As a shell command's: after SIGTERM, how long a target has to return.
KILL_AFTER_S = 2.0
_POLL_S = 0.05
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["pysched.python_child"])


@dataclass(frozen=True)
class _Call:
    """What the child needs to build its RunContext: plain values."""

    ref: str
    job_id: str
    run_id: int
    run_at: datetime
    attempt: int
    fence: int
    idempotency_key: str
    payload: dict[str, Any]
    checkpoint_state: Any
    node_pid: int  # the node the child is to end with
    node_started: str | None  # its start time, so a pid reused is not taken for it


class _Stopped(Exception):
    """The run was stopped from outside (its node stopping, its lease lost,
    a newer run replacing it) before its target returned."""


def run_in_child(ref: str, ctx: RunContext, timeout_s: float, stopping: threading.Event | None) -> Outcome:
    """Run ``ref`` for ``ctx`` in a child process, for at most ``timeout_s``;
    stopped, too, when ``ctx.cancelled`` or ``stopping`` is set."""
    call = _Call(
        ref,
        ctx.job_id,
        ctx.run_id,
        ctx.run_at,
        ctx.attempt,
        ctx.fence,
        ctx.idempotency_key,
        ctx.payload,
        ctx.checkpoint_state,
        os.getpid(),
        _started(os.getpid()),
    )
    ours, theirs = _CONTEXT.Pipe()
    child = _CONTEXT.Process(target=_child_main, args=(call, theirs), name=f"pysched-run-{ctx.job_id}", daemon=True)
    child.start()
    theirs.close()
    assert child.pid is not None
    # Stopped with the node's shell commands (shell.stop_commands) when the
    # node stops or the run is cancelled, whichever thread waits here.
    events = tuple(e for e in (stopping, ctx.cancelled) if e is not None)
    if not track(child.pid, events):
        signal_group(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if ctx.cancelled.is_set() or (stopping is not None and stopping.is_set()):
                raise _Stopped("stopped before it returned (ctx.cancelled is set)")
            left = deadline - time.monotonic()
            if left <= 0:
                ctx.cancelled.set()
                raise TimeoutError(f"timed out after {timeout_s:g} s ({_stop(child)})")
            if not ours.poll(min(left, _POLL_S)):
                continue
            try:
                message = ours.recv()
            except EOFError:
                child.join(KILL_AFTER_S)
                return Outcome(
                    False, error=f"its process ended without an answer (exit code {child.exitcode})", kind="exception"
                )
            if message[0] == "checkpoint":
                ours.send(ctx.save_checkpoint is not None and ctx.save_checkpoint(message[1]))
                continue
            outcome: Outcome = message[1]
            return outcome
    finally:
        untrack(child.pid)  # before it is reaped: its pid is then free for others
        _stop(child)
        ours.close()


def _stop(child: Any) -> str:
    """SIGTERM to the child's group (the target's ctx.cancelled), then
    SIGKILL to what is left of it, whatever it started too; how it ended,
    in words."""
    pid = child.pid
    how = "it had ended"
    if child.exitcode is None:
        signal_group(pid, signal.SIGTERM)
        asked = time.monotonic()
        child.join(KILL_AFTER_S)
        if child.exitcode is None:
            signal_group(pid, signal.SIGKILL)
            how = f"stopped: SIGTERM, then SIGKILL {KILL_AFTER_S:g} s later"
        else:
            how = f"it returned {time.monotonic() - asked:.1f} s after SIGTERM set ctx.cancelled"
    child.join()
    # What the target started and left behind: a group outlives its leader,
    # and its id is not given to another process while it does.
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    return how


def _child_main(call: _Call, conn: Connection) -> None:
    # A group of its own: stopping it stops whatever the target started.
    os.setsid()
    cancelled = threading.Event()
    # Set by the parent's SIGTERM: the target's cue to return.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: cancelled.set())
    _end_with_node(call.node_pid, call.node_started)
    lock = threading.Lock()

    def save(text: str) -> bool:
        with lock:
            conn.send(("checkpoint", text))
            return bool(conn.recv())

    ctx = RunContext(
        call.job_id,
        call.run_id,
        call.run_at,
        call.attempt,
        call.fence,
        call.idempotency_key,
        call.payload,
        cancelled=cancelled,
        checkpoint_state=call.checkpoint_state,
        save_checkpoint=save,
    )
    try:
        outcome = python_outcome(resolve(call.ref)(ctx))
    except BaseException as exc:
        outcome = failure_outcome(exc)
    try:
        with lock:
            conn.send(("done", outcome))
    finally:
        os._exit(0)  # whatever threads the target left behind


def _end_with_node(pid: int, started: str | None) -> None:
    """A node gone (kill -9 leaves no stop to run) takes its targets' groups
    with it: none runs on beside the run's next attempt."""

    def watch() -> None:
        while _started(pid) == started:
            time.sleep(0.5)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="pysched-node-watch", daemon=True).start()


def _started(pid: int) -> str | None:
    """When process ``pid`` started (its /proc stat field), None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
