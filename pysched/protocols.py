"""The contracts every backend implements, embedded and distributed alike.

The scheduler core (leader, worker, planning) speaks only to these; a
backend module is imported only where a node is assembled.
"""

from __future__ import annotations

import enum
import json
import logging
import threading
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

from pysched.model import Job, Overlap
from pysched.overlap import RunningSlot, SlotHold, SlotTake
from pysched.records import DispatchRecord, idempotency_key, run_id_for


class JobExists(ValueError):
    """A job with this id is already registered."""

    @classmethod
    def for_state(cls, job_id: str, state: str) -> JobExists:
        """The refusal, saying why when the job there has completed: it
        keeps its id and history (trigger runs it again). A cancelled job's
        id may be registered again, as a new job (``replaced_runs``)."""
        if state == "completed":
            return cls(f"job {job_id!r} was {state} and keeps its id and history; register the new job under a new id")
        return cls(f"job {job_id!r} already exists")


# Run states of a run that was never handed on (or was held, or cancelled
# before it was): nothing outside the store has seen its identity.
_NEVER_HANDED_ON = frozenset({"scheduled", "paused", "cancelled"})


def replaced_runs(
    job_id: str, old_runs: Collection[tuple[int, str, int | None]], first: PlannedRun | None, now_ms: int
) -> int:
    """The ``runs_since_ms`` of a job registered in place of a cancelled
    one, whose runs are ``old_runs`` (run_at_ms, state, dispatched_at_ms):
    the new job's runs are all at or after it (its first run's time, or its
    registration), and each run of the old job a worker may have met is
    before it. So the new job's idempotency keys are never the old job's,
    and a record of the old job still travelling (a dispatch, a late
    outcome) is told by its run time alone. Raises JobExists when the new
    job's first run would come at or before a run of the old job that was
    handed on (a one-shot declared again at the time it ran)."""
    since = now_ms if first is None else min(now_ms, first.run_at_ms)
    used = [at for at, state, dispatched in old_runs if dispatched is not None or state not in _NEVER_HANDED_ON]
    if used and max(used) >= since:
        raise JobExists(
            f"job {job_id!r} was cancelled after its run at {max(used)} ms was handed on; a job taking its id"
            " must first run later than that: declare it under a new id or for a later time"
        )
    return since


def of_replaced_job(job: JobRecord, run_at_ms: int) -> bool:
    """Whether a run of ``job``'s id at ``run_at_ms`` was of the cancelled
    job it replaced (see replaced_runs): nothing of it is the job's."""
    return run_at_ms < job.runs_since_ms


class JobNotFound(LookupError):
    """No job with this id."""


class JobNotActive(ValueError):
    """The job was cancelled or has completed."""


# The partitions a new store gets when its creator names no count.
DEFAULT_PARTITIONS = 64


class PartitionsMismatch(ValueError):
    """A client named a partition count other than the one its store was
    created with. Jobs are placed by ``crc32(id) % count``: a client counting
    differently would place jobs in partitions no node leads."""

    def __init__(self, store: str, named: int, stored: int) -> None:
        super().__init__(
            f"partitions = {named}, but {store} was created with {stored} partitions and keeps them;"
            f" leave partitions out (the store's count is used) or set it to {stored}"
        )
        self.named = named
        self.stored = stored


@dataclass(frozen=True, slots=True)
class PlannedRun:
    run_at_ms: int  # the schedule's time: part of the idempotency key
    due_ms: int  # run_at plus the job's deterministic jitter: when it fires


# A leader reloads its whole horizon at least this often, so a new run due
# later than NEAR_MS from now reaches its wheel in time without a change
# notice: registering it need not wake every leader (a bulk registration of
# 50,000 runs would otherwise make each leader re-read its partitions after
# every chunk). Leaders check their reload period against it.
NEAR_MS = 40_000


# How far a watermark trails what its leader has read: a registration that
# reaches the store this late for its own due time is still picked up.
SETTLE_MS = 10_000


# A row due at or behind its partition's watermark would never be read: the
# watermark says everything due by then was handed on. It is stored due this
# far past the watermark instead, past any watermark a leader whose last
# read began before the row landed may still record: the one stored trails
# that by up to a reload period (under NEAR_MS, see LeaderConfig) and the
# seconds between two moves (under SETTLE_MS). The row's change notice has
# the leader read it at once; to that leader it is due within about NEAR_MS,
# whatever the writer's clock said.
AHEAD_OF_WATERMARK_MS = NEAR_MS + SETTLE_MS


def placed_ahead(due_ms: int, mark: int | None) -> int:
    """Where a schedule row meant for ``due_ms`` goes in a partition whose
    watermark is ``mark`` (None: none read): at ``due_ms``, unless that is
    at or behind the watermark; then AHEAD_OF_WATERMARK_MS past it.

    For every row a run is owed by: a registration's first run, and a row
    owed again (a retry, a parking, a hand-back, a trigger, a redrive),
    whose due time was set before the write landed (from a failure's end, a
    breaker's reopening, a worker's or a client's clock) and which may land
    after a leader moved the watermark past it. The stores read the
    watermark again after the write and place the row again by this rule if
    it was passed meanwhile."""
    if mark is None or due_ms > mark:
        return due_ms
    return mark + AHEAD_OF_WATERMARK_MS


def owed_where_written(
    state: str, delivery: int, due_ms: int, written_delivery: int, written_due_ms: int, sets_due: bool
) -> bool:
    """Whether a run whose row owed again was written (due at
    ``written_due_ms``, read as the delivery after ``written_delivery``) is
    still owed by that row, by its run row as read now (``state``, the
    ``delivery`` it last met, its ``due_ms``): not ended, not handed on
    since, and, when the write set the run's due time (``sets_due``: all but
    a hand-back's), not placed elsewhere since. Only then is the row placed
    again ahead of a watermark that passed it."""
    if state in ("succeeded", "failed", "cancelled", "missed") or delivery > written_delivery:
        return False
    return not sets_due or due_ms == written_due_ms


def is_near(run: PlannedRun | None, now_ms: int) -> bool:
    """Whether registering ``run`` must tell its leader at once."""
    return run is not None and run.due_ms <= now_ms + NEAR_MS


class Run(NamedTuple):
    """A run on its way from the store through the wheel to a worker. One
    column order everywhere: the native codec and loader read it by position
    (run_id, due_ms; the codec every column)."""

    run_id: int  # the wheel's handle
    job_id: str
    run_at_ms: int  # the schedule's time: part of the idempotency key
    due_ms: int
    partition: int
    # The delivery number of this logical run: 1 when it is first handed on,
    # one more each time it is handed on again (re-sent by a new leader after
    # a failover, handed back after a fence rejection, or handed on again
    # after its worker's claim lease died). Never part of the key.
    attempt: int
    # Part of the idempotency key: 0 for a schedule time's first logical run.
    attempt_group: int


