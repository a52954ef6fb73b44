"""The embedded leader hands a dead worker's run on again when the run's
lease runs out, not at its next periodic read (up to 30 s later): the real
leader on the SQLite engine, on a simulated clock."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from pysched import native
from pysched.clock import ManualClock
from pysched.leader import LeaderConfig, PartitionLeader, RunDispatched, SyncDriver
from pysched.leader.recording import record_sent
from pysched.model import Job
from pysched.node import EmbeddedBackends, open_embedded
from pysched.protocols import ClaimOutcome
from pysched.records import DispatchRecord
from pysched.registry import register
from pysched.targets import RunContext
from pysched.worker import Executor, WorkerConfig

T0 = 1_700_000_040_000
LEASE_MS = 5_000


def test_a_dead_workers_run_is_handed_on_again_when_its_lease_runs_out(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    backends = open_embedded(tmp_path / "pysched.db", partitions=4, clock=clock)
    job = Job.model_validate(
        {
            "id": "long",
            "schedule": {"kind": "once", "run_at_ms": T0 + 1_000},
            "target": {"kind": "shell", "command": "true"},
        }
    )
    register(backends.store, job, T0)
    fired: list[RunDispatched] = []
    leader = PartitionLeader(
        backends.store, backends.coordinator, backends.dispatcher, clock, "leader", LeaderConfig(), fired.append
    )
    driver = SyncDriver(leader)

    def run_until(end_ms: int) -> None:
        while (now := clock.now_ms()) < end_ms:
            driver.round(now)
            clock.advance(10)

    run_until(T0 + 1_500)
    assert [e.attempt for e in fired] == [1]
    # A worker takes the run, starts it, and dies: nothing renews its lease.
    delivery = backends.dispatcher.take(0)
    assert delivery is not None
    record = native.decode(delivery.payload)
    started = clock.now_ms()
    backends.claims.claim(record, "worker/1", started, LEASE_MS)
    assert backends.store.run_started(record, "worker", started) == 1
    run_until(started + 20_000)
    # Handed on again as its next delivery once the lease ran out: within
    # the leader's lease check (1 s) of it, though the next periodic read is
    # 30 s after the last; and once only.
    assert [e.attempt for e in fired] == [1, 2]
    assert started + LEASE_MS < fired[1].dispatched_at_ms <= started + LEASE_MS + 1_010
    # Taken over, it is the same attempt: the dead worker's ended none.
    redelivered = backends.dispatcher.take(0)
    assert redelivered is not None
    again = native.decode(redelivered.payload)
    assert again.attempt == 2
    claim = backends.claims.claim(again, "worker/2", clock.now_ms(), LEASE_MS)
    assert claim.outcome is ClaimOutcome.TAKEN_OVER
    assert backends.store.run_started(again, "worker", clock.now_ms()) == 1
    backends.close()


def one_shot_led(tmp_path: Path, job_id: str) -> tuple[EmbeddedBackends, dict[int, int]]:
    """A database with one one-shot due at T0 + 1 s, and a leader's fences."""
    backends = open_embedded(tmp_path / "pysched.db", partitions=4, lease_ttl_ms=1_000)
    job = Job.model_validate(
        {
            "id": job_id,
            "schedule": {"kind": "once", "run_at_ms": T0 + 1_000},
            "target": {"kind": "shell", "command": "true"},
        }
    )
    register(backends.store, job, T0)
    fences = backends.coordinator.poll("leader", T0)
    assert fences
    return backends, fences


def test_a_run_handed_on_again_is_not_owed_again_until_its_new_delivery_dies_or_the_fence_moves(
    tmp_path: Path,
) -> None:
    backends, fences = one_shot_led(tmp_path, "long")
    store = backends.store

    def owed(at_ms: int, under: dict[int, int]) -> list[int]:
        return [row.attempt for row in store.due_runs(under, at_ms + 60_000, at_ms)]

    def hand_on(at_ms: int, under: dict[int, int]) -> DispatchRecord:
        rows = store.due_runs(under, at_ms + 60_000, at_ms)
        record_sent(store, rows, under, {}, at_ms)
        return native.decode(native.encode_batch(rows, under[rows[0].partition], at_ms)[0])

    first = hand_on(T0 + 1_000, fences)
    started = T0 + 1_100
    backends.claims.claim(first, "worker/1", started, LEASE_MS)
    assert store.run_started(first, "worker", started) == 1
    assert owed(started + LEASE_MS - 1, fences) == []  # its worker may be alive
    # Its worker died: owed again once the lease ran out, as the next delivery.
    expired = started + LEASE_MS + 1
    assert owed(expired, fences) == [2]
    second = hand_on(expired, fences)
    # That delivery waits in this leader's queue: a read meanwhile owes nothing.
    assert owed(expired + 20_000, fences) == []
    # Taken over and dead again: owed again once the new lease ran out.
    taken = expired + 100
    assert backends.claims.claim(second, "worker/2", taken, LEASE_MS).outcome is ClaimOutcome.TAKEN_OVER
    assert store.run_started(second, "worker", taken) == 1
    assert owed(taken + LEASE_MS - 1, fences) == []
    assert owed(taken + LEASE_MS + 1, fences) == [3]
    hand_on(taken + LEASE_MS + 1, fences)
    assert owed(taken + LEASE_MS + 2_000, fences) == []
    # A newer leader's queue does not hold that delivery: owed to it.
    newer = backends.coordinator.poll("newer", taken + LEASE_MS + 5_000)
    assert newer and all(newer[p] > fences[p] for p in fences)
    assert owed(taken + LEASE_MS + 5_000, newer) == [4]
    backends.close()


