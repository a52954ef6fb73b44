"""Long runs on the cluster engine, with real `pysched up` and `pysched
worker` processes on the real servers: the cluster twins of
test_long_run_processes.py.

- A worker killed with SIGKILL mid-run: the run is delivered again, started
  on the other worker within 30 s of the death, resumes from its last
  checkpoint as its next attempt (the one on the dead worker is recorded
  lost) under the same idempotency key, and its effect is committed once.
- A run outlasting its lease many times on a live worker, delivered again
  meanwhile (another worker joins the consumer group and Kafka hands the
  uncommitted record out again): never started a second time.
- An idle worker gets runs while another worker's every thread runs a long
  job: the busy one still takes part in the group's rebalance.

The issue's numbers are a 30 s lease renewed every 10 s and runs of minutes;
here the workers run with ``--lease 2`` (heartbeats every 2/3 s) and the runs
take seconds. The jobs are in tests/cluster_jobs.py. Every process is
started by the test and stopped by its PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from pysched.model import Job
from pysched.node import open_cluster
from pysched.registry import register
from tests.cluster_jobs import COUNT_TO
from tests.helpers import Cluster, cli_json, now_ms, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# At the issue's own sizes, run by hand (PYSCHED_FULL_SCALE=1; about ten
# minutes): the default 30 s lease renewed every 10 s, a 2-minute counting
# job killed halfway, a 5-minute run on a live worker. CI runs them scaled
# down: a 2 s lease, a 10 s count, a run of seven leases.
FULL_SCALE = os.environ.get("PYSCHED_FULL_SCALE") == "1"
# The suite's 300 s a test is too short for the 5-minute run.
TEST_TIMEOUT_S = 900 if FULL_SCALE else 300
LEASE_S = 30 if FULL_SCALE else 2
STEP_S = 3.0 if FULL_SCALE else 0.25  # the count's step: COUNT_TO of them
LONG_RUN_S = 300 if FULL_SCALE else 7 * LEASE_S


def _worker(cluster: Cluster, name: str) -> subprocess.Popen[bytes]:
    # Two threads: one runs the long job, the other keeps consuming (and
    # answering the group's rebalances).
    return cluster.start(name, "worker", "--workers", "2", "--lease", str(LEASE_S))


def _add(cluster: Cluster, job_id: str, ref: str, payload: dict[str, Any]) -> None:
    cli_json(
        "add",
        job_id,
        "--in",
        "1",
        "--python",
        ref,
        "--payload",
        json.dumps(payload),
        "--config",
        str(cluster.config_path),
        db=cluster.tmp / "unused.db",  # --config wins over --db
    )


def _history(cluster: Cluster, job_id: str) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = cli_json(
        "history", job_id, "--config", str(cluster.config_path), db=cluster.tmp / "unused.db"
    )
    return runs


def _starts(out: Path) -> list[dict[str, Any]]:
    """Each execution's start, in the order they began."""
    starts = [json.loads(p.read_text()) for p in out.glob("started.*.json")]
    return sorted(starts, key=lambda s: float(s["at"]))


def _progress(out: Path) -> int:
    path = out / "progress"
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text else 0


def _logs(cluster: Cluster, *names: str) -> str:
    return "\n".join(f"--- {name} ---\n{cluster.log(name)[-4000:]}" for name in names)


