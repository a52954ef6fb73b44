"""One simulated world from its seed to its verdict."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

from pysched.protocols import MissedRuns
from pysched.registry import register_many
from pysched.sim.faults import KINDS, MAX_SKEW_MS, plan_faults
from pysched.sim.invariants import FenceWatch, LeaderWatch, Violation, check_runs
from pysched.sim.ledger import close_ledger, open_ledger
from pysched.sim.workload import OwedRuns, make_jobs
from pysched.sim.world import World

# The world starts on a Monday, 00:00 UTC: a top-of-the-hour burst at once.
START_MS = 1_799_020_800_000  # 2027-01-04T00:00:00Z
STEP_MS = 100  # how far the world clock moves between rounds
# Runs due this near the end are not judged: they may still be on their way.
_UNJUDGED_MS = 120_000
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

    def replay_line(self) -> str:
        return (
            f"pysched-sim --seed {self.seed} --jobs {self.jobs} --hours {self.hours:g} --nodes {self.nodes}"
            f" --partitions {self.partitions} --fault-count {self.fault_count}"
            f" --faults {','.join(sorted(self.faults)) or 'none'}" + (f" --flaky {self.flaky:g}" if self.flaky else "")
        )


@dataclass
class SimReport:
    config: SimConfig
    owed: int = 0
    executed: int = 0
    missed: int = 0  # runs owed that were recorded missed, with a reason
    faults: int = 0
    failed_calls: int = 0
    violations: list[Violation] = field(default_factory=list)
    # Of every execution and its time: the same seed gives the same digest.
    digest: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations


def simulate(config: SimConfig) -> SimReport:
    rng = random.Random(config.seed)
    end = START_MS + round(config.hours * 3_600_000)
    plan = plan_faults(rng, config.faults, config.nodes, START_MS + 60_000, end, config.fault_count)
    world = World(rng, config.nodes, config.partitions, START_MS, plan)
    world_id = f"world-{next(_worlds)}"
    ledger = open_ledger(world_id, world.clock)
    try:
        jobs = make_jobs(rng, config.jobs, world_id, START_MS, end - START_MS, config.flaky)
        register_many(world.nodes[0].clients.store, jobs, START_MS)
        fences = FenceWatch()
        leaders = LeaderWatch()
        report = SimReport(config)
        while world.clock.now_ms() < end:
            world.round()
            violation = fences.check(world.cluster.election.grants()) or leaders.check(
                world.cluster.broker, world.cluster.election
            )
            if violation is not None:
                report.violations.append(violation)
                break
            world.clock.advance(STEP_MS)
        judged_until = end - _UNJUDGED_MS
        owed = OwedRuns(jobs, START_MS, judged_until)
        # A node whose clock runs ahead may start a run due just past the end.
        later = OwedRuns(jobs, START_MS, end + MAX_SKEW_MS, after_ms=judged_until)
        missed: dict[str, list[MissedRuns]] = {}
        for span in world.cluster.schedule.missed.values():
            missed.setdefault(span.job_id, []).append(span)
        violations, report.missed = check_runs(owed, later, ledger, plan.quiet_from_ms, missed)
        report.violations += violations
        report.owed = owed.count if owed.count is not None else sum(1 for _ in owed)
        report.executed = ledger.executed
        report.digest = ledger.digest()
        report.faults = world.faults_begun
        report.failed_calls = sum(node.faults.injected for node in world.nodes)
        return report
    finally:
        close_ledger(world_id)
