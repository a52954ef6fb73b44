"""The leader and workers on a simulated clock: minutes of schedule in a second."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from pysched import native
from pysched.catchup import next_run
from pysched.clock import ManualClock
from pysched.leader import LeaderConfig, PartitionLeader, RunDispatched, SyncDriver
from pysched.leader.recording import record_sent
from pysched.model import Job
from pysched.node import open_embedded
from pysched.protocols import (
    ClaimOutcome,
    Coordinator,
    Dispatcher,
    Fences,
    PlannedRun,
    Run,
    ScheduleStore,
)
from pysched.registry import register
from pysched.worker import WorkerPool

T0 = 1_800_000_000_000  # on a whole minute


def drive(leader: PartitionLeader, end_ms: int) -> None:
    """Run the leader's parts on this thread until ``end_ms`` on its clock."""
    SyncDriver(leader).run_until(end_ms)


def job(spec: dict[str, object]) -> Job:
    return Job.model_validate({"target": {"kind": "shell", "command": "true"}, **spec})


def run_leader(tmp_path: Path, jobs: list[Job], end_ms: int, config: LeaderConfig) -> list[RunDispatched]:
    backends = open_embedded(tmp_path / "leader.db")
    for j in jobs:
        register(backends.store, j, T0)
    clock = ManualClock(T0)
    events: list[RunDispatched] = []
    leader = PartitionLeader(
        backends.store, backends.coordinator, backends.dispatcher, clock, "node-a", config, events.append
    )
    drive(leader, end_ms)
    return events


def test_a_simulated_ten_minutes_fires_every_run_once_on_time(tmp_path: Path) -> None:
    jobs = [
        job({"id": "every-10s", "schedule": {"kind": "cron", "expr": "*/10 * * * * *"}, "critical": True}),
        job({"id": "minutely", "schedule": {"kind": "cron", "expr": "* * * * *"}}),
        job({"id": "once", "schedule": {"kind": "once", "run_at_ms": T0 + 95_005}}),
    ]
    # Reload every second with a 60 s horizon: each run is loaded ~60 times.
    config = LeaderConfig(reload_every_ms=1_000, tick_ms=10)
    end = T0 + 600_005
    events = run_leader(tmp_path, jobs, end, config)
    offset = native.jitter_offset("minutely", 60_000)
    minutely = sum(1 for k in range(1, 11) if T0 + k * 60_000 + offset < end)
    by_job = Counter(e.job_id for e in events)
    assert by_job == {"every-10s": 60, "minutely": minutely, "once": 1}
    assert max(Counter((e.job_id, e.run_at_ms) for e in events).values()) == 1
    for e in events:
        assert 0 <= e.dispatched_at_ms - e.due_ms < config.tick_ms, e
    # The minutely job is jittered deterministically inside its 60 s window.
    offsets = {e.due_ms - e.run_at_ms for e in events if e.job_id == "minutely"}
    assert offsets == {offset}
    assert {e.run_at_ms % 10_000 for e in events if e.job_id == "every-10s"} == {0}


def test_a_run_missed_while_down_fires_once_then_the_schedule_resumes(tmp_path: Path) -> None:
    backends = open_embedded(tmp_path / "leader.db")
    register(backends.store, job({"id": "m", "schedule": {"kind": "cron", "expr": "* * * * *"}, "critical": True}), T0)
    # The node comes up 10 minutes after the job's first run was due.
    clock = ManualClock(T0 + 10 * 60_000 + 30_000)
    events: list[RunDispatched] = []
    leader = PartitionLeader(
        backends.store,
        backends.coordinator,
        backends.dispatcher,
        clock,
        "n",
        LeaderConfig(),
        events.append,
    )
    drive(leader, T0 + 13 * 60_000 + 30_000)
    assert [e.run_at_ms for e in events] == [T0 + 60_000, T0 + 11 * 60_000, T0 + 12 * 60_000, T0 + 13 * 60_000]


