"""Workflows and activities the Temporal tests' worker runs beside the
examples', each counting its effects by workflow id in this process (the
activities run outside the workflow sandbox, in the test's own process)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from examples.temporal_workflows import compose_greeting

# Workflow id -> times its effect ran.
GREETINGS: Counter[str] = Counter()
FLAKY_CALLS: Counter[str] = Counter()


@activity.defn(name="compose_greeting")
async def counted_greeting(name: str) -> str:
    """The example's activity, counted: the workflow's one effect."""
    GREETINGS[activity.info().workflow_id] += 1
    return await compose_greeting(name)


@activity.defn
async def fail_the_first_time() -> str:
    """Fails on the first execution of its workflow id, succeeds after: a
    downstream that recovers by the run's retry."""
    workflow_id = activity.info().workflow_id
    FLAKY_CALLS[workflow_id] += 1
    if FLAKY_CALLS[workflow_id] == 1:
        raise ApplicationError("not yet", type="NotYet", non_retryable=True)
    return "recovered"


@workflow.defn
class FailsFirstTime:
    @workflow.run
    async def run(self) -> str:
        try:
            return await workflow.execute_activity(
                fail_the_first_time,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        except Exception as exc:
            # The activity's failure, as the workflow's own.
            raise ApplicationError("the downstream failed", type="NotYet") from exc
