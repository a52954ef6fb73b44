"""A simulated cluster: nodes running the real leader and worker steps on
the in-memory backends, one virtual clock, faults from a seeded plan.

Everything happens on one thread, in an order drawn from the seed: the same
seed replays the same world."""

from __future__ import annotations

import functools
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from pysched.breakers import BreakerPolicy
from pysched.clock import ManualClock
from pysched.leader import LeaderConfig, PartitionLeader, SyncDriver
from pysched.leader.driver import ROUND, Part
from pysched.memory import open_memory
from pysched.memory.dispatcher import MemoryConsumer
from pysched.records import DispatchRecord
from pysched.sim.batches import BatchingConsumer
from pysched.sim.calls import FiberCalls, NodeFibers
from pysched.sim.changes import JobChanges
from pysched.sim.cluster_tables import TableServers
from pysched.sim.faults import FaultEvent, FaultPlan, NodeFaults
from pysched.sim.ledger import Ledger
from pysched.sim.servers import ModelServers, NodeClients, SimServers, StoreKind
from pysched.worker.calls import Capacity
from pysched.worker.config import WorkerConfig
from pysched.worker.executor import Executor
from pysched.worker.step import DeliveryWorker

# The node faults a named outage sets (NodeFaults), all nodes at once.
OutageFlag = Literal["recording_down", "history_down"]

# Deliveries one worker may take in one round: enough that the workers keep
# up with a top-of-the-hour burst within a few rounds.
_DELIVERIES_PER_ROUND = 200


# Every job of a world calls one downstream (the simulator's target module),
# and a flaky world fails a third of their first attempts on purpose: a
# production budget would rightly dead-letter most of those retries, and a
# breaker open for 30 s would make every run late. The world's downstream is
# sized so that both are exercised on every run (breaker reads and writes,
# counts, budget decisions) while the runs stay owed once and on time: its
# budget is unbounded, and its breaker opens only after 1,000 failures in a
# row.
WORKER_CONFIG = WorkerConfig(breaker=BreakerPolicy(failure_threshold=1_000, budget_floor=1_000_000))

# A world whose downstream goes down gets the production breaker and budget
# instead (breakers.BreakerPolicy: open after 5 failures in a row for 30 s,
# then one probe; retries within 20% of first attempts plus 600 a minute):
# that world exists to see them open, park and resume.
OUTAGE_WORKER_CONFIG = WorkerConfig(breaker=BreakerPolicy())


# A node's workers with --target-time, each taking batches, and the runs it
# may have under way at once: a catch-up world's hundred minutely jobs keep
# some ten places taken, a few of them for minutes; the rest are there so
# that a run rarely waits for a place, and its lateness is the run path's.
TIMED_CONCURRENCY = 8


class NodeClock:
    """A node's view of the world's clock, off by its skew. Nodes never move
    time: the world does."""

    def __init__(self, world: ManualClock, skew_ms: int) -> None:
        self._world = world
        self.skew_ms = skew_ms

    def now_ms(self) -> int:
        return self._world.now_ms() + self.skew_ms

    def sleep(self, seconds: float) -> None:
        pass


@dataclass(eq=False)
class TimedWorker:
    """One of the workers of a node whose targets take time, on a fiber of
    its own; ``stop_asked``: its consumer dropped out of the group, which
    it learns between its steps, as a worker thread does at its next poll."""

    consumer: BatchingConsumer
    worker: DeliveryWorker
    stop_asked: bool = False
    replacing: bool = False
    # The broker's state (records appended, group generation) when its
    # consumer last had nothing to give: unchanged, it still has nothing.
    seen: tuple[int, int] | None = None


