"""How long run history is kept, and the background pass that prunes it.

A finished run (succeeded, failed, cancelled, missed) goes when it ended more than
``days`` ago or when its job has ``keep_per_job`` newer finished runs,
whichever comes first. A scheduled, dispatched or running run is never
pruned, nor the newest finished run of a job: ``show`` always has a last run
to report.

The defaults, 7 days and 1,000 runs per job, sit between what schedulers
people know keep: Celery's results expire after a day, Temporal keeps closed
workflows 3 days by default (30 on its cloud), a Kubernetes CronJob keeps its
last 3 jobs. A week covers a weekly job's last run and an incident looked at
after a weekend; 1,000 runs bound the rows of a job firing every second to
about 17 minutes of history instead of 86,400 rows a day.

A pruned run's claim outlives its history: Kafka may deliver a dispatch
record again for as long as it keeps it (a rebalance, a consumer whose
commits stalled, a group whose offsets expired and start again from the
earliest record), under a fence that may still be its partition's, and
Redis may have lost what it knew. Without the claim the record would be
claimed anew and its run run again. So pruning turns the claim into a
tombstone (state ``pruned``: no holder, result or checkpoint), which a
claim answers with ClaimOutcome.PRUNED, and deletes it only once no record
of the run can be delivered any more: ``PRUNED_CLAIM_KEPT_MS`` after the
pruning. The topic keeps a record ``DISPATCH_RETENTION_MS`` after its
append (dispatch/kafka.py sets it on the topic); the broker deletes a whole
segment at a time, once its newest record is that old, so a record lives at
most one segment's span (``DISPATCH_SEGMENT_MS``) longer, and the broker
looks every 5 minutes (log.retention.check.interval.ms). The records of a
pruned run were appended before it was pruned: it had ended, and a leader
hands on only runs owed. Storage stays bounded: at most the claims
of the runs pruned in the last ``PRUNED_CLAIM_KEPT_MS``, each a key and a
state. The embedded engine's queue lives in its process, shorter than that.

Why not the other ways: refusing a record whose run the store no longer
knows costs a read of the run on every first delivery, and a run absent
from the history cannot be told from one whose row a racing write has not
landed yet; a per-partition "pruned through" mark is held back for good by
one run left unfinished.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass

from pysched.clock import Clock
from pysched.protocols import ScheduleStore

log = logging.getLogger("pysched.retention")

DAY_MS = 86_400_000
HOUR_MS = 3_600_000
# How long Kafka keeps a dispatch record: three days, a weekend's outage of
# every worker with room. A record not delivered by then is lost to Kafka.
DISPATCH_RETENTION_MS = 3 * DAY_MS
# The span of one segment of the dispatch topic (Kafka's default is 7 days,
# which would keep a record up to 7 days past its retention).
DISPATCH_SEGMENT_MS = HOUR_MS
# How long a pruned run's claim is kept as a tombstone: past the last time
# Kafka may deliver a record of it (the retention, a segment's span, and an
# hour for the broker's retention checks and clocks).
PRUNED_CLAIM_KEPT_MS = DISPATCH_RETENTION_MS + DISPATCH_SEGMENT_MS + HOUR_MS
BATCH_PAUSE_S = 0.02


@dataclass(frozen=True)
class Retention:
    days: int = 7  # 0: no age limit
    keep_per_job: int = 1_000  # 0: no count limit
    # A pass this often; history is allowed to overshoot by what accrues
    # between passes.
    every_ms: int = 300_000
    # Runs deleted per store call (one SQLite transaction): the leader's
    # writes queue behind each call, never behind a whole pass.
    batch: int = 2_000

    def __post_init__(self) -> None:
        if self.days < 0 or self.keep_per_job < 0 or self.every_ms <= 0 or self.batch <= 0:
            raise ValueError(f"retention out of range: {self}")

    @property
    def enabled(self) -> bool:
        return self.days > 0 or self.keep_per_job > 0


class HistoryPruner:
    """Prunes the history of the partitions a node leads, in the background."""

    def __init__(self, store: ScheduleStore, clock: Clock, retention: Retention) -> None:
        self.store = store
        self.clock = clock
        self.retention = retention

    def prune(self, partitions: Collection[int], stop: threading.Event | None = None) -> int:
        """One pass: batches until nothing is left to prune (or ``stop``).
        Returns how many runs were pruned."""
        r = self.retention
        if not r.enabled or not partitions:
            return 0
        before = self.clock.now_ms() - r.days * DAY_MS if r.days else None
        keep = r.keep_per_job or None
        total = 0
        pause = stop or threading.Event()
        while not pause.is_set():
            pruned = self.store.prune_history(partitions, before, keep, r.batch, self.clock.now_ms())
            total += pruned
            if pruned < r.batch:
                break
            # Let the writers that queued behind this batch go first.
            pause.wait(BATCH_PAUSE_S)
        return total

    def run(self, partitions: Callable[[], Collection[int]], stop: threading.Event) -> None:
        """A pass as soon as the node leads partitions, then every ``every_ms``."""
        if not self.retention.enabled:
            return
        while not stop.is_set():
            led = partitions()
            if not led:
                stop.wait(1.0)
                continue
            try:
                pruned = self.prune(led, stop)
            except Exception as exc:
                log.warning("pruning history failed, will retry: %s: %s", type(exc).__name__, exc)
            else:
                if pruned:
                    log.info("pruned %d finished runs from the history", pruned)
            stop.wait(self.retention.every_ms / 1000)
