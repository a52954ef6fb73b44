"""Two example workflows for a `--temporal` target.

``Greeting`` calls one activity and returns its text; ``AlwaysFails`` ends
in a failure, to see a run fail and be retried. A workflow fails (rather
than retrying its task forever) by raising ``ApplicationError``; its
``type`` names the failure, and ``--retry-on exception:TYPE`` matches it.

The workflow id is the run's idempotency key (``workflow.info().workflow_id``,
``JOB:RUN_AT_MS:ATTEMPT_GROUP``): the same for every attempt of a run.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow
from temporalio.exceptions import ApplicationError

TASK_QUEUE = "pysched-examples"


@activity.defn
async def compose_greeting(name: str) -> str:
    return f"Hello, {name}!"


@workflow.defn
class Greeting:
    @workflow.run
    async def run(self, name: str = "world") -> str:
        return await workflow.execute_activity(compose_greeting, name, start_to_close_timeout=timedelta(seconds=30))


@workflow.defn
class AlwaysFails:
    @workflow.run
    async def run(self, reason: str = "it always does") -> None:
        raise ApplicationError(reason, type="ExampleFailure", non_retryable=True)


WORKFLOWS = [Greeting, AlwaysFails]
ACTIVITIES = [compose_greeting]