@dataclass
class SimNode:
    """One `pysched up` process: a leader and a worker, and what is done to
    it. A crash and restart makes a new process (a new holder).

    ``target_time``: its targets take time (their payloads say how long) and
    it runs as a node's pool does: ``concurrency`` workers, each taking
    batches of deliveries, within the node's capacity, each on a fiber
    (calls.py); otherwise one worker, one delivery at a time, each target
    called and returned within its step."""

    index: int
    cluster: SimServers
    clock: NodeClock
    seed: float  # its generators' seed, drawn from the world's
    faults: NodeFaults
    worker_config: WorkerConfig = WORKER_CONFIG
    leader_config: LeaderConfig = field(default_factory=LeaderConfig)
    target_time: bool = False
    incarnation: int = 0
    alive: bool = True
    paused_until_ms: int = 0
    rng: random.Random = field(init=False)
    clients: NodeClients = field(init=False)
    consumer: MemoryConsumer = field(init=False)
    leader: PartitionLeader = field(init=False)
    driver: SyncDriver = field(init=False)
    executor: Executor = field(init=False)
    worker: DeliveryWorker = field(init=False)
    # What the executors of its earlier incarnations counted (parked,
    # retried, dead_lettered, ...).
    past_counts: Counter[str] = field(default_factory=Counter)
    # Its process's fibers and workers, with target_time.
    fibers: NodeFibers | None = None
    timed: list[TimedWorker] = field(default_factory=list)
    _next_heartbeat_ms: int = 0
    _replace_consumer: bool = False
    _eviction_due: bool = False

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.start()

    @property
    def holder(self) -> str:
        return f"node-{self.index}.{self.incarnation}"

    def start(self) -> None:
        self.alive = True
        self._replace_consumer = False
        self.clients = self.cluster.node(self.faults, self.clock, self.holder)
        self.leader = PartitionLeader(
            self.clients.store,
            self.clients.coordinator,
            self.clients.dispatcher,
            self.clock,
            self.holder,
            self.leader_config,
        )
        self.driver = SyncDriver(self.leader)
        # Its retries' backoffs drawn from the seed too, each process its own.
        retry_rng = random.Random(f"{self.seed}/{self.incarnation}")
        if self.target_time:
            self._start_timed(retry_rng)
            return
        self.executor = Executor(
            self.clients.claims, self.clients.store, self.clock, self.holder, self.worker_config, retry_rng
        )
        self.consumer = self.clients.dispatcher.consumer()
        self.worker = DeliveryWorker(self.consumer, self.executor, self.rng)

    def _start_timed(self, retry_rng: random.Random) -> None:
        self.fibers = NodeFibers(self.holder)
        config = self.worker_config
        self.executor = Executor(
            self.clients.claims,
            self.clients.store,
            self.clock,
            self.holder,
            config,
            retry_rng,
            calls=FiberCalls(self.fibers),
            capacity=Capacity(config.concurrency),
        )
        self.timed = []
        for _ in range(config.concurrency):
            worker = self._timed_worker()
            self.timed.append(worker)
            self.fibers.add_worker(functools.partial(self._work, worker))

    def _timed_worker(self) -> TimedWorker:
        consumer = BatchingConsumer(self.clients.dispatcher.consumer())
        worker = DeliveryWorker(consumer, self.executor, self.rng, self.worker_config.batch)
        return TimedWorker(consumer, worker)

    def _work(self, timed: TimedWorker) -> None:
        """A worker's fiber: its steps of each round, then wait for the next."""
        fibers = self.fibers
        assert fibers is not None
        fiber = fibers.workers[self.timed.index(timed)]
        while True:
            if timed.stop_asked:
                timed.stop_asked = False
                timed.replacing = True
                timed.worker.stop()
            if timed.replacing and timed.worker.finished:
                timed.replacing = False
                fresh = self._timed_worker()
                timed.consumer, timed.worker = fresh.consumer, fresh.worker
            for _ in range(_DELIVERIES_PER_ROUND):
                # A step that took a batch may have waited rounds for its
                # calls: its consumer may have dropped out meanwhile.
                if timed.stop_asked or not timed.worker.step(self.clock.now_ms()):
                    break
            fiber.suspend(ready=functools.partial(self._may_step, timed))

    def _crashed_consumer_expired(self, world_now: int) -> bool:
        """Whether a crashed consumer's session has run out: the group
        rebalances at the next read, and may give any consumer partitions."""
        broker = self.cluster.broker
        group = broker.groups.get(self.clients.dispatcher.group)
        timeout = broker.session_timeout_ms
        return group is not None and any(
            m.crashed_at_ms is not None and world_now >= m.crashed_at_ms + timeout for m in group.members.values()
        )

    def _may_step(self, timed: TimedWorker) -> bool:
        """Whether a worker's step would do anything now: its consumer
        dropped out, a delivery it holds is due again, or its consumer may
        give one (and its node has a place to run it)."""
        if timed.stop_asked or timed.replacing:
            return True
        retry_at = timed.worker.retry_at_ms
        if retry_at is not None:
            return self.clock.now_ms() >= retry_at
        broker = self.cluster.broker
        group = broker.groups.get(self.clients.dispatcher.group)
        seen = (broker.appended, 0 if group is None else group.generation)
        if seen == timed.seen and not self._eviction_due:
            return False
        if timed.consumer.may_deliver():
            return True
        timed.seen = seen
        return False

    def crash(self) -> None:
        """Gone without a word: its lease and its consumer's session run out."""
        self.alive = False
        if self.target_time:
            for timed in self.timed:
                timed.consumer.crash()
            return
        self.consumer.crash()

    def restart(self) -> None:
        self.past_counts += self.executor.counts
        self.incarnation += 1
        self.start()

    def counts(self) -> Counter[str]:
        """What its executors counted, over every incarnation."""
        return self.past_counts + self.executor.counts

    def lose_consumer(self) -> None:
        """The worker's consumer drops out of the group (a session timeout, a
        broker restart): its partitions move, and what it took and did not
        commit goes to another consumer. The worker takes nothing more from
        it, finishes what it holds (its acknowledgement is refused), and then
        gets a new consumer."""
        if self.target_time:
            for timed in self.timed:
                timed.consumer.crash()
                timed.stop_asked = True
            return
        self.consumer.crash()
        self.worker.stop()
        self._replace_consumer = True

    def round(self, world_now: int, order: list[Part]) -> None:
        if not self.alive or world_now < self.paused_until_ms:
            return
        now = self.clock.now_ms()
        self.driver.round(now, order)
        if self.fibers is not None:
            self._eviction_due = self._crashed_consumer_expired(world_now)
            self.fibers.resume_calls(world_now)
            self.fibers.resume_workers()
        elif self._replace_consumer and self.worker.finished:
            self._replace_consumer = False
            self.consumer = self.clients.dispatcher.consumer()
            self.worker = DeliveryWorker(self.consumer, self.executor, self.rng)
        if self.fibers is None:
            for _ in range(_DELIVERIES_PER_ROUND):
                if not self.worker.step(self.clock.now_ms()):
                    break
        if now >= self._next_heartbeat_ms:
            self._next_heartbeat_ms = now + self.executor.config.heartbeat_ms
            self.executor.heartbeat_step(now)  # a failure is logged, and tried at the next


