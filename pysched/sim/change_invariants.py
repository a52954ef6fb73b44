"""The checks of a world whose workload changes its jobs: the rules are
in invariants.py's docstring; what each change owes, in owed_changes.py."""

from __future__ import annotations

from collections.abc import Collection

from pysched.sim.invariants import Violation
from pysched.sim.ledger import Ledger
from pysched.sim.owed_changes import ChangedOwed


def check_changes(ledger: Ledger, owed: ChangedOwed, horizon_ms: int) -> list[Violation]:
    """No run starts once a change took its schedule away, nor while its
    job is paused, but one a worker may have taken before the pause
    (ordered by the calls made: Ledger.first_call); each redrive before
    ``horizon_ms`` brought a new attempt of its run."""
    out: list[Violation] = []
    first_call = ledger.first_call
    for key, calls_before in owed.superseded.items():
        if first_call.get(key, 0) > calls_before:
            detail = f"{key} started after a change took its schedule away"
            out.append(Violation("changed", detail, _first_start(ledger, key)))
    for job_id, pauses in owed.pauses.items():
        prefix = f"{job_id}:"
        for key, n in first_call.items():
            if not (key.startswith(prefix) and key.endswith(":0")):
                continue
            for pause in pauses:
                if pause.from_call < n <= pause.until_call and key not in pause.taken_before:
                    detail = f"{key} started while its job was paused ({pause.at_ms}, resumed {pause.until_ms})"
                    out.append(Violation("paused", detail, _first_start(ledger, key)))
    for key, at in owed.redriven:
        calls = ledger.tries.get(key, ())
        if at <= horizon_ms and not any(started >= at for _, started in calls) and key not in ledger.first_start:
            out.append(Violation("redrive", f"{key} was redriven at {at} and never called again", at))
    return sorted(out, key=lambda v: (v.at_ms, v.kind, v.detail))


def _first_start(ledger: Ledger, key: str) -> int:
    """When the run of ``key`` first called its downstream, failing or not."""
    calls = [at for at in (ledger.first_try.get(key), ledger.first_start.get(key)) if at is not None]
    return min(calls, default=0)


def check_exclusive(ledger: Ledger, exclusive: Collection[str]) -> list[Violation]:
    """No two calls of a job whose overlap policy is not allow are under way
    at once (``exclusive``: those jobs)."""
    out: list[Violation] = []
    for job_id in sorted(exclusive):
        # The call under way longest so far: a later one that starts before
        # it ends overlaps it (calls of one run are one run's, taken over).
        longest: tuple[int, str] | None = None
        for start, end, key in sorted(ledger.spans.get(job_id, ())):
            if longest is not None and start < longest[0] and key != longest[1]:
                detail = f"{key} started {longest[0] - start} ms before {longest[1]} ended"
                out.append(Violation("overlap", detail, start))
            if longest is None or end > longest[0]:
                longest = (end, key)
    return out
