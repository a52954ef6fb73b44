"""Running a job's target: a Python callable, a shell command, an HTTP call,
a Temporal workflow.

Each receives the run's identity, and its idempotency key is handed to
downstream systems (an ``Idempotency-Key`` header, a ``PYSCHED_IDEMPOTENCY_KEY``
environment variable, ``ctx.idempotency_key``, a workflow id) so that a repeated delivery can
be recognised there too.
"""

from __future__ import annotations

import importlib
import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pysched.checkpoints import CheckpointError, CheckpointRefused, decode_checkpoint, encode_checkpoint
from pysched.model import HttpTarget, Job, PythonTarget, ShellTarget, TemporalTarget
from pysched.records import DispatchRecord
from pysched.shell import run_command

_OUTPUT_LIMIT = 4_000


@dataclass(frozen=True)
class RunContext:
    """What a Python target receives."""

    job_id: str
    run_id: int
    run_at: datetime
    attempt: int
    fence: int
    idempotency_key: str
    payload: dict[str, Any] = field(default_factory=dict)
    # Set when the run is to stop (its timeout passed, its lease was lost to
    # another execution, its job was cancelled, a newer run of the job
    # replaced it): a long Python target checks it and returns.
    cancelled: threading.Event = field(default_factory=threading.Event, compare=False)
    # The state the run resumes from: the last checkpoint an earlier
    # execution of it saved (one that died, or an attempt that failed);
    # None on a fresh run.
    checkpoint_state: Any = None
    # Saves a checkpoint's JSON text under the run's claim; False when the
    # claim is no longer this execution's. None: not run by a worker.
    save_checkpoint: Callable[[str], bool] | None = field(default=None, compare=False, repr=False)

    def checkpoint(self, state: Any) -> None:
        """Save ``state`` (JSON-serializable, at most 64 KiB encoded) durably
        with the run, for an execution that resumes it. Raises
        CheckpointTooLarge, CheckpointError (not JSON), and CheckpointRefused
        when the run was taken over by another execution (``cancelled`` is
        then set: stop)."""
        text = encode_checkpoint(state)
        if self.save_checkpoint is None:
            raise CheckpointError("checkpoints are kept only for runs a worker runs")
        if not self.save_checkpoint(text):
            self.cancelled.set()
            raise CheckpointRefused(
                f"run {self.idempotency_key} is no longer this execution's: its lease ran out and it was taken over"
            )


@dataclass(frozen=True)
class Outcome:
    succeeded: bool
    result: str | None = None
    error: str | None = None
    # What kind of failure (model.RETRY_KINDS, or one never retried:
    # "4xx", "import"), and for an exception the names of its class and its
    # bases, which ``exception:Name`` matches.
    kind: str | None = None
    exception_names: tuple[str, ...] = ()


def context_for(
    job: Job,
    record: DispatchRecord,
    cancelled: threading.Event | None = None,
    checkpoint: str | None = None,
    save_checkpoint: Callable[[str], bool] | None = None,
) -> RunContext:
    """The context of a run; ``checkpoint``: the JSON text it resumes from."""
    return RunContext(
        cancelled=cancelled or threading.Event(),
        checkpoint_state=decode_checkpoint(checkpoint),
        save_checkpoint=save_checkpoint,
        job_id=record.job_id,
        run_id=record.run_id,
        run_at=datetime.fromtimestamp(record.run_at_ms / 1000, UTC),
        attempt=record.attempt,
        fence=record.fence,
        idempotency_key=record.idempotency_key,
        payload=dict(job.payload),
    )


def run_target(
    job: Job, ctx: RunContext, stopping: threading.Event | None = None, temporal_address: str | None = None
) -> Outcome:
    """Run the job's target for ``ctx``. ``stopping``: the event under which
    a node stops the shell commands of its runs (shell.stop_commands) and
    stops waiting on their workflows; a Python or HTTP target runs in the
    caller's thread, which nothing stops. ``temporal_address``: the
    Temporal server's host:port (None: PYSCHED_TEMPORAL_ADDRESS, else
    127.0.0.1:7233)."""
    target = job.target
    try:
        if isinstance(target, ShellTarget):
            return _run_shell(target, ctx, stopping)
        if isinstance(target, PythonTarget):
            return _run_python(target, ctx, stopping)
        if isinstance(target, TemporalTarget):
            return _run_temporal(target, ctx, stopping, temporal_address)
        return _run_http(target, ctx)
    except BaseException as exc:
        # A target's failure is the run's outcome, not the worker's: also
        # sys.exit(), KeyboardInterrupt or any BaseException it raises, which
        # would otherwise end the worker thread that runs it.
        return failure_outcome(exc)


def runs_in_thread(job: Job) -> bool:
    """Whether the job's target runs in the worker's own thread, which
    nothing can stop (a Python function without a timeout, an HTTP call):
    a shell command, a timed Python target's child process and the wait on
    a workflow are stopped with their node."""
    target = job.target
    return isinstance(target, HttpTarget) or (isinstance(target, PythonTarget) and target.timeout_s is None)


class _Unimportable(Exception):
    """The target's module or function cannot be found: trying again will
    not find it."""


def _kind_of(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, urllib.error.URLError | ConnectionError):
        return "timeout" if isinstance(getattr(exc, "reason", None), TimeoutError) else "connect"
    return "exception"


def _names(exc: BaseException) -> tuple[str, ...]:
    return tuple(cls.__name__ for cls in type(exc).__mro__ if cls is not object)


