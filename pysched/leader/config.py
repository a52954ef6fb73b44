"""What a partition leader is told, and what it tells observers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pysched.config import DEFAULT_CATCH_UP_RATE
from pysched.protocols import NEAR_MS, Run


@dataclass(frozen=True)
class LeaderConfig:
    horizon_ms: int = 60_000
    reload_every_ms: int = 30_000
    tick_ms: int = 10
    change_poll_ms: int = 100
    # How often the leader looks for a running run whose worker's lease ran
    # out (the embedded engine hands such runs on; ScheduleStore.next_lease_expiry).
    lease_check_ms: int = 1_000
    coordinate_every_ms: int = 1_000
    # How often the leader sweeps for runs nothing else would hand on again
    # (ScheduleStore.sweep_owed): the store groups the runs to look at in
    # buckets of as long (SWEEP_BUCKET_MS), so a sweep reads about one
    # bucket per partition led, and a dead worker's run waits at most this
    # long past the sweep's own grace.
    sweep_every_ms: int = 10_000
    # How often quiet partitions' watermarks are moved up to now: what a new
    # leader may send again after a failover.
    watermark_every_ms: int = 5_000
    standby_poll_ms: int = 500
    retry_backoff_ms: tuple[int, ...] = (100, 200, 500, 1_000, 2_000, 5_000)
    # A run more than this overdue when its time comes round (the leader
    # was down, its partition moved) goes through the catch-up lane: handed
    # on after the runs due now, at most catch_up_rate a second.
    catch_up_after_ms: int = 60_000
    catch_up_rate: int = DEFAULT_CATCH_UP_RATE

    def __post_init__(self) -> None:
        if self.catch_up_rate < 1:
            raise ValueError(f"catch_up_rate must be at least 1 run a second; got {self.catch_up_rate}")
        # Registrations due later than NEAR_MS send no change notice: the
        # periodic read of their partition must come round before they are due.
        if self.reload_every_ms >= NEAR_MS or self.horizon_ms < NEAR_MS:
            raise ValueError(
                f"reload_every_ms must be under {NEAR_MS} and horizon_ms at least {NEAR_MS}:"
                " runs registered further ahead are found by the periodic read alone"
            )

    def backoff_ms(self, failures: int) -> int:
        """The wait after ``failures`` consecutive failed attempts (>= 1)."""
        return self.retry_backoff_ms[min(failures - 1, len(self.retry_backoff_ms) - 1)]


@dataclass(frozen=True)
class RunDispatched:
    """Past-tense event for observers (the CLI logs it; tests count it)."""

    job_id: str
    run_id: int
    run_at_ms: int
    due_ms: int
    dispatched_at_ms: int
    fence: int
    attempt: int


@dataclass(frozen=True)
class BatchDispatched:
    """Past-tense event for observers that count (metrics): a batch handed
    on at ``dispatched_at_ms``, told once, as RunDispatched is, but as one
    call: a 50,000-run burst is counted without 50,000 calls."""

    rows: Sequence[Run]
    dispatched_at_ms: int