def test_a_stale_leaders_dispatch_is_fenced(tmp_path: Path) -> None:
    backends = open_embedded(tmp_path / "leader.db", lease_ttl_ms=1_000)
    register(backends.store, job({"id": "o", "schedule": {"kind": "once", "run_at_ms": T0 + 100}}), T0)
    old = backends.coordinator.poll("old", T0)
    assert old
    rows = backends.store.due_runs(old, T0 + 60_000, T0 + 100)
    sent = list(rows)
    stale_payload = native.encode_batch(sent, old[0], T0 + 100)[0]
    record_sent(backends.store, sent, old, {}, T0 + 100)
    # The old leader pauses past its lease; another node takes over.
    new = backends.coordinator.poll("new", T0 + 5_000)
    assert new and all(new[p] > old[p] for p in old)
    clock = ManualClock(T0 + 5_000)
    pool = WorkerPool(backends.dispatcher, backends.claims, backends.store, clock, "w")
    assert pool.handle(stale_payload) is ClaimOutcome.FENCED
    assert backends.store.history("o")[0].state == "dispatched"  # not run
    # The new leader hands the run on again under its fence and it runs once.
    again = backends.store.due_runs(new, T0 + 60_000, T0 + 5_000)
    sent = list(again)
    record_sent(backends.store, sent, new, {}, T0 + 5_000)
    payload = native.encode_batch(sent, new[0], T0 + 5_000)[0]
    assert pool.handle(payload) is ClaimOutcome.CLAIMED
    assert pool.handle(payload) is ClaimOutcome.SUCCEEDED
    assert [r.state for r in backends.store.history("o")] == ["succeeded"]
    assert pool.counts == {"fenced": 1, "claimed": 1, "succeeded": 2}


class TrailingStore:
    """A store whose watermark is stuck (its recording fell behind): every
    run it ever returned comes back on each read, as Cassandra's schedule
    does until the watermark passes it (test double around the real store)."""

    def __init__(self, store: ScheduleStore) -> None:
        self._store = store
        self._returned: dict[int, Run] = {}

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def due_runs(self, fences: Fences, horizon_ms: int, now_ms: int) -> list[Run]:
        for row in self._store.due_runs(fences, horizon_ms, now_ms):
            self._returned.setdefault(row.run_id, row)
        return sorted(self._returned.values(), key=lambda r: (r.due_ms, r.run_id))


def test_a_trailing_watermark_resends_nothing(tmp_path: Path) -> None:
    backends = open_embedded(tmp_path / "leader.db")
    register(backends.store, job({"id": "once", "schedule": {"kind": "once", "run_at_ms": T0 + 5_000}}), T0)
    register(backends.store, job({"id": "m", "schedule": {"kind": "cron", "expr": "* * * * *"}, "critical": True}), T0)
    events: list[RunDispatched] = []
    leader = PartitionLeader(
        TrailingStore(backends.store),  # type: ignore[arg-type]
        backends.coordinator,
        backends.dispatcher,
        ManualClock(T0),
        "n",
        LeaderConfig(reload_every_ms=1_000),
        events.append,
    )
    drive(leader, T0 + 6 * 60_000)
    # Minutes after each run was sent, the store still returns it: it is
    # never sent again.
    assert [(e.job_id, e.run_at_ms) for e in events] == [("once", T0 + 5_000)] + [
        ("m", T0 + k * 60_000) for k in range(1, 6)
    ]


def test_a_run_jittered_to_the_end_of_its_minute_misses_no_later_run(tmp_path: Path) -> None:
    # Its runs are due 59.993 s after each minute: each one fires after the
    # next minute began, whose run is still 59.993 s ahead and must not be
    # taken for missed.
    late = job({"id": "late-3668", "schedule": {"kind": "cron", "expr": "* * * * *"}, "jitter_window_s": 60})
    assert native.jitter_offset(late.id, 60_000) == 59_993
    events = run_leader(tmp_path, [late], T0 + 6 * 60_000 + 1_000, LeaderConfig())
    assert [e.run_at_ms for e in events] == [T0 + k * 60_000 for k in range(1, 6)]
    assert {e.dispatched_at_ms - e.due_ms for e in events} <= set(range(10))


def test_the_next_run_counts_from_due_times() -> None:
    minutely = job({"id": "m", "schedule": {"kind": "cron", "expr": "* * * * *"}})
    # Sent 12 ms after a due time 59.993 s past its minute: the next minute is next.
    assert next_run(minutely, 59_993, T0, T0 + 60_005)[0] == PlannedRun(T0 + 60_000, T0 + 119_993)
    # Ten minutes down: the next run still ahead, none of those missed.
    assert next_run(minutely, 30_000, T0, T0 + 10 * 60_000 + 45_000)[0] == PlannedRun(
        T0 + 11 * 60_000, T0 + 11 * 60_000 + 30_000
    )
    assert next_run(minutely, 0, T0, T0 + 10 * 60_000 + 5)[0] == PlannedRun(T0 + 11 * 60_000, T0 + 11 * 60_000)


class DownUntil:
    """The in-process dispatcher, failing every publish before ``until_ms``
    (a broker outage; test double around the real dispatcher)."""

    def __init__(self, dispatcher: Dispatcher, clock: ManualClock, until_ms: int) -> None:
        self._dispatcher = dispatcher
        self._clock = clock
        self._until_ms = until_ms

    def __getattr__(self, name: str) -> object:
        return getattr(self._dispatcher, name)

    def publish(self, partitions: Sequence[int], payloads: Sequence[bytes]) -> None:
        if self._clock.now_ms() < self._until_ms:
            raise ConnectionError("broker unreachable")
        self._dispatcher.publish(partitions, payloads)


