"""Long runs on the memory engine and a manual clock: a run taken over from a
worker whose lease ran out resumes from its last checkpoint (same key, as
its next attempt: the one whose lease ran out is lost); the stale execution's checkpoint is refused and its
``ctx.cancelled`` set; a live worker's run keeps its lease however long it
runs; a run whose job is cancelled is stopped and recorded cancelled.
Nothing here sleeps or reads real time."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from pysched import native
from pysched.checkpoints import CheckpointRefused, CheckpointTooLarge
from pysched.clock import ManualClock
from pysched.leader.recording import record_sent
from pysched.memory import open_memory
from pysched.model import Job
from pysched.protocols import ClaimOutcome
from pysched.records import DispatchRecord
from pysched.registry import register
from pysched.targets import RunContext
from pysched.worker import Executor, WorkerConfig

T0 = 1_700_000_040_000
LEASE = 30_000
CONFIG = WorkerConfig(lease_ms=LEASE, heartbeat_ms=10_000, busy_wait_ms=5_000)

# What the target does at each start, in order; and the contexts it saw.
_script: list[Callable[[RunContext], None]] = []
_seen: list[RunContext] = []


def long_run(ctx: RunContext) -> None:
    _seen.append(ctx)
    _script.pop(0)(ctx)


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    _script.clear()
    _seen.clear()
    yield
    _script.clear()
    _seen.clear()


class World:
    def __init__(self) -> None:
        self.clock = ManualClock(T0)
        self.cluster = open_memory(4, self.clock, dispatcher_partitions=1)
        self.leader = self.cluster.node()
        self.nodes = [self.cluster.node(), self.cluster.node()]
        self.executors = [
            Executor(n.claims, n.store, self.clock, f"node-{i + 1}", CONFIG) for i, n in enumerate(self.nodes)
        ]

    def dispatch(self, job_id: str) -> DispatchRecord:
        now = self.clock.now_ms()
        store = self.leader.store
        register(
            store,
            Job.model_validate(
                {
                    "id": job_id,
                    "schedule": {"kind": "once", "run_at_ms": T0 + 1_000},
                    "target": {"kind": "python", "ref": f"{__name__}:long_run"},
                }
            ),
            now,
        )
        fences = self.leader.coordinator.poll("leader", now)
        rows = store.due_runs(fences, now + 60_000, now)
        record_sent(store, rows, fences, {}, now)
        (payload,) = native.encode_batch(rows, fences[rows[0].partition], now)
        self.leader.dispatcher.publish([rows[0].partition], [payload])
        return native.decode(payload)

    def advance(self, ms: int) -> int:
        self.clock.advance(ms)
        return self.clock.now_ms()

    def history(self, job_id: str) -> list[tuple[str, int]]:
        return [(r.state, r.attempt) for r in self.leader.store.history(job_id)]


def test_a_run_taken_over_after_its_lease_ran_out_resumes_from_its_last_checkpoint() -> None:
    w = World()
    rec = w.dispatch("long")
    first, second = w.executors
    refused: list[BaseException] = []

    def dies_after_two_checkpoints(ctx: RunContext) -> None:
        assert ctx.checkpoint_state is None  # a fresh run
        ctx.checkpoint({"done": 1})
        w.advance(5_000)
        ctx.checkpoint({"done": 2})
        # Its worker stops beating (dead, or paused): the lease runs out and
        # another worker takes the run over, finishing it.
        w.advance(LEASE + 1)
        execution = second.new_execution(rec)
        assert second.attempt([execution]) == [ClaimOutcome.TAKEN_OVER]
        # That attempt is recorded lost; its retry is owed at once.
        assert w.history("long") == [("retrying", rec.attempt)]
        # Back from the pause: its lease is gone, and it learns so.
        first.heartbeat_step(w.clock.now_ms())
        assert ctx.cancelled.is_set()
        try:
            ctx.checkpoint({"done": 3})
        except CheckpointRefused as exc:
            refused.append(exc)

    def resumes(ctx: RunContext) -> None:
        assert ctx.checkpoint_state == {"done": 2}
        assert not ctx.cancelled.is_set()
        ctx.checkpoint({"done": 5})

    _script.extend([dies_after_two_checkpoints, resumes])
    assert first.attempt([first.new_execution(rec)]) == [ClaimOutcome.CLAIMED]
    assert len(refused) == 1, "the stale execution's checkpoint was not refused"
    retry = rec._replace(attempt=rec.attempt + 1)
    assert second.attempt([second.new_execution(retry)]) == [ClaimOutcome.TAKEN_OVER]
    # Same logical run, same key, as its next attempt.
    assert [c.idempotency_key for c in _seen] == [rec.idempotency_key] * 2
    assert [c.attempt for c in _seen] == [rec.attempt, rec.attempt + 1]
    # The resumed execution's outcome stands; the stale one recorded nothing.
    assert w.history("long") == [("succeeded", rec.attempt + 1)]
    assert (first.counts["lease_lost"], second.counts["succeeded"], first.counts["succeeded"]) == (1, 1, 0)
    # Its last checkpoint is the resumed execution's, not the stale one's.
    assert w.nodes[0].claims.tables.claim_rows()[rec.idempotency_key].checkpoint == '{"done":5}'


def test_a_live_workers_run_keeps_its_lease_far_longer_than_the_ttl() -> None:
    w = World()
    rec = w.dispatch("five-minutes")
    first, second = w.executors

    def runs_five_minutes(ctx: RunContext) -> None:
        for beat in range(30):  # 30 beats of 10 s: ten TTLs
            now = w.advance(CONFIG.heartbeat_ms)
            assert first.heartbeat_step(now) == 1
            ctx.checkpoint({"beats": beat + 1})
            # Another worker given the run (a redelivery) must not take it.
            other = second.new_execution(rec)
            assert second.attempt([other]) == [ClaimOutcome.BUSY]
            second.end([other])
            assert not ctx.cancelled.is_set()

    _script.append(runs_five_minutes)
    assert first.attempt([first.new_execution(rec)]) == [ClaimOutcome.CLAIMED]
    assert len(_seen) == 1
    assert w.history("five-minutes") == [("succeeded", rec.attempt)]
    assert first.counts["lease_lost"] == 0


def test_a_run_whose_job_is_cancelled_is_stopped_and_recorded_cancelled() -> None:
    w = World()
    rec = w.dispatch("doomed")
    first = w.executors[0]

    def cancelled_midway(ctx: RunContext) -> None:
        w.leader.store.cancel_job("doomed", w.clock.now_ms())
        first.heartbeat_step(w.advance(CONFIG.heartbeat_ms))
        assert ctx.cancelled.is_set()

    _script.append(cancelled_midway)
    first.attempt([first.new_execution(rec)])
    (run,) = w.leader.store.history("doomed")
    assert run.state == "cancelled"
    assert run.error is not None and "job was cancelled" in run.error


def test_a_checkpoint_too_large_fails_in_the_job() -> None:
    w = World()
    rec = w.dispatch("big")
    first = w.executors[0]
    raised: list[BaseException] = []

    def too_big(ctx: RunContext) -> None:
        try:
            ctx.checkpoint({"blob": "x" * 70_000})
        except CheckpointTooLarge as exc:
            raised.append(exc)

    _script.append(too_big)
    first.attempt([first.new_execution(rec)])
    assert len(raised) == 1 and "65,536" in str(raised[0])