def delivery_for(handed_attempt: int, handed_fence: int | None, fence: int) -> int:
    """The attempt a leader holding ``fence`` reads for a run last handed on
    at ``handed_attempt`` (0: never) under ``handed_fence``: its own send
    comes back unchanged (the leader skips it); a predecessor's is handed on
    again, as the next delivery."""
    if handed_attempt <= 0:
        return 1
    if handed_fence is not None and handed_fence >= fence:
        return handed_attempt
    return handed_attempt + 1


def next_attempt(attempt: int, ended_attempt: int) -> int:
    """The attempt a start of a run is: one past the last attempt that ended
    in a failure or an interruption (``ended_attempt``, 0: none), else the
    attempt already started (``attempt``, 0: none). A run taken over from a
    worker that died, handed on again by a new leader, or parked on its way
    is the same attempt: no attempt of it ended. The attempt counts what the
    user sees; the delivery number (``Run.attempt``) counts hand-overs."""
    if ended_attempt >= attempt:
        return ended_attempt + 1
    return attempt


def shown_attempt(state: str, attempt: int, ended_attempt: int) -> int:
    """The attempt a run's history shows: of its current or last start,
    but for a run handed on (or parked) and not started since, the attempt
    its start will be."""
    if state in ("dispatched", "parked"):
        return next_attempt(attempt, ended_attempt)
    return attempt


def add_read_run(rows: dict[int, Run], run: Run) -> None:
    """Add a run read from a schedule row to ``rows`` (by run id). A run
    may have several rows: a hand-back's beside the row it was handed on
    from, and rows left behind by those (a retry's or a parking's write
    deletes only the row its delivery came from). The run is due once, as
    the row of the latest delivery says: each row owing a run again is
    written for a delivery after every one it follows, and only the latest
    says when the run is owed (a retry's row, due after its backoff, follows
    a hand-back's row due a moment after the rejection). Of rows of one
    delivery (a hand-back's and the row it was handed on from), the
    earlier. A row left behind and read alone (the latest beyond the
    horizon) is handed on as the older delivery it is, which the run's
    failed claim refuses."""
    known = rows.get(run.run_id)
    # Later delivery first, then earlier due time.
    if known is None or (-run.attempt, run.due_ms) < (-known.attempt, known.due_ms):
        rows[run.run_id] = run


def runs_behind(
    placed: Mapping[str, tuple[int, PlannedRun]], marks: Mapping[int, int]
) -> list[tuple[str, int, PlannedRun]]:
    """Of runs just registered (job id -> partition, run as written), those
    whose partition's watermark (``marks``) has reached their due time: no
    leader would read them again where they are."""
    return [(job_id, p, run) for job_id, (p, run) in placed.items() if p in marks and run.due_ms <= marks[p]]


# ``hand_back``'s ``started_by`` when no start counts, whoever recorded it:
# the run's claim is held by no live lease (Executor._hand_back).
ABANDONED = "(abandoned)"


def held_by_pause(state: str | None, dispatched_at_ms: int | None) -> bool:
    """Whether a paused job's next run, its row in ``state`` handed on at
    ``dispatched_at_ms``, is held by the pause: never handed on. A run sent
    before the pause reached it (a pause between its leader's send and the
    record of it, which marks a held row handed on) is its worker's: it runs,
    or is recorded missed by a worker that finds the job paused."""
    return state == "paused" and dispatched_at_ms is None


def still_owed(state: str, worker: str | None, started_by: str | None) -> bool:
    """Whether a run rejected for its fence is still owed, given its row's
    ``state`` and ``worker``: not when it started elsewhere, finished or was
    cancelled; still when it was interrupted, when the only start is the
    rejected worker's own, or when no live lease holds it (``ABANDONED``)."""
    if state in ("scheduled", "interrupted", "retrying", "parked"):
        return True
    return state == "running" and started_by is not None and started_by in (worker, ABANDONED)


# The leader's sweep (ScheduleStore.sweep_owed) looks at each run handed on
# this long after its hand-over, and again as long after each look that
# found its claim held or not yet taken: by then a live worker has claimed
# it and heartbeats it (a lease is 30 s by default).
SWEEP_LOOK_AFTER_MS = 60_000
# A claim's lease that ran out, or a claim let go of, succeeded or failed
# with the run's history still saying handed on or running, is taken for
# dead once this long has passed: a worker's own hand-back, a Kafka
# redelivery's take-over or a history write is over in far less.
DEAD_CLAIM_AFTER_MS = 30_000
# How the sweep groups the runs it is to look at: by the ten seconds in
# which their look comes due, each group read once and then deleted whole.
SWEEP_BUCKET_MS = 10_000
# How far back a partition's first sweep reads (no bucket swept yet; or,
# behind the watermark, the first sweep of a store client): what was due
# before, whoever led the partition then swept.
SWEEP_LOOKBACK_MS = 10 * 60_000


def look_bucket(at_ms: int) -> int:
    """The sweep's bucket of a look due at ``at_ms``."""
    return at_ms // SWEEP_BUCKET_MS


def buckets_due(swept_through: int | None, now_ms: int) -> range:
    """The buckets a sweep at ``now_ms`` reads, after ``swept_through`` (the
    last one read; None: none yet). A bucket is read a whole bucket after
    it ended: a hand-over recorded a little late still lands in one not yet
    read."""
    first = look_bucket(now_ms - SWEEP_LOOKBACK_MS) if swept_through is None else swept_through + 1
    return range(first, look_bucket(now_ms) - 1)


@dataclass(frozen=True, slots=True)
class ClaimSeen:
    """A run's idempotency claim as the sweep reads it: its ``state``
    (running, succeeded, failed, released), when it was last written, the
    latest delivery it was taken for, and until when a running claim's
    holder is, or was last, alive: while a live lease holds the run (the
    cluster's in etcd), its end; else the end of the lease the claim row
    carries."""

    state: str
    updated_at_ms: int
    delivery: int
    alive_until_ms: int
    # A failed claim's failure (ClaimedFailure.to_json): the history is owed
    # that failure, never a run of the failed delivery again.
    failure: str | None = None


class SweepLook(NamedTuple):
    """A run handed on, to be looked at by the sweep for its ``delivery``:
    a row of the store's looks, written with the run's hand-over."""

    partition: int
    job_id: str
    run_at_ms: int
    attempt_group: int
    run_id: int
    due_ms: int
    delivery: int

    @classmethod
    def of(cls, run: Run) -> SweepLook:
        return cls(run.partition, run.job_id, run.run_at_ms, run.attempt_group, run.run_id, run.due_ms, run.attempt)

    def record(self) -> DispatchRecord:
        """The delivery looked for, as a worker had it (its fence unknown)."""
        return DispatchRecord(
            self.run_id,
            self.job_id,
            self.run_at_ms,
            self.due_ms,
            self.partition,
            self.delivery,
            self.attempt_group,
            0,
            0,
        )


