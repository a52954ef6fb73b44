"""A simulated cluster: nodes running the real leader and worker steps on
the in-memory backends, one virtual clock, faults from a seeded plan.

Everything happens on one thread, in an order drawn from the seed: the same
seed replays the same world."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from pysched.breakers import BreakerPolicy
from pysched.clock import ManualClock
from pysched.leader import LeaderConfig, PartitionLeader, SyncDriver
from pysched.leader.driver import ROUND, Part
from pysched.memory import MemoryCluster, MemoryNode, open_memory
from pysched.memory.dispatcher import MemoryConsumer
from pysched.sim.faults import FaultEvent, FaultPlan, NodeFaults
from pysched.worker.config import WorkerConfig
from pysched.worker.executor import Executor
from pysched.worker.step import DeliveryWorker

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


@dataclass
class SimNode:
    """One `pysched up` process: a leader and a worker, and what is done to
    it. A crash and restart makes a new process (a new holder)."""

    index: int
    cluster: MemoryCluster
    clock: NodeClock
    seed: float  # its generators' seed, drawn from the world's
    faults: NodeFaults
    worker_config: WorkerConfig = WORKER_CONFIG
    leader_config: LeaderConfig = field(default_factory=LeaderConfig)
    incarnation: int = 0
    alive: bool = True
    paused_until_ms: int = 0
    rng: random.Random = field(init=False)
    clients: MemoryNode = field(init=False)
    consumer: MemoryConsumer = field(init=False)
    leader: PartitionLeader = field(init=False)
    driver: SyncDriver = field(init=False)
    executor: Executor = field(init=False)
    worker: DeliveryWorker = field(init=False)
    # What the executors of its earlier incarnations counted (parked,
    # retried, dead_lettered, ...).
    past_counts: Counter[str] = field(default_factory=Counter)
    _next_heartbeat_ms: int = 0
    _replace_consumer: bool = False

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.start()

    @property
    def holder(self) -> str:
        return f"node-{self.index}.{self.incarnation}"

    def start(self) -> None:
        self.alive = True
        self._replace_consumer = False
        self.clients = self.cluster.node(self.faults)
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
        self.executor = Executor(
            self.clients.claims, self.clients.store, self.clock, self.holder, self.worker_config, retry_rng
        )
        self.consumer = self.clients.dispatcher.consumer()
        self.worker = DeliveryWorker(self.consumer, self.executor, self.rng)

    def crash(self) -> None:
        """Gone without a word: its lease and its consumer's session run out."""
        self.alive = False
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
        self.consumer.crash()
        self.worker.stop()
        self._replace_consumer = True

    def round(self, world_now: int, order: list[Part]) -> None:
        if not self.alive or world_now < self.paused_until_ms:
            return
        now = self.clock.now_ms()
        self.driver.round(now, order)
        if self._replace_consumer and self.worker.finished:
            self._replace_consumer = False
            self.consumer = self.clients.dispatcher.consumer()
            self.worker = DeliveryWorker(self.consumer, self.executor, self.rng)
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
    ) -> None:
        self.rng = rng
        self.clock = ManualClock(start_ms)
        self.cluster = open_memory(partitions, self.clock)
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

    def round(self) -> None:
        """Begin and end the faults due now, then one round of every live
        node, in an order drawn from the seed, each node's parts in an order
        drawn too."""
        now = self.clock.now_ms()
        self._blackout(now)
        self._recording_outage(now)
        self._history_outage(now)
        self._faults(now)
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
                node.crash()
        elif self.blacked_out and now >= up:
            self.blacked_out = False
            for node in self.nodes:
                node.restart()

    def _recording_outage(self, now: int) -> None:
        if self.recording_outage_ms is None:
            return
        down, up = self.recording_outage_ms
        if down <= now < up:
            if not self.nodes[0].faults.recording_down:
                self.faults_begun += 1
            for node in self.nodes:
                node.faults.recording_down = True
        else:
            for node in self.nodes:
                node.faults.recording_down = False

    def _history_outage(self, now: int) -> None:
        if self.history_outage_ms is None:
            return
        down, up = self.history_outage_ms
        if down <= now < up:
            if not self.nodes[0].faults.history_down:
                self.faults_begun += 1
            for node in self.nodes:
                node.faults.history_down = True
        else:
            for node in self.nodes:
                node.faults.history_down = False

    def _faults(self, now: int) -> None:
        while self._pending and self._pending[0].at_ms <= now:
            event = self._pending.pop(0)
            self.faults_begun += 1
            node = self.nodes[event.node]
            if event.kind == "crash":
                node.crash()
            elif event.kind == "pause":
                node.paused_until_ms = now + event.duration_ms
            elif event.kind == "rebalance":
                node.lose_consumer()
            elif event.kind == "redis":
                self.cluster.claims.forget_fast_path()
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