def _describe(exc: BaseException) -> str:
    """'SystemExit: 3', 'KeyboardInterrupt', 'ValueError: bad x'."""
    try:
        text = str(exc)
    except BaseException:  # its own __str__ may be as hostile as the job
        text = "(its message could not be read)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _run_shell(target: ShellTarget, ctx: RunContext, stopping: threading.Event | None) -> Outcome:
    env = dict(os.environ)
    env.update(
        PYSCHED_JOB_ID=ctx.job_id,
        PYSCHED_RUN_ID=str(ctx.run_id),
        PYSCHED_RUN_AT=ctx.run_at.isoformat(),
        PYSCHED_ATTEMPT=str(ctx.attempt),
        PYSCHED_FENCE=str(ctx.fence),
        PYSCHED_IDEMPOTENCY_KEY=ctx.idempotency_key,
        PYSCHED_PAYLOAD=json.dumps(ctx.payload),
    )
    ran = run_command(target.command, env, target.timeout_s, stopping, ctx.cancelled)
    if ran.returncode is None:
        return Outcome(False, error=f"timed out after {target.timeout_s} s", kind="timeout")
    out = ran.stdout_tail.strip()[-_OUTPUT_LIMIT:] or None
    err = ran.stderr_tail.strip()[-_OUTPUT_LIMIT:]
    if ran.returncode != 0:
        return Outcome(
            False, result=out, error=f"exit status {ran.returncode}" + (f": {err}" if err else ""), kind="exception"
        )
    # Kept on success too: a warning on stderr is worth reading.
    return Outcome(True, result=out, error=err or None)


def _run_python(target: PythonTarget, ctx: RunContext, stopping: threading.Event | None) -> Outcome:
    if target.timeout_s is not None:
        # Imported here: only a node running a timed Python target starts
        # the child processes.
        from pysched.python_child import run_in_child

        return run_in_child(target.ref, ctx, target.timeout_s, stopping)
    return python_outcome(resolve(target.ref)(ctx))


def resolve(ref: str) -> Callable[[RunContext], Any]:
    """The function ``module:function`` names; raises _Unimportable when it
    cannot be found."""
    module_name, func_name = ref.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            raise _Unimportable(_describe(exc)) from None
        raise  # the module itself imports something missing: its own failure
    func = getattr(module, func_name, None)
    if func is None:
        raise _Unimportable(f"AttributeError: module {module_name!r} has no attribute {func_name!r}")
    return func  # type: ignore[no-any-return]


def import_problem(ref: str) -> str | None:
    """Why ``module:function`` cannot be called as a target from this
    process (its module does not import, names no such function, or not a
    callable one); None when it can. Imports the module, as a worker does."""
    try:
        func = resolve(ref)
    except _Unimportable as exc:
        return str(exc)
    except (Exception, SystemExit) as exc:  # raised by the module's own code
        return f"importing {ref.partition(':')[0]} raised {_describe(exc)}"[:_OUTPUT_LIMIT]
    if not callable(func):
        return f"{ref} is a {type(func).__name__}, not a function"
    return None


def python_outcome(value: Any) -> Outcome:
    """A Python target's return value as its run's result: JSON, or its repr."""
    if value is None:
        return Outcome(True)
    try:
        return Outcome(True, result=json.dumps(value)[:_OUTPUT_LIMIT])
    except TypeError:
        return Outcome(True, result=repr(value)[:_OUTPUT_LIMIT])


def failure_outcome(exc: BaseException) -> Outcome:
    """A failed run's outcome for what its target raised."""
    if isinstance(exc, _Unimportable):
        return Outcome(False, error=str(exc)[:_OUTPUT_LIMIT], kind="import")
    return Outcome(False, error=_describe(exc)[:_OUTPUT_LIMIT], kind=_kind_of(exc), exception_names=_names(exc))


def _run_http(target: HttpTarget, ctx: RunContext) -> Outcome:
    body = None
    if target.method != "GET":
        body = json.dumps(
            {"job_id": ctx.job_id, "run_at": ctx.run_at.isoformat(), "attempt": ctx.attempt, "payload": ctx.payload}
        ).encode()
    request = urllib.request.Request(
        target.url,
        data=body,
        method=target.method,
        headers={
            "Idempotency-Key": ctx.idempotency_key,
            "Content-Type": "application/json",
            "User-Agent": "pysched",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=target.timeout_s) as resp:
            text = resp.read(_OUTPUT_LIMIT).decode("utf-8", "replace")
            return Outcome(True, result=f"HTTP {resp.status}" + (f": {text}" if text else ""))
    except urllib.error.HTTPError as exc:
        # 408 and 429 ask to be tried again later; any other 4xx would fail
        # again.
        transient = exc.code >= 500 or exc.code in (408, 429)
        return Outcome(False, error=f"HTTP {exc.code} {exc.reason}", kind="5xx" if transient else "4xx")


def _run_temporal(
    target: TemporalTarget, ctx: RunContext, stopping: threading.Event | None, address: str | None
) -> Outcome:
    try:
        # Here, not at the top: only a worker that runs a workflow loads the SDK.
        from pysched import temporal_target
    except ImportError as exc:
        raise _Unimportable(f"a Temporal target needs pysched[temporal] installed: {_describe(exc)}") from None
    return temporal_target.run_workflow(
        target, ctx.idempotency_key, address or temporal_target.address_from_env(), stopping
    )
