"""Several `pysched up` nodes and `pysched worker` processes on the real
servers: exactly-once execution, failover after kill -9, fencing after
SIGSTOP, and durability across a Cassandra restart.

Each test counts executions in a ledger the job itself appends to. Every
process is started by the test and stopped by its PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pysched.config import ClusterConfig
from pysched.node import open_cluster
from tests.conftest import SERVICES_STATE, cluster_config_for
from tests.helpers import PYSCHED, Cluster, now_ms, stop_node, wait_for, write_config

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent


def assert_exactly_once(keys: Counter[str], expected: set[str]) -> None:
    assert set(keys) == expected, f"{len(expected - set(keys))} runs lost"
    assert max(keys.values()) == 1, f"ran twice: {[k for k, v in keys.items() if v > 1][:5]}"


def wait_all_ran(cluster: Cluster, expected: set[str], timeout_s: float) -> Counter[str]:
    try:
        wait_for(lambda: set(cluster.ledger_keys()) >= expected, timeout_s, f"{len(expected)} runs in the ledger")
    except AssertionError:
        missing = sorted(expected - set(cluster.ledger_keys()))
        died = {name: proc.returncode for name, proc in cluster.procs.items() if proc.poll() is not None}
        raise AssertionError(
            f"{len(missing)} of {len(expected)} runs never ran (first: {missing[:5]}); processes ended: {died}"
        ) from None
    time.sleep(2)  # would a duplicate still arrive?
    return cluster.ledger_keys()


def test_three_nodes_two_workers_run_5000_runs_exactly_once(cluster: Cluster) -> None:
    for name in ("node-a", "node-b", "node-c"):
        cluster.node(name)
    for name in ("worker-1", "worker-2"):
        cluster.worker(name)
    wait_for(lambda: len(cluster.leaders()) == cluster.config.partitions, 60, "every partition to have a leader")
    first = now_ms() + 40_000
    t = time.monotonic()
    # A registration slower than the lead (a busy machine) only makes its
    # runs fire as they are stored: the check is that each runs once.
    expected = cluster.register_spread(5_000, first, 30_000)
    register_s = time.monotonic() - t
    keys = wait_all_ran(cluster, expected, 150)
    assert_exactly_once(keys, expected)
    holders = {lease.holder for lease in cluster.leaders().values()}
    assert len(holders) == 3  # the partitions are shared by all three nodes
    print(f"5000 runs: registered in {register_s:.1f} s, all executed once")


def test_kill_9_of_a_node_moves_its_partitions_and_loses_nothing(cluster: Cluster) -> None:
    nodes = cluster.three_nodes_two_workers()
    first = now_ms() + 10_000
    expected = cluster.register_spread(1_000, first, 30_000)
    time.sleep(max(0.0, (first + 8_000 - now_ms()) / 1000))
    victim = nodes["node-b"]
    before = cluster.leaders()
    victim_holder = next(lease.holder for lease in before.values() if f":{victim.pid}:" in lease.holder)
    orphaned = {p for p, lease in before.items() if lease.holder == victim_holder}
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(10)
    killed = time.monotonic()

    def taken_over() -> bool:
        now = cluster.leaders()
        return all(p in now and now[p].holder != victim_holder for p in orphaned)

    # How fast is a figure (printed), not a check: a busy machine is slower.
    wait_for(taken_over, 120, "the dead node's partitions to get new leaders")
    takeover_s = time.monotonic() - killed
    after = cluster.leaders()
    assert all(after[p].fence > before[p].fence for p in orphaned)
    keys = wait_all_ran(cluster, expected, 120)
    assert_exactly_once(keys, expected)
    print(f"kill -9: {len(orphaned)} partitions led again after {takeover_s:.1f} s")


def test_a_leader_paused_past_its_lease_is_fenced_off(cluster: Cluster) -> None:
    nodes = cluster.three_nodes_two_workers()
    first = now_ms() + 8_000
    expected = cluster.register_spread(1_000, first, 40_000)
    time.sleep(max(0.0, (first + 5_000 - now_ms()) / 1000))
    paused = nodes["node-c"]
    before = cluster.leaders()
    paused_holder = next(lease.holder for lease in before.values() if f":{paused.pid}:" in lease.holder)
    held = {p for p, lease in before.items() if lease.holder == paused_holder}
    log_before = len(cluster.log("node-c"))

    def taken_over() -> bool:
        now = cluster.leaders()
        return all(p in now and now[p].holder != paused_holder for p in held)

    os.kill(paused.pid, signal.SIGSTOP)
    try:
        # Past the 10 s lease: the others take its partitions with higher fences.
        time.sleep(cluster.config.lease_ttl_s + 6)
        wait_for(taken_over, 120, "the paused node's partitions to get new leaders")
        during = cluster.leaders()
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    assert all(during[p].fence > before[p].fence for p in held)
    keys = wait_all_ran(cluster, expected, 120)
    time.sleep(3)
    keys = cluster.ledger_keys()
    # The woken leader stops in one of two ways, both correct, and which one
    # depends on which of its threads runs first: it sees that its last
    # answer from etcd has expired and stops sending, or a send already
    # under way reaches a worker and meets the higher fence. Either is
    # logged; a woken leader that did neither would be running stale.
    woken = cluster.log("node-c")[log_before:]
    rejected = sum(cluster.log(w).count("rejected ") for w in ("worker-1", "worker-2"))
    stopped = woken.count("stopped leading") + woken.count("no longer leading partitions")
    assert rejected + stopped > 0, "the woken leader neither stopped nor met the fence"
    assert_exactly_once(keys, expected)
    print(f"SIGSTOP: woken leader stopped itself {stopped} times; {rejected} stale dispatches rejected by the fence")


def test_a_registration_survives_a_cassandra_restart(cluster: Cluster) -> None:
    from tests.helpers import cli_json

    db = cluster.tmp / "unused.db"  # --config wins over --db
    added = cli_json(
        "add", "survivor", "--cron", "0 3 * * *", "--shell", "true", "--config", str(cluster.config_path), db=db
    )
    assert added["state"] == "active"
    # The harshest restart: kill -9 (of the server this project started),
    # then start it again on the same data.
    pid = int(json.loads(SERVICES_STATE.read_text())["cassandra"]["pid"])
    os.kill(pid, signal.SIGKILL)
    t = time.monotonic()
    wait_for(
        lambda: not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text(),
        30,
        "cassandra to die",
    )
    subprocess.run([str(ROOT / "scripts" / "services"), "up", "cassandra"], check=True, timeout=300)
    restart_s = time.monotonic() - t
    shown = cli_json("show", "survivor", "--config", str(cluster.config_path), db=db)
    assert shown["schedule"]["expr"] == "0 3 * * *" and shown["next_run_at"] == added["next_run_at"]
    print(f"cassandra restart took {restart_s:.1f} s; the registration is intact")


@pytest.mark.parametrize("server", ["cassandra", "redis", "kafka", "etcd"])
def test_an_unreachable_server_is_named_at_start_up(
    services: dict[str, Any], keyspace: str, tmp_path: Path, server: str
) -> None:
    config = cluster_config_for(services, keyspace).model_dump()
    # A loopback port nothing listens on.
    config[server] = "redis://127.0.0.1:9/0" if server == "redis" else "127.0.0.1:9"
    path = write_config(tmp_path / "bad.toml", config)
    proc = subprocess.run(
        [*PYSCHED, "up", "--config", str(path)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode != 0
    assert f"{server} at " in proc.stderr and "127.0.0.1:9" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("server", ["redis", "kafka", "etcd"])
def test_a_failed_start_up_leaves_no_driver_thread_running(
    services: dict[str, Any], keyspace: str, server: str
) -> None:
    """Cassandra connects first; a server that fails after it used to leave
    the driver's threads running, and one printed a traceback at exit."""
    config = cluster_config_for(services, keyspace).model_dump()
    config[server] = "redis://127.0.0.1:9/0" if server == "redis" else "127.0.0.1:9"
    before = set(threading.enumerate())
    with pytest.raises(ConnectionError):
        open_cluster(ClusterConfig.model_validate(config))
    started = [t for t in threading.enumerate() if t not in before]
    for thread in started:
        thread.join(15)
    assert [t.name for t in started if t.is_alive()] == []


