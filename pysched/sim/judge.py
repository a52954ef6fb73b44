"""A simulated world's verdict: every run it owes, from its jobs and the
changes its workload made, against the ledger and the store
(invariants.py states the rules)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pysched import native
from pysched.leader import LeaderConfig
from pysched.memory.store import RunRow
from pysched.model import Job
from pysched.protocols import MissedRuns
from pysched.records import idempotency_key
from pysched.retries import LOST
from pysched.sim.change_invariants import check_changes, check_exclusive
from pysched.sim.changes import JobChanges
from pysched.sim.faults import MAX_SKEW_MS
from pysched.sim.invariants import (
    RECOVERY_MS,
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
    stopped_by_change,
)
from pysched.sim.ledger import Ledger
from pysched.sim.owed_changes import ChangedOwed, WorldOwed, owed_after_changes
from pysched.sim.servers import StoreRows
from pysched.sim.workload import OwedRuns
from pysched.sim.world import World

# The world starts on a Monday, 00:00 UTC: a top-of-the-hour burst at once.
START_MS = 1_799_020_800_000  # 2027-01-04T00:00:00Z
STEP_MS = 100  # how far the world clock moves between rounds
# Runs due this near the end are not judged: they may still be on their way.
UNJUDGED_MS = 120_000

RunRows = Mapping[str, Mapping[tuple[int, int], RunRow]]


@dataclass
class Counts:
    owed: int = 0
    missed: int = 0  # runs owed that were recorded missed, with a reason
    dead_letters: int = 0  # runs owed that failed for good
    lane_peak: int = 0  # the most runs a leader's catch-up lane handed on in one second


@dataclass
class JudgedWorld:
    """A world that ended, and what it owes: with changes, the runs of the
    jobs they touched worked out from them (owed_changes.py), and the rows
    a prune took judged as they were."""

    world: World
    jobs: list[Job]
    ledger: Ledger
    start_ms: int
    end_ms: int
    quiet_from_ms: int
    changes: JobChanges | None
    changed: ChangedOwed = field(init=False)
    stored: StoreRows = field(init=False)  # what the store holds at the end
    runs: RunRows = field(init=False)
    dead_letters: dict[tuple[str, int, int], int] = field(init=False)

    def __post_init__(self) -> None:
        self.stored = tables = self.world.cluster.rows()
        self.runs, self.dead_letters = tables.runs, dict(tables.dead_letters)
        self.changed = ChangedOwed()
        if self.changes is None:
            return
        judged_until = self.end_ms - UNJUDGED_MS
        quiet = self.quiet_from_ms + RECOVERY_MS
        self.changed = owed_after_changes(
            self.jobs, self.changes.applied, self.start_ms, judged_until, self.end_ms, quiet
        )
        pruned = self.changes.pruned
        self.runs = {j: {**pruned.get(j, {}), **tables.runs.get(j, {})} for j in {*tables.runs, *pruned}}
        self.dead_letters = {**self.changes.pruned_dead, **tables.dead_letters}

    def owed(self) -> tuple[WorldOwed, WorldOwed]:
        """The runs owed to the end, and those that may or may not have run
        (due too near the end, or where a change left it open)."""
        judged_until = self.end_ms - UNJUDGED_MS
        unchanged = [job for job in self.jobs if job.id not in self.changed.followed]
        owed = OwedRuns(unchanged, self.start_ms, judged_until)
        # A node whose clock runs ahead may start a run due just past the end.
        later = OwedRuns(unchanged, self.start_ms, self.end_ms + MAX_SKEW_MS, after_ms=judged_until)
        return WorldOwed(owed, self.changed.certain), WorldOwed(later, self.changed.optional)

    def lost_dead_letters(self) -> set[str]:
        """The dead letters' keys whose last attempt was lost with its node."""
        return {
            idempotency_key(job_id, run_at, group)
            for job_id, run_at, group in self.dead_letters
            if (row := self.runs.get(job_id, {}).get((run_at, group))) is not None
            and row.failures
            and row.failures[-1][1].kind == LOST
        }


def waits_for_overlap(ledger: Ledger) -> dict[str, int]:
    """The runs of jobs that may not overlap (overlap forbid, buffer_one,
    replace) whose call began after an earlier run's, by key: when the
    earlier calls ended. A run waits for them, and is late from then."""
    waits: dict[str, int] = {}
    for spans in ledger.spans.values():
        ended = 0
        for _, end, key in sorted(spans):
            if ended > 0:
                waits[key] = max(waits.get(key, 0), ended)
            ended = max(ended, end)
    return waits


def judge_settled(judged: JudgedWorld, settle_ms: int, downstream_down: bool) -> list[Violation]:
    """Whether the world settled: every run due a settle time after the
    faults stopped has ended; no run failed for good but by an outage of
    its downstream (or lost with its node twice); no retry came before its
    time. Every attempt group, not the first alone."""
    end = judged.end_ms
    violations: list[Violation] = []
    if end - judged.quiet_from_ms >= settle_ms:
        violations += check_settled(judged.runs, end - settle_ms)
    if not downstream_down:
        dead = {idempotency_key(*run): at_ms for run, at_ms in judged.dead_letters.items()}
        violations += check_dead_letters(dead, judged.lost_dead_letters())
    violations += check_retry_waits(judged.stored.retries_due, judged.ledger.tries)
    if judged.changes is not None:
        violations += check_changes(judged.ledger, judged.changed, end - settle_ms)
        violations += check_exclusive(judged.ledger, judged.ledger.exclusive)
    return violations


def judge_runs(judged: JudgedWorld, leader_config: LeaderConfig) -> tuple[list[Violation], Counts]:
    """Every run owed to the end of the world, against the ledger and the
    store; and the counts of runs owed, missed and dead."""
    world, ledger, counts = judged.world, judged.ledger, Counts()
    owed, later = judged.owed()
    missed: dict[str, list[MissedRuns]] = {}
    for span in judged.stored.missed.values():
        missed.setdefault(span.job_id, []).append(span)
    dead = {idempotency_key(job_id, run_at, group) for job_id, run_at, group in judged.dead_letters}
    lost = judged.lost_dead_letters()
    changed = judged.changed
    held = {**changed.held, **waits_for_overlap(ledger)}
    stopped = stopped_by_change(ledger, judged.runs, changed.changed)
    violations, counts.missed = check_runs(owed, later, ledger, judged.quiet_from_ms, missed, dead, lost, held, stopped)
    counts.owed = owed.count if owed.count is not None else sum(1 for _ in owed)
    counts.dead_letters = len(dead)
    by_id = {job.id: job for job in judged.jobs}
    violations += check_ends(owed, ledger, judged.runs, changed.changed)
    violations += check_policies(owed, missed, by_id, changed.paused)
    violations += check_found_behind(judged.stored.found_behind)
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
    lane_violations, counts.lane_peak = check_lane(
        world.cluster.broker,
        world.cluster.election,
        leader_config.catch_up_rate,
        leader_config.catch_up_after_ms,
        skews,
    )
    return sorted(violations + lane_violations, key=lambda v: (v.at_ms, v.kind, v.detail)), counts
