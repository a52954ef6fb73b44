"""The job every load run executes: one line in a ledger file per execution,
written by the job itself: "<idempotency key> <due_ms> <started_ms>" (due 0 for a recurring job: the
load generator knows each run's due time)."""

from __future__ import annotations

import os
import time

from pysched.targets import RunContext


def append(ctx: RunContext) -> None:
    started = time.time_ns() // 1_000_000
    line = f"{ctx.idempotency_key} {ctx.payload.get('due_ms', 0)} {started}\n".encode()
    # O_APPEND writes of one short line are atomic across processes.
    fd = os.open(ctx.payload["ledger"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
