"""The cluster twin of test_breakers_processes.py: a downstream that fails
every call, 2,000 runs against it, on real `pysched up` and two `pysched
worker` processes on the real servers. The breaker is one row in Cassandra
and the budget's counts are each process's own rows there: the attempts of
both workers together stay within the breaker and the budget, runs are
parked or dead-lettered and none is lost; when the downstream recovers, the
parked runs complete and `dlq redrive --all` completes the dead letters,
each effect once."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pysched.node import open_cluster
from pysched.registry import register_many
from tests.conftest import running_cluster
from tests.helpers import Cluster, cli, cli_json, now_ms, wait_for
from tests.http_downstream import Downstream, jobs_calling

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

RUNS = 2_000
PROCESSES = 2
THREADS = 2  # a process
THRESHOLD = 5
OPEN_S = 2.0
OUTAGE_S = 8.0
BUDGET_FLOOR = 3


def _run_states(cluster: Cluster) -> Counter[str]:
    """Every run's state, read from the runs table itself."""
    backends = open_cluster(cluster.config, coordinator=False)
    try:
        tables: Any = backends.store.tables  # type: ignore[attr-defined]
        rows = tables.execute(f"SELECT state FROM {cluster.config.keyspace}.runs", timeout=30)
        return Counter(row.state for row in rows)
    finally:
        backends.close()


def _cli_json(cluster: Cluster, *args: str) -> Any:
    return cli_json(*args, "--config", str(cluster.config_path), db=cluster.tmp / "unused.db")


@pytest.fixture
def breaker_cluster(services: dict[str, Any], keyspace: str, tmp_path: Path) -> Iterator[Cluster]:
    yield from running_cluster(
        services,
        keyspace,
        tmp_path,
        partitions=16,
        breaker_failures=THRESHOLD,
        breaker_open_s=OPEN_S,
        retry_budget_floor=BUDGET_FLOOR,
    )


def test_a_failing_downstream_is_held_to_the_budget_across_workers_and_every_run_completes_once(
    breaker_cluster: Cluster, downstream: Downstream
) -> None:
    cluster = breaker_cluster
    cluster.node("node")
    for k in range(PROCESSES):
        cluster.start(f"worker-{k}", "worker", "--workers", str(THREADS), "--quiet")
    wait_for(lambda: len(cluster.leaders()) == cluster.config.partitions, 60, "every partition to have a leader")
    due_ms = now_ms() + 15_000
    jobs = jobs_calling(downstream.url, RUNS, due_ms)
    backends = open_cluster(cluster.config, coordinator=False)
    try:
        assert register_many(backends.store, jobs, now_ms()) == []
    finally:
        backends.close()
    assert now_ms() < due_ms, "registration outlasted its lead: the runs were late before the test began"
    node_log = cluster.tmp / "node.log"

    # The outage.
    wait_for(lambda: _run_states(cluster)["parked"] > 0, 90, "runs parked behind the open breaker", node_log)
    outage_began = time.monotonic()
    (breaker,) = _cli_json(cluster, "breakers")
    assert breaker["downstream"] == f"http:{downstream.url.split('/')[2]}"
    assert breaker["state"] in ("open", "half-open")
    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - outage_began)))
    failed_calls = downstream.recover()
    outage_s = (now_ms() - due_ms) / 1000  # from the first call
    # Before the breaker opened: THRESHOLD failures, and a call in flight on
    # each other thread of both workers (a worker that has not yet re-read
    # the row learns of the opening when its own failure's write loses).
    # Then one probe per open period, across the cluster (a conditional
    # write). Retries are held to the budget (its floor set low here, first
    # attempts being few): each worker writes its grant before the next
    # decision, so only two decisions at the same instant can both take the
    # last one; a retry refused waits a window, making no call meanwhile.
    bound = THRESHOLD + PROCESSES * THREADS + BUDGET_FLOOR + (PROCESSES - 1) + int(outage_s / OPEN_S) + 2
    print(f"failed calls during the outage: {failed_calls} (bound {bound}, of {RUNS} runs, two workers)")
    assert failed_calls <= bound

    # Recovery: the probe closes the breaker, the parked runs complete.
    def settled() -> bool:
        states = _run_states(cluster)
        return set(states) <= {"succeeded", "failed"} and sum(states.values()) == RUNS

    wait_for(settled, 180, "every run to succeed or fail for good", node_log)
    dead_count = _run_states(cluster)["failed"]
    dead = _cli_json(cluster, "dlq", "ls", "--limit", str(RUNS))
    assert len(dead) == dead_count
    # A run the budget held back is retried later, never dead-lettered for it.
    assert not any("retry budget" in d["error"] for d in dead)
    cli("dlq", "redrive", "--all", "--config", str(cluster.config_path), db=cluster.tmp / "unused.db")
    wait_for(lambda: _run_states(cluster) == Counter({"succeeded": RUNS}), 120, "the redriven runs", node_log)
    assert _cli_json(cluster, "breakers")[0]["state"] == "closed"

    # None lost, each effect once: every run's key got exactly one 200.
    with downstream.lock:
        answers = dict(downstream.answers)
    assert len(answers) == RUNS
    assert Counter(statuses.count(200) for statuses in answers.values()) == Counter({1: RUNS})
    assert downstream.count(503) == failed_calls  # nothing failed after the recovery