class SweepVerdict(enum.Enum):
    DROP = "drop"  # nothing owed by this look: the run ended, is owed by a row, or was handed on since
    LOOK_AGAIN = "look_again"  # a worker holds it alive, or the dispatcher has not delivered it yet
    OWE = "owe"  # handed on or running under a dead claim: owed again, as its next delivery
    # Its claim failed and keeps the failure, which the history lacks: the
    # failure is recorded (ClaimedFailure.written_as); the claim stays failed.
    RECORD_FAILURE = "record_failure"


def sweep_verdict(
    state: str, handed_on: bool, delivery: int, looked_for: int, claim: ClaimSeen | None, now_ms: int
) -> SweepVerdict:
    """What the sweep does with a run it looks at for delivery
    ``looked_for``, its run row saying ``state``, whether it was handed on
    (a scheduled run with a dispatch time) and the latest ``delivery`` it
    met, and its claim as ``claim`` (None: never claimed). A run ended,
    retrying or parked is owed by its own row or by nothing; one handed on
    again since is looked at for that delivery. A delivery not claimed yet
    (no claim, or one taken for an earlier delivery) is the dispatcher's
    still: a consumer's backlog. Otherwise, handed on,
    running or interrupted under a claim whose holder is dead (its lease
    ran out, or it let go, succeeded or failed without the history saying
    so) for DEAD_CLAIM_AFTER_MS: nothing will hand it on again but this.
    A claim that failed and keeps its failure is never owed as a delivery
    (that would take the failed claim over and run a dead letter again, or
    a retry before its backoff): its failure is recorded instead."""
    if delivery > looked_for:
        return SweepVerdict.DROP
    if state not in ("running", "interrupted") and not (state == "scheduled" and handed_on):
        return SweepVerdict.DROP
    if claim is None or claim.delivery < looked_for:
        return SweepVerdict.LOOK_AGAIN
    dead_since = claim.alive_until_ms if claim.state == "running" else claim.updated_at_ms
    if dead_since + DEAD_CLAIM_AFTER_MS > now_ms:
        return SweepVerdict.LOOK_AGAIN
    if claim.state == "failed" and claim.failure is not None:
        return SweepVerdict.RECORD_FAILURE
    return SweepVerdict.OWE


def owed_behind_mark(state: str, handed_on: bool, run_due_ms: int, row_due_ms: int) -> bool:
    """Whether a schedule row due at ``row_due_ms``, found at or behind its
    partition's watermark, is still the row its run is owed by: the run
    (``state``, handed on or not, due at ``run_due_ms``) waits for its
    first hand-over, a retry or the end of its parking, and is due where
    this row is. A row handed on is marked with its leader's fence; a run
    owed by another row (placed again ahead) has that row's due time."""
    if state == "scheduled" and handed_on:
        return False
    return state in ("scheduled", "retrying", "parked") and run_due_ms == row_due_ms


@dataclass(frozen=True, slots=True)
class JobRecord:
    job: Job
    state: str  # active | paused | cancelled | completed
    partition: int
    jitter_ms: int
    created_at_ms: int
    next_run: PlannedRun | None
    # The job's runs are at or after this time; a run of its id before it
    # was of the cancelled job this one replaced (replaced_runs). 0: the
    # job replaced none.
    runs_since_ms: int = 0
    # Of a paused job whose next run had been handed on when the pause came
    # (between its leader's send and its record: the run is its worker's,
    # not the pause's to hold): that run's schedule time. The pause then
    # holds none (``next_run`` is None) and a resume plans from the
    # schedule's time after it (catchup.held_after_sent).
    sent_before_pause_ms: int | None = None


# Job states a run can be triggered in: a completed one-shot may be run
# again; a paused job holds its runs until resumed.
TRIGGERABLE = frozenset({"active", "completed"})


def check_triggerable(job_id: str, state: str) -> None:
    """JobNotActive unless a job in ``state`` may be triggered (every store's
    rule and words)."""
    if state not in TRIGGERABLE:
        raise JobNotActive(f"job {job_id!r} is {state}" + (": resume it first" if state == "paused" else ""))


class RunNotFound(LookupError):
    """No run with this identity."""


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """One failed attempt of a run, kept with the run: what a dead letter
    shows, and how many retries a run has had."""

    attempt: int
    worker: str | None
    started_at_ms: int | None
    ended_at_ms: int
    error: str | None
    # targets.Outcome.kind: timeout, connect, 5xx, 4xx, exception, import, ...
    kind: str | None
    # Whether this failure made the run a dead letter: retries after a
    # redrive are counted from the last such failure.
    dead_lettered: bool = False
    # What the attempt printed (a shell command's standard output's tail).
    result: str | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "attempt": self.attempt,
                "worker": self.worker,
                "started_at_ms": self.started_at_ms,
                "ended_at_ms": self.ended_at_ms,
                "error": self.error,
                "kind": self.kind,
                "dead_lettered": self.dead_lettered,
                "result": self.result,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> FailedAttempt:
        data = json.loads(text)
        return cls(
            int(data["attempt"]),
            data.get("worker"),
            data.get("started_at_ms"),
            int(data["ended_at_ms"]),
            data.get("error"),
            data.get("kind"),
            bool(data.get("dead_lettered", False)),
            data.get("result"),
        )


# Run states owed again at the run's due_ms (a retry's, or the end of its
# parking): the dispatch and start times it shows are an earlier attempt's,
# and a lag taken from them against that due time would mean nothing.
OWED_AGAIN = frozenset({"retrying", "parked"})


