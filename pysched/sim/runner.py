"""One simulated world from its seed to its verdict."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from dataclasses import dataclass, field, replace

from pysched import native
from pysched.config import DEFAULT_CATCH_UP_RATE
from pysched.leader import LeaderConfig
from pysched.model import Job
from pysched.protocols import MissedRuns
from pysched.records import idempotency_key
from pysched.registry import register_many
from pysched.retries import LOST
from pysched.sim.faults import KINDS, MAX_SKEW_MS, Outage, plan_faults
from pysched.sim.invariants import (
    FenceWatch,
    LeaderWatch,
    Violation,
    check_catch_up,
    check_dead_letters,
    check_ends,
    check_found_behind,
    check_lane,
    check_policies,
    check_retry_waits,
    check_runs,
    check_settled,
)
from pysched.sim.ledger import Ledger, close_ledger, open_ledger
from pysched.sim.workload import LONGEST_TARGET_MS, OwedRuns, make_jobs, with_durations
from pysched.sim.world import OUTAGE_WORKER_CONFIG, TIMED_CONCURRENCY, WORKER_CONFIG, World

# The world starts on a Monday, 00:00 UTC: a top-of-the-hour burst at once.
START_MS = 1_799_020_800_000  # 2027-01-04T00:00:00Z
STEP_MS = 100  # how far the world clock moves between rounds
# Runs due this near the end are not judged: they may still be on their way.
_UNJUDGED_MS = 120_000
# How long a world runs after its faults stop before every run due by then
# must have ended (invariants.check_settled): runs due this near the end are
# not judged, and, with --target-time, its longest target and a lease more.
_SETTLE_MS = _UNJUDGED_MS
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
    )
    world_id = f"world-{next(_worlds)}"
    ledger = open_ledger(world_id, world.clock, down)
    try:
        jobs = make_jobs(rng, config.jobs, world_id, START_MS, end - START_MS, config.flaky, config.catch_up)
        settle_ms = _SETTLE_MS
        if config.target_time:
            # Generators of their own, seeded by name: the world's draws stay
            # as they were.
            jobs = with_durations(jobs, random.Random(f"{config.seed}/durations"), worker_config.lease_ms)
            world.attach(ledger, random.Random(f"{config.seed}/crashed-calls"))
            settle_ms += LONGEST_TARGET_MS + worker_config.lease_ms
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
        report.violations += _judge(world, jobs, ledger, end, quiet_from, leader_config, report)
        report.violations += _judge_settled(world, ledger, end, quiet_from, settle_ms, down is not None)
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
    """Round after round until ``end``, watching fences and leader keys as
    the world goes; while the whole cluster is down, straight to its
    return."""
    fences = FenceWatch()
    leaders = LeaderWatch()
    while world.clock.now_ms() < end:
        world.round()
        violation = fences.check(world.cluster.election.grants()) or leaders.check(
            world.cluster.broker, world.cluster.election
        )
        if violation is not None:
            report.violations.append(violation)
            return
        idle_until = world.idle_until()
        world.clock.advance(STEP_MS if idle_until is None else max(STEP_MS, idle_until - world.clock.now_ms()))


def _judge_settled(
    world: World, ledger: Ledger, end: int, quiet_from: int, settle_ms: int, downstream_down: bool
) -> list[Violation]:
    """Whether the world settled: every run due a settle time after the
    faults stopped has ended; no run failed for good but by an outage of
    its downstream (or lost with its node twice); no retry came before its
    time. Every attempt group, not the first alone."""
    tables = world.cluster.schedule
    violations: list[Violation] = []
    if end - quiet_from >= settle_ms:
        violations += check_settled(tables.runs, end - settle_ms)
    if not downstream_down:
        dead = {idempotency_key(*run): at_ms for run, at_ms in tables.dead_letters.items()}
        lost = {
            key
            for (job_id, run_at, group), key in ((run, idempotency_key(*run)) for run in tables.dead_letters)
            if (row := tables.runs.get(job_id, {}).get((run_at, group))) is not None
            and row.failures
            and row.failures[-1][1].kind == LOST
        }
        violations += check_dead_letters(dead, lost)
    violations += check_retry_waits(tables.retries_due, ledger.tries)
    return violations


def _judge(
    world: World,
    jobs: list[Job],
    ledger: Ledger,
    end: int,
    quiet_from: int,
    leader_config: LeaderConfig,
    report: SimReport,
) -> list[Violation]:
    """Every run owed to the end of the world, against the ledger and the
    store; sets the report's counts of runs owed, missed and dead."""
    judged_until = end - _UNJUDGED_MS
    owed = OwedRuns(jobs, START_MS, judged_until)
    # A node whose clock runs ahead may start a run due just past the end.
    later = OwedRuns(jobs, START_MS, end + MAX_SKEW_MS, after_ms=judged_until)
    tables = world.cluster.schedule
    missed: dict[str, list[MissedRuns]] = {}
    for span in tables.missed.values():
        missed.setdefault(span.job_id, []).append(span)
    dead = {idempotency_key(job_id, run_at, group) for job_id, run_at, group in tables.dead_letters}
    lost = {
        idempotency_key(job_id, run_at, group)
        for job_id, run_at, group in tables.dead_letters
        if (row := tables.runs.get(job_id, {}).get((run_at, group))) is not None
        and row.failures
        and row.failures[-1][1].kind == LOST
    }
    violations, report.missed = check_runs(owed, later, ledger, quiet_from, missed, dead, lost)
    report.owed = owed.count if owed.count is not None else sum(1 for _ in owed)
    report.dead_letters = len(dead)
    by_id = {job.id: job for job in jobs}
    violations += check_ends(owed, ledger, tables.runs)
    violations += check_policies(owed, missed, by_id)
    violations += check_found_behind(tables.found_behind)
    if world.plan.blackout_ms is not None:
        down, up = world.plan.blackout_ms
        # The round before the outage handed on nothing due after it, but
        # by a node whose clock runs ahead.
        sent_before = {
            native.decode(record.payload).idempotency_key
            for partition in range(world.cluster.broker.partitions)
            for record in world.cluster.broker.records_since(partition, 0)
            if record.appended_at_ms < down
        }
        violations += check_catch_up(owed, ledger, by_id, down - STEP_MS, up, sent_before)
    skews = {f"node-{node.index}": node.clock.skew_ms for node in world.nodes}
    lane_violations, report.lane_peak = check_lane(
        world.cluster.broker,
        world.cluster.election,
        leader_config.catch_up_rate,
        leader_config.catch_up_after_ms,
        skews,
    )
    return sorted(violations + lane_violations, key=lambda v: (v.at_ms, v.kind, v.detail))
