"""A failed delivery's end kept on its claim (ClaimedFailure), written into
its run's history when the history lacks it: its worker died, or its write
was refused, between the two. The executor does it for the next delivery it
claims; the leader's sweep for a run no delivery will come for. One rule
for both, so a failure recorded by either is the failure its worker chose:
the same attempt, the same retry or dead letter."""

from __future__ import annotations

import logging

from pysched.protocols import ClaimedFailure, RunNotFound, ScheduleStore
from pysched.records import DispatchRecord

log = logging.getLogger(__name__)


def record_kept_failure(store: ScheduleStore, record: DispatchRecord, text: str, now_ms: int) -> ClaimedFailure | None:
    """Write the failure ``text`` (ClaimedFailure.to_json) kept on the claim
    of ``record``'s run into its history, unless the history has that
    attempt already (a worker whose write was merely slow wrote it: a
    failure is recorded once per attempt). Returns the failure written,
    None when nothing was."""
    try:
        claimed = ClaimedFailure.from_json(text)
    except (ValueError, KeyError, TypeError):
        # A claim completed before claims kept their failure: the history
        # was written after it, or the run is taken over as lost.
        return None
    failure = claimed.failure
    try:
        run = store.get_run(record.job_id, record.run_at_ms, record.attempt_group)
    except RunNotFound:
        return None
    if any(f.attempt == failure.attempt for f in run.failures):
        return None
    failed, retry_due_ms = claimed.written_as(record, now_ms)
    store.run_failed(failed, failure, retry_due_ms)
    log.warning(
        "recorded attempt %d of %s failed, as its claim kept it (its worker died before the history had it)",
        failure.attempt,
        record.idempotency_key,
    )
    return claimed
