"""A Temporal worker for the example workflows:

    python -m examples.temporal_worker [--address 127.0.0.1:7233] [--task-queue pysched-examples]

The address defaults to PYSCHED_TEMPORAL_ADDRESS, as pysched's own does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os

from temporalio.client import Client
from temporalio.worker import Worker

from examples.temporal_workflows import ACTIVITIES, TASK_QUEUE, WORKFLOWS


async def serve(address: str, namespace: str, task_queue: str) -> None:
    client = await Client.connect(address, namespace=namespace)
    worker = Worker(client, task_queue=task_queue, workflows=WORKFLOWS, activities=ACTIVITIES)
    print(f"polling {task_queue!r} on {address} ({namespace}); Ctrl-C stops", flush=True)  # noqa: T201
    await worker.run()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.temporal_worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default=os.environ.get("PYSCHED_TEMPORAL_ADDRESS", "127.0.0.1:7233"))
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--task-queue", default=TASK_QUEUE)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.address, args.namespace, args.task_queue))


if __name__ == "__main__":
    main()
