"""One simulated world from its seed to its verdict."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from dataclasses import dataclass, field, replace

# The world's start and step, from the judge, which counts from them too.
__all__ = ["START_MS", "STEP_MS", "SimConfig", "SimReport", "simulate"]

from pysched.config import DEFAULT_CATCH_UP_RATE
from pysched.leader import LeaderConfig
from pysched.memory.store import MemoryScheduleStore
from pysched.registry import register_many
from pysched.sim.changes import JobChanges, plan_changes
from pysched.sim.faults import KINDS, Outage, plan_faults
from pysched.sim.invariants import FenceWatch, LeaderWatch, Violation
from pysched.sim.judge import START_MS, STEP_MS, UNJUDGED_MS, JudgedWorld, judge_runs, judge_settled
from pysched.sim.ledger import close_ledger, open_ledger
from pysched.sim.servers import ModelServers, StoreKind
from pysched.sim.workload import LONGEST_TARGET_MS, make_jobs, with_durations, with_overlap
from pysched.sim.world import OUTAGE_WORKER_CONFIG, TIMED_CONCURRENCY, WORKER_CONFIG, World

# How long a world runs after its faults stop before every run due by then
# must have ended (invariants.check_settled): runs due this near the end are
# not judged, and, with --target-time, its longest target and a lease more.
_SETTLE_MS = UNJUDGED_MS
_worlds = itertools.count(1)


@dataclass(frozen=True)
class SimConfig:
    seed: int
    jobs: int = 1_000
    hours: float = 1.0
    faults: frozenset[str] = frozenset(KINDS)
    nodes: int = 3
    partitions: int = 16
    fault_count: int = 12
    flaky: float = 0.0  # the fraction of jobs whose runs fail before they succeed
    # Each job follows a catch-up policy drawn from all four (else run_once).
    catch_up: bool = False
    catch_up_rate: int = DEFAULT_CATCH_UP_RATE  # the leaders' catch-up lane, runs a second
    # Every node down at once for a while, then started again.
    cluster_outage: Outage | None = None
    # The jobs' downstream fails every call for a while; the world's breaker
    # and retry budget are then the production defaults.
    downstream_outage: Outage | None = None
    # The leaders cannot record what they send for a while (faults.py).
    recording_outage: Outage | None = None
    # The workers cannot record how their runs ended for a while (faults.py).
    history_outage: Outage | None = None
    # Targets take time (drawn per job, workload.with_durations) and the
    # workers take batches, as a node's pool does (world.SimNode).
    target_time: bool = False
    # The workload changes its jobs while they run (changes.py), and each
    # job follows an overlap policy drawn from all four.
    changes: bool = False
    # The store the nodes run: the model (pysched.memory.store), or the
    # cluster's own over in-memory tables (cluster_tables.py).
    store: StoreKind = "model"

    def replay_line(self) -> str:
        options = [
            f"pysched-sim --seed {self.seed} --jobs {self.jobs} --hours {self.hours:g} --nodes {self.nodes}",
            f"--partitions {self.partitions} --fault-count {self.fault_count}",
            f"--faults {','.join(sorted(self.faults)) or 'none'}",
        ]
        if self.flaky:
            options.append(f"--flaky {self.flaky:g}")
        if self.catch_up:
            options.append("--catch-up")
        if self.catch_up_rate != DEFAULT_CATCH_UP_RATE:
            options.append(f"--catch-up-rate {self.catch_up_rate}")
        if self.cluster_outage is not None:
            options.append(f"--cluster-outage {self.cluster_outage.spec()}")
        if self.downstream_outage is not None:
            options.append(f"--downstream-outage {self.downstream_outage.spec()}")
        if self.recording_outage is not None:
            options.append(f"--recording-outage {self.recording_outage.spec()}")
        if self.history_outage is not None:
            options.append(f"--history-outage {self.history_outage.spec()}")
        if self.target_time:
            options.append("--target-time")
        if self.changes:
            options.append("--changes")
        if self.store != "model":
            options.append(f"--store {self.store}")
        return " ".join(options)


@dataclass
class SimReport:
    config: SimConfig
    owed: int = 0
    executed: int = 0
    missed: int = 0  # runs owed that were recorded missed, with a reason
    faults: int = 0
    failed_calls: int = 0
    dead_letters: int = 0  # runs owed that failed for good
    # World times of the calls made while the downstream was down.
    calls_while_down: tuple[int, ...] = ()
    # What the nodes' executors counted: parked, retried, dead_lettered, ...
    counts: Counter[str] = field(default_factory=Counter)
    lane_peak: int = 0  # the most runs a leader's catch-up lane handed on in one second
    violations: list[Violation] = field(default_factory=list)
    # Of every execution and its time: the same seed gives the same digest.
    digest: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations


def simulate(config: SimConfig) -> SimReport:
    rng = random.Random(config.seed)
    end = START_MS + round(config.hours * 3_600_000)
    blackout = None if config.cluster_outage is None else config.cluster_outage.window_ms(START_MS, STEP_MS)
    down = None if config.downstream_outage is None else config.downstream_outage.window_ms(START_MS, STEP_MS)
    plan = plan_faults(rng, config.faults, config.nodes, START_MS + 60_000, end, config.fault_count, blackout)
    leader_config = LeaderConfig(catch_up_rate=config.catch_up_rate)
    worker_config = WORKER_CONFIG if down is None else OUTAGE_WORKER_CONFIG
    if config.target_time:
        worker_config = replace(worker_config, concurrency=TIMED_CONCURRENCY)
    recording = None if config.recording_outage is None else config.recording_outage.window_ms(START_MS, STEP_MS)
    history = None if config.history_outage is None else config.history_outage.window_ms(START_MS, STEP_MS)
    world = World(
        rng,
        config.nodes,
        config.partitions,
        START_MS,
        plan,
        worker_config,
        leader_config,
        recording,
        history,
        config.target_time,
        config.store,
    )
    world_id = f"world-{next(_worlds)}"
    ledger = open_ledger(world_id, world.clock, down)
    try:
        jobs = make_jobs(rng, config.jobs, world_id, START_MS, end - START_MS, config.flaky, config.catch_up)
        world.attach(ledger, random.Random(f"{config.seed}/crashed-calls"))
        settle_ms = _SETTLE_MS
        if config.target_time:
            # Generators of their own, seeded by name: the world's draws stay
            # as they were.
            jobs = with_durations(jobs, random.Random(f"{config.seed}/durations"), worker_config.lease_ms)
            settle_ms += LONGEST_TARGET_MS + worker_config.lease_ms
        changes = None
        if config.changes:
            jobs = with_overlap(jobs, random.Random(f"{config.seed}/overlap"))
            ledger.exclusive = frozenset(job.id for job in jobs if job.overlap != "allow")
            # Drawn so that each has a settle time after it, as a fault has.
            drawn = plan_changes(random.Random(f"{config.seed}/changes"), jobs, START_MS + 60_000, end - settle_ms)
            if not isinstance(world.cluster, ModelServers):
                raise ValueError("a world whose jobs change runs on the model store only, for now")
            changes = JobChanges(drawn, MemoryScheduleStore(world.cluster.memory.schedule), world.clock, ledger)
            world.attach_changes(changes)
        register_many(world.nodes[0].clients.store, jobs, START_MS)
        report = SimReport(config)
        _run(world, end, report)
        ledger.finish()
        # Runs due before the downstream is back and settled are owed
        # whenever they come, as are those of a fault, and those whose
        # earlier runs could not be recorded (their next runs are planned
        # when the recording is), and those that ended while their end could
        # not be written (a retry is owed once it is).
        windows = (down, recording, history)
        quiet_from = max([plan.quiet_from_ms] + [window[1] for window in windows if window is not None])
        judged = JudgedWorld(world, jobs, ledger, START_MS, end, quiet_from, changes)
        violations, counts = judge_runs(judged, leader_config)
        report.violations += violations
        report.violations += judge_settled(judged, settle_ms, down is not None)
        report.owed, report.missed, report.dead_letters = counts.owed, counts.missed, counts.dead_letters
        report.lane_peak = counts.lane_peak
        report.violations.sort(key=lambda v: (v.at_ms, v.kind, v.detail))
        report.executed = ledger.executed
        report.digest = ledger.digest()
        report.faults = world.faults_begun
        report.failed_calls = sum(node.faults.injected for node in world.nodes)
        report.calls_while_down = tuple(ledger.calls_while_down)
        report.counts = sum((node.counts() for node in world.nodes), Counter())
        return report
    finally:
        world.close()
        close_ledger(world_id)


def _run(world: World, end: int, report: SimReport) -> None:
    """Round after round until ``end``, watching fences (as etcd issues
    them and as the tables take them) and leader keys as the world goes;
    while the whole cluster is down, straight to its return."""
    fences = FenceWatch()
    leaders = LeaderWatch()
    while world.clock.now_ms() < end:
        world.round()
        violation = (
            fences.check(world.cluster.election.grants())
            or leaders.check(world.cluster.broker, world.cluster.election)
            or world.cluster.fence_violation()
        )
        if violation is not None:
            report.violations.append(violation)
            return
        idle_until = world.idle_until()
        world.clock.advance(STEP_MS if idle_until is None else max(STEP_MS, idle_until - world.clock.now_ms()))
