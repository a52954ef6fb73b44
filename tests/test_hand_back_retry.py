"""A run rejected for a stale leader's fence is handed back: a second
schedule row, due a moment later, the first staying. The new leader reads
both rows as one run and hands it on; its attempt fails, with a retry due
within the leader's horizon. The retry's write deletes only the row the
failed delivery came from: the hand-back row is left, due before the
retry. The leader reads the two as one run at the retry's time, the row of
the latest delivery: the retry waits out its backoff."""

from __future__ import annotations

import random

from pysched import native
from pysched.leader.recording import record_sent
from pysched.model import Job
from pysched.registry import register
from pysched.targets import RunContext
from pysched.worker import Executor
from tests.test_worker_step import CONFIG, T0, World

_attempts: list[int] = []


def fails_first(ctx: RunContext) -> None:
    _attempts.append(ctx.attempt)
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails")


def _job(job_id: str) -> Job:
    return Job.model_validate(
        {
            "id": job_id,
            "schedule": {"kind": "once", "run_at_ms": T0 + 1_000},
            "target": {"kind": "python", "ref": f"{__name__}:fails_first"},
            "retry": {"retries": 3, "backoff_base_s": 40, "backoff_cap_s": 40},
        }
    )


def test_a_retry_is_not_handed_on_before_its_backoff_by_a_hand_back_row_left_behind() -> None:
    _attempts.clear()
    w = World()
    # Its retry delays drawn from a generator of its own: the same each time.
    w.executor = Executor(w.node.claims, w.node.store, w.clock, "node-1", CONFIG, random.Random(3))
    w.worker.consumer.close()
    w.worker = w.new_worker()
    now = w.clock.now_ms()
    register(w.leader.store, _job("job"), now)
    fences = w.leader.coordinator.poll("leader", now)
    (row,) = w.leader.store.due_runs(fences, now + 60_000, now)
    record_sent(w.leader.store, [row], fences, {}, now)
    p = row.partition
    old = fences[p]
    w.leader.dispatcher.publish([p], [native.encode_batch([row], old, now)[0]])
    # A new leader takes the partition: the old one's record is stale, and
    # is handed back.
    new = old + 1
    w.node.claims.raise_fence(p, new)
    w.node.store.raise_fence(p, new)
    w.advance_to(row.due_ms)
    assert w.step()
    assert w.executor.counts["fenced"] == 1
    assert len([r for r in w.cluster.schedule.schedule_rows(p) if r.run_id == row.run_id]) == 2
    # The new leader hands the run on, and moves its watermark through now.
    now = w.clock.now_ms()
    (again,) = w.leader.store.due_runs({p: new}, now + 60_000, now)
    assert again.attempt == 2
    record_sent(w.leader.store, [again], {p: new}, {p: now}, now)
    w.leader.dispatcher.publish([p], [native.encode_batch([again], new, now)[0]])
    assert w.step()
    assert _attempts == [1]
    (run,) = w.leader.store.history("job")
    assert run.state == "retrying"
    retry_due = run.due_ms
    # The retry's write tells the leader, which reads the partition again
    # and hands on what is due: nothing of this run before its retry time.
    now = w.clock.now_ms()
    owed = w.leader.store.due_runs({p: new}, now + 60_000, now)
    due_now = [r for r in owed if r.due_ms <= now + 1_000]
    if due_now:
        w.advance_to(max(r.due_ms for r in due_now))
        now = w.clock.now_ms()
        record_sent(w.leader.store, due_now, {p: new}, {}, now)
        w.leader.dispatcher.publish([p] * len(due_now), native.encode_batch(due_now, new, now))
        w.step()
    assert now < retry_due
    assert _attempts == [1], f"attempt 2 ran {retry_due - now} ms before its retry was due ({owed})"
