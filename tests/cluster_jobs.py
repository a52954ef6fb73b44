"""Python targets for the cluster's process tests (test_cluster_long_runs.py).

The worker processes import this module as ``tests.cluster_jobs``: they run
from the repository's root with it on PYTHONPATH (helpers.Cluster.start).
Each job reports to the directory its payload names (``dir``), in files the
test reads while the run goes on: one ``started.*.json`` per execution that
began, ``progress`` after each checkpoint saved, and its single effect in
``effects/``, created with O_EXCL under its idempotency key, so a second
execution that reached its end would meet the first one's file and say so
(``duplicate.*``) rather than overwrite it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from pysched.targets import RunContext

# The counter's steps, a quarter second each plus a checkpoint (unless the
# payload's ``step_s`` says otherwise): long enough to be killed halfway,
# short enough for a test.
COUNT_TO = 40
STEP_S = 0.25


def _report(ctx: RunContext, name: str, values: dict[str, Any]) -> None:
    """Write ``values`` to ``name`` in the payload's directory whole: the
    test polls the directory and must never read half a file."""
    out = Path(ctx.payload["dir"])
    tmp = out / f".{name}.tmp"
    tmp.write_text(json.dumps(values))
    tmp.replace(out / name)


def _started(ctx: RunContext, resumed_from: int) -> None:
    pid = os.getpid()  # a Python target runs on a thread of its worker process
    values = {"from": resumed_from, "key": ctx.idempotency_key, "attempt": ctx.attempt, "pid": pid, "at": time.time()}
    _report(ctx, f"started.{pid}.{time.monotonic_ns()}.json", values)


def _commit_effect(ctx: RunContext, effect: dict[str, Any]) -> None:
    """The run's one effect, keyed by its idempotency key: a second one for
    the same key is recorded as a duplicate and fails the run."""
    out = Path(ctx.payload["dir"])
    effects = out / "effects"
    effects.mkdir(exist_ok=True)
    path = effects / ctx.idempotency_key.replace(":", "_")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        (out / f"duplicate.{os.getpid()}.{time.monotonic_ns()}").write_text(json.dumps(effect))
        raise
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(effect))


def count(ctx: RunContext) -> int | str:
    """Counts to COUNT_TO, saving each step as a checkpoint; an execution
    that resumes the run starts after the last step saved."""
    start = int((ctx.checkpoint_state or {}).get("n", 0))
    _started(ctx, start)
    progress = Path(ctx.payload["dir"]) / "progress"
    step_s = float(ctx.payload.get("step_s", STEP_S))
    for n in range(start + 1, COUNT_TO + 1):
        if ctx.cancelled.is_set():
            return "cancelled"
        time.sleep(step_s)
        ctx.checkpoint({"n": n})
        # After the checkpoint: what the test reads was saved already.
        progress.write_text(str(n))
    _commit_effect(ctx, {"resumed_from": start})
    return start


def outlast(ctx: RunContext) -> int:
    """Runs for at least ``min_s`` seconds, and then until the test lets it
    end (the file ``may_end`` in its directory, at most ``max_s``),
    checkpointing every step. A stop (its lease lost, ``ctx.cancelled``) is
    written down, not hidden: the test fails on it."""
    out = Path(ctx.payload["dir"])
    min_s, max_s = float(ctx.payload["min_s"]), float(ctx.payload["max_s"])
    step_s = float(ctx.payload.get("step_s", STEP_S))
    _started(ctx, 0)
    began = time.monotonic()
    steps = 0
    while True:
        ran_s = time.monotonic() - began
        if ran_s >= max_s or (ran_s >= min_s and (out / "may_end").exists()):
            break
        if ctx.cancelled.is_set():
            _report(ctx, f"cancelled.{os.getpid()}.json", {"after_s": ran_s})
            return steps
        time.sleep(step_s)
        steps += 1
        ctx.checkpoint({"n": steps})
    _commit_effect(ctx, {"steps": steps, "ran_s": time.monotonic() - began})
    return steps


def mark(ctx: RunContext) -> None:
    """A short run: only says it started."""
    _started(ctx, 0)
