"""Catch-up policies: the pure rules, and a worker meeting a late run (the
memory engine on a manual clock: nothing here sleeps or reads real time)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pysched import native
from pysched.catchup import Replay, count_missed, late_reason, next_run, replay
from pysched.clock import ManualClock
from pysched.leader.recording import record_sent
from pysched.memory import open_memory
from pysched.model import Job
from pysched.protocols import MissedRuns, PlannedRun
from pysched.registry import register
from pysched.targets import RunContext
from pysched.worker import DeliveryWorker, Executor, WorkerConfig
from tests.helpers import cli

T0 = 1_700_000_040_000  # a minute boundary
MINUTE = 60_000
_started: list[str] = []


def started(ctx: RunContext) -> None:
    _started.append(ctx.idempotency_key)


def job(schedule: dict[str, object], policy: str = "run_once", max_delay_s: float | None = None) -> Job:
    spec: dict[str, object] = {
        "id": f"j-{policy}",
        "schedule": schedule,
        "target": {"kind": "python", "ref": f"{__name__}:started"},
        "jitter_window_s": 0,
        "catch_up": policy,
    }
    if max_delay_s is not None:
        spec["max_delay_s"] = max_delay_s
    return Job.model_validate(spec)


MINUTELY = {"kind": "cron", "expr": "* * * * *"}


@pytest.mark.parametrize(
    ("policy", "late_ms", "reason"),
    [
        ("run_once", 3_600_000, None),
        ("run_all", 3_600_000, None),
        ("skip", 60_000, None),  # within the default max delay of 60 s
        ("skip", 60_001, "skipped"),
        ("deadline", 60_001, "past_deadline"),
    ],
)
def test_a_late_run_runs_unless_its_policy_says_otherwise(policy: str, late_ms: int, reason: str | None) -> None:
    assert late_reason(job(MINUTELY, policy), T0, T0 + late_ms) == reason


def test_max_delay_sets_how_late_is_too_late() -> None:
    lenient = job(MINUTELY, "deadline", max_delay_s=600)
    assert late_reason(lenient, T0, T0 + 600_000) is None
    assert late_reason(lenient, T0, T0 + 600_001) == "past_deadline"


def test_on_time_nothing_is_passed_over() -> None:
    for policy in ("run_once", "skip", "run_all", "deadline"):
        planned, missed = next_run(job(MINUTELY, policy), 0, T0, T0 + 5)
        assert planned is not None and planned.run_at_ms == T0 + MINUTE
        assert missed is None


def test_a_span_is_counted_by_the_schedule_and_estimated_past_ten_thousand_times() -> None:
    minutely = job(MINUTELY)
    assert count_missed(minutely, MissedRuns(minutely.id, T0 + MINUTE, T0 + 11 * MINUTE, "skipped")) == 10
    # Thirty days of a minutely job: counted to 10,000, the rest at that pace.
    month = MissedRuns(minutely.id, T0, T0 + 30 * 1_440 * MINUTE, "skipped")
    assert count_missed(minutely, month) == 30 * 1_440
    weekdays = job({"kind": "cron", "expr": "0 9 * * 1-5"})
    # 2023-11-14 (a Tuesday) 22:34 UTC to two weeks later: ten weekdays at nine.
    assert count_missed(weekdays, MissedRuns(weekdays.id, T0, T0 + 14 * 1_440 * MINUTE, "skipped")) == 10


def _deliver_late(policy: str) -> tuple[str, list[str], list[str]]:
    """A one-shot due at T0 + 1 s, handed on to a worker five minutes late:
    its key, the states of its runs, and the targets started."""
    _started.clear()
    clock = ManualClock(T0)
    cluster = open_memory(4, clock, dispatcher_partitions=1)
    node = cluster.node()
    one_shot = job({"kind": "once", "run_at_ms": T0 + 1_000}, policy)
    register(node.store, one_shot, T0)
    clock.advance(5 * MINUTE)
    now = clock.now_ms()
    fences = node.coordinator.poll("leader", now)
    (row,) = node.store.due_runs(fences, now + MINUTE, now)
    record_sent(node.store, [row], fences, {}, now)
    payload = native.encode_batch([row], fences[row.partition], now)[0]
    node.dispatcher.publish([row.partition], [payload])
    executor = Executor(node.claims, node.store, clock, "node-1", WorkerConfig())
    worker = DeliveryWorker(node.dispatcher.consumer(), executor, random.Random(1))
    assert worker.step(now)
    key = native.decode(payload).idempotency_key
    return key, [r.state for r in node.store.history(one_shot.id)], list(_started)


def test_a_worker_skips_a_run_too_late_for_its_policy_and_counts_it() -> None:
    _, states, ran = _deliver_late("skip")
    assert (states, ran) == (["missed"], [])


def test_a_worker_runs_a_late_run_whose_policy_runs_it() -> None:
    key, states, ran = _deliver_late("run_once")
    assert (states, ran) == (["succeeded"], [key])


@pytest.mark.parametrize(
    ("policy", "runs", "missed", "reason"),
    [
        ("run_once", 1, 119, "skipped"),
        ("skip", 0, 120, "skipped"),
        ("run_all", 120, 0, None),
        ("deadline", 10, 110, "past_deadline"),
    ],
)
def test_the_dry_run_tells_what_a_leader_back_after_two_hours_replays(
    policy: str, runs: int, missed: int, reason: str | None
) -> None:
    # 120 times overdue, the first at T0, just before T0 + 2 h: the last ten
    # are within a deadline of 10 min.
    overdue = PlannedRun(T0, T0)
    now = T0 + 120 * MINUTE - 1
    plan = replay(job(MINUTELY, policy, 600 if policy == "deadline" else None), 0, overdue, now)
    assert (plan.runs, plan.missed, plan.reason if plan.missed else None) == (runs, missed, reason)


def test_the_dry_run_of_a_late_one_shot_follows_its_policy() -> None:
    overdue = PlannedRun(T0, T0)
    once = {"kind": "once", "run_at_ms": T0}
    assert replay(job(once, "skip"), 0, overdue, T0 + MINUTE + 1) == Replay(0, 1, "skipped")
    assert replay(job(once, "run_once"), 0, overdue, T0 + 60 * MINUTE) == Replay(1, 0, None)


def test_catch_up_without_dry_run_is_refused(tmp_path: Path) -> None:
    proc = cli("catch-up", db=tmp_path / "x.db", check=False)
    assert proc.returncode == 2 and "--dry-run" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.db").exists()
