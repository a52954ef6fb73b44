"""The Temporal workflow target, against the dev server of scripts/services
and a real Temporal worker in this process: a run starts one workflow under
its idempotency key, whatever delivers it twice, and ends as the workflow
does."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pysched.model import Job
from pysched.targets import Outcome, RunContext, run_target
from tests.helpers import cli, cli_json, start_node, stop_node, wait_for

T = TypeVar("T")


# -- the CLI: no server needed -------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--temporal", "Greeting"], "--task-queue: required with --temporal"),
        (["--temporal", "", "--task-queue", "q"], "--temporal: a workflow type name"),
        (["--temporal", "Greeting", "--task-queue", " q"], "--task-queue: a task queue name"),
        (["--temporal", "Greeting", "--task-queue", "q", "--shell", "true"], "give exactly one of"),
        (["--shell", "true", "--task-queue", "q"], "--task-queue: applies only to --temporal"),
        (["--shell", "true", "--temporal-args", "[]"], "--temporal-args: applies only to --temporal"),
        (["--temporal", "Greeting", "--task-queue", "q", "--temporal-args", "{"], "--temporal-args: not JSON"),
        (
            ["--temporal", "Greeting", "--task-queue", "q", "--temporal-args", '{"a": 1}'],
            "--temporal-args: a JSON array",
        ),
        (["--temporal", "Greeting", "--task-queue", "q", "--temporal-args", "[NaN]"], "--temporal-args: not JSON"),
        (["--temporal", "Greeting", "--task-queue", "q", "--temporal-namespace", "a b"], "--temporal-namespace:"),
        (["--temporal", "Greeting", "--task-queue", "q", "--timeout", "0"], "--timeout:"),
        (["--temporal", "Greeting", "--task-queue", "q", "--method", "GET"], "--method: applies only to --http"),
    ],
)
def test_bad_temporal_input_names_the_option_and_stores_nothing(db_path: Path, args: list[str], message: str) -> None:
    proc = cli("add", "wf", "--in", "60", *args, db=db_path, check=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not db_path.exists()


def test_a_temporal_job_is_shown_with_its_workflow(db_path: Path) -> None:
    cli("add", "wf", "--in", "60", "--temporal", "Greeting", "--task-queue", "q", "--temporal-args", '["x", 1]',
        db=db_path)  # fmt: skip
    target = cli_json("show", "wf", db=db_path)["target"]
    assert target == {
        "kind": "temporal",
        "workflow": "Greeting",
        "task_queue": "q",
        "args": ["x", 1],
        "namespace": "default",
        "timeout_s": None,
    }
    assert '"workflow": "Greeting"' in cli("show", "wf", db=db_path).stdout


def test_only_a_temporal_run_loads_the_sdk() -> None:
    code = "import sys, pysched.cli, pysched.node, pysched.targets, pysched.worker;print('temporalio' in sys.modules)"
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert ran.stdout.strip() == "False"


def test_an_unreachable_server_fails_the_run_as_connect() -> None:
    # A port nothing listens on: refused at once.
    out = run_target(_job("Greeting", "q"), _ctx(), temporal_address="127.0.0.1:1")
    assert not out.succeeded and out.kind == "connect", out


# -- against the dev server ----------------------------------------------------


@dataclass
class TemporalWorld:
    """A Temporal worker polling a task queue of this test module's own, on
    an event loop in a thread; ``call`` runs a coroutine there."""

    address: str
    task_queue: str
    loop: asyncio.AbstractEventLoop
    client: Any

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def executions(self, query: str) -> list[Any]:
        async def listed() -> list[Any]:
            return [w async for w in self.client.list_workflows(query)]

        return self.call(listed())


@pytest.fixture(scope="module")
def temporal(temporal_address: str) -> Iterator[TemporalWorld]:
    from temporalio.client import Client
    from temporalio.worker import Worker

    from examples.temporal_workflows import WORKFLOWS
    from tests.temporal_workflows import FailsFirstTime, counted_greeting, fail_the_first_time

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="temporal-test-worker", daemon=True)
    thread.start()
    task_queue = f"pysched-test-{uuid.uuid4().hex[:8]}"

    async def connect() -> tuple[Any, Any]:
        # The worker is made on the loop it runs on: it binds to it.
        client = await Client.connect(temporal_address)
        worker = Worker(
            client,
            task_queue=task_queue,
            workflows=[*WORKFLOWS, FailsFirstTime],
            activities=[counted_greeting, fail_the_first_time],
        )
        return client, worker

    client, worker = asyncio.run_coroutine_threadsafe(connect(), loop).result(30)
    running = asyncio.run_coroutine_threadsafe(worker.run(), loop)
    try:
        yield TemporalWorld(temporal_address, task_queue, loop, client)
    finally:
        asyncio.run_coroutine_threadsafe(worker.shutdown(), loop).result(30)
        running.result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def _job(workflow: str, task_queue: str, **target: Any) -> Job:
    return Job.model_validate(
        {
            "id": "wf",
            "schedule": {"kind": "once", "run_at_ms": 0},
            "target": {"kind": "temporal", "workflow": workflow, "task_queue": task_queue, **target},
        }
    )


def _ctx(key: str | None = None) -> RunContext:
    return RunContext("wf", 1, datetime.now(UTC), 1, 1, key or f"wf:{uuid.uuid4().int % 10**12}:0")


@pytest.mark.cluster
def test_a_duplicate_dispatch_starts_one_workflow(temporal: TemporalWorld) -> None:
    from tests.temporal_workflows import GREETINGS

    job = _job("Greeting", temporal.task_queue, args=["twice"], timeout_s=60)
    ctx = _ctx()
    outcomes: list[Outcome] = []
    # Two deliveries of one run at once (a redelivery while the first still
    # runs, as after a lost acknowledgement), then a third once it is over
    # (as after a worker died before recording the outcome).
    threads = [
        threading.Thread(target=lambda: outcomes.append(run_target(job, ctx, temporal_address=temporal.address)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    outcomes.append(run_target(job, ctx, temporal_address=temporal.address))

    assert [o.succeeded for o in outcomes] == [True, True, True], outcomes
    assert {o.result for o in outcomes} == {json.dumps("Hello, twice!")}
    assert GREETINGS[ctx.idempotency_key] == 1
    wait_for(lambda: len(temporal.executions(f'WorkflowId = "{ctx.idempotency_key}"')) >= 1, 30, "the workflow listed")
    executions = temporal.executions(f'WorkflowId = "{ctx.idempotency_key}"')
    assert len(executions) == 1, executions
    assert executions[0].status.name == "COMPLETED"


@pytest.mark.cluster
def test_a_failed_workflow_fails_the_run_as_an_exception_named_by_its_type(temporal: TemporalWorld) -> None:
    job = _job("AlwaysFails", temporal.task_queue, timeout_s=60)
    out = run_target(job, _ctx(), temporal_address=temporal.address)
    assert not out.succeeded
    assert out.kind == "exception"
    assert "ExampleFailure" in out.exception_names, out
    assert "it always does" in (out.error or "")


@pytest.mark.cluster
def test_a_retry_after_a_failed_workflow_starts_it_again_under_the_same_id(temporal: TemporalWorld) -> None:
    from tests.temporal_workflows import FLAKY_CALLS

    job = _job("FailsFirstTime", temporal.task_queue, timeout_s=60)
    ctx = _ctx()
    first = run_target(job, ctx, temporal_address=temporal.address)
    assert not first.succeeded and first.kind == "exception", first
    second = run_target(job, ctx, temporal_address=temporal.address)
    assert second.succeeded and second.result == json.dumps("recovered"), second
    # Completed now: a third delivery reads its result, and starts nothing.
    third = run_target(job, ctx, temporal_address=temporal.address)
    assert third.result == second.result
    assert FLAKY_CALLS[ctx.idempotency_key] == 2

    query = f'WorkflowId = "{ctx.idempotency_key}"'
    wait_for(lambda: len(temporal.executions(query)) >= 2, 30, "both executions listed")
    assert sorted(e.status.name for e in temporal.executions(query)) == ["COMPLETED", "FAILED"]


@pytest.mark.cluster
def test_a_workflow_past_its_timeout_fails_the_run_as_a_timeout(temporal: TemporalWorld) -> None:
    # No worker polls this queue: the workflow never gets going.
    job = _job("Greeting", f"{temporal.task_queue}-unpolled", timeout_s=0.5)
    out = run_target(job, _ctx(), temporal_address=temporal.address)
    assert not out.succeeded and out.kind == "timeout", out


@pytest.mark.cluster
@pytest.mark.slow
def test_a_node_runs_temporal_jobs_and_retries_a_failed_workflow(
    temporal: TemporalWorld, tmp_path: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through `pysched up`: a workflow's result is the run's; a workflow
    that fails is retried by the job's policy, as a new execution under the
    run's workflow id; one that fails for good is a dead letter."""
    queue = temporal.task_queue
    cli("add", "greet", "--in", "0", "--temporal", "Greeting", "--task-queue", queue, "--temporal-args", '["node"]',
        db=db_path)  # fmt: skip
    cli("add", "flaky", "--in", "0", "--temporal", "FailsFirstTime", "--task-queue", queue,
        "--retries", "2", "--backoff", "0.1:0.1", db=db_path)  # fmt: skip
    cli("add", "doomed", "--in", "0", "--temporal", "AlwaysFails", "--task-queue", queue,
        "--retries", "1", "--backoff", "0.1:0.1", db=db_path)  # fmt: skip
    log = tmp_path / "node.log"
    # The embedded engine's workers find the server here.
    monkeypatch.setenv("PYSCHED_TEMPORAL_ADDRESS", temporal.address)
    node = start_node(db_path, tmp_path, log, "--workers", "2")

    def last(job_id: str) -> dict[str, Any]:
        runs = cli_json("history", job_id, db=db_path)
        return runs[0] if runs else {}

    try:
        wait_for(lambda: last("greet").get("state") == "succeeded", 90, "greet succeeded", log)
        wait_for(lambda: last("flaky").get("state") == "succeeded", 90, "flaky succeeded on its retry", log)
        wait_for(lambda: bool(cli_json("dlq", "ls", db=db_path)), 90, "doomed dead-lettered", log)
    finally:
        stop_node(node)

    assert last("greet")["result"] == json.dumps("Hello, node!")
    assert last("flaky")["attempt"] == 2
    (dead,) = cli_json("dlq", "ls", db=db_path)
    assert [(f["attempt"], f["kind"]) for f in dead["failures"]] == [(1, "exception"), (2, "exception")]
    assert "ExampleFailure" in dead["failures"][-1]["error"]

    # Each run's workflows ran under its idempotency key: one for greet,
    # a failed and a completed one for flaky, two failed for doomed.
    def statuses(job_id: str) -> list[str]:
        found = temporal.executions(f'TaskQueue = "{queue}"')
        return sorted(e.status.name for e in found if e.id.startswith(f"{job_id}:"))

    wait_for(lambda: len(statuses("doomed")) >= 2, 30, "doomed's executions listed")
    assert statuses("greet") == ["COMPLETED"]
    assert statuses("flaky") == ["COMPLETED", "FAILED"]
    assert statuses("doomed") == ["FAILED", "FAILED"]
    assert len({e.id for e in temporal.executions(f'TaskQueue = "{queue}"') if e.id.startswith("flaky:")}) == 1