def _starts(cluster: Cluster, job_id: str) -> dict[int, int]:
    """When each run of ``job_id`` started, by its schedule time (loadgen's
    ledger: "<idempotency key> <due_ms> <started_ms>" a line)."""
    if not cluster.ledger.exists():
        return {}
    starts: dict[int, int] = {}
    for line in cluster.ledger.read_text().splitlines():
        key, _, started_ms = line.split()
        run_job, run_at_ms, _ = key.split(":")
        if run_job == job_id:
            starts[int(run_at_ms)] = int(started_ms)
    return starts


@dataclass(frozen=True)
class _Recorded:
    """What the store says of a job's minutes: when each run recorded was
    handed on, by its schedule time; the minutes recorded skipped."""

    sent: dict[int, int | None]
    skipped: set[int]


def _recorded(cluster: Cluster, job_id: str) -> _Recorded:
    backends = open_cluster(cluster.config, coordinator=False)
    try:
        runs = backends.store.history(job_id)
        spans = backends.store.missed_runs([job_id]).get(job_id, [])
    finally:
        backends.close()
    return _Recorded(
        {r.run_at_ms: r.dispatched_at_ms for r in runs},
        {t for span in spans if span.reason == "skipped" for t in range(span.first_ms, span.end_ms, 60_000)},
    )


