"""Running a job's target: a Python callable, a shell command, an HTTP call.

Each receives the run's identity, and its idempotency key is handed to
downstream systems (an ``Idempotency-Key`` header, a ``PYSCHED_IDEMPOTENCY_KEY``
environment variable, ``ctx.idempotency_key``) so that a repeated delivery can
be recognised there too.
"""

from __future__ import annotations

import importlib
import json
import os
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pysched.model import HttpTarget, Job, PythonTarget, ShellTarget
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


@dataclass(frozen=True)
class Outcome:
    succeeded: bool
    result: str | None = None
    error: str | None = None


def context_for(job: Job, record: DispatchRecord) -> RunContext:
    return RunContext(
        job_id=record.job_id,
        run_id=record.run_id,
        run_at=datetime.fromtimestamp(record.run_at_ms / 1000, UTC),
        attempt=record.attempt,
        fence=record.fence,
        idempotency_key=record.idempotency_key,
        payload=dict(job.payload),
    )


def run_target(job: Job, ctx: RunContext, stopping: threading.Event | None = None) -> Outcome:
    """Run the job's target for ``ctx``. ``stopping``: the event under which
    a node stops the shell commands of its runs (shell.stop_commands); a
    Python or HTTP target runs in the caller's thread, which nothing stops."""
    target = job.target
    try:
        if isinstance(target, ShellTarget):
            return _run_shell(target, ctx, stopping)
        if isinstance(target, PythonTarget):
            return _run_python(target, ctx)
        return _run_http(target, ctx)
    except BaseException as exc:
        # A target's failure is the run's outcome, not the worker's: also
        # sys.exit(), KeyboardInterrupt or any BaseException it raises, which
        # would otherwise end the worker thread that runs it.
        return Outcome(False, error=_describe(exc)[:_OUTPUT_LIMIT])


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
    ran = run_command(target.command, env, target.timeout_s, stopping)
    if ran.returncode is None:
        return Outcome(False, error=f"timed out after {target.timeout_s} s")
    out = ran.stdout_tail.strip()[-_OUTPUT_LIMIT:] or None
    if ran.returncode != 0:
        err = ran.stderr_tail.strip()[-_OUTPUT_LIMIT:]
        return Outcome(False, result=out, error=f"exit status {ran.returncode}" + (f": {err}" if err else ""))
    return Outcome(True, result=out)


def _run_python(target: PythonTarget, ctx: RunContext) -> Outcome:
    module_name, func_name = target.ref.split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    value = func(ctx)
    if value is None:
        return Outcome(True)
    try:
        return Outcome(True, result=json.dumps(value)[:_OUTPUT_LIMIT])
    except TypeError:
        return Outcome(True, result=repr(value)[:_OUTPUT_LIMIT])


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
        return Outcome(False, error=f"HTTP {exc.code} {exc.reason}")
