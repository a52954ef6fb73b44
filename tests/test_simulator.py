"""The simulator: seeds in short form (each a world with faults, checked for
lost, doubled, early and late runs, and for sends under a fence that no
longer leads), its replay, and that it catches holes put back; worlds whose
downstream goes down behind a real breaker, worlds whose whole cluster
goes down for two hours, each catch-up policy checked on the return,
worlds whose leaders cannot record what they send for a while, worlds
whose workers cannot record how their runs ended for a while, and worlds
whose jobs are changed as they run."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from pysched.breakers import BreakerPolicy
from pysched.clock import ManualClock
from pysched.memory.store import MemoryScheduleStore, RunRow
from pysched.protocols import MissedRuns
from pysched.sim.change_invariants import check_changes
from pysched.sim.faults import KINDS, Outage
from pysched.sim.invariants import (
    check_dead_letters,
    check_ends,
    check_retry_waits,
    check_runs,
    check_settled,
)
from pysched.sim.ledger import Execution, Ledger
from pysched.sim.owed_changes import ChangedOwed, Pause
from pysched.sim.runner import SimConfig, simulate
from pysched.sim.workload import OwedRun
from pysched.sim.world import OUTAGE_WORKER_CONFIG
from pysched.sim.worlds import (
    CATCH_UP_RATE,
    PINNED_FAULTS,
    catch_up_world,
    changing_world,
    cluster_outage_world,
    history_outage_world,
    recording_outage_world,
    tables_history_outage_world,
)
from pysched.stores import cassandra as cassandra_store
from pysched.worker.executor import Execution as ExecutorExecution
from pysched.worker.executor import Executor

# CI's short form: 200 worlds of 100 jobs, 3 nodes and 6 faults over a
# simulated quarter of an hour.
SHORT_SEEDS = range(1, 201)


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    # Thousands of injected failures, each logged by the nodes.
    logger = logging.getLogger("pysched")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


@pytest.mark.parametrize("seed", SHORT_SEEDS)
def test_a_seeded_world_loses_and_doubles_nothing(seed: int) -> None:
    report = simulate(SimConfig(seed, jobs=100, hours=0.25, fault_count=6))
    assert report.owed > 0
    assert report.ok, f"{report.violations[:3]}\nreplay: {report.config.replay_line()}"


# Worlds where a third of the jobs fail their runs' first one or two
# attempts: each run still ends in exactly one effect, on time from its first
# attempt, whatever the faults do to its retries.
FLAKY_SEEDS = range(1001, 1051)


@pytest.mark.parametrize("seed", FLAKY_SEEDS)
def test_a_world_of_flaky_jobs_retries_each_run_to_one_effect(seed: int) -> None:
    report = simulate(SimConfig(seed, jobs=100, hours=0.25, fault_count=6, flaky=0.3))
    assert report.owed > 0
    assert report.ok, f"{report.violations[:3]}\nreplay: {report.config.replay_line()}"


# Worlds that once broke an invariant, each kept as it was found.
FOUND = [
    # A worker's start recorded though its answer was lost, its retry fenced:
    # the hand-back took the run for started and dropped it.
    SimConfig(
        5022,
        jobs=300,
        hours=0.5,
        fault_count=10,
        faults=PINNED_FAULTS,
    ),
    # A poll handed a partition over to a node back from a crash, then
    # failed raising the fence of a partition it won (a store fault): its
    # leader led the partition on its previous answer, beside the new one.
    *(catch_up_world(seed) for seed in (27, 47, 55)),
    # A worker recorded a run started (its answer lost) and died before it
    # ran the target; Kafka brought the run to another worker, which found
    # it fenced by the partition's new leader and, the run being "running",
    # dropped it: the claim of the one that started it had run out.
    catch_up_world(80),
]


# Worlds of 300 flaky jobs, each of the four catch-up policies: a retry due
# at the very time its run was delivered for took that delivery's schedule
# row, which its leader's late record then marked handed on: the retry was
# never sent (seeds 242, 246, 259).
FOUND += [catch_up_world(seed, flaky=0.2) for seed in (242, 246, 259)]

# The same worlds: a worker completed a failed run's claim, its history write
# failed, and it died. Its record, rejected for its fence, was acknowledged
# with the run left "running", or, taken over, recorded lost, the failure
# gone (seed 233). Seed 226: the worker's repeated recordings each drew the
# retry's time again, so the failure its claim kept was not the one it then
# wrote; recorded late from the claim, its retry fell behind the watermark.
FOUND += [catch_up_world(seed, flaky=0.2) for seed in (226, 233)]


# Seeds 2 and 4 (and 3 and 9) left a run retrying for good: its retry row
# landed behind the watermark the leaders had moved on meanwhile, and no
# leader read it again.
FOUND += [history_outage_world(seed) for seed in (2, 4)]


# Cassandra out of a node's reach past a worker's lease: an execution that
# had claimed its run and was waiting out the backoff of a failed write saw
# its heartbeats fail for a whole lease, and was dropped, its delivery left
# unacknowledged and its claim unended: nothing owed the run again.
FOUND += [SimConfig(seed, jobs=100, hours=0.25, fault_count=6, faults=frozenset({"cassandra"})) for seed in (1, 2)]


# Issue 29, C4: a reschedule landing between a leader's read of its plans
# and its write of them. The plan read from a one-shot completed the job it
# had become a cron (seeds 8, 17: the cron's first run fired, and none
# after it); one read from a cron planned the old schedule's next run after
# the new one's (seed 36: that run fired, owed by no schedule).
STALE_PLAN_SEEDS = (8, 17, 36)
FOUND += [changing_world(seed) for seed in STALE_PLAN_SEEDS]


@pytest.mark.parametrize("config", FOUND, ids=lambda c: f"seed-{c.seed}")
def test_a_world_that_once_broke_an_invariant_now_holds(config: SimConfig) -> None:
    report = simulate(config)
    assert report.ok, f"{report.violations[:3]}\nreplay: {report.config.replay_line()}"


# CI's short form of the changing worlds.
CHANGES_SEEDS = range(1, 21)


@pytest.mark.parametrize("seed", CHANGES_SEEDS)
def test_a_world_whose_jobs_are_changed_as_they_run_owes_what_the_changes_leave(seed: int) -> None:
    report = simulate(changing_world(seed))
    assert report.owed > 0
    assert report.ok, f"{report.violations[:3]}\nreplay: {report.config.replay_line()}"


def test_the_stale_plan_hole_put_back_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 29, C4: with each plan written to its job whatever the job has
    # become since it was read, these seeds lose the runs of a one-shot
    # rescheduled to a cron, or run one the new schedule does not owe.
    def as_it_is_now(self: MemoryScheduleStore, job_id: str, next_run_at_ms: int | None) -> Any:
        return self.tables.jobs.get(job_id)

    monkeypatch.setattr(MemoryScheduleStore, "_as_planned", as_it_is_now)
    kinds = {seed: {v.kind for v in simulate(changing_world(seed)).violations} for seed in STALE_PLAN_SEEDS}
    assert "lost" in kinds[8] and "lost" in kinds[17], kinds
    assert "unowed" in kinds[36], kinds


# A pause that lands between a leader's send of a run and its record took
# that run for the one it holds (the job's next run until the record moves
# it on), though it was handed on and a worker ran it: the resume owed it
# again, and it was left scheduled for good (seeds 1004 and 1023 of the
# flaky worlds), or counted it missed though it ran (seeds 9, 31, 34, 35, 36
# and 40 of the catch-up worlds). A run handed on is not the pause's to
# hold (protocols.held_by_pause; tests/test_contract_pause_races.py).
@pytest.mark.parametrize("seed", (1004, 1023))
def test_a_pause_between_a_send_and_its_record_holds_no_run_handed_on(seed: int) -> None:
    report = simulate(changing_world(seed, flaky=0.3))
    assert report.ok, f"{report.violations[:3]}\nreplay: {report.config.replay_line()}"


def test_the_checker_orders_starts_after_changes_by_the_calls_made() -> None:
    ledger = Ledger(ManualClock(0))
    ledger.numbered = frozenset({"j"})
    ledger.tried("j:100:0", 1, 100, fails=False)  # call 1: before the cancel
    owed = ChangedOwed(superseded={"j:100:0": 1, "j:200:0": 1})
    assert check_changes(ledger, owed, 10_000) == []
    ledger.tried("j:200:0", 1, 100, fails=False)  # call 2: after it, in the same round
    ledger.add(Execution("j:200:0", 100))
    (violation,) = check_changes(ledger, owed, 10_000)
    assert (violation.kind, violation.at_ms) == ("changed", 100)
    paused = ChangedOwed(pauses={"j": [Pause(50, 150, 1, 2)]})
    (violation,) = check_changes(ledger, paused, 10_000)
    assert violation.kind == "paused" and "j:200:0" in violation.detail
    # Due by the pause, it may have been taken by a worker before it, which
    # checks its job once, when it takes it.
    taken = ChangedOwed(pauses={"j": [Pause(50, 150, 1, 2, taken_before=frozenset({"j:200:0"}))]})
    assert check_changes(ledger, taken, 10_000) == []


def test_a_run_a_worker_took_before_its_job_was_paused_may_still_start() -> None:
    # Timed world 13: a run handed on well before the pause, its job read
    # when its worker took it, waited for a free place and was called about
    # a second after the pause, as a Kubernetes Job created before its
    # CronJob's suspend, or an APScheduler job already submitted to its
    # executor (README, Pause and resume).
    report = simulate(SimConfig(13, jobs=100, hours=0.25, fault_count=6, target_time=True, changes=True))
    assert report.ok, f"{report.violations[:3]}\nreplay: {report.config.replay_line()}"


def test_a_seed_replays_the_same_world() -> None:
    config = SimConfig(7, jobs=100, hours=0.25, fault_count=6)
    first, again = simulate(config), simulate(config)
    assert first.faults > 0 and first.executed > 0
    assert first.digest == again.digest
    assert simulate(SimConfig(8, jobs=100, hours=0.25, fault_count=6)).digest != first.digest


def test_the_checker_names_each_kind_of_violation() -> None:
    ledger = Ledger(ManualClock(0))
    owed = [
        OwedRun("a", "a", 1_000, 1_000),
        OwedRun("b", "b", 1_000, 1_000),
        OwedRun("c", "c", 10_000, 10_000),
        OwedRun("d", "d", 1_000, 1_000),
        OwedRun("e", "e", 1_000, 1_000),
        OwedRun("f", "f", 1_000, 1_000),
    ]
    for execution in [
        Execution("b", 1_000),
        Execution("b", 1_500),  # twice
        Execution("c", 2_000),  # 8 s early
        Execution("d", 200_000),  # late, after the faults stopped
        Execution("x", 3_000),  # owed by nobody
        Execution("f", 1_000),  # ran, and also recorded missed
    ]:
        ledger.add(execution)
    # e: not run, and recorded missed: an outcome, not a violation.
    missed = {j: [MissedRuns(j, 1_000, 1_001, "skipped")] for j in ("e", "f")}
    violations, missed_count = check_runs(owed, [], ledger, quiet_from_ms=-100_000, missed=missed)
    assert sorted(v.kind for v in violations) == ["doubled", "doubled", "early", "late", "lost", "unowed"]
    assert missed_count == 1


def test_a_dead_letter_is_an_outcome_and_a_second_one_is_a_double() -> None:
    ledger = Ledger(ManualClock(0))
    owed = [OwedRun("a", "a", 1_000, 1_000), OwedRun("b", "b", 1_000, 1_000), OwedRun("c", "c", 1_000, 1_000)]
    ledger.add(Execution("b", 1_000))
    missed = {"c": [MissedRuns("c", 1_000, 1_001, "skipped"), MissedRuns("c", 500, 2_000, "skipped")]}
    violations, _ = check_runs(owed, [], ledger, quiet_from_ms=0, missed=missed, dead={"a", "b"})
    # a: failed for good, an outcome; b: ran and failed for good; c: missed twice.
    assert sorted(v.detail.split()[0] for v in violations) == ["b", "c"]
    assert {v.kind for v in violations} == {"doubled"}


# A downstream that fails every call for five virtual minutes, behind the
# production breaker and budget (world.OUTAGE_WORKER_CONFIG), among drawn
# faults. Not the store's: a breaker the store cannot read lets the run
# through (the breaker is advice, worker/downstreams.py), which no bound
# survives. Nor skew: a node whose clock runs ahead sees the breaker
# half-open early, and the probes would come closer than one an open period.
DOWNSTREAM_OUTAGE = Outage(at_s=180, for_s=300)
DOWNSTREAM_OUTAGE_FAULTS = frozenset(KINDS) - {"store", "skew"}
DOWNSTREAM_OUTAGE_SEEDS = range(2001, 2009)


def calls_bound(policy: BreakerPolicy, nodes: int, outage_ms: int) -> int:
    """The most calls a downstream down for ``outage_ms`` can get:
    ``failure_threshold`` failures in a row open its breaker; each other
    node may make one call more on the closed breaker it cached (that
    call's failure loses its write to the opened row and reads it); then
    one probe per open period. A run in the simulator calls and reports in
    one step, so no call is in flight across a change. Retries add no term:
    a retry is admitted by the breaker as a first attempt is; the budget
    only decides whether a failed run is retried or dead-lettered."""
    return policy.failure_threshold + (nodes - 1) + outage_ms // policy.open_ms


@pytest.mark.parametrize("seed", DOWNSTREAM_OUTAGE_SEEDS)
def test_a_downstream_outage_is_held_to_its_breaker_and_every_run_ends_once(seed: int) -> None:
    config = SimConfig(
        seed,
        jobs=400,
        hours=0.25,
        fault_count=4,
        faults=DOWNSTREAM_OUTAGE_FAULTS,
        downstream_outage=DOWNSTREAM_OUTAGE,
    )
    report = simulate(config)
    # Each run owed succeeded once, or failed for good with as many failed
    # attempts recorded as calls failed (a parked run counts none); none
    # was left parked or retrying once the downstream came back.
    assert report.ok, f"{report.violations[:3]}\nreplay: {report.config.replay_line()}"
    bound = calls_bound(OUTAGE_WORKER_CONFIG.breaker, config.nodes, round(DOWNSTREAM_OUTAGE.for_s * 1000))
    calls = len(report.calls_while_down)
    assert OUTAGE_WORKER_CONFIG.breaker.failure_threshold <= calls <= bound, report.config.replay_line()
    # The breaker opened: runs were parked, then ran once it closed.
    assert report.counts["parked"] > calls
    # Retried, and within the retry budget: at this traffic its floor lets
    # every stated retry through.
    assert report.counts["retried"] > 0


# Seeds 2, 4, 8 and 10 lost runs for good until the marks of batches sent
# before a catch-up replay's next run was planned were held below it
# (recording.Recorder). In seed 19 a node whose
# clock runs ahead hands a run on just before the outage: not one it missed.
CLUSTER_OUTAGE_SEEDS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 19, 21)


@pytest.mark.parametrize("seed", CLUSTER_OUTAGE_SEEDS)
def test_a_cluster_outage_ends_each_nominal_time_as_its_catch_up_policy_says(seed: int) -> None:
    report = simulate(cluster_outage_world(seed))
    # Each time of the outage: run_all ran it; run_once ran the first alone;
    # skip ran none; deadline ran those within its max delay; each other
    # time recorded missed once, with its policy's reason; and no lane
    # handed on more than CATCH_UP_RATE runs in any second.
    assert report.ok, f"{report.violations[:3]}\nreplay: {report.config.replay_line()}"
    assert report.missed > 0 and report.executed > 0
    assert 0 < report.lane_peak <= CATCH_UP_RATE


# Seed 38 lost a run behind a watermark moved by a batch sent before the run
# was planned; seed 46 lost one stored by a recording whose answer was lost
# (a store fault as the outage ended), which its retry did not plan again.
# In seed 116 a worker whose delivery was fenced waited for the live holder
# of the run's claim: itself, from an attempt whose answer was lost; its
# consumer took nothing more for the rest of the world.
# Seed 30 was judged, not the run path: a worker ran a run, the write
# completing its claim was refused (a claims fault) and the node crashed
# before it was tried again; the next delivery took the dead claim over and
# ran the run again, as a dead worker's run must be. The judge counted the
# effect the crash left unrecorded as a double (world.py, _orphan_unrecorded).
RECORDING_OUTAGE_SEEDS = (1, 2, 3, 30, 38, 46, 116)


@pytest.mark.parametrize("seed", RECORDING_OUTAGE_SEEDS)
def test_runs_recorded_late_lose_no_next_run(seed: int) -> None:
    report = simulate(recording_outage_world(seed))
    assert report.ok, f"{report.violations[:3]}\nreplay: {report.config.replay_line()}"
    assert report.failed_calls > 0 and report.executed > 0


def test_a_run_again_after_a_death_is_a_double_unless_the_dead_nodes_write_of_its_end_was_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Seed 30's world, as if the crashed node had not yet tried to write the
    # end it held (an executor holding ends back): nothing then excuses the
    # run's second effect.
    ends_unrecorded = Executor.ends_unrecorded

    def never_tried(self: Executor) -> list[ExecutorExecution]:
        ends = ends_unrecorded(self)
        for execution in ends:
            execution.end_refused = False
        return ends

    monkeypatch.setattr(Executor, "ends_unrecorded", never_tried)
    report = simulate(recording_outage_world(30))
    assert [v.detail for v in report.violations] == ["minutely-000141:1799021580000:0 ran 2 times"]


def _row(job_id: str, run_at: int, group: int, state: str, **fields: Any) -> RunRow:
    return RunRow(job_id, run_at, group, run_id=1, due_ms=run_at, partition=0, state=state, **fields)


def test_a_world_that_did_not_settle_is_found() -> None:
    runs = {
        "a": {(1_000, 0): _row("a", 1_000, 0, "running")},
        "b": {(1_000, 0): _row("b", 1_000, 0, "retrying")},
        "c": {(1_000, 0): _row("c", 1_000, 0, "parked")},
        "d": {(1_000, 0): _row("d", 1_000, 0, "succeeded")},
        "e": {(90_000, 0): _row("e", 90_000, 0, "running")},  # past the horizon: may still run
    }
    violations = check_settled(runs, horizon_ms=60_000)
    assert [(v.kind, v.detail.split()[0]) for v in violations] == [
        ("unsettled", "a:1000:0"),
        ("unsettled", "b:1000:0"),
        ("unsettled", "c:1000:0"),
    ]


def test_a_dead_letter_without_a_downstream_outage_is_found() -> None:
    violations = check_dead_letters({"a:1000:0": 5_000, "b:1000:0": 6_000}, lost={"b:1000:0"})
    # b was lost with its node twice: dead-lettered by design.
    assert [(v.kind, v.detail.split()[0]) for v in violations] == [("dead", "a:1000:0")]


def test_every_attempt_group_is_judged() -> None:
    ledger = Ledger(ManualClock(0))
    ledger.fail("a:1000:1", 1_000)  # a call of group 1 failed; none recorded
    ledger.add(Execution("a:1000:1", 2_000))
    runs = {"a": {(1_000, 0): _row("a", 1_000, 0, "cancelled"), (1_000, 1): _row("a", 1_000, 1, "running")}}
    violations = check_ends([OwedRun("a:1000:0", "a", 1_000, 1_000)], ledger, runs)
    assert sorted(v.kind for v in violations) == ["failures", "unsettled"]
    assert all("a:1000:1" in v.detail for v in violations)


def test_a_retry_before_its_backoff_is_found() -> None:
    retries_due = {("a", 1_000, 0): {1: 10_000}, ("b", 1_000, 0): {1: 10_000}}
    tries = {"a:1000:0": [(1, 1_000), (2, 5_000)], "b:1000:0": [(1, 1_000), (2, 10_000)]}
    violations = check_retry_waits(retries_due, tries)
    assert [(v.kind, v.detail.split()[0]) for v in violations] == [("backoff", "a:1000:0")]


def test_a_world_of_timed_targets_replays_the_same_world() -> None:
    config = SimConfig(3, jobs=100, hours=0.25, fault_count=6, target_time=True)
    first, again = simulate(config), simulate(config)
    assert first.executed > 0 and first.faults > 0
    assert first.digest == again.digest
    assert first.digest != simulate(SimConfig(3, jobs=100, hours=0.25, fault_count=6)).digest


# Worlds whose targets take time (most seconds, some past the lease, a few
# minutes) and whose workers take batches: opt-in (--target-time) while the
# runs they find late are fixed (a worker's consumer takes nothing while its
# batch's calls run). Seeds 179 and 226: a node's heartbeats failed for a
# whole lease while its 57 s target ran; the target succeeded, its outcome
# was dropped, and the run taken over ran twice (before a run whose lease
# was lost was recorded or handed back). Seeds 98 and 145: a target that
# went on past its stop returned, and the run, handed back although nobody
# had taken it over, ran twice (before such a return was recorded as it
# ended).
TIMED_SEEDS = (3, 18, 86, 92, 98, 145, 179, 226)


@pytest.mark.parametrize("seed", TIMED_SEEDS)
def test_a_world_of_timed_targets_loses_and_doubles_nothing(seed: int) -> None:
    report = simulate(SimConfig(seed, jobs=100, hours=0.25, fault_count=6, target_time=True))
    assert report.owed > 0
    assert report.ok, f"{report.violations[:3]}\nreplay: {report.config.replay_line()}"


def test_a_world_on_the_cluster_store_replays_the_same_world() -> None:
    # Every node a client of one set of tables with its own clock, the
    # world's faults at each table call: the same seed, the same world.
    config = SimConfig(7, jobs=100, hours=0.25, fault_count=6, store="tables")
    first, again = simulate(config), simulate(config)
    assert first.faults > 0 and first.executed > 0 and first.failed_calls > 0
    assert first.digest == again.digest
    assert simulate(SimConfig(8, jobs=100, hours=0.25, fault_count=6, store="tables")).digest != first.digest


# Worlds on the cluster's own store over in-memory tables (--store tables),
# short and flaky, each a few seconds: held, pinned so that a change to the
# real store, its claims or the tables beneath them is judged by them.
TABLES_SEEDS = (
    SimConfig(7, jobs=100, hours=0.25, fault_count=6, store="tables"),
    SimConfig(27, jobs=100, hours=0.25, fault_count=6, store="tables"),
    SimConfig(30, jobs=100, hours=0.25, fault_count=6, store="tables"),
    SimConfig(1007, jobs=100, hours=0.25, fault_count=6, flaky=0.3, store="tables"),
    SimConfig(1011, jobs=100, hours=0.25, fault_count=6, flaky=0.3, store="tables"),
)


@pytest.mark.parametrize("config", TABLES_SEEDS, ids=lambda c: f"seed-{c.seed}")
def test_a_world_on_the_cluster_store_loses_and_doubles_nothing(config: SimConfig) -> None:
    report = simulate(config)
    assert report.owed > 0 and report.failed_calls > 0
    assert report.ok, f"{report.violations[:3]}\nreplay: {report.config.replay_line()}"


def test_a_world_on_the_cluster_store_whose_run_ends_were_written_late_holds() -> None:
    report = simulate(tables_history_outage_world(1001))
    assert report.ok, f"{report.violations[:3]}\nreplay: {report.config.replay_line()}"


def test_rows_owed_again_behind_the_watermark_put_back_into_the_cluster_store_are_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The hole of history_outage_world put back into the real store, not the
    # model: a retry written late stays where its due time says, behind a
    # watermark no leader reads from again.
    monkeypatch.setattr(cassandra_store, "placed_ahead", lambda due_ms, mark: due_ms)
    monkeypatch.setattr(
        cassandra_store.CassandraScheduleStore, "_keep_owed_ahead", lambda self, record, due_ms, *rest, **named: due_ms
    )
    report = simulate(tables_history_outage_world(1001))
    assert any(v.kind == "lost" for v in report.violations), report.violations[:3]