def test_runs_overdue_through_an_outage_are_sent_once_after_it(tmp_path: Path) -> None:
    # While publishing failed, every reload added the overdue runs to the
    # retry list once more: after recovery each was sent once per reload.
    backends = open_embedded(tmp_path / "leader.db")
    for k in range(3):
        register(backends.store, job({"id": f"o{k}", "schedule": {"kind": "once", "run_at_ms": T0 + 1_000 + k}}), T0)
    clock = ManualClock(T0)
    events: list[RunDispatched] = []
    leader = PartitionLeader(
        backends.store,
        backends.coordinator,
        DownUntil(backends.dispatcher, clock, T0 + 20_000),  # type: ignore[arg-type]
        clock,
        "n",
        LeaderConfig(reload_every_ms=1_000),
        events.append,
    )
    drive(leader, T0 + 30_000)
    assert Counter(e.job_id for e in events) == {"o0": 1, "o1": 1, "o2": 1}
    assert backends.dispatcher.qsize() == 3


class UnreachableBetween:
    """The real coordinator, unreachable from ``start_ms`` to ``end_ms``
    (test double around it)."""

    def __init__(self, coordinator: Coordinator, clock: ManualClock, start_ms: int, end_ms: int) -> None:
        self._coordinator = coordinator
        self._clock = clock
        self._start_ms = start_ms
        self._end_ms = end_ms

    def __getattr__(self, name: str) -> object:
        return getattr(self._coordinator, name)

    def poll(self, holder: str, now_ms: int) -> dict[int, int]:
        if self._start_ms <= self._clock.now_ms() < self._end_ms:
            raise ConnectionError("coordinator unreachable")
        return self._coordinator.poll(holder, now_ms)


def test_a_leader_that_cannot_prove_its_lease_stops_dispatching_until_it_can(tmp_path: Path) -> None:
    # It kept leading on its last answer for as long as the coordinator
    # was unreachable, while others may have taken its partitions.
    backends = open_embedded(tmp_path / "leader.db")
    register(backends.store, job({"id": "s", "schedule": {"kind": "cron", "expr": "* * * * * *"}}), T0)
    clock = ManualClock(T0)
    coordinator = UnreachableBetween(backends.coordinator, clock, T0 + 10_000, T0 + 40_000)
    events: list[RunDispatched] = []
    leader = PartitionLeader(
        backends.store,
        coordinator,  # type: ignore[arg-type]
        backends.dispatcher,
        clock,
        "n",
        LeaderConfig(),
        events.append,
    )
    drive(leader, T0 + 60_000)
    # The last answer came from a poll begun before T0 + 10 s.
    valid_until = T0 + 10_000 + backends.coordinator.answer_valid_ms
    sent_at = [e.dispatched_at_ms for e in events]
    assert not [t for t in sent_at if valid_until <= t < T0 + 40_000]
    # On its last answer while that held, and again once it was answered.
    assert max(t for t in sent_at if t < T0 + 40_000) > T0 + 10_000
    assert len([t for t in sent_at if t >= T0 + 40_000]) >= 19


def test_a_job_whose_stored_definition_no_longer_validates_holds_up_no_other(tmp_path: Path) -> None:
    # Issue 10, hole 8: its spec failing to parse made each batch it was in
    # fail for ever, and every batch behind it waited; its runs' deliveries
    # were retried for ever by the worker that took them.
    backends = open_embedded(tmp_path / "leader.db")
    for job_id in ("good", "bad"):
        register(
            backends.store, job({"id": job_id, "schedule": {"kind": "cron", "expr": "* * * * *"}, "critical": True}), T0
        )
    with backends.db.transaction() as conn:
        conn.execute("UPDATE jobs SET spec = ? WHERE job_id = 'bad'", ('{"id": "bad", "schedule": {"kind": "x"}}',))
    clock = ManualClock(T0)
    events: list[RunDispatched] = []
    leader = PartitionLeader(
        backends.store, backends.coordinator, backends.dispatcher, clock, "n", LeaderConfig(), events.append
    )
    drive(leader, T0 + 3 * 60_000 + 1_000)
    assert [e.run_at_ms for e in events if e.job_id == "good"] == [T0 + k * 60_000 for k in (1, 2, 3)]
    assert [e.run_at_ms for e in events if e.job_id == "bad"] == [T0 + 60_000]
    pool = WorkerPool(backends.dispatcher, backends.claims, backends.store, clock, "w")
    while (delivery := backends.dispatcher.take(0)) is not None:
        pool.handle(delivery.payload)
    (bad,) = [r for r in backends.store.last_runs(["bad"]).values()]
    assert bad.state == "failed" and bad.error is not None and "no longer validates" in bad.error
