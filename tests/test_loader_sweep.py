"""The leader's periodic read, a sweep of a few partitions at a time: each
partition led is read again within ``reload_every_ms``, no read but the
first takes them all, and what a read of some partitions finds changes
nothing of the others."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

from pysched.clock import ManualClock
from pysched.leader import LeaderConfig, PartitionLeader, RunDispatched, SyncDriver
from pysched.leader.cache import RunCache
from pysched.leader.loading import Loaded, Loader
from pysched.model import Job
from pysched.node import open_embedded
from pysched.protocols import NEAR_MS, Fences, Run, ScheduleStore
from pysched.registry import register

T0 = 1_800_000_000_000
PARTITIONS = 64


class ReadsSeen:
    """The store, noting which partitions each read of due runs took; its
    reads fail while ``down`` (start, end) holds the time read at."""

    def __init__(self, store: ScheduleStore, down: tuple[int, int] = (0, 0)) -> None:
        self.store = store
        self.down = down
        self.reads: list[tuple[int, frozenset[int]]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def due_runs(self, fences: Fences, horizon_ms: int, now_ms: int) -> list[Run]:
        if self.down[0] <= now_ms < self.down[1]:
            raise TimeoutError("the store is down")
        self.reads.append((now_ms, frozenset(fences)))
        return self.store.due_runs(fences, horizon_ms, now_ms)


def sweep(tmp_path: Path, end: int, down: tuple[int, int] = (0, 0)) -> ReadsSeen:
    backends = open_embedded(tmp_path / "pysched.db", partitions=PARTITIONS)
    store = ReadsSeen(backends.store, down)
    fences = {p: 1 for p in range(PARTITIONS)}
    config = LeaderConfig()
    loader = Loader(store, config, lambda: fences, lambda: 0)  # type: ignore[arg-type]
    for now in range(T0, end, config.change_poll_ms):
        loader.step(now)
    backends.close()
    return store


def read_times(store: ReadsSeen, partition: int, end: int) -> list[int]:
    return [at for at, parts in store.reads if partition in parts] + [end]


def test_each_partition_is_read_again_within_reload_every_ms_a_few_at_a_time(tmp_path: Path) -> None:
    reload_every = LeaderConfig().reload_every_ms
    end = T0 + 3 * reload_every
    store = sweep(tmp_path, end)
    first, *rest = store.reads
    assert first == (T0, frozenset(range(PARTITIONS)))  # at start, all at once
    assert rest and max(len(parts) for _, parts in rest) <= 3
    for p in range(PARTITIONS):
        assert max(b - a for a, b in pairwise(read_times(store, p, end))) <= reload_every, p


def test_a_sweep_held_up_by_a_store_outage_catches_up_at_once(tmp_path: Path) -> None:
    reload_every = LeaderConfig().reload_every_ms
    end = T0 + 3 * reload_every
    down = (T0 + 5_000, T0 + 40_000)
    store = sweep(tmp_path, end, down)
    back = min(at for at, _ in store.reads if at >= down[1])
    for p in range(PARTITIONS):
        for a, b in pairwise(read_times(store, p, end)):
            # Only a gap the outage made is longer, and it ends when the store is back.
            assert b - a <= reload_every or (a < down[0] and b == back), (p, a - T0, b - T0)


def test_a_run_registered_too_far_ahead_for_a_change_notice_fires_on_time(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    backends = open_embedded(tmp_path / "pysched.db", partitions=PARTITIONS, clock=clock)
    fired: list[RunDispatched] = []
    config = LeaderConfig()
    leader = PartitionLeader(
        backends.store, backends.coordinator, backends.dispatcher, clock, "leader", config, fired.append
    )
    driver = SyncDriver(leader)

    def run_until(end_ms: int) -> None:
        while (now := clock.now_ms()) < end_ms:
            driver.round(now)
            clock.advance(10)

    run_until(T0 + 1_000)  # read every partition: nothing yet
    # Due past NEAR_MS: its registration tells the leader nothing, the sweep finds it.
    due = {f"far-{k}": T0 + 1_000 + NEAR_MS + 100 * k for k in range(1, 40)}
    for job_id, at in due.items():
        job = {
            "id": job_id,
            "schedule": {"kind": "once", "run_at_ms": at},
            "target": {"kind": "shell", "command": "true"},
        }
        register(backends.store, Job.model_validate(job), T0 + 1_000)
    run_until(T0 + 1_000 + NEAR_MS + 5_000)
    assert {e.job_id: e.run_at_ms for e in fired} == due
    assert all(0 <= e.dispatched_at_ms - e.due_ms < config.tick_ms for e in fired)
    backends.close()


def _run(run_id: int, partition: int) -> Run:
    return Run(run_id, f"job-{run_id}", T0 + 10_000, T0 + 10_000, partition, 1, 0)


def test_a_read_of_some_partitions_drops_only_their_runs_gone_from_the_store() -> None:
    cache = RunCache(T0, catch_up_rate=100)
    fences = {0: 1, 1: 1, 2: 1}
    horizon = T0 + 60_000
    cache.apply(Loaded(fences, [_run(1, 0), _run(2, 1), _run(3, 2)], horizon, 0, True, T0), fences)
    # A sweep of partition 1 alone: run 2 was cancelled; runs 1 and 3 were not read.
    cache.apply(Loaded({1: 1}, [], horizon, 0, True, T0 + 1_000), fences)
    assert sorted(row.run_id for row in cache.take_due(T0 + 10_000, fences, with_overdue=False)) == [1, 3]