def _wait_for_leaders(cluster: Cluster) -> None:
    wait_for(lambda: len(cluster.leaders()) == cluster.config.partitions, 60, "every partition to have a leader")


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_run_whose_worker_is_killed_resumes_from_its_checkpoint_on_the_other_worker(
    cluster: Cluster, tmp_path: Path
) -> None:
    out = tmp_path / "count"
    out.mkdir()
    cluster.node("node")
    workers = {"worker-1": _worker(cluster, "worker-1"), "worker-2": _worker(cluster, "worker-2")}
    _wait_for_leaders(cluster)
    _add(cluster, "count", "tests.cluster_jobs:count", {"dir": str(out), "step_s": STEP_S})
    wait_for(lambda: _progress(out) >= 4, 90, "the run to checkpoint a few steps", tmp_path / "node.log")
    (first,) = _starts(out)
    victim = next(name for name, proc in workers.items() if proc.pid == first["pid"])
    survivor = next(name for name in workers if name != victim)
    killed_at = time.time()
    os.kill(workers[victim].pid, signal.SIGKILL)
    workers[victim].wait(30)
    saved = _progress(out)
    assert saved < COUNT_TO, "the run ended before the kill: nothing to resume"

    # Waited for well past the 30 s, so that a late start is
    # reported with how late it was rather than as a time-out.
    wait_for(lambda: len(_starts(out)) >= 2, 120, "the run to start again", tmp_path / f"{survivor}.log")
    second = _starts(out)[1]
    # The bound, with no slack added: Kafka notices the death after
    # its 10 s session timeout and hands the partition on, and by then the
    # 2 s lease has run out, so the other worker takes the claim over at
    # once. It takes 8 to 10 s here, on a machine busy with other tests.
    redispatch_s = float(second["at"]) - killed_at
    assert redispatch_s <= 30, f"started again {redispatch_s:.1f} s after the death\n{_logs(cluster, survivor)}"
    assert second["pid"] == workers[survivor].pid

    effects = out / "effects"
    wait_for(
        lambda: effects.exists() and any(effects.iterdir()),
        90 + COUNT_TO * STEP_S,
        "the run's effect",
        tmp_path / f"{survivor}.log",
    )
    wait_for(
        lambda: [r["state"] for r in _history(cluster, "count")] == ["succeeded"],
        60,
        "the run to be recorded succeeded",
        tmp_path / f"{survivor}.log",
    )
    starts = _starts(out)
    assert len(starts) == 2, starts
    assert starts[0]["from"] == 0
    # Resumed from the last checkpoint saved: the one `progress` showed, or
    # the next, saved between the read of `progress` and the kill.
    assert saved <= starts[1]["from"] <= saved + 1, (saved, starts)
    assert saved > 0
    assert starts[1]["key"] == starts[0]["key"]
    # Its worker died: that attempt is lost, and the run resumed as the next.
    assert (starts[0]["attempt"], starts[1]["attempt"]) == (1, 2)
    (run,) = _history(cluster, "count")
    assert run["attempt"] == 2
    (effect,) = effects.iterdir()
    assert effect.name == starts[0]["key"].replace(":", "_")
    assert json.loads(effect.read_text()) == {"resumed_from": starts[1]["from"]}
    assert not list(out.glob("duplicate.*"))
    print(f"kill -9: started again on {survivor} {redispatch_s:.1f} s after the death, from step {starts[1]['from']}")


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_run_outlasting_its_lease_on_a_live_worker_is_never_started_again(cluster: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "outlast"
    out.mkdir()
    cluster.node("node")
    names = ["worker-1", "worker-2"]
    for name in names:
        _worker(cluster, name)
    _wait_for_leaders(cluster)
    # Seven leases at least, and then until the run was delivered again and
    # found running a few times (at most a minute: then the test fails).
    min_s = LONG_RUN_S
    payload = {"dir": str(out), "min_s": min_s, "max_s": min_s + 60, "step_s": STEP_S}
    _add(cluster, "outlast", "tests.cluster_jobs:outlast", payload)
    wait_for(lambda: len(_starts(out)) == 1, 90, "the run to start", tmp_path / "node.log")
    (start,) = _starts(out)
    # On Kafka, a record is delivered again only when its partition is
    # assigned anew: a third worker joining the group makes a rebalance, and
    # the run's record, not committed while it runs, goes out again. Only
    # the live lease keeps it from being run again then.
    names.append("worker-3")
    _worker(cluster, "worker-3")
    waiting = f"waiting on {start['key']}: it runs elsewhere under a live lease"

    def found_running() -> int:
        return sum(cluster.log(name).count(waiting) for name in names)

    # The one holding it looks again every lease: three looks span several
    # leases after the redelivery.
    wait_for(
        lambda: found_running() >= 3 or len(_starts(out)) > 1 or bool(list(out.glob("effects/*"))),
        max(60, 5 * LEASE_S),
        "the run to be delivered again while it runs",
    )
    assert len(_starts(out)) == 1, f"started again while it ran: {_starts(out)}\n{_logs(cluster, *names)}"
    assert found_running() >= 3, f"not delivered again while it ran\n{_logs(cluster, *names)}"
    (out / "may_end").touch()
    wait_for(lambda: bool(list(out.glob("effects/*"))), 90 + LONG_RUN_S, "the run to end")
    wait_for(
        lambda: [r["state"] for r in _history(cluster, "outlast")] == ["succeeded"],
        60,
        "the run to be recorded succeeded",
    )
    time.sleep(2 * LEASE_S)  # would a late second start still come?
    assert len(_starts(out)) == 1, _starts(out)
    assert not list(out.glob("cancelled.*")), "the run was stopped: its lease was lost"
    assert not list(out.glob("duplicate.*"))
    (effect,) = (out / "effects").iterdir()
    ran_s = float(json.loads(effect.read_text())["ran_s"])
    assert ran_s >= min_s
    (run,) = _history(cluster, "outlast")
    assert run["attempt"] == 1
    # Nothing stopped it: its lease was never lost (the worker logs why it
    # stops a run, "stopping outlast ...: its lease ...").
    logs = _logs(cluster, *names)
    assert "stopping outlast" not in logs, logs
    print(f"ran {ran_s:.1f} s on a {LEASE_S} s lease; found running {found_running()} times by a redelivery")


def _register_shorts(cluster: Cluster, out: Path, n: int, run_at_ms: int) -> None:
    """n one-shot runs of the short job, all due at ``run_at_ms``; spread
    by their ids over the schedule's partitions, so over Kafka's too."""
    backends = open_cluster(cluster.config, coordinator=False)
    try:
        for k in range(n):
            job = Job.model_validate(
                {
                    "id": f"short{k:02d}",
                    "schedule": {"kind": "once", "run_at_ms": run_at_ms},
                    "target": {"kind": "python", "ref": "tests.cluster_jobs:mark"},
                    "payload": {"dir": str(out)},
                }
            )
            register(backends.store, job, now_ms())
    finally:
        backends.close()


def test_an_idle_worker_gets_runs_while_another_worker_is_saturated_by_a_long_one(
    cluster: Cluster, tmp_path: Path
) -> None:
    long_out, short_out = tmp_path / "long", tmp_path / "short"
    long_out.mkdir()
    short_out.mkdir()
    cluster.node("node")
    # One thread: the long run takes all of this worker.
    cluster.start("busy", "worker", "--workers", "1", "--lease", str(LEASE_S))
    _wait_for_leaders(cluster)
    _add(cluster, "outlast", "tests.cluster_jobs:outlast", {"dir": str(long_out), "min_s": 1, "max_s": 120})
    try:
        wait_for(lambda: len(_starts(long_out)) == 1, 90, "the long run to start", tmp_path / "busy.log")
        cluster.start("idle", "worker", "--workers", "2", "--lease", str(LEASE_S))
        due_ms = now_ms() + 5_000
        _register_shorts(cluster, short_out, 16, due_ms)
        # With the topic's 8 partitions shared by the two workers, about half
        # of the 16 runs are the idle worker's: the first starts a second or
        # two after it is due. 30 s is the bound for a run to find a
        # live worker again after its own died.
        wait_for(
            lambda: len(_starts(short_out)) > 0,
            max(0.0, due_ms / 1000 - time.time()) + 30,
            "a short run to start while the long one runs",
            tmp_path / "idle.log",
        )
        assert not list(long_out.glob("effects/*")), "the long run ended first: nothing was shown"
    finally:
        (long_out / "may_end").touch()
    wait_for(lambda: len(_starts(short_out)) == 16, 90, "every short run to start")