class World:
    """The cluster's servers, its nodes, the world clock and the fault plan."""

    def __init__(
        self,
        rng: random.Random,
        nodes: int,
        partitions: int,
        start_ms: int,
        plan: FaultPlan,
        worker_config: WorkerConfig = WORKER_CONFIG,
        leader_config: LeaderConfig | None = None,
        recording_outage_ms: tuple[int, int] | None = None,
        history_outage_ms: tuple[int, int] | None = None,
        target_time: bool = False,
        store: StoreKind = "model",
    ) -> None:
        self.rng = rng
        self.clock = ManualClock(start_ms)
        # With target_time, a dispatch partition for each worker, as a
        # cluster's Kafka topic has (16) for its nodes' workers (4 each):
        # the group gives each worker's consumer its own.
        dispatch_partitions = nodes * worker_config.concurrency if target_time else 2
        self.cluster: SimServers
        if store == "tables":
            self.cluster = TableServers(partitions, self.clock, dispatch_partitions)
        else:
            self.cluster = ModelServers(open_memory(partitions, self.clock, dispatch_partitions))
        self.plan = plan
        self.nodes = [
            SimNode(
                i,
                self.cluster,
                NodeClock(self.clock, plan.skews_ms[i]),
                rng.random(),
                NodeFaults(random.Random(rng.random())),
                worker_config,
                leader_config or LeaderConfig(),
                target_time,
            )
            for i in range(nodes)
        ]
        self._pending = list(plan.events)  # not yet begun, by time
        self._active: list[FaultEvent] = []  # begun, not yet over
        self.faults_begun = 0
        self.blacked_out = False
        # [down, up): the leaders cannot record what they send.
        self.recording_outage_ms = recording_outage_ms
        # [down, up): the workers cannot record how their runs ended.
        self.history_outage_ms = history_outage_ms
        # The downstream (its calls take time with target_time), told of the
        # effects a node's death leaves unrecorded; and how the calls in
        # flight when their node dies end (attach).
        self.ledger: Ledger | None = None
        self._crash_rng = random.Random()
        # The fibers of the node processes that died, ended with the world.
        self._dead_fibers: list[NodeFibers] = []
        # With --changes: what the workload does to its jobs (attach_changes).
        self.changes: JobChanges | None = None

    def attach_changes(self, changes: JobChanges) -> None:
        """The workload's changes, each at its time or, for one racing a
        recording, between a leader's read of its plans and its write."""
        self.changes = changes
        for node in self.nodes:
            node.faults.between_plan_and_write = changes.between_plan_and_write

    def attach(self, ledger: Ledger, crash_rng: random.Random) -> None:
        """The downstream; ``crash_rng``: whether a call in flight (its
        calls taking time) took effect before its node died, a generator of
        its own so that the world's other draws stay as they were."""
        self.ledger = ledger
        self._crash_rng = crash_rng

    def round(self) -> None:
        """Land the calls that end now; begin and end the faults due now,
        then one round of every live node, in an order drawn from the seed,
        each node's parts in an order drawn too."""
        now = self.clock.now_ms()
        self.cluster.round(now)
        if self.ledger is not None:
            self.ledger.land(now)
        self._blackout(now)
        self._named_outage(now, self.recording_outage_ms, "recording_down")
        self._named_outage(now, self.history_outage_ms, "history_down")
        self._faults(now)
        if self.changes is not None:
            self.changes.round(now)
        nodes = list(self.nodes)
        self.rng.shuffle(nodes)
        for node in nodes:
            order = list(ROUND)
            self.rng.shuffle(order)
            node.round(now, order)

    def idle_until(self) -> int | None:
        """While the whole cluster is down, when it comes back: no round
        before then can do anything, and the world may skip to it."""
        return self.plan.blackout_ms[1] if self.blacked_out and self.plan.blackout_ms is not None else None

    def _blackout(self, now: int) -> None:
        """The cluster's outage: every node gone at once without a word,
        each started again as a new process when it ends."""
        if self.plan.blackout_ms is None:
            return
        down, up = self.plan.blackout_ms
        if not self.blacked_out and down <= now < up:
            self.blacked_out = True
            self.faults_begun += 1
            for node in self.nodes:
                self._crash(node)
        elif self.blacked_out and now >= up:
            self.blacked_out = False
            for node in self.nodes:
                node.restart()

    def _crash(self, node: SimNode) -> None:
        """The node's process dies: its calls in flight never return, and
        the ends it could not record are never recorded."""
        node.crash()
        if self.ledger is not None:
            self._orphan_unrecorded(node, self.ledger)
        if node.fibers is not None:
            if self.ledger is not None:
                self.ledger.abandon(node.fibers, self._crash_rng)
            self._dead_fibers.append(node.fibers)

    def _orphan_unrecorded(self, node: SimNode, ledger: Ledger) -> None:
        """The runs the dying process ran to their effect and failed to
        record: nothing durable says they ran (the claim still running under
        it, the history not saying succeeded), and their next delivery takes
        the claim over once its lease dies and runs them again, as it must
        (the run's worker died; see the executor's ``_record``). Only a
        write refused counts: an end the process had not yet tried to write
        is the executor's to answer for."""
        for execution in node.executor.ends_unrecorded():
            end = execution.ended
            called = execution.started_at_ms is not None and end is not None and end.state == "succeeded"
            key = execution.record.idempotency_key
            if not (called and execution.end_refused and self.cluster.running_holder(key) == execution.holder):
                continue
            if not self._recorded_succeeded(execution.record):
                ledger.orphan(key)

    def _recorded_succeeded(self, record: DispatchRecord) -> bool:
        return self.cluster.run_state(record.job_id, record.run_at_ms, record.attempt_group) == "succeeded"

    def close(self) -> None:
        """End the threads of every fiber, the world being over."""
        for fibers in [*self._dead_fibers, *(n.fibers for n in self.nodes if n.fibers is not None)]:
            fibers.kill()
        self.cluster.close()

    def _named_outage(self, now: int, window: tuple[int, int] | None, flag: OutageFlag) -> None:
        """Set ``flag`` on every node's faults while ``now`` is in
        ``window`` ([down, up)), counting the outage once as it begins."""
        if window is None:
            return
        down = window[0] <= now < window[1]
        if down and not getattr(self.nodes[0].faults, flag):
            self.faults_begun += 1
        for node in self.nodes:
            setattr(node.faults, flag, down)

    def _faults(self, now: int) -> None:
        while self._pending and self._pending[0].at_ms <= now:
            event = self._pending.pop(0)
            self.faults_begun += 1
            node = self.nodes[event.node]
            if event.kind == "crash":
                self._crash(node)
            elif event.kind == "pause":
                node.paused_until_ms = now + event.duration_ms
            elif event.kind == "rebalance":
                node.lose_consumer()
            elif event.kind == "redis":
                self.cluster.lose_fast_path(now, self.plan.quiet_from_ms)
            else:
                node.faults.start(event)
            self._active.append(event)
        for event in [e for e in self._active if e.at_ms + e.duration_ms <= now]:
            self._active.remove(event)
            node = self.nodes[event.node]
            if event.kind == "crash":
                node.restart()
            elif event.kind not in ("pause", "rebalance", "redis"):
                node.faults.stop(event)
