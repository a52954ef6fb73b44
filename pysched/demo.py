"""Demo jobs for `pysched up --demo`: visible within seconds of starting."""

from __future__ import annotations

import logging

from pysched.model import Job
from pysched.protocols import JobExists, ScheduleStore
from pysched.registry import register
from pysched.targets import RunContext

log = logging.getLogger("pysched.demo")


def hello(ctx: RunContext) -> dict[str, object]:
    """A Python target: it receives the run's identity."""
    return {"hello": ctx.job_id, "run_at": ctx.run_at.isoformat(), "key": ctx.idempotency_key}


def register_demo_jobs(store: ScheduleStore, now_ms: int) -> None:
    jobs = [
        Job.model_validate(
            {
                "id": "demo-every-5s",
                "schedule": {"kind": "cron", "expr": "*/5 * * * * *"},
                "target": {"kind": "shell", "command": 'echo "tick at $(date +%T), key $PYSCHED_IDEMPOTENCY_KEY"'},
                "jitter_window_s": 0,
            }
        ),
        Job.model_validate(
            {
                "id": "demo-python-10s",
                "schedule": {"kind": "cron", "expr": "*/10 * * * * *"},
                "target": {"kind": "python", "ref": "pysched.demo:hello"},
                "jitter_window_s": 0,
            }
        ),
        Job.model_validate(
            {
                "id": "demo-once",
                "schedule": {"kind": "once", "run_at_ms": now_ms + 3_000},
                "target": {"kind": "shell", "command": "echo one-shot fired"},
            }
        ),
    ]
    for job in jobs:
        try:
            register(store, job, now_ms)
            log.info("registered demo job %s", job.id)
        except JobExists:
            pass
