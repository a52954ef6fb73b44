"""What a simulated world must show: every owed run executed exactly once,
none before its time, fences that only grow, and, once the faults stop,
every run on time again."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pysched import native
from pysched.memory.coordinator import Election, FenceGrant
from pysched.memory.dispatcher import Broker
from pysched.protocols import MissedRuns
from pysched.sim.faults import MAX_SKEW_MS
from pysched.sim.ledger import Ledger
from pysched.sim.workload import OwedRun

# Once the faults have stopped and this long has passed (a lease TTL, a
# coordinator answer, a reload and a claim lease running out), every run
# starts within LATE_BOUND_MS of its due time.
RECOVERY_MS = 60_000
LATE_BOUND_MS = 5_000


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str  # lost, doubled, unowed, early, late, fence
    detail: str
    at_ms: int  # world time it concerns


class FenceWatch:
    """Checks, as grants arrive, that each partition's fences only grow."""

    def __init__(self) -> None:
        self._seen = 0
        self._last: dict[int, int] = {}

    def check(self, grants: Sequence[FenceGrant]) -> Violation | None:
        for grant in grants[self._seen :]:
            self._seen += 1
            last = self._last.get(grant.partition, -1)
            if grant.fence <= last:
                return Violation(
                    "fence",
                    f"partition {grant.partition} granted fence {grant.fence} to {grant.holder} after {last}",
                    grant.at_ms,
                )
            self._last[grant.partition] = grant.fence
        return None


class LeaderWatch:
    """Checks, as records reach the broker, that each was handed on under a
    leader key alive when it was: a leader that kept leading on an expired
    answer (a pause past its lease, etcd unreachable) sends under a fence
    that no longer leads, and its workers' fence checks would hide it."""

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}  # broker partition -> records checked

    def check(self, broker: Broker, election: Election) -> Violation | None:
        for partition in range(broker.partitions):
            seen = self._seen.get(partition, 0)
            new = broker.records_since(partition, seen)
            self._seen[partition] = seen + len(new)
            for record in new:
                sent = native.decode(record.payload)
                if not election.leading_at(sent.partition, sent.fence, record.appended_at_ms):
                    return Violation(
                        "fence",
                        f"{sent.idempotency_key} handed on under fence {sent.fence} of partition {sent.partition},"
                        " whose leader key had stopped leading",
                        record.appended_at_ms,
                    )
        return None


def check_runs(
    owed: Iterable[OwedRun],
    owed_later: Iterable[OwedRun],
    ledger: Ledger,
    quiet_from_ms: int,
    missed: Mapping[str, Sequence[MissedRuns]] | None = None,
) -> tuple[list[Violation], int]:
    """``owed``: runs that must have executed by the end, or been recorded
    missed with a reason (``missed``: the store's spans by job);
    ``owed_later``: runs due too near the end to be judged, which may or may
    not have. Each run owed once; both are read once (a day's runs are
    millions: no set of them is kept). Returns the violations and how many
    runs owed were recorded missed: each nominal time ends in exactly one
    recorded outcome."""
    first_start = ledger.first_start
    first_try = ledger.first_try  # a flaky run is on time when its first attempt is
    spans = missed or {}
    out: list[Violation] = []
    known = 0  # runs owed that executed: every key the ledger holds, unless one is unowed
    missed_count = 0
    for run in owed:
        started = first_start.get(run.key)
        reason = _missed_reason(spans.get(run.job_id, ()), run.run_at_ms)
        if reason is not None:
            if started is not None:
                out.append(Violation("doubled", f"{run.key} ran and was also recorded missed ({reason})", started))
            else:
                missed_count += 1
            continue
        if started is None:
            out.append(Violation("lost", f"{run.key} (due {run.due_ms}) never ran", run.due_ms))
            continue
        known += 1
        n = ledger.count(run.key)
        if n > 1:
            out.append(Violation("doubled", f"{run.key} ran {n} times", run.due_ms))
        started = first_try.get(run.key, started)
        if started < run.due_ms - MAX_SKEW_MS:
            out.append(Violation("early", f"{run.key} started {run.due_ms - started} ms before its time", started))
        if run.due_ms >= quiet_from_ms + RECOVERY_MS and started - run.due_ms > LATE_BOUND_MS:
            out.append(
                Violation("late", f"{run.key} started {started - run.due_ms} ms late with no fault active", started)
            )
    owed_keys: set[str] | None = None
    later = list(owed_later)  # a couple of minutes' runs
    for run in later:
        if run.key in first_start:
            known += 1
        n = ledger.count(run.key)
        if n > 1:
            out.append(Violation("doubled", f"{run.key} ran {n} times", run.due_ms))
    if known < len(first_start):
        # Some run executed that nobody owes: name it, from the runs owed again.
        owed_keys = {run.key for run in owed} | {run.key for run in later}
        for key, started in first_start.items():
            if key not in owed_keys:
                out.append(Violation("unowed", f"{key} ran {ledger.count(key)} times but no schedule owes it", started))
    return sorted(out, key=lambda v: (v.at_ms, v.kind, v.detail)), missed_count


def _missed_reason(spans: Sequence[MissedRuns], run_at_ms: int) -> str | None:
    for span in spans:
        if span.first_ms <= run_at_ms < span.end_ms:
            return span.reason
    return None
