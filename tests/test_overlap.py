"""The overlap policy at a worker: runs of a job firing every second, the
next one delivered while the one before is still inside its target (the
memory engine on a manual clock: nothing here sleeps or reads real time).
Two workers each have their own executor, as two nodes do."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from pysched import native
from pysched.clock import ManualClock
from pysched.leader.recording import record_sent
from pysched.memory import MemoryNode, open_memory
from pysched.model import Job
from pysched.overlap import SlotHold
from pysched.records import DispatchRecord
from pysched.registry import register
from pysched.shell import CommandResult, run_command, stop_commands
from pysched.targets import RunContext
from pysched.worker import DeliveryWorker, Executor, WorkerConfig

T0 = 1_700_000_040_000
SECOND = 1_000

# What the target did, in order: ("start" | "end" | "cancelled", run_at
# in seconds after T0), and what the next start does while it runs.
_log: list[tuple[str, int]] = []
_while_running: list[Callable[[RunContext], None]] = []


def target(ctx: RunContext) -> None:
    at = (int(ctx.run_at.timestamp() * 1000) - T0) // SECOND
    _log.append(("start", at))
    if _while_running:
        _while_running.pop(0)(ctx)
    _log.append(("cancelled" if ctx.cancelled.is_set() else "end", at))


@pytest.fixture(autouse=True)
def _nothing_ran_yet() -> Iterator[None]:
    _log.clear()
    _while_running.clear()
    yield
    _log.clear()
    _while_running.clear()


@dataclass
class World:
    clock: ManualClock
    node: MemoryNode
    fences: dict[int, int]
    workers: list[DeliveryWorker]
    executors: list[Executor]
    job: Job
    # (run id, attempt) of each delivery handed on: a leader skips its own.
    sent: set[tuple[int, int]] = field(default_factory=set)

    def hand_on(self) -> int:
        """Hand on every run due by now, as a leader does; how many."""
        now = self.clock.now_ms()
        due = self.node.store.due_runs(self.fences, now + 1, now)
        rows = [r for r in due if r.due_ms <= now and (r.run_id, r.attempt) not in self.sent]
        self.sent.update((r.run_id, r.attempt) for r in rows)
        record_sent(self.node.store, rows, self.fences, {}, now)
        for row in rows:
            payload = native.encode_batch([row], self.fences[row.partition], now)[0]
            self.node.dispatcher.publish([row.partition], [payload])
        return len(rows)

    def tick(self, worker: int) -> None:
        """One second on: the next run is handed on, and ``worker`` takes it."""
        self.clock.advance(SECOND)
        assert self.hand_on() == 1
        assert self.workers[worker].step(self.clock.now_ms())

    def states(self) -> dict[int, str]:
        return {(r.run_at_ms - T0) // SECOND: r.state for r in self.node.store.history(self.job.id)}


def world(policy: str, workers: int = 2) -> World:
    clock = ManualClock(T0)
    cluster = open_memory(4, clock, dispatcher_partitions=1)
    node = cluster.node()
    job = Job.model_validate(
        {
            "id": f"every-second-{policy}",
            "schedule": {"kind": "cron", "expr": "* * * * * *"},
            "target": {"kind": "python", "ref": f"{__name__}:target"},
            "jitter_window_s": 0,
            "overlap": policy,
        }
    )
    register(node.store, job, T0)
    fences = node.coordinator.poll("leader", T0)
    consumer = node.dispatcher.consumer()
    executors = [Executor(node.claims, node.store, clock, f"node-{i}", WorkerConfig()) for i in range(workers)]
    # The workers share one consumer: whichever steps takes the next run.
    return World(
        clock,
        node,
        fences,
        [DeliveryWorker(consumer, e, random.Random(i)) for i, e in enumerate(executors)],
        executors,
        job,
    )


def test_allow_runs_the_next_run_beside_the_one_still_running() -> None:
    w = world("allow")
    _while_running.append(lambda _: w.tick(1))
    w.tick(0)
    assert _log == [("start", 1), ("start", 2), ("end", 2), ("end", 1)]
    assert w.states() == {1: "succeeded", 2: "succeeded"}
    assert w.node.store.running_slot(w.job.id) is None  # allow takes no slot


def test_forbid_misses_the_run_due_while_the_previous_runs_and_counts_it() -> None:
    w = world("forbid")
    _while_running.append(lambda _: w.tick(1))
    w.tick(0)
    assert _log == [("start", 1), ("end", 1)]
    assert w.states() == {1: "succeeded", 2: "missed"}
    (missed,) = w.node.store.missed_runs([w.job.id])[w.job.id]
    assert (missed.reason, missed.first_ms) == ("overlap", T0 + 2 * SECOND)
    # Once it has ended, the next run runs.
    w.tick(1)
    assert w.states()[3] == "succeeded"


def test_replace_on_another_node_stops_the_running_run_at_its_next_heartbeat_then_starts() -> None:
    w = world("replace")

    def newer_run_then_heartbeat(ctx: RunContext) -> None:
        w.tick(1)  # node-1 takes run 2: it waits for run 1 to stop
        assert not ctx.cancelled.is_set()
        w.executors[0].heartbeat_step(w.clock.now_ms())
        assert ctx.cancelled.is_set()

    _while_running.append(newer_run_then_heartbeat)
    w.tick(0)
    assert w.states() == {1: "cancelled", 2: "parked"}
    # Run 1 let go of the slot as it ended: run 2 is due at once.
    assert w.hand_on() == 1
    assert w.workers[1].step(w.clock.now_ms())
    assert _log == [("start", 1), ("cancelled", 1), ("start", 2), ("end", 2)]
    assert w.states() == {1: "cancelled", 2: "succeeded"}
    replaced = w.node.store.get_run(w.job.id, T0 + SECOND)
    assert replaced.error is not None and replaced.error.startswith("replaced:")


def test_replace_on_the_same_node_stops_the_running_run_at_once_then_starts() -> None:
    w = world("replace")
    seen: list[bool] = []

    def newer_run(ctx: RunContext) -> None:
        w.tick(1)
        seen.append(ctx.cancelled.is_set())

    _while_running.append(newer_run)
    # Two workers of one node: one executor.
    w.workers[1].executor = w.executors[0]
    w.tick(0)
    assert seen == [True]  # cancelled as soon as the newer run came
    assert w.hand_on() == 1
    assert w.workers[1].step(w.clock.now_ms())
    assert _log == [("start", 1), ("cancelled", 1), ("start", 2), ("end", 2)]
    assert w.states() == {1: "cancelled", 2: "succeeded"}


def test_buffer_one_runs_one_waiting_run_when_the_previous_ends_and_misses_the_next() -> None:
    w = world("buffer_one")

    def two_more_runs(_: RunContext) -> None:
        w.tick(1)  # run 2 waits
        w.tick(1)  # run 3 finds run 2 waiting: missed

    _while_running.append(two_more_runs)
    w.tick(0)
    assert _log == [("start", 1), ("end", 1)]
    assert w.states() == {1: "succeeded", 2: "parked", 3: "missed"}
    assert w.executors[1].counts["waiting"] == 1
    # Run 1's end made run 2 due at once: the leader hands it on now.
    assert w.hand_on() == 1
    assert w.workers[1].step(w.clock.now_ms())
    assert _log[-2:] == [("start", 2), ("end", 2)]
    assert w.states() == {1: "succeeded", 2: "succeeded", 3: "missed"}
    (missed,) = w.node.store.missed_runs([w.job.id])[w.job.id]
    assert missed.reason == "overlap"


def test_a_waiting_run_whose_holder_died_runs_once_the_holders_lease_runs_out() -> None:
    w = world("buffer_one")
    slot_holder = w.node.store.take_slot
    # Run 1 holds the slot on a worker that then dies: nothing lets it go.
    w.clock.advance(SECOND)
    w.hand_on()
    consumer = w.workers[0].consumer
    delivery = consumer.next(0)
    assert delivery is not None
    dead = native.decode(delivery.payload)
    slot_holder(dead, "dead-node/1", "buffer_one", w.clock.now_ms(), WorkerConfig().lease_ms)
    w.tick(1)
    assert w.states()[2] == "parked"
    # Parked until the lease's end, when it is handed on again and runs.
    w.clock.advance(WorkerConfig().lease_ms)
    assert w.hand_on() >= 1
    while w.workers[1].step(w.clock.now_ms()):
        pass
    assert ("start", 2) in _log
    assert w.states()[2] == "succeeded"


def test_a_replaced_runs_shell_command_is_stopped_with_its_process_group() -> None:
    cancelled = threading.Event()
    ran: list[CommandResult] = []
    thread = threading.Thread(
        target=lambda: ran.append(run_command("sleep 30; echo done", {}, None, None, cancelled)), daemon=True
    )
    thread.start()
    # As the executor does: the run's event set, then its commands stopped
    # (a command not yet registered sees the event set, and is killed at once).
    cancelled.set()
    for _ in range(200):
        if stop_commands(cancelled, 5.0):
            break
        threading.Event().wait(0.05)
    thread.join(20)
    (result,) = ran
    assert result.returncode is not None and result.returncode < 0
    assert "done" not in result.stdout_tail


class _LetGoBeforeThePark:
    """The store as a worker sees it, with the replaced run letting go of
    the slot (on its own thread, in production) between the waiting run's
    decision and its park."""

    def __init__(self, store: Any, job_id: str) -> None:
        self._store = store
        self._job_id = job_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def run_parked(self, record: DispatchRecord, due_ms: int, reason: str, now_ms: int) -> None:
        self._store.release_slot(SlotHold(self._job_id, "the-replaced-run", "its-holder"), now_ms)
        self._store.run_parked(record, due_ms, reason, now_ms)


def test_a_replacing_run_parked_after_the_old_run_let_go_is_due_at_once() -> None:
    # Seen with `--overlap replace` on one node: the old run stopped within
    # milliseconds, found nothing parked to wake, and the new run waited
    # out the old run's lease (25-30 s), then ran out of order.
    w = world("replace")
    w.executors[1].store = _LetGoBeforeThePark(w.node.store, w.job.id)

    def newer_run_then_heartbeat(ctx: RunContext) -> None:
        w.tick(1)
        w.executors[0].heartbeat_step(w.clock.now_ms())

    _while_running.append(newer_run_then_heartbeat)
    w.tick(0)
    assert w.states() == {1: "cancelled", 2: "parked"}
    assert w.hand_on() == 1  # due now, not at the old run's lease end
    assert w.workers[1].step(w.clock.now_ms())
    assert w.states() == {1: "cancelled", 2: "succeeded"}


def test_a_run_waiting_for_the_previous_one_does_not_start_once_its_job_is_paused() -> None:
    # Seen from the CLI: a paused job's buffered and replacing runs still
    # started when their turn came.
    w = world("buffer_one")

    def next_run_waits_then_pause(_: RunContext) -> None:
        w.tick(1)  # run 2 waits
        w.node.store.pause_job(w.job.id, w.clock.now_ms())

    _while_running.append(next_run_waits_then_pause)
    w.tick(0)
    # Run 3, the next, is held out of the wheel by the pause.
    assert w.states() == {1: "succeeded", 2: "parked", 3: "paused"}
    assert w.hand_on() == 1  # run 1's end woke run 2
    assert w.workers[1].step(w.clock.now_ms())
    assert _log == [("start", 1), ("end", 1)]
    assert w.states() == {1: "succeeded", 2: "missed", 3: "paused"}
    assert w.node.store.get_run(w.job.id, T0 + 2 * SECOND).error == "missed: the job was paused"


def test_under_replace_a_run_due_while_one_waits_to_replace_is_missed_saying_so() -> None:
    w = world("replace")

    def two_newer_runs_then_heartbeat(ctx: RunContext) -> None:
        w.tick(1)  # run 2 waits to replace run 1
        w.tick(1)  # run 3: run 2 is already on its way
        w.executors[0].heartbeat_step(w.clock.now_ms())

    _while_running.append(two_newer_runs_then_heartbeat)
    w.tick(0)
    assert w.states() == {1: "cancelled", 2: "parked", 3: "missed"}
    missed = w.node.store.get_run(w.job.id, T0 + 3 * SECOND)
    assert missed.error is not None
    assert missed.error.startswith(f"missed: a newer run of {w.job.id} already waits to replace the running one")
