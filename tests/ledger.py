"""A Python target for tests: appends the run's idempotency key to a ledger
file named in the job's payload. The ledger, not pysched's own records, is
what the exactly-once tests count."""

from __future__ import annotations

import os

from pysched.targets import RunContext


def append(ctx: RunContext) -> None:
    line = f"{ctx.idempotency_key}\n".encode()
    # O_APPEND writes of one short line are atomic across processes.
    fd = os.open(ctx.payload["ledger"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
