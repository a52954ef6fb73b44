"""Two hours with no scheduler up, on a simulated clock: the real leader and
worker on the memory engine come back to minutely jobs, and each catch-up
policy does what it says. Every schedule time of the outage ends in exactly
one recorded outcome: a run, or a missed count with its reason. The
catch-up lane never hands on more than its rate in any second, and runs due
now are not held behind it."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from pysched import cron
from pysched.clock import ManualClock
from pysched.leader import LeaderConfig, PartitionLeader, RunDispatched, SyncDriver
from pysched.memory import MemoryCluster, open_memory
from pysched.model import Job
from pysched.protocols import MissedRuns
from pysched.registry import register
from pysched.targets import RunContext
from pysched.worker import DeliveryWorker, Executor, WorkerConfig

T0 = 1_700_000_040_000  # a minute boundary
MINUTE = 60_000
HOUR = 60 * MINUTE
RATE = 50  # catch-up runs a second, low enough to be seen working


def noop(ctx: RunContext) -> None:
    pass


def minutely(job_id: str, policy: str, max_delay_s: float | None = None) -> Job:
    spec: dict[str, object] = {
        "id": job_id,
        "schedule": {"kind": "cron", "expr": "* * * * *"},
        "target": {"kind": "python", "ref": f"{__name__}:noop"},
        "jitter_window_s": 0,
        "catch_up": policy,
    }
    if max_delay_s is not None:
        spec["max_delay_s"] = max_delay_s
    return Job.model_validate(spec)


@dataclass
class Process:
    """One `pysched up`: a leader and a worker, stepped by the test."""

    cluster: MemoryCluster
    clock: ManualClock
    holder: str
    fired: list[RunDispatched] = field(default_factory=list)
    catch_up_rate: int = RATE

    def __post_init__(self) -> None:
        node = self.cluster.node()
        config = LeaderConfig(catch_up_rate=self.catch_up_rate)
        self.leader = PartitionLeader(
            node.store, node.coordinator, node.dispatcher, self.clock, self.holder, config, self.fired.append
        )
        self.driver = SyncDriver(self.leader)
        executor = Executor(node.claims, node.store, self.clock, self.holder, WorkerConfig())
        self.consumer = node.dispatcher.consumer()
        self.worker = DeliveryWorker(self.consumer, executor, random.Random(7))

    def run_for(self, ms: int) -> None:
        end = self.clock.now_ms() + ms
        while (now := self.clock.now_ms()) < end:
            self.driver.round(now)
            while self.worker.step(self.clock.now_ms()):
                pass
            self.clock.advance(10)

    def crash(self) -> None:
        """Gone without a word: its lease and its consumer's session run out."""
        self.consumer.crash()


def _times(job: Job, first_ms: int, end_ms: int) -> list[int]:
    assert job.schedule.kind == "cron"
    out, t = [], first_ms - 1
    while (t := cron.next_after(job.schedule.expr, "UTC", t) or end_ms) < end_ms:
        out.append(t)
    return out


def _missed_times(job: Job, spans: list[MissedRuns]) -> dict[int, str]:
    return {t: span.reason for span in spans for t in _times(job, span.first_ms, span.end_ms)}


def test_each_policy_after_a_two_hour_outage() -> None:
    clock = ManualClock(T0)
    cluster = open_memory(4, clock, dispatcher_partitions=1)
    jobs = {
        "run_once": minutely("once", "run_once"),
        "skip": minutely("skip", "skip"),
        "run_all": minutely("all", "run_all"),
        "deadline": minutely("deadline", "deadline", max_delay_s=600),
    }
    store = cluster.node().store
    for job in jobs.values():
        register(store, job, T0)
    before = Process(cluster, clock, "before")
    before.run_for(3 * MINUTE)  # runs at +1 and +2 min
    before.crash()
    clock.advance(2 * HOUR)  # nobody up
    back = clock.now_ms()
    after = Process(cluster, clock, "after")
    after.run_for(10 * MINUTE)
    end = clock.now_ms()

    outage = _times(jobs["run_all"], T0 + 3 * MINUTE, back)  # the 120 times nobody fired
    assert len(outage) == 120
    for policy, job in jobs.items():
        runs = {r.run_at_ms: r.state for r in store.history(job.id, 10_000)}
        missed = _missed_times(job, store.missed_runs([job.id]).get(job.id, []))
        assert not set(missed) & {t for t, s in runs.items() if s != "missed"}, policy
        # Every schedule time up to the last one fired: one outcome each.
        for t in _times(job, T0 + MINUTE, end - MINUTE):
            assert (runs.get(t) == "succeeded") != (t in missed), (policy, t, runs.get(t), missed.get(t))
        ran_in_outage = [t for t in outage if runs.get(t) == "succeeded"]
        missed_in_outage = [missed[t] for t in outage if t in missed]
        if policy == "run_once":
            # The first overdue time ran; the other 119 were skipped.
            assert ran_in_outage == outage[:1]
            assert missed_in_outage == ["skipped"] * 119
        elif policy == "skip":
            assert ran_in_outage == []
            assert missed_in_outage == ["skipped"] * 120
        elif policy == "run_all":
            assert ran_in_outage == outage
            assert missed_in_outage == []
        else:
            # The times less than 10 min old on the return ran (the one
            # exactly 10 min old is later than that once handed on), the rest
            # are past their deadline (the first overdue one, 2 h late, too).
            recent = [t for t in outage if t + 600_000 > back]
            assert ran_in_outage == recent and len(recent) == 9
            assert missed_in_outage == ["past_deadline"] * 111
    # The catch-up lane: never more than RATE in any one second.
    late = sorted(e.dispatched_at_ms for e in after.fired if e.dispatched_at_ms - e.due_ms > 60_000)
    assert len(late) >= 120
    assert max(sum(1 for t in late if s <= t < s + 1_000) for s in late) <= RATE


def test_the_catch_up_lane_keeps_its_rate_and_runs_due_now_go_first() -> None:
    clock = ManualClock(T0)
    cluster = open_memory(4, clock, dispatcher_partitions=1)
    store = cluster.node().store
    replaying = [minutely(f"all-{i}", "run_all") for i in range(20)]
    for job in replaying:
        register(store, job, T0)
    before = Process(cluster, clock, "before")
    before.run_for(90_000)
    before.crash()
    clock.advance(HOUR)
    back = clock.now_ms()
    # Registered on the return: its runs are due now, never late.
    punctual = minutely("punctual", "run_once")
    register(store, punctual, back)
    after = Process(cluster, clock, "after")
    after.run_for(2 * MINUTE)
    # 20 jobs x 60 missed times = 1,200 runs to replay at 50 a second: the
    # lane is still busy when the punctual job's runs come due.
    late = sorted(e.dispatched_at_ms for e in after.fired if e.dispatched_at_ms - e.due_ms > 60_000)
    assert len(late) >= RATE * 20
    assert max(sum(1 for t in late if s <= t < s + 1_000) for s in late) <= RATE
    on_time = [e for e in after.fired if e.job_id == "punctual"]
    assert len(on_time) == 2
    assert all(e.dispatched_at_ms - e.due_ms <= 20 for e in on_time), on_time
