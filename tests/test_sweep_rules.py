"""The sweep's rules (protocols.sweep_verdict, owed_behind_mark,
buckets_due), one case per branch: every store decides by them."""

from __future__ import annotations

import pytest

from pysched.protocols import (
    DEAD_CLAIM_AFTER_MS,
    SWEEP_BUCKET_MS,
    SWEEP_LOOKBACK_MS,
    ClaimSeen,
    SweepVerdict,
    buckets_due,
    look_bucket,
    owed_behind_mark,
    sweep_verdict,
)

NOW = 1_800_000_000_000
LONG_AGO = NOW - DEAD_CLAIM_AFTER_MS
LATELY = LONG_AGO + 1
DROP, AGAIN, OWE = SweepVerdict.DROP, SweepVerdict.LOOK_AGAIN, SweepVerdict.OWE
RECORD = SweepVerdict.RECORD_FAILURE
KEPT = '{"failure":"...","retry_due_ms":null,"delivery":1,"due_ms":0}'  # what the verdict is given, never read


def running(alive_until: int, delivery: int = 1) -> ClaimSeen:
    return ClaimSeen("running", NOW - 120_000, delivery, alive_until)


@pytest.mark.parametrize(
    ("state", "handed_on", "delivery", "looked_for", "claim", "verdict"),
    [
        # Handed on again since: looked at for that delivery.
        ("running", True, 2, 1, running(LONG_AGO), DROP),
        # Ended, owed by a row of its own, or never handed on.
        ("succeeded", True, 1, 1, running(LONG_AGO), DROP),
        ("retrying", True, 1, 1, running(LONG_AGO), DROP),
        ("parked", True, 1, 1, running(LONG_AGO), DROP),
        ("scheduled", False, 1, 1, running(LONG_AGO), DROP),
        # Not claimed yet, for this delivery: the dispatcher's still.
        ("scheduled", True, 1, 1, None, AGAIN),
        ("scheduled", True, 2, 2, running(LONG_AGO, delivery=1), AGAIN),
        # Held alive, or dead too lately.
        ("running", True, 1, 1, running(NOW + 10_000), AGAIN),
        ("running", True, 1, 1, running(LATELY), AGAIN),
        ("interrupted", True, 1, 1, ClaimSeen("released", LATELY, 1, 0), AGAIN),
        # Dead long enough: owed again.
        ("running", True, 1, 1, running(LONG_AGO), OWE),
        ("scheduled", True, 1, 1, running(LONG_AGO), OWE),
        ("interrupted", True, 1, 1, ClaimSeen("released", LONG_AGO, 1, 0), OWE),
        ("running", True, 1, 1, ClaimSeen("succeeded", LONG_AGO, 1, 0), OWE),
        # A failed claim without its failure (kept before claims kept it).
        ("running", True, 1, 1, ClaimSeen("failed", LONG_AGO, 1, 0), OWE),
        # A failed claim keeping its failure: the failure is recorded, the
        # failed delivery never owed again; not before its worker's own
        # write has had DEAD_CLAIM_AFTER_MS to land.
        ("running", True, 1, 1, ClaimSeen("failed", LONG_AGO, 1, 0, KEPT), RECORD),
        ("running", True, 1, 2, ClaimSeen("failed", LONG_AGO, 2, 0, KEPT), RECORD),
        ("running", True, 1, 1, ClaimSeen("failed", LATELY, 1, 0, KEPT), AGAIN),
        # A released claim is let go of with no outcome: owed again.
        ("running", True, 1, 1, ClaimSeen("released", LONG_AGO, 1, 0), OWE),
    ],
)
def test_the_sweeps_verdict(
    state: str, handed_on: bool, delivery: int, looked_for: int, claim: ClaimSeen | None, verdict: SweepVerdict
) -> None:
    assert sweep_verdict(state, handed_on, delivery, looked_for, claim, NOW) is verdict


def test_a_row_behind_the_mark_owes_its_run_only_where_the_run_is_due_and_waits() -> None:
    assert owed_behind_mark("retrying", True, 500, 500)
    assert owed_behind_mark("parked", True, 500, 500)
    assert owed_behind_mark("scheduled", False, 500, 500)
    assert not owed_behind_mark("scheduled", True, 500, 500)  # handed on
    assert not owed_behind_mark("retrying", True, 900, 500)  # placed again elsewhere
    assert not owed_behind_mark("running", True, 500, 500)
    assert not owed_behind_mark("succeeded", True, 500, 500)


def test_a_sweep_reads_each_bucket_once_a_bucket_after_it_ended() -> None:
    first = buckets_due(None, NOW)
    assert first.start == look_bucket(NOW - SWEEP_LOOKBACK_MS)
    assert first.stop == look_bucket(NOW) - 1
    assert buckets_due(first.stop - 1, NOW) == range(first.stop, first.stop)
    assert buckets_due(first.stop - 1, NOW + SWEEP_BUCKET_MS) == range(first.stop, first.stop + 1)
