"""Running a Temporal target: start a workflow under the run's idempotency
key as its workflow id, and wait for how it ends.

Imported only when a Temporal target runs (targets.py), so that a worker
without one never loads the SDK. The SDK is asyncio and the workers are
threads: each process keeps one event loop, in a daemon thread started on
first use, and one client per (address, namespace) on it; a worker thread
hands its coroutine to that loop and waits on the result.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import timedelta
from typing import Any, TypeVar

from temporalio.client import Client, WorkflowFailureError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.exceptions import TimeoutError as WorkflowTimeoutError
from temporalio.service import RPCError, RPCStatusCode

from pysched.model import TemporalTarget
from pysched.targets import Outcome

DEFAULT_ADDRESS = "127.0.0.1:7233"
ADDRESS_ENV = "PYSCHED_TEMPORAL_ADDRESS"
_CONNECT_TIMEOUT_S = 10.0
# How often a worker thread waiting on a workflow looks at its node's stop.
_STOP_POLL_S = 0.5
_OUTPUT_LIMIT = 4_000
# RPC failures that say the server could not be reached, not that it refused.
_UNREACHABLE = frozenset({RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED})

T = TypeVar("T")


def address_from_env() -> str:
    """The embedded engine's Temporal address: PYSCHED_TEMPORAL_ADDRESS, or
    the dev server's default port on this machine."""
    return os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS


class _Loop:
    """The process's event loop thread and its clients. Recreated in a
    forked child, which inherits neither the thread nor the connections."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clients: dict[tuple[str, str], Client] = {}

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                self._loop = asyncio.new_event_loop()
                self._pid = os.getpid()
                self._clients = {}
                threading.Thread(target=self._loop.run_forever, name="pysched-temporal", daemon=True).start()
            loop = self._loop
        return asyncio.run_coroutine_threadsafe(coro, loop)

    async def client(self, address: str, namespace: str) -> Client:
        """The loop's client for ``address`` and ``namespace``, connected on
        first use; a connection that failed is not kept, so the next run
        tries again. Runs on the loop, whose single thread makes the check
        and the store one step (two runs racing may both connect; the
        second client is simply dropped)."""
        key = (address, namespace)
        client = self._clients.get(key)
        if client is None:
            client = await Client.connect(
                address, namespace=namespace, connect_timeout=timedelta(seconds=_CONNECT_TIMEOUT_S)
            )
            client = self._clients.setdefault(key, client)
        return client


_LOOP = _Loop()


async def _start_and_wait(target: TemporalTarget, workflow_id: str, address: str) -> Any:
    client = await _LOOP.client(address, target.namespace)
    timeout = None if target.timeout_s is None else timedelta(seconds=target.timeout_s)
    try:
        # One workflow per idempotency key. A start under an id whose
        # workflow is running attaches to it (USE_EXISTING): a duplicate
        # delivery, or the redelivery after a worker died mid-run, waits on
        # the workflow already going. One that ended in failure (failed,
        # timed out, terminated, cancelled) is started anew under the same
        # id (ALLOW_DUPLICATE_FAILED_ONLY): the retry of a failed run runs
        # the workflow again instead of reading back the same failure
        # forever. One that completed is not started again: the start is
        # refused, and its result is read instead.
        handle = await client.start_workflow(
            target.workflow,
            args=list(target.args),
            id=workflow_id,
            task_queue=target.task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            execution_timeout=timeout,
        )
    except WorkflowAlreadyStartedError:
        handle = client.get_workflow_handle(workflow_id)
    return await handle.result()


def run_workflow(
    target: TemporalTarget, workflow_id: str, address: str, stopping: threading.Event | None = None
) -> Outcome:
    """Start (or attach to) the workflow and wait until it ends, its
    ``timeout_s`` passes, or ``stopping`` is set. A workflow outlives what
    stops the wait: the run's next attempt, under the same id, attaches
    to it while it runs."""
    future = _LOOP.submit(_start_and_wait(target, workflow_id, address))
    deadline = None if target.timeout_s is None else time.monotonic() + target.timeout_s
    while True:
        wait_s = _STOP_POLL_S if deadline is None else min(_STOP_POLL_S, max(deadline - time.monotonic(), 0.0))
        try:
            value = future.result(timeout=wait_s)
        except FutureTimeout:
            if stopping is not None and stopping.is_set():
                future.cancel()
                return Outcome(False, error=f"stopped waiting for workflow {workflow_id}")
            if deadline is not None and time.monotonic() >= deadline:
                future.cancel()
                return Outcome(
                    False, error=f"workflow {workflow_id}: timed out after {target.timeout_s:g} s", kind="timeout"
                )
            continue
        except BaseException as exc:
            return _failure(target, workflow_id, address, exc)
        return Outcome(True, result=_text(value))


def _text(value: Any) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value)[:_OUTPUT_LIMIT]
    except (TypeError, ValueError):
        return repr(value)[:_OUTPUT_LIMIT]


def _failure(target: TemporalTarget, workflow_id: str, address: str, exc: BaseException) -> Outcome:
    """The kind of failure, for the retry rules: the workflow's own failure
    is an ``exception`` (named by its ApplicationError's type, the class of
    the Python exception that failed it, so ``exception:Name`` matches), its
    timing out a ``timeout``, a server that cannot be reached ``connect``."""
    where = f"workflow {target.workflow} ({workflow_id})"
    if isinstance(exc, WorkflowFailureError):
        cause = exc.cause  # ApplicationError, TerminatedError, CancelledError or TimeoutError
        if isinstance(cause, WorkflowTimeoutError):
            return Outcome(False, error=f"{where} timed out", kind="timeout")
        names: tuple[str, ...] = (type(cause).__name__,)
        if isinstance(cause, ApplicationError) and cause.type:
            names = (cause.type, *names)
        return Outcome(False, error=f"{where} failed: {_message(cause)}", kind="exception", exception_names=names)
    if (isinstance(exc, RPCError) and exc.status in _UNREACHABLE) or _is_connect_failure(exc):
        return Outcome(False, error=f"Temporal at {address}: {_message(exc)}", kind="connect")
    names = tuple(cls.__name__ for cls in type(exc).__mro__ if cls is not object)
    return Outcome(False, error=f"{where}: {_message(exc)}", kind="exception", exception_names=names)


def _is_connect_failure(exc: BaseException) -> bool:
    # Client.connect reports a refused or timed-out connection as a
    # RuntimeError of its native core, in these words.
    return isinstance(exc, RuntimeError | ConnectionError | OSError) and "connect" in str(exc).lower()


def _message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except BaseException:
        text = ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