def test_all_nodes_down_for_three_minutes_then_one_node_catches_up(cluster: Cluster) -> None:
    node = cluster.node("node-a")
    worker = cluster.worker("worker-1")
    wait_for(lambda: len(cluster.leaders()) == cluster.config.partitions, 60, "every partition to have a leader")
    first = now_ms() + 30_000
    expected = cluster.register_spread(200, first, 120_000)  # all due while nothing runs
    minutely = cluster.register_minutely(10)
    stop_node(node)
    stop_node(worker)
    stopped = now_ms()
    time.sleep(180)
    restarted = now_ms()
    cluster.node("node-b")
    cluster.worker("worker-2")
    keys = wait_all_ran(cluster, expected, 180)
    wait_for(
        lambda: all(any(t >= restarted for t in _starts(cluster, j)) for j in minutely),
        150,
        "every minutely job to fire on schedule after the restart",
    )
    keys = cluster.ledger_keys()
    assert_exactly_once(Counter({k: n for k, n in keys.items() if k in expected}), expected)
    assert max(keys.values()) == 1, f"ran twice: {[k for k, v in keys.items() if v > 1][:5]}"
    for job_id in minutely:
        # The minutes owed while nothing ran (three, or four when one fell
        # due as the node was stopping, before it was handed on) run once:
        # the first of them, handed on late at the restart; the rest are
        # recorded skipped, and the schedule resumes from now. Every minute
        # owed up to the restart ran or is recorded skipped, never both.
        starts = _starts(cluster, job_id)
        recorded = _recorded(cluster, job_id)
        seen = (job_id, stopped, restarted, sorted(starts.items()), sorted(recorded.sent.items()))
        caught_up = [t for t, sent in recorded.sent.items() if t < restarted and sent is not None and sent >= restarted]
        assert len(caught_up) == 1, seen
        first = min([*starts, *recorded.skipped])
        for t in range(first, restarted, 60_000):
            assert (t in starts) != (t in recorded.skipped), (t, *seen, sorted(recorded.skipped))
    print(
        f"all down for {(restarted - stopped) / 1000:.0f} s: 200 overdue one-shots ran once, 10 minutely jobs caught up"
    )