def test_a_run_started_before_its_hand_on_was_recorded_is_owed_after_a_restart(tmp_path: Path) -> None:
    # The worker's start can land before the leader records the hand-on
    # (recording is off the tick thread); the node then dies unrecorded.
    backends, fences = one_shot_led(tmp_path, "early")
    store = backends.store
    rows = store.due_runs(fences, T0 + 60_000, T0 + 1_000)
    record = native.decode(native.encode_batch(rows, fences[rows[0].partition], T0 + 1_000)[0])
    started = T0 + 1_100
    backends.claims.claim(record, "worker/1", started, LEASE_MS)
    assert store.run_started(record, "worker", started) == 1
    # Restarted past the worker's lease, under a newer fence: owed again.
    later = started + LEASE_MS + 1_000
    newer = backends.coordinator.poll("restarted", later)
    assert newer and all(newer[p] > fences[p] for p in fences)
    assert [row.attempt for row in store.due_runs(newer, later + 60_000, later)] == [2]
    # Under the same fence too: nothing says a delivery is waiting for it.
    assert [row.attempt for row in store.due_runs(fences, later + 60_000, later)] == [2]
    backends.close()


# What the target below was called for, and what it does while it runs.
_calls: list[int] = []
_while_running: list[Callable[[], None]] = []


def fails_when_stopped(ctx: RunContext) -> None:
    _calls.append(ctx.attempt)
    while _while_running:
        _while_running.pop(0)()
    if ctx.cancelled.is_set():
        raise RuntimeError("stopped: ctx.cancelled was set")


def test_a_failure_recorded_after_the_lease_ran_out_refuses_the_delivery_handed_on_meanwhile(tmp_path: Path) -> None:
    # The worker's heartbeats failed for a lease and it stopped its run;
    # meanwhile the leader found the lease run out and handed the run on
    # again, a delivery nobody has claimed yet. The target then fails:
    # nobody took the claim over, so the failure is recorded, with its
    # retry 40 s on. The delivery handed on before it must not take the
    # failed claim over and run the retry at once, ahead of its backoff.
    _calls.clear()
    clock = ManualClock(T0)
    backends = open_embedded(tmp_path / "pysched.db", partitions=4, clock=clock)
    store = backends.store
    job = Job.model_validate(
        {
            "id": "fails",
            "schedule": {"kind": "once", "run_at_ms": T0 + 1_000},
            "target": {"kind": "python", "ref": f"{__name__}:fails_when_stopped"},
            "retry": {"retries": 3, "backoff_base_s": 40, "backoff_cap_s": 40},
        }
    )
    register(store, job, T0)
    fences = backends.coordinator.poll("leader", T0)
    (row,) = store.due_runs(fences, T0 + 60_000, T0)
    record_sent(store, [row], fences, {}, T0)
    record = native.decode(native.encode_batch([row], fences[row.partition], T0)[0])
    executor = Executor(backends.claims, store, clock, "w1", WorkerConfig(lease_ms=LEASE_MS), random.Random(3))
    execution = executor.new_execution(record)
    handed_on: list[DispatchRecord] = []

    def lease_runs_out_and_the_run_is_handed_on_again() -> None:
        clock.advance(LEASE_MS + 1_000)
        now = clock.now_ms()
        again = store.due_runs(fences, now + 60_000, now)
        record_sent(store, again, fences, {}, now)
        handed_on.extend(native.decode(p) for p in native.encode_batch(again, fences[row.partition], now))
        executor.stop(execution, "its lease ran out: not renewed", lease_lost=True)

    _while_running.append(lease_runs_out_and_the_run_is_handed_on_again)
    assert executor.attempt([execution]) == [ClaimOutcome.CLAIMED]
    run = store.get_run("fails", record.run_at_ms)
    assert (run.state, [f.attempt for f in run.failures]) == ("retrying", [1])
    (late,) = handed_on
    assert late.attempt == 2
    other = Executor(backends.claims, store, clock, "w2", WorkerConfig(lease_ms=LEASE_MS), random.Random(5))
    assert other.attempt([other.new_execution(late)]) == [ClaimOutcome.FAILED]
    assert _calls == [1]
    # Its retry, when due, is a delivery after that one, and runs.
    clock.advance(run.due_ms - clock.now_ms())
    now = clock.now_ms()
    (retry,) = store.due_runs(fences, now + 60_000, now)
    assert retry.attempt > late.attempt
    record_sent(store, [retry], fences, {}, now)
    retried = native.decode(native.encode_batch([retry], fences[row.partition], now)[0])
    assert other.attempt([other.new_execution(retried)]) == [ClaimOutcome.TAKEN_OVER]
    assert _calls == [1, 2]
    backends.close()