def shows_an_earlier_dispatch(run: RunRecord) -> bool:
    """Whether the dispatch and start times ``run`` shows are an earlier
    delivery's, not of its due time now, so that no fire lag, start lag or
    duration can be taken from them: a run owed again (OWED_AGAIN), one
    revived by a reschedule and not handed on since (scheduled), and one
    cancelled while owed again. That last is told by its dispatch coming
    before its due: a run is handed on at or after its due time, and a
    retry's or a parking's due comes after the delivery that failed."""
    if run.state in OWED_AGAIN or run.state == "scheduled":
        return True
    return run.state == "cancelled" and run.dispatched_at_ms is not None and run.dispatched_at_ms < run.due_ms


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: int
    job_id: str
    run_at_ms: int
    # When the run is owed: handed on at or after it. For a run owed again
    # (a retry, a parking, a trigger, a redrive), the time it was owed again
    # for, unless its row was written after the partition's watermark had
    # passed that time (placed_ahead): then the later time it is handed on
    # at. A retry's failure keeps its own end time in ``failures``.
    due_ms: int
    # scheduled | dispatched | running | succeeded | failed | cancelled, or
    # interrupted: stopped with its node, to run again as a new attempt, or
    # retrying: failed, and owed again as the next attempt at ``due_ms``, or
    # missed: handed on too late for its job's catch-up policy, never run, or
    # parked: not started, its downstream's circuit breaker being open, and
    # owed again at ``due_ms`` (when the breaker lets runs through again),
    # or waiting for its job's previous run to end (overlap buffer_one).
    state: str
    # The attempt of its current or last start (shown_attempt; 0 before it
    # is handed on): what ctx.attempt says, not how often it was handed on.
    attempt: int
    fence: int | None
    dispatched_at_ms: int | None
    started_at_ms: int | None
    ended_at_ms: int | None
    worker: str | None
    error: str | None
    result: str | None
    # The run's failed attempts, oldest first: filled by get_run and
    # dead_letters, left empty by the history and last_runs reads.
    failures: tuple[FailedAttempt, ...] = ()
    attempt_group: int = 0

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.job_id, self.run_at_ms, self.attempt_group)

    @classmethod
    def waiting(
        cls, run_id: int, job_id: str, run_at_ms: int, due_ms: int, state: str, attempt: int, fence: int | None
    ) -> RunRecord:
        """A run not yet handed on: no dispatch, start or end yet."""
        return cls(run_id, job_id, run_at_ms, due_ms, state, attempt, fence, None, None, None, None, None, None)


@dataclass(frozen=True, slots=True)
class BreakerRow:
    """A downstream's circuit breaker as the store keeps it: one row per
    downstream, the authority every worker and node reads and changes by
    conditional writes (on ``version``). Half-open is not stored: it is
    ``open`` once ``reopens_at_ms`` has passed (breakers.breaker_state)."""

    downstream: str
    # Bumped by every write; 0 for a breaker never written (closed).
    version: int = 0
    state: str = "closed"  # closed | open
    # Failures in a row of the kinds that count (breakers.BREAKER_KINDS).
    failures: int = 0
    opened_at_ms: int | None = None
    reopens_at_ms: int | None = None
    # While half-open: until when the run let through as the probe holds
    # the probe; past it, the probe is taken for lost and another may go.
    probe_until_ms: int | None = None


@dataclass(frozen=True, slots=True)
class AttemptCount:
    """One node's calls to a downstream and the retries it granted for it,
    in one bucket of time (breakers.BUCKET_MS): what the retry budget sums
    over its sliding window."""

    downstream: str
    holder: str
    bucket_ms: int  # the bucket's start
    calls: int
    retries: int


@dataclass(frozen=True, slots=True)
class JobPlanState:
    """What planning needs of an active job once one of its runs was handed on."""

    job: Job
    partition: int
    jitter_ms: int
    # The schedule time of the run planned last for the job (by its
    # registration, a reschedule, or the dispatch of the run before it);
    # None when the store knows of none.
    next_run_at_ms: int | None
    # When that run is due, where the store keeps it with the job (None:
    # not kept; the embedded store reads its runs by state, not by
    # watermark, and needs it not).
    next_due_ms: int | None = None


# Why a schedule time of a job ran no run: its catch-up policy skipped it
# (``skip``, or one of the times ``run_once`` collapsed), it was later than
# the job's ``max_delay`` (``deadline``), the job was paused, or its previous
# run was still running (overlap ``forbid``).
MISSED_REASONS = ("skipped", "past_deadline", "paused", "overlap")


@dataclass(frozen=True, slots=True)
class MissedRuns:
    """The schedule times of a job from ``first_ms`` up to (not including)
    ``end_ms`` that ran no run, for ``reason``. Kept once under (job,
    ``first_ms``) however often written, the later end kept: a schedule
    time is missed once, and a write repeated after a timeout counts
    nothing twice. Stored as the
    span, counted when read (catchup.count_missed): a day of a minutely job
    is one row, not 1,440."""

    job_id: str
    first_ms: int
    end_ms: int
    reason: str


@dataclass(frozen=True, slots=True)
class NextRun:
    job_id: str
    partition: int
    run: PlannedRun
    # The schedule times passed over to reach ``run`` (catch-up after
    # downtime), recorded with it.
    missed: MissedRuns | None = None


