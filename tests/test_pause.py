"""Pause, resume and cancel reach runs already in a leader's wheel or its
catch-up lane: the real leader and worker on the memory engine, on a
simulated clock."""

from __future__ import annotations

from pathlib import Path

from pysched.catchup import count_missed
from pysched.clock import ManualClock
from pysched.memory import open_memory
from pysched.memory.store import MemoryScheduleStore
from pysched.model import Job
from pysched.registry import register, resume
from tests.helpers import cli, cli_json
from tests.test_catchup_outage import HOUR, MINUTE, T0, Process, minutely

ONCE = {"kind": "once", "run_at_ms": T0 + MINUTE}


def _one_job_world(job: Job) -> tuple[ManualClock, MemoryScheduleStore, Process]:
    """``job`` registered at T0 on the memory engine, and a node to step."""
    clock = ManualClock(T0)
    cluster = open_memory(4, clock, dispatcher_partitions=1)
    store = cluster.node().store
    register(store, job, T0)
    return clock, store, Process(cluster, clock, "node")


def _fired(process: Process, job_id: str) -> list[int]:
    return [e.run_at_ms for e in process.fired if e.job_id == job_id]


def test_a_paused_job_fires_nothing_and_on_resume_follows_its_policy() -> None:
    job = minutely("paused", "run_once")
    clock, store, node = _one_job_world(job)
    node.run_for(30_000)  # its first run (T0 + 1 min) is in the wheel now
    store.pause_job(job.id, clock.now_ms())
    node.run_for(5 * MINUTE)
    assert _fired(node, job.id) == []
    resume(store, job.id, clock.now_ms())  # at T0 + 5 min 30 s
    node.run_for(MINUTE)
    # run_once: the latest time already due runs once, at once; the next on time.
    assert _fired(node, job.id) == [T0 + 5 * MINUTE, T0 + 6 * MINUTE]
    (span,) = store.missed_runs([job.id])[job.id]
    assert (span.reason, count_missed(job, span)) == ("paused", 4)
    states = {r.run_at_ms: r.state for r in store.history(job.id)}
    assert states == {T0 + MINUTE: "missed", T0 + 5 * MINUTE: "succeeded", T0 + 6 * MINUTE: "succeeded"}


def test_a_job_resumed_before_its_held_run_is_due_fires_it_on_time() -> None:
    job = minutely("brief", "skip")
    clock, store, node = _one_job_world(job)
    node.run_for(20_000)
    store.pause_job(job.id, clock.now_ms())
    node.run_for(20_000)
    resume(store, job.id, clock.now_ms())
    node.run_for(30_000)
    assert [(e.run_at_ms, e.dispatched_at_ms - e.due_ms) for e in node.fired] == [(T0 + MINUTE, 0)]
    assert store.missed_runs([job.id]) == {}


def test_a_run_triggered_and_handed_on_before_a_pause_still_runs() -> None:
    # A pause holds the schedule's runs; a triggered one is no part of it,
    # wherever it is when the pause comes (the worker recorded it missed).
    job = minutely("poked", "skip")
    clock, store, node = _one_job_world(job)
    triggered = store.trigger(job.id, clock.now_ms())
    for _ in range(200):  # the leader alone: handed on, not yet claimed
        node.driver.round(clock.now_ms())
        clock.advance(10)
    assert _fired(node, job.id) == [triggered.run_at_ms]
    store.pause_job(job.id, clock.now_ms())
    node.run_for(20_000)
    runs = store.history(job.id)
    assert [(r.run_at_ms, r.attempt_group, r.state) for r in runs if r.state != "paused"] == [
        (triggered.run_at_ms, 1, "succeeded")
    ]


def test_a_cancelled_run_in_the_wheel_never_fires() -> None:
    job = minutely("cancelled", "run_once")
    clock, store, node = _one_job_world(job)
    node.run_for(59_000)  # due in a second, long in the wheel
    store.cancel_job(job.id, clock.now_ms())
    node.run_for(2 * MINUTE)
    assert _fired(node, job.id) == []


def test_a_run_waiting_in_the_catch_up_lane_leaves_it_when_its_job_is_cancelled() -> None:
    clock = ManualClock(T0)
    cluster = open_memory(4, clock, dispatcher_partitions=1)
    store = cluster.node().store
    # 200 one-shots due at once while nobody is up: back an hour later, they
    # wait in the lane, handed on at 10 a second, oldest (then by run id) first.
    for i in range(200):
        register(store, Job.model_validate({**minutely(f"o-{i}", "run_once").model_dump(), "schedule": ONCE}), T0)
    clock.advance(HOUR)
    node = Process(cluster, clock, "node", catch_up_rate=10)
    node.run_for(1_000)
    assert len(node.leader.lane) > 150
    last = max(node.leader.lane.waiting(), key=lambda row: (row.due_ms, row.run_id)).job_id
    store.cancel_job(last, clock.now_ms())
    node.run_for(30_000)
    assert len(node.fired) == 199
    assert last not in {e.job_id for e in node.fired}


def test_pause_and_resume_from_the_cli(db_path: Path) -> None:
    cli("add", "nightly", "--cron", "0 2 * * *", "--shell", "true", db=db_path)
    assert cli_json("pause", "nightly", db=db_path)["state"] == "paused"
    again = cli("pause", "nightly", db=db_path, check=False)
    assert (again.returncode, again.stderr.strip()) == (2, "error: job 'nightly' is paused, not active")
    shown = cli_json("show", "nightly", db=db_path)
    assert shown["state"] == "paused" and shown["next_run_at"] is not None  # the run it holds
    assert cli_json("resume", "nightly", db=db_path)["state"] == "active"
    assert cli("resume", "nightly", db=db_path, check=False).returncode == 2
    unknown = cli("pause", "nope", db=db_path, check=False)
    assert unknown.returncode == 3 and "Traceback" not in unknown.stderr
