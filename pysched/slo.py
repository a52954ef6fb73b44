"""A job's fire-lag objective against its runs: attainment, error budget and
burn rates, as an SRE reads them.

A run counts once it has been handed on (a run owed again, retrying or
parked, counts when it is handed on again): good when it left the
scheduler within the job's target fire lag of its due time. Attainment is
the share of good runs in the window; the error budget is the share of
runs the objective lets be late (1% for P99), and what remains of it is
1 - late / (budget x runs); a burn rate is the share of late runs over a
window divided by the budget (1: the budget is spent exactly by the end of
the objective's window; 14.4 over an hour: a month's budget gone in two
days). Only the runs the store keeps count (history retention: 7 days or
1,000 runs a job by default), and missed runs, which were never handed on,
are counted apart (`pysched show`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pysched.model import Job
from pysched.protocols import RunRecord, shows_an_earlier_dispatch

_DAY_MS = 86_400_000
# The windows burn rates are shown over: the short ones an alert reads.
BURN_WINDOWS_MS = (("1h", 3_600_000), ("6h", 6 * 3_600_000), ("3d", 3 * _DAY_MS))


@dataclass(frozen=True, slots=True)
class BurnRate:
    window: str
    runs: int
    late: int
    # None: no run in the window.
    rate: float | None


@dataclass(frozen=True, slots=True)
class SloReport:
    job_id: str
    fire_lag_ms: int
    objective: float
    window_days: int
    runs: int
    late: int
    # None when no run counts yet.
    attainment: float | None
    budget_remaining: float | None
    burn_rates: tuple[BurnRate, ...]
    # The due time of the oldest run counted: how far back the store's
    # history let the window reach.
    oldest_due_ms: int | None

    @property
    def met(self) -> bool | None:
        return None if self.attainment is None else self.attainment >= self.objective


def slo_report(job: Job, runs: Sequence[RunRecord], now_ms: int) -> SloReport:
    policy = job.slo
    target_ms = round(policy.fire_lag_s * 1000)
    budget = 1.0 - policy.objective
    window_start = now_ms - policy.window_days * _DAY_MS
    counted = [
        (r.due_ms, r.dispatched_at_ms - r.due_ms > target_ms)
        for r in runs
        if r.dispatched_at_ms is not None and not shows_an_earlier_dispatch(r) and window_start <= r.due_ms <= now_ms
    ]
    late = sum(1 for _, is_late in counted if is_late)
    burns = []
    for name, span_ms in BURN_WINDOWS_MS:
        inside = [is_late for due, is_late in counted if due >= now_ms - span_ms]
        late_inside = sum(inside)
        burns.append(BurnRate(name, len(inside), late_inside, late_inside / len(inside) / budget if inside else None))
    return SloReport(
        job_id=job.id,
        fire_lag_ms=target_ms,
        objective=policy.objective,
        window_days=policy.window_days,
        runs=len(counted),
        late=late,
        attainment=1.0 - late / len(counted) if counted else None,
        budget_remaining=1.0 - late / (budget * len(counted)) if counted else None,
        burn_rates=tuple(burns),
        oldest_due_ms=min((due for due, _ in counted), default=None),
    )