@dataclass(frozen=True, slots=True)
class NextRuns:
    """What the core decided for the jobs of a batch handed on: the store
    records it, and decides nothing."""

    # Each job's next run, to be stored with the job's next-run pointer.
    runs: list[NextRun]
    # Jobs with no run to come: they complete.
    completed: list[str]
    # Next runs already stored for re-sent runs (planning.planned_before):
    # returned with the runs stored; a cluster store writes one again only
    # where it finds no row of it (its recording may have died between the
    # job's pointer and the run's rows), never over one.
    stored_before: list[NextRun] = field(default_factory=list)
    # Per job planned for (a next run or a completion), its next run's
    # schedule time as ``planning_state`` read it (None: none known). The
    # plan was made from the job as it was then: the store writes it only
    # while the job is active with that same next run, in one conditional
    # write. A reschedule, a resume or another leader's record of the same
    # run moves it, and has planned the job's next run itself.
    planned_from: dict[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DispatchOutcome:
    """What a leader asks a store to record for a batch it handed on: the
    runs, how far each partition's watermark may move, and what the core
    planned after them."""

    rows: Sequence[Run]
    marks: Mapping[int, int]
    next_runs: NextRuns


def within_fences(outcome: DispatchOutcome, fences: Fences, floors: Mapping[int, int]) -> DispatchOutcome:
    """The part of ``outcome`` a leader holding ``fences`` may still write,
    given each partition's stored fence (``floors``): nothing of a partition
    a newer leader has taken. Its successor sends, marks and plans those
    runs itself; a stale mark written over its own would make a run look
    owed again, and a stale plan is made from the job as it was."""
    stale = {p for p, fence in fences.items() if floors.get(p, 0) > fence}
    if not stale:
        return outcome
    partition_of = {row.job_id: row.partition for row in outcome.rows}
    return DispatchOutcome(
        [row for row in outcome.rows if row.partition not in stale],
        {p: mark for p, mark in outcome.marks.items() if p not in stale},
        NextRuns(
            [nxt for nxt in outcome.next_runs.runs if nxt.partition not in stale],
            [job_id for job_id in outcome.next_runs.completed if partition_of.get(job_id) not in stale],
            [nxt for nxt in outcome.next_runs.stored_before if nxt.partition not in stale],
            outcome.next_runs.planned_from,
        ),
    )


def log_stale_plans(log: logging.Logger, job_ids: Collection[str]) -> None:
    """Say that the plans for ``job_ids`` were not written: each job changed
    after its plan was read (NextRuns.planned_from), and what changed it
    planned its next run."""
    if job_ids:
        shown = sorted(job_ids)
        log.info(
            "%d next runs or completions not recorded: planned from a job state that changed before the write"
            " (a reschedule, resume or another leader planned them): %s%s",
            len(shown),
            ", ".join(shown[:5]),
            "" if len(shown) <= 5 else ", ...",
        )


def stored_runs(next_runs: Sequence[NextRun]) -> list[Run]:
    """Next runs as a cluster store keeps them, for the leader's wheel:
    first deliveries, their handles derived from their identity."""
    return [
        Run(run_id_for(n.job_id, n.run.run_at_ms, 0), n.job_id, n.run.run_at_ms, n.run.due_ms, n.partition, 1, 0)
        for n in next_runs
    ]


# (job, partition, jitter_ms, first run): one job of a bulk registration.
Registration = tuple[Job, int, int, PlannedRun | None]
# Partition -> the fence its leader holds.
Fences = Mapping[int, int]


class DeadLetterSink(Protocol):
    """Where a run that failed for good is also announced (on a cluster, a
    Kafka topic), for consumers outside pysched; the store stays the record
    (``pysched dlq``). At least once: a consumer tells copies apart by the
    run's idempotency key."""

    def publish(self, run: RunRecord, now_ms: int) -> None:
        """Announce ``run``, a dead letter read back with its failed
        attempts; raises when it could not be."""
        ...

    def close(self) -> None: ...


class ScheduleStore(Protocol):
    """Job definitions, the schedule of runs, and their history."""

    @property
    def partitions(self) -> int:
        """How many partitions its jobs are spread over: fixed when the store
        was created, so every client places and leads jobs alike."""
        ...

    def add_job(self, job: Job, partition: int, jitter_ms: int, first: PlannedRun | None, now_ms: int) -> JobRecord:
        """Register a job and its first run; durable when this returns.
        Raises JobExists."""
        ...

    def add_jobs(self, items: Sequence[Registration], now_ms: int) -> list[str]:
        """Register many jobs at once, each as add_job would; ids that already
        exist are left unchanged and returned. Durable when this returns."""
        ...

    def get_job(self, job_id: str) -> JobRecord: ...

    def writes_together(self) -> AbstractContextManager[None]:
        """The writes this thread makes inside, to this store and to claims
        kept in the same database, are durable together when it ends (or
        none are, if it raises): fewer commits, one for a run's claim and
        history. A store that cannot group them makes each durable as it
        goes, and the caller relies on nothing more than that."""
        ...

    def list_jobs(self) -> list[JobRecord]: ...

    def cancel_job(self, job_id: str, now_ms: int) -> JobRecord:
        """Stop a job: its pending runs are cancelled, history is kept."""
        ...

    def reschedule(self, job: Job, jitter_ms: int, first: PlannedRun | None, now_ms: int) -> JobRecord:
        """Replace an active job's schedule; pending runs, and runs handed on
        but not started, are cancelled (a started run keeps its spec and
        goes on) and ``first`` becomes the next run. Raises JobNotFound,
        JobNotActive."""
        ...

    def pause_job(self, job_id: str, now_ms: int) -> JobRecord:
        """Stop an active job firing: its run waiting to be handed on is
        held (state ``paused``, out of every leader's wheel) until
        resume_job. Runs already handed on (a worker finds the job paused
        and records them missed, from ``paused`` too: a pause that lands
        between a leader's send and its record holds a run it cannot tell
        from a waiting one), running, or waiting for a retry of an earlier
        fire go on; the job's next run, found handed on, is not held
        (JobRecord.sent_before_pause_ms). Raises JobNotFound,
        JobNotActive."""
        ...

    def resume_job(self, job_id: str, next_run: PlannedRun | None, missed: MissedRuns | None, now_ms: int) -> JobRecord:
        """A paused job active again (completed when ``next_run`` is None):
        its held run becomes ``next_run`` when they are the same schedule
        time, and is recorded missed otherwise; a run handed on before the
        pause (held_by_pause false) is left to its worker, neither written
        again nor recorded missed; ``missed`` is kept (the core decides
        both by the job's catch-up policy, catchup.on_resume). Raises
        JobNotFound, JobNotActive (a job that is not paused)."""
        ...

    def history(self, job_id: str, limit: int = 50) -> list[RunRecord]:
        """Runs of a job, newest first."""
        ...

    def last_runs(self, job_ids: Sequence[str]) -> dict[str, RunRecord]:
        """Each job's newest run that was handed on (whatever became of it);
        a job with none is left out."""
        ...

    def change_versions(self) -> dict[int, int]:
        """Per partition, a number that changes whenever a job of it is
        cancelled or rescheduled, or added with a run due soon (``is_near``):
        leaders poll it to reload early."""
        ...

    def due_runs(self, fences: Fences, horizon_ms: int, now_ms: int) -> list[Run]:
        """Runs of the given partitions due before ``horizon_ms`` that their
        leader must hand on: not yet handed on, or handed on by a predecessor
        whose work may have died with it. A store whose watermark trails
        "now" may also return runs handed on in the last seconds; the leader
        skips those it sent itself. Each run's ``attempt`` is the delivery
        it would be (``delivery_for``): one more than the attempt last handed
        on under an older fence, 1 if none was, and the same attempt again
        for a run handed on under the reader's own fence."""
        ...

    def next_lease_expiry(self, fences: Fences, after_ms: int) -> int | None:
        """The earliest time, at or after ``after_ms``, when a running run of
        these partitions is owed again because its worker's claim lease runs
        out, for a store whose leader hands such runs on again (the embedded
        engine): its leader reads again then, not at its next periodic read.
        None when there is none, or when the dispatcher delivers such runs
        again itself (the cluster: Kafka)."""
        ...

    def sweep_owed(self, fences: Fences, now_ms: int) -> int:
        """The leader's safety net, every few seconds, for the partitions it
        leads: (a) each run handed on whose look has come due
        (SWEEP_LOOK_AFTER_MS after its hand-over, or after the last look)
        and that is still handed on, running or interrupted under a dead
        claim (sweep_verdict: its worker died after its hand-back failed,
        or the hand-back was lost) is owed again, once, as its next
        delivery, by a row ahead of the watermark; (b) each row the
        watermark passed since the last sweep that still owes its run
        (owed_behind_mark) is placed again ahead of it. (a) is conditional
        on the claim as read (two leaders, or a sweep and the worker's own
        hand-back, owe it once); each look reads only the runs handed on
        in one SWEEP_BUCKET_MS, never all history. Returns how many runs it
        owed again. A store whose leader reads runs by their state and
        claim (the embedded engine) owes them there and sweeps nothing."""
        ...

    def planning_state(self, job_ids: Collection[str]) -> dict[str, JobPlanState]:
        """The active jobs among ``job_ids``, as planning their next runs
        needs them; a cancelled, completed or unknown job is left out. One
        read per job at most: the recorder asks once per batch."""
        ...

    def finish_dispatch(
        self, rows: Sequence[Run], fences: Fences, marks: Mapping[int, int], now_ms: int, next_runs: NextRuns
    ) -> list[Run]:
        """After the dispatcher has the rows durably: record them handed on
        at their attempt (a run a worker already started, or one cancelled
        meanwhile, keeps its state); record ``next_runs``, as the core planned
        them from ``planning_state``, each only while its job is active with
        the next run it was planned from (NextRuns.planned_from): a job
        cancelled, paused, rescheduled or planned by another leader meanwhile
        keeps what that did, and a run handed on or run meanwhile is never
        made to wait again; then move the watermarks of the partitions in ``marks``
        up to the due time given (never back, and never for a fence older
        than the partition's). The caller vouches that every run of those
        partitions due by then has been handed on (an empty ``rows`` says so
        for quiet partitions). Returns the next runs it stored, with their
        ids."""
        ...

    def run_started(self, record: DispatchRecord, worker: str, now_ms: int) -> int | None:
        """Record the start; the attempt it is (``next_attempt``), or None
        when the run was cancelled (or replaced by a reschedule) after it
        was handed on: it must not run. The attempt is not the record's
        delivery number: a run whose worker died is started again as the
        same attempt, one that failed or was interrupted as the next,
        whichever delivery brings it. The run keeps the highest delivery
        it has met, so that a retry or a park is read as a later one."""
        ...

    def run_interrupted(self, record: DispatchRecord, error: str, now_ms: int) -> None:
        """Record that the run's execution was stopped before it ended (its
        node stopped past its grace period), if the run is running: state
        ``interrupted``, with ``error`` saying why. A run not running keeps
        its record. The run is owed again, as the next attempt (run_started),
        the way a run whose worker died is: its claim was let go, and its
        delivery was not acknowledged, so the embedded engine's next leader
        hands it on again and Kafka delivers it again. A reschedule cancels
        it, as it does a run handed on and not started."""
        ...

    def run_finished(
        self, record: DispatchRecord, state: str, error: str | None, result: str | None, now_ms: int
    ) -> None:
        """Record the outcome: ``state`` is succeeded, failed or cancelled.
        A run already recorded succeeded keeps its record: a redelivery of
        it (its claim succeeded) records its outcome again."""
        ...

    def run_failed(self, record: DispatchRecord, failure: FailedAttempt, retry_due_ms: int | None) -> None:
        """Record a failed attempt (kept with the run, once per attempt
        number: a repeated call changes nothing more). With ``retry_due_ms``
        the run is ``retrying``: owed again at that time, as the next
        attempt of the same idempotency key, fired through the wheel like
        any run. Without, it has failed for good and is a dead letter until
        redriven or pruned with its history. A run that succeeded or was
        cancelled meanwhile keeps its state; a run whose job was cancelled
        is not retried, and ends cancelled."""
        ...

    def run_missed(self, record: DispatchRecord, missed: MissedRuns, error: str, now_ms: int) -> None:
        """Record a run handed on too late for its job's catch-up policy:
        it ends ``missed`` with ``error`` saying why, never having run, and
        ``missed`` (the run's own time) is kept. A run parked on its way (it
        never started) may be missed too. A run that has started, ended or
        was cancelled meanwhile keeps its state."""
        ...

    def missed_runs(self, job_ids: Sequence[str]) -> dict[str, list[MissedRuns]]:
        """Per job (those with any), the schedule times it missed, oldest
        first."""
        ...

    def get_run(self, job_id: str, run_at_ms: int, attempt_group: int = 0) -> RunRecord:
        """One run, with its failed attempts. Raises RunNotFound (a run
        still waiting for its first dispatch is found)."""
        ...

    def dead_letters(self, limit: int = 1000) -> list[RunRecord]:
        """Runs that failed for good, with their failed attempts, newest
        failure first."""
        ...

    def redrive(self, job_id: str, run_at_ms: int, attempt_group: int, now_ms: int) -> bool:
        """Make a dead letter owed again, at once, as the next attempt of the
        same idempotency key (its failed attempts are kept; its retries
        are counted again from the redrive). False when the run is not a dead letter."""
        ...

    def trigger(self, job_id: str, now_ms: int) -> RunRecord:
        """A run of the job now, once, beside its schedule, which it does
        not move: run_at ``now_ms`` in an attempt group of its own (1, or
        more when that key is taken), so its idempotency key is its own, and
        owed at once. Raises JobNotFound, or JobNotActive for a job paused
        (resume it first) or cancelled."""
        ...

    def run_parked(self, record: DispatchRecord, due_ms: int, reason: str, now_ms: int) -> None:
        """Record that the run was not started because its downstream's
        circuit breaker is open: state ``parked``, ``reason`` as its error,
        owed again at ``due_ms`` as the next delivery of the same
        idempotency key, fired through the wheel like a retry. No failed
        attempt is recorded and the run's retries are untouched. A run that
        succeeded, was cancelled or started meanwhile keeps its state; a
        run whose job was cancelled ends cancelled."""
        ...

    def take_slot(
        self, record: DispatchRecord, holder: str, policy: Overlap | str, now_ms: int, lease_ms: int
    ) -> SlotTake:
        """Decide, by the job's overlap ``policy`` (or overlap.OWED), whether
        ``record`` may start now that its job's running slot is as stored,
        in one conditional write (overlap.decide): RUN takes the slot for
        ``holder`` until ``now_ms + lease_ms`` (under replace, from the run
        holding it, returned as ``replaced``); WAIT (buffer_one) records the
        run as the one waiting; MISS writes nothing."""
        ...

    def extend_slots(self, holds: Sequence[SlotHold], now_ms: int, lease_ms: int) -> list[SlotHold]:
        """Extend the lease of each slot still held as ``holds`` says, in
        one call per worker beside the claims' heartbeat; returns the holds
        that no longer hold their slot (replaced, or taken after the lease
        ran out): their runs are to stop."""
        ...

    def release_slot(self, hold: SlotHold, now_ms: int) -> None:
        """The run of ``hold`` has ended: let go of its job's slot if the
        run still holds it, and make the run waiting for it (buffer_one),
        if it is still parked, due at ``now_ms``."""
        ...

    def running_slot(self, job_id: str) -> RunningSlot | None:
        """The job's slot as stored (held or not), None if never written."""
        ...

    def breaker(self, downstream: str) -> BreakerRow:
        """The downstream's breaker; a closed one of version 0 if none was
        ever written."""
        ...

    def breakers(self) -> list[BreakerRow]:
        """Every breaker written, by downstream."""
        ...

    def swap_breaker(self, expected_version: int, row: BreakerRow) -> bool:
        """Write ``row`` (its version ``expected_version + 1``) only if the
        stored breaker is still at ``expected_version`` (0: none stored): a
        conditional write, so that of two workers seeing the same breaker
        one transition wins (one half-open probe). False when another write
        came first; the caller reads again."""
        ...

    def record_attempts(self, count: AttemptCount) -> None:
        """Set one node's totals for one bucket (a write repeated, or
        overtaken by a larger total, is harmless: each node writes only its
        own rows). Rows older than the budget's window may be dropped."""
        ...

    def attempt_counts(self, downstream: str, since_ms: int) -> list[AttemptCount]:
        """Every node's rows for ``downstream`` of the buckets starting at
        or after ``since_ms``."""
        ...

    def watermarks(self) -> dict[int, int]:
        """Per partition, the latest due time handed on."""
        ...

    def hand_back(self, record: DispatchRecord, now_ms: int, started_by: str | None = None) -> bool:
        """A worker rejected ``record`` for its fence: a newer leader leads the
        partition, and the run, unless it started or ended meanwhile, must
        reach that leader again (the claim keeps it to one effect); so must
        a run interrupted, which is owed again. A start recorded by
        ``started_by`` does not count: that worker tried to start the run
        before the rejection, and never ran it. True if it was handed back."""
        ...

    def raise_fence(self, partition: int, fence: int) -> None:
        """A new leader's fence, before it reads the partition: from now on
        the store refuses to move the partition's watermark for an older
        fence. A leader paused past its lease may still record what it sent,
        and its runs, rejected by the workers, must not fall behind the
        watermark its successor starts from."""
        ...

    def prune_history(
        self,
        partitions: Collection[int],
        finished_before_ms: int | None,
        keep_per_job: int | None,
        limit: int,
        now_ms: int,
    ) -> int:
        """Delete up to ``limit`` finished runs (succeeded, failed,
        cancelled) of the jobs of ``partitions`` that ended before
        ``finished_before_ms`` or have ``keep_per_job`` newer finished runs
        of their job (None: no such limit), a job's oldest first. A
        scheduled, dispatched or running run is never deleted, nor a job's
        newest finished run. Each one's idempotency claim becomes a
        tombstone, which a claim answers PRUNED, kept until
        ``now_ms + retention.PRUNED_CLAIM_KEPT_MS``; the tombstones past
        that go (see retention.py). Returns how many runs were deleted:
        fewer than ``limit`` when none is left."""
        ...


@dataclass(frozen=True, slots=True)
class Lease:
    holder: str
    fence: int  # strictly increasing across terms
    expires_at_ms: int


class Coordinator(Protocol):
    """Leadership of the schedule partitions, leases and fences."""

    # How long a successful poll's answer holds, from when the poll began:
    # the holder's lease outlives it, so no other holder can have taken a
    # partition before then. A leader with no newer answer stops dispatching.
    answer_valid_ms: int

    def poll(self, holder: str, now_ms: int) -> dict[int, int]:
        """Acquire, renew or give up partitions; returns those this holder
        leads now with their fences (empty while standing by). A fence is
        strictly greater than every earlier fence of its partition and is
        published to the executing side before it is returned."""
        ...

    def release(self, holder: str) -> None:
        """Give up every partition at once, so others need not wait out a lease."""
        ...

    def leaders(self) -> dict[int, Lease]:
        """Who leads each partition, for status reports."""
        ...

    def giving_up(self, holder: str) -> Mapping[int, int]:
        """The partitions, with the fences they were led under, that a poll
        of this holder has begun to hand over, whatever that poll answered:
        one that failed after its hand-overs, or whose call timed out while
        they went on, answered nothing, and its leader would otherwise lead
        them on its previous answer beside their new leader."""
        ...


class HandOvers:
    """A coordinator's record of what each holder's polls began to hand over
    (Coordinator.giving_up), for both coordinators: noted before the key is
    deleted, and over once a poll grants the partition back under the same
    fence (the delete never applied). Read by the tick's thread while a poll
    writes it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_holder: dict[str, dict[int, int]] = {}

    def begin(self, holder: str, partition: int, fence: int) -> None:
        with self._lock:
            self._by_holder.setdefault(holder, {})[partition] = fence

    def granted(self, holder: str, owned: Mapping[int, int]) -> None:
        with self._lock:
            giving_up = self._by_holder.get(holder, {})
            for partition, fence in owned.items():
                if giving_up.get(partition) == fence:
                    del giving_up[partition]

    def of(self, holder: str) -> dict[int, int]:
        with self._lock:
            return dict(self._by_holder.get(holder, {}))


@dataclass(frozen=True, slots=True)
class Delivery:
    payload: bytes
    # When the dispatcher took the record: the broker's LogAppendTime on
    # Kafka, the enqueue time in process.
    appended_at_ms: int
    token: object = None  # what the consumer needs to acknowledge it


class DispatchConsumer(Protocol):
    def next(self, timeout_s: float) -> Delivery | None: ...

    def ack(self, delivery: Delivery) -> None:
        """Done with it: a delivery not acknowledged is delivered again."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class BatchConsumer(DispatchConsumer, Protocol):
    """A consumer that can give a worker several deliveries at once, each
    acknowledged on its own in any order (the embedded queue, which
    redelivers nothing). Kafka's cannot: acknowledging a record commits
    past the ones before it, so its workers take one at a time."""

    def next_batch(self, most: int, timeout_s: float) -> list[Delivery]:
        """The next delivery, waiting at most ``timeout_s`` for it, and with
        it up to ``most - 1`` more that are there already: no more than a
        fair share of what is queued, so a burst is spread over the node's
        workers. Empty if none came."""
        ...


class Dispatcher(Protocol):
    """Carries encoded dispatch records from leaders to workers."""

    def publish(self, partitions: Sequence[int], payloads: Sequence[bytes]) -> None:
        """Hand on each payload, to its schedule partition's lane; returns
        once they are durably handed on, raises if any was not. Two parallel
        sequences, not pairs: a burst of 50,000 builds no tuple per run."""
        ...

    def consumer(self) -> DispatchConsumer: ...

    def close(self) -> None: ...


class ClaimOutcome(enum.Enum):
    CLAIMED = "claimed"  # first delivery: run it
    TAKEN_OVER = "taken_over"  # a previous holder's lease died: run it again
    SUCCEEDED = "succeeded"  # already done: replay the stored result, do not run
    BUSY = "busy"  # another worker runs it under a live lease: back off
    FENCED = "fenced"  # dispatched under a fence older than the partition's
    # This delivery (or a later one) already ended in a failure: do not run
    # it; its failure (Claim.failure) goes into the run's history if that
    # write was lost, and the run's retry, if any, is a delivery of its own.
    FAILED = "failed"
    # Its run's history was pruned (retention.py): a stale record delivered
    # again. Acknowledged, never run, nothing recorded.
    PRUNED = "pruned"


@dataclass(frozen=True, slots=True)
class Claim:
    outcome: ClaimOutcome
    result: str | None = None
    fence_floor: int = 0
    # TAKEN_OVER: the last checkpoint an earlier execution of the run saved
    # (save_checkpoint), JSON text; None when none was saved.
    checkpoint: str | None = None
    # BUSY: when the holder's lease ends unless renewed, as far as the claim
    # saw (None: not known). A worker that died is found then, not at the
    # next look of a fixed beat.
    busy_until_ms: int | None = None
    # FAILED, or TAKEN_OVER from a delivery that failed: that failure
    # (ClaimedFailure.to_json), to record if the history lacks it.
    failure: str | None = None


def not_at_delivery(retry_due_ms: int | None, delivered_due_ms: int) -> int | None:
    """A retry's due time, never the time its failed delivery was due for:
    the stores key a run's schedule row by its due time, and the row it was
    delivered from may still be marked handed on by its leader's late
    record, which would take the retry's row for that delivery."""
    if retry_due_ms is not None and retry_due_ms == delivered_due_ms:
        return retry_due_ms + 1
    return retry_due_ms


@dataclass(frozen=True, slots=True)
class ClaimedFailure:
    """A failed delivery's end, kept on its claim before the run's history
    is written (Executor._write_ends): a worker dying between the two
    leaves it to whichever delivery comes next, which records it as it
    was, with the retry the failing worker chose."""

    failure: FailedAttempt
    retry_due_ms: int | None  # None: a dead letter
    # The delivery that failed, and the due time it was delivered for: the
    # history is written as that delivery's worker would have.
    delivery: int
    due_ms: int

    def to_json(self) -> str:
        return json.dumps(
            {
                "failure": self.failure.to_json(),
                "retry_due_ms": self.retry_due_ms,
                "delivery": self.delivery,
                "due_ms": self.due_ms,
            },
            separators=(",", ":"),
        )

    def written_as(self, record: DispatchRecord, now_ms: int) -> tuple[DispatchRecord, int | None]:
        """The record and retry time ScheduleStore.run_failed is given to
        write this failure, kept on the claim of ``record``'s run, into the
        history as the failing delivery's worker would have: its delivery
        and due time, and the retry it chose, not behind ``now_ms`` (a
        partition's watermark may have passed it while nobody knew of it)
        and never at the time it was delivered for (not_at_delivery)."""
        failed = record._replace(attempt=self.delivery, due_ms=self.due_ms)
        if self.retry_due_ms is None:
            return failed, None
        return failed, not_at_delivery(max(self.retry_due_ms, now_ms), self.due_ms)

    @classmethod
    def from_json(cls, text: str) -> ClaimedFailure:
        data = json.loads(text)
        retry = data.get("retry_due_ms")
        return cls(
            FailedAttempt.from_json(data["failure"]),
            None if retry is None else int(retry),
            int(data["delivery"]),
            int(data["due_ms"]),
        )


@dataclass(frozen=True, slots=True)
class FailedClaim:
    """A claim that ended in a failure: the delivery it was taken for, and
    the failure (ClaimedFailure.to_json)."""

    delivery: int
    failure: str


# The state of a claim whose run was pruned: a tombstone, kept while a
# record of the run may still be delivered (retention.py).
PRUNED_STATE = "pruned"


def completed_state(succeeded: bool, result: str | None) -> str:
    """The state a claim is left in by ``IdempotencyClaims.complete``:
    succeeded; failed, carrying the failure to record; or released, let go
    of with no outcome."""
    if succeeded:
        return "succeeded"
    return "failed" if result is not None else "released"


@dataclass(frozen=True, slots=True)
class ClaimHolder:
    """The execution holding an unfinished run's claim."""

    holder: str
    # The fence of the delivery it claimed under.
    fence: int
    # When its lease ends unless renewed; None: it has run out.
    alive_until_ms: int | None


class IdempotencyClaims(Protocol):
    """The executing side's guard: fence check plus a conditional claim."""

    def claim(self, record: DispatchRecord, holder: str, now_ms: int, lease_ms: int) -> Claim:
        """Claim ``record``'s key for ``holder``, one execution of it. A
        holder claiming its own live claim again takes it over: it is the same
        execution trying again after a failure (its first claim may have
        landed), and must not wait out its own lease."""
        ...

    def heartbeat(self, keys: Sequence[str], holders: Sequence[str], now_ms: int, lease_ms: int) -> list[int]:
        """Extend the lease of each running claim ``keys[i]`` held by
        ``holders[i]``, and of no other: a claim whose execution ended without
        an outcome must run out. One call per worker process, naming every run
        it has going, rather than one per run; two parallel sequences, like
        ``Dispatcher.publish``. Returns the positions ``i`` not extended: those
        runs' leases are lost (taken over, or expired)."""
        ...

    def raise_fence(self, partition: int, fence: int) -> None:
        """Reject from now on any dispatch of ``partition`` below ``fence``."""
        ...

    def unfinished_claim(self, key: str, now_ms: int) -> ClaimHolder | None:
        """Who holds ``key``'s claim while its run is unfinished (None: it
        finished, or was never claimed), and until when. Asked when a
        delivery is rejected for its fence (Executor._hand_back): a run
        whose holder's lease has run out (its worker died, perhaps before it
        ran the target) reaches the partition's new leader again, or
        nothing; one held alive is looked at again when its lease ends."""
        ...

    def failed_claim(self, key: str) -> FailedClaim | None:
        """``key``'s claim if it ended in a failure (None: running, let go
        of, succeeded, or never claimed). Asked when a delivery is rejected
        for its fence: a delivery that failed is not handed back (its retry
        is a delivery of its own), and its failure reaches the history."""
        ...

    def complete(self, key: str, holder: str, succeeded: bool, result: str | None, now_ms: int) -> bool:
        """End ``holder``'s running claim of ``key`` (a claim no longer its
        does not change). Succeeded: ``result`` is replayed to every later
        delivery. Not succeeded, with ``result`` (a ClaimedFailure's JSON):
        the delivery the claim was taken for failed, and neither it nor an
        earlier one is taken over again (FAILED); a later delivery (a
        retry, a redrive, a run handed on again) takes it over. Not
        succeeded, without: let go of, with no outcome (an interruption, a
        run parked or missed), and any delivery takes it over at once (Kafka
        delivers an unacknowledged record again as the same delivery).
        Whether the claim is ``holder``'s: ended now, or already by an
        earlier call of it; False when another execution took it over (its
        lease ran out), and nothing is written: the run is that execution's
        to record."""
        ...

    def save_checkpoint(self, key: str, holder: str, state: str, now_ms: int) -> bool:
        """Keep ``state`` (JSON text) as the run's checkpoint, durably, if
        ``holder`` holds ``key``'s claim and it is running; False, and
        nothing written, otherwise: an execution whose claim was taken over
        (its lease ran out) must not overwrite its successor's progress. A
        later claim that takes the run over returns it (Claim.checkpoint),
        whatever attempt it is; it goes with the claim when pruned."""
        ...
