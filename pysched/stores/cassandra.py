"""The distributed schedule store: Cassandra.

Tables (keyspace from the config):

- ``jobs``: one row per job, its spec and state, and where its next run is.
- ``schedule``: the runs waiting to fire, partitioned by ``(time_bucket,
  shard)`` (the minute of the due time, the job's partition) and clustered by
  due time, so a leader reads "partition p, the next two minutes" as a few
  bounded slices; a :00 burst of 50,000 spreads over 64 shards (~800 rows).
- ``runs``: each run's history, partitioned by job, newest first, with
  its failed attempts (a map by attempt number).
- ``dead_letters``: the runs that failed for good, one Cassandra partition
  per schedule partition, newest failure first (see the schema).
- ``watermarks``: per partition, the due time up to which every run has been
  durably handed on; a new leader starts there.
- ``changes``: per partition, a counter bumped by registrations, which leaders
  poll to reload early.
- ``claims``: the authoritative idempotency claims (see claims/redis_cassandra).
- ``breakers``, ``attempt_counts``: circuit breakers and the retry
  budget's counts, per downstream (see stores/cassandra_breakers).
- ``sweep_looks``, ``sweep_cursors``: the runs handed on, for the leader's
  sweep to look at (see stores/cassandra_sweep).
- ``meta``: what is fixed when the keyspace is created: the partition count,
  which every client reads instead of taking it from its configuration.

Writes that acknowledge a registration use QUORUM; job creation and state
changes that must not race use lightweight transactions. A registration (or
a reschedule) reads the watermarks before it writes its run and again after:
a run due at or behind its partition's watermark, which no leader would
read, is stored ahead of it, and so is one the watermark passed while it
was being written (protocols.placed_ahead, _keep_ahead). So does every row
a run is owed again by (a retry, a parking, a hand-back, a trigger, a
redrive: _keep_owed_ahead), whose due time was set before the write landed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass, replace
from typing import Any

from cassandra import ConsistencyLevel, OperationTimedOut, WriteTimeout
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
from cassandra.policies import DCAwareRoundRobinPolicy, RetryPolicy

from pysched import overlap
from pysched.clock import Clock
from pysched.config import ClusterConfig, host_port
from pysched.kept_failures import record_kept_failure
from pysched.model import STORED, Job, Overlap, plannable_job
from pysched.overlap import RunningSlot, SlotHold, SlotTake
from pysched.protocols import (
    AHEAD_OF_WATERMARK_MS,
    DEFAULT_PARTITIONS,
    NEAR_MS,
    PRUNED_STATE,
    SETTLE_MS,
    SWEEP_LOOK_AFTER_MS,
    SWEEP_LOOKBACK_MS,
    AttemptCount,
    BreakerRow,
    ClaimSeen,
    DispatchOutcome,
    FailedAttempt,
    Fences,
    JobExists,
    JobNotActive,
    JobNotFound,
    JobPlanState,
    JobRecord,
    MissedRuns,
    NextRun,
    NextRuns,
    PartitionsMismatch,
    PlannedRun,
    Registration,
    Run,
    RunNotFound,
    RunRecord,
    SweepLook,
    SweepVerdict,
    add_read_run,
    buckets_due,
    check_triggerable,
    delivery_for,
    held_by_pause,
    is_near,
    log_stale_plans,
    next_attempt,
    owed_behind_mark,
    owed_where_written,
    placed_ahead,
    replaced_runs,
    runs_behind,
    shown_attempt,
    still_owed,
    stored_runs,
    sweep_verdict,
    within_fences,
)
from pysched.records import DispatchRecord, idempotency_key, run_id_for
from pysched.retention import PRUNED_CLAIM_KEPT_MS
from pysched.stores import cassandra_breakers as breaker_tables
from pysched.stores import cassandra_job_ids as job_id_tables
from pysched.stores import cassandra_slots as slot_tables
from pysched.stores import cassandra_sweep as sweep_tables
from pysched.stores.cassandra_rows import applied, named_rows
from pysched.stores.cql_tables import Batch, Bound, CqlTables, DriverTables, Prepared, raise_failed

log = logging.getLogger("pysched.cassandra")

BUCKET_MS = 60_000
# A run a worker hands back (or a client triggers or redrives) is due this
# long after the caller's now: ahead of the watermark, unless the caller's
# clock is behind the leaders' (placed_ahead then places it).
HAND_BACK_MS = 1_000
# Watermarks move in steps of this much at least: fewer fenced writes.
WATERMARK_STEP_MS = 5_000
# A lightweight transaction that timed out is tried this many times in all.
_CAS_ATTEMPTS = 5
_AMBIGUOUS = (WriteTimeout, OperationTimedOut)
# A registration's job rows and first runs go in logged batches of about
# this many bytes: Cassandra warns of a batch over 5 KiB (and fails one
# over 50 KiB: a spec that large goes in a batch of its own).
_REGISTRATION_BATCH_BYTES = 4_500
# What a job's rows weigh in a batch besides its spec (as Cassandra counts
# it: about 530 bytes measured, with room).
_ROWS_BYTES = 600
_FINISHED = frozenset({"succeeded", "failed", "cancelled", "missed"})
# How often a registration's run, or a row owed again, is placed ahead of a
# watermark that keeps passing it while it is written.
_PLACE_ATTEMPTS = 5
# Jobs whose runs one pruning step reads at once.
_PRUNE_READ_JOBS = 256
# What get_run and dead_letters read of a run.
_FULL_RUN_COLUMNS = (
    "run_id, job_id, run_at_ms, attempt_group, due_ms, partition, state, attempt, fence, dispatched_at_ms,"
    " started_at_ms, ended_at_ms, worker, error, result, failures, dead_at_ms, delivery, ended_attempt"
)


@dataclass(frozen=True)
class PrunedDeadLetter:
    """A dead letter the pruner read and means to delete, as it read it."""

    job_id: str
    run_at_ms: int
    attempt_group: int
    partition: int
    dead_at_ms: int


class BackendUnavailable(ConnectionError):
    """A server the node needs cannot be reached; the message names it."""


def prunable(
    runs: Sequence[tuple[int, int, str, int | None]], finished_before_ms: int | None, keep: int | None, limit: int
) -> set[int]:
    """Of one job's runs, newest first as (run_at_ms, attempt_group, state,
    ended_at_ms), the positions of at most ``limit`` that go, oldest first
    (see ScheduleStore.prune_history)."""
    out: list[int] = []
    newer = 0
    for i, (run_at_ms, _, state, ended_at_ms) in enumerate(runs):
        if state not in _FINISHED:
            continue
        newer += 1
        ended = run_at_ms if ended_at_ms is None else ended_at_ms
        if newer > 1 and (
            (keep is not None and newer > keep) or (finished_before_ms is not None and ended < finished_before_ms)
        ):
            out.append(i)
    return set(out[-limit:]) if limit > 0 else set()


def connect(config: ClusterConfig) -> DriverTables:
    """The cluster's tables, over a driver session of the store's profile
    (QUORUM writes and reads, SERIAL transactions, 15 s requests)."""
    host, port = host_port(config.cassandra, 9042)
    profile = ExecutionProfile(
        load_balancing_policy=DCAwareRoundRobinPolicy(local_dc="datacenter1"),
        consistency_level=ConsistencyLevel.QUORUM,
        serial_consistency_level=ConsistencyLevel.SERIAL,
        retry_policy=RetryPolicy(),
        request_timeout=15,
        row_factory=named_rows,
    )
    cluster = Cluster(
        [host],
        port=port,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        connect_timeout=5,
        protocol_version=5,
    )
    try:
        return DriverTables(cluster.connect())
    except NoHostAvailable as exc:
        cluster.shutdown()
        raise BackendUnavailable(f"cassandra at {host}:{port} is unreachable: {exc}") from None


SCHEMA = [
    "CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': {rf}}}",
    "CREATE TABLE IF NOT EXISTS {ks}.jobs (job_id text PRIMARY KEY, spec text, state text, partition int,"
    " jitter_ms bigint, created_at_ms bigint, updated_at_ms bigint, next_run_at_ms bigint, next_due_ms bigint)",
    # attempt and fence: the delivery last handed on and its leader's fence,
    # written when it is recorded, so that a new leader reading the row again
    # hands the run on as the next delivery (protocols.delivery_for).
    "CREATE TABLE IF NOT EXISTS {ks}.schedule (time_bucket bigint, shard int, due_ms bigint, run_id bigint,"
    " job_id text, run_at_ms bigint, attempt_group int, attempt int, fence bigint,"
    " PRIMARY KEY ((time_bucket, shard), due_ms, run_id))",
    "ALTER TABLE {ks}.schedule ADD IF NOT EXISTS (attempt int, fence bigint)",
    # JobRecord.runs_since_ms: set when the job took the id of a cancelled one.
    "ALTER TABLE {ks}.jobs ADD IF NOT EXISTS (runs_since_ms bigint)",
    "CREATE TABLE IF NOT EXISTS {ks}.runs (job_id text, run_at_ms bigint, attempt_group int, run_id bigint,"
    " due_ms bigint, partition int, state text, attempt int, fence bigint, dispatched_at_ms bigint,"
    " started_at_ms bigint, ended_at_ms bigint, worker text, error text, result text, interrupted_attempt int,"
    " failures map<int, text>, dead_at_ms bigint, delivery int, ended_attempt int,"
    " PRIMARY KEY ((job_id), run_at_ms, attempt_group)) WITH CLUSTERING ORDER BY (run_at_ms DESC, attempt_group ASC)",
    # The attempt interrupted, while the run is: a dispatch since (which
    # writes attempt, never state) may have written the next one to attempt.
    "ALTER TABLE {ks}.runs ADD IF NOT EXISTS (interrupted_attempt int)",
    # failures: the run's failed attempts, attempt -> FailedAttempt.to_json(),
    # each written as failures[attempt] = ..., so a write repeated after a
    # timeout is still one entry. dead_at_ms: while the run is a dead letter,
    # the failure time its dead_letters row is clustered by (how redrive and
    # pruning find that row, and how a stale one is told apart).
    "ALTER TABLE {ks}.runs ADD IF NOT EXISTS (failures map<int, text>, dead_at_ms bigint)",
    # attempt: the attempt a user sees (protocols.next_attempt); delivery:
    # the delivery last handed on or started (Run.attempt; a row written
    # before it has it in attempt); ended_attempt: the last attempt that
    # failed or was interrupted. interrupted_attempt is no longer written.
    "ALTER TABLE {ks}.runs ADD IF NOT EXISTS (delivery int, ended_attempt int)",
    # The runs that failed for good. One Cassandra partition per schedule
    # partition (the run's), clustered by failure time, newest first:
    # dead_letters(limit) reads the newest ``limit`` of each of a bounded
    # number of partitions and merges them, never the runs table, and no
    # partition grows with the whole cluster's failures. A row goes when its
    # run is redriven or pruned.
    "CREATE TABLE IF NOT EXISTS {ks}.dead_letters (partition int, failed_at_ms bigint, job_id text,"
    " run_at_ms bigint, attempt_group int, PRIMARY KEY ((partition), failed_at_ms, job_id, run_at_ms, attempt_group))"
    " WITH CLUSTERING ORDER BY (failed_at_ms DESC, job_id ASC, run_at_ms ASC, attempt_group ASC)",
    # One Cassandra partition per schedule partition: the fenced LWTs of
    # different leaders never contend.
    "CREATE TABLE IF NOT EXISTS {ks}.watermarks (partition int PRIMARY KEY, fired_through_ms bigint, fence bigint)",
    # The schedule times each job missed (protocols.MissedRuns), a span a
    # row: written again after a timeout, the same row.
    "CREATE TABLE IF NOT EXISTS {ks}.missed_runs (job_id text, first_ms bigint, end_ms bigint, reason text,"
    " PRIMARY KEY ((job_id), first_ms))",
    "CREATE TABLE IF NOT EXISTS {ks}.changes (k int, partition int, n counter, PRIMARY KEY (k, partition))",
    "CREATE TABLE IF NOT EXISTS {ks}.claims (idem_key text PRIMARY KEY, run_id bigint, state text, holder text,"
    " fence bigint, lease_expires_ms bigint, result text, updated_at_ms bigint)",
    # The run's last checkpoint, written under the claim (claims/redis_cassandra).
    "ALTER TABLE {ks}.claims ADD IF NOT EXISTS (checkpoint text)",
    # The latest delivery the claim was taken for: a failed claim refuses it
    # and every earlier one (a row written before has none: 0).
    "ALTER TABLE {ks}.claims ADD IF NOT EXISTS (delivery int)",
    "CREATE TABLE IF NOT EXISTS {ks}.meta (name text PRIMARY KEY, value int)",
    *job_id_tables.SCHEMA,
    *breaker_tables.SCHEMA,
    *slot_tables.SCHEMA,
    *sweep_tables.SCHEMA,
]


def ensure_schema(tables: CqlTables, config: ClusterConfig, now_ms: int) -> int:
    """Create what is missing; returns the keyspace's partition count.
    Every partition gets a watermark at creation (``now_ms``): no run can be
    due before the schedule that holds it existed. Raises PartitionsMismatch if the
    configuration names another count than the keyspace's, which is left
    as it was."""
    for statement in SCHEMA:
        tables.execute(statement.format(ks=config.keyspace, rf=config.replication_factor), timeout=60)
    tables.agree_on_schema()
    known = {r.partition for r in tables.execute(f"SELECT partition FROM {config.keyspace}.watermarks")}
    # A keyspace made before the count was stored: its watermarks were
    # written for the partitions its clients were configured with, which is
    # what its nodes led; a configuration that names a count knows better.
    unrecorded = config.partitions or (max(known) + 1 if known else DEFAULT_PARTITIONS)
    partitions = _settle_partitions(tables, config.keyspace, unrecorded)
    job_id_tables.backfill(tables, config.keyspace)
    if config.partitions is not None and config.partitions != partitions:
        raise PartitionsMismatch(f"keyspace {config.keyspace!r}", config.partitions, partitions)
    missing = [p for p in range(partitions) if p not in known]
    if missing:
        start = now_ms - SETTLE_MS
        # Write timestamp 1: any real write wins over it, so this creates the
        # row without a Paxos round that nodes starting together contend on.
        insert = tables.prepare(
            f"INSERT INTO {config.keyspace}.watermarks (partition, fired_through_ms, fence) VALUES (?, ?, 0)"
            " USING TIMESTAMP 1"
        )
        for p in missing:
            tables.execute(insert, (p, start))
    return partitions


def stored_partitions(tables: CqlTables, keyspace: str) -> int | None:
    """The keyspace's partition count, None before ensure_schema wrote it."""
    row = tables.execute(f"SELECT value FROM {keyspace}.meta WHERE name = 'partitions'").one()
    return None if row is None else int(row.value)


def _settle_partitions(tables: CqlTables, keyspace: str, count: int) -> int:
    """The keyspace's count, writing ``count`` if it has none. A lightweight
    transaction: of clients creating the keyspace together, one count wins
    and all of them read it. Only the first open of a keyspace gets past
    the plain read."""
    insert = f"INSERT INTO {keyspace}.meta (name, value) VALUES ('partitions', %s) IF NOT EXISTS"
    for _ in range(_CAS_ATTEMPTS):
        stored = stored_partitions(tables, keyspace)
        if stored is not None:
            return stored
        # Applied or not, the transaction leaves a committed count for the
        # read that follows; one that timed out may not have, and is tried again.
        with suppress(*_AMBIGUOUS):
            tables.execute(insert, (count,))
    raise BackendUnavailable(f"cassandra: could not record the partition count of keyspace {keyspace}")


def _ahead_of(run: PlannedRun | None, mark: int | None) -> PlannedRun | None:
    """Where a registered run goes: where it was planned, unless that is at
    or behind its partition's watermark (``mark``), which no leader reads
    from; then ahead of it (placed_ahead). Its schedule time, and so its
    identity, stays."""
    if run is None:
        return None
    due_ms = placed_ahead(run.due_ms, mark)
    return run if due_ms == run.due_ms else PlannedRun(run.run_at_ms, due_ms)


def _delivery(row: Any) -> int:
    """The delivery a run row last met; a row written before runs kept it
    apart from the attempt kept it in ``attempt``."""
    return int(row.delivery if row.delivery is not None else row.attempt or 0)


@dataclass(frozen=True)
class _Registered:
    """What a registration did: each job stored (its state and first run),
    and each id already taken (the state of the job there)."""

    stored: dict[str, tuple[str, PlannedRun | None]]
    existing: dict[str, str]
    runs_since: dict[str, int]
    # Ids of cancelled jobs a new job could not take, and why.
    refused: dict[str, JobExists]


class CassandraScheduleStore:
    def __init__(
        self,
        tables: CqlTables,
        config: ClusterConfig,
        clock: Clock | None = None,
        run_held: Callable[[str], int | None] | None = None,
    ) -> None:
        """``run_held``: how long etcd still holds a run's key (EtcdRunLeases.held_for_ms),
        for the leader's sweep to tell a dead worker's run from a live one's."""
        self.tables = tables
        # The keyspace's count, not the configuration's: the partitions
        # every node leads (ensure_schema writes it, and checks the
        # configuration against it).
        stored = stored_partitions(tables, config.keyspace)
        if stored is None:
            raise BackendUnavailable(f"cassandra: keyspace {config.keyspace} has no partition count; run ensure_schema")
        self.partitions = stored
        self.keyspace = ks = config.keyspace
        p = tables.prepare
        # A registration's job row, written whole once its id is claimed
        # (cassandra_job_ids), in one logged batch with its first run.
        self._write_job = p(
            f"INSERT INTO {ks}.jobs (job_id, spec, state, partition, jitter_ms, created_at_ms, updated_at_ms,"
            " next_run_at_ms, next_due_ms, runs_since_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self._job_ids = job_id_tables.JobIdClaims(tables, ks, clock)
        # What goes of a cancelled job whose id a new job takes.
        self._job_runs = p(
            f"SELECT run_at_ms, attempt_group, state, dispatched_at_ms, partition, dead_at_ms, due_ms, run_id"
            f" FROM {ks}.runs WHERE job_id = ?"
        )
        self._delete_job_runs = p(f"DELETE FROM {ks}.runs WHERE job_id = ?")
        # At the caller's time in milliseconds, the scale its spans are
        # written in (_missed_row): a delete at the server's microseconds
        # would hide every span the job holding the id next misses.
        self._delete_job_missed = p(f"DELETE FROM {ks}.missed_runs USING TIMESTAMP ? WHERE job_id = ?")
        self._delete_job_slot = p(f"DELETE FROM {ks}.running_slots WHERE job_id = ?")
        self._runs_since = p(f"SELECT runs_since_ms FROM {ks}.jobs WHERE job_id = ?")
        self._get_job = p(
            f"SELECT job_id, spec, state, partition, jitter_ms, created_at_ms, next_run_at_ms, next_due_ms,"
            f" updated_at_ms, runs_since_ms FROM {ks}.jobs WHERE job_id = ?"
        )
        self._all_jobs = p(
            f"SELECT job_id, spec, state, partition, jitter_ms, created_at_ms, next_run_at_ms, next_due_ms,"
            f" updated_at_ms, runs_since_ms FROM {ks}.jobs"
        )
        self._set_job_state = p(
            f"UPDATE {ks}.jobs SET state = ?, next_run_at_ms = null, next_due_ms = null, updated_at_ms = ?"
            " WHERE job_id = ? IF state = ?"
        )
        self._reschedule_job = p(
            f"UPDATE {ks}.jobs SET spec = ?, jitter_ms = ?, state = ?, next_run_at_ms = ?, next_due_ms = ?,"
            " updated_at_ms = ? WHERE job_id = ? IF state = 'active'"
        )
        self._insert_run = p(
            f"INSERT INTO {ks}.runs (job_id, run_at_ms, attempt_group, run_id, due_ms, partition, state, attempt,"
            " delivery, ended_attempt) VALUES (?, ?, ?, ?, ?, ?, 'scheduled', 0, 0, 0)"
        )
        self._groups_at = p(f"SELECT attempt_group FROM {ks}.runs WHERE job_id = ? AND run_at_ms = ?")
        self._insert_new_run = p(
            f"INSERT INTO {ks}.runs (job_id, run_at_ms, attempt_group, run_id, due_ms, partition, state, attempt,"
            " delivery, ended_attempt) VALUES (?, ?, ?, ?, ?, ?, 'scheduled', 0, 0, 0) IF NOT EXISTS"
        )
        self._insert_schedule = p(
            f"INSERT INTO {ks}.schedule (time_bucket, shard, due_ms, run_id, job_id, run_at_ms, attempt_group)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)"
        )
        self._delete_schedule = p(
            f"DELETE FROM {ks}.schedule WHERE time_bucket = ? AND shard = ? AND due_ms = ? AND run_id = ?"
        )
        self._pause_job = p(
            f"UPDATE {ks}.jobs SET state = 'paused', updated_at_ms = ? WHERE job_id = ? IF state = 'active'"
        )
        self._resume_job = p(
            f"UPDATE {ks}.jobs SET state = ?, next_run_at_ms = ?, next_due_ms = ?, updated_at_ms = ?"
            " WHERE job_id = ? IF state = 'paused'"
        )
        # A pause holds its job's next run only while it waits to be handed
        # on (protocols.held_by_pause): a row not yet written (its leader's
        # record moved the job's pointer, and writes the row next), or one
        # scheduled and never marked sent. A row the record of its send,
        # its worker's start or its end wrote meanwhile is not held.
        self._hold_unwritten_run = p(
            f"INSERT INTO {ks}.runs (job_id, run_at_ms, attempt_group, run_id, due_ms, partition, state, attempt,"
            " delivery, ended_attempt) VALUES (?, ?, 0, ?, ?, ?, 'paused', 0, 0, 0) IF NOT EXISTS"
        )
        self._hold_run = p(
            f"UPDATE {ks}.runs SET state = 'paused' WHERE job_id = ? AND run_at_ms = ? AND attempt_group = 0"
            " IF state = 'scheduled' AND dispatched_at_ms = null"
        )
        self._held_state = p(
            f"SELECT state, dispatched_at_ms FROM {ks}.runs WHERE job_id = ? AND run_at_ms = ? AND attempt_group = 0"
        )
        # Only a run still held: one handed on is its worker's to record.
        self._missed_while_paused = p(
            f"UPDATE {ks}.runs SET state = 'missed', ended_at_ms = ?, error = 'missed: the job was paused'"
            " WHERE job_id = ? AND run_at_ms = ? AND attempt_group = 0 IF state = 'paused' AND dispatched_at_ms = null"
        )
        self._cancel_run = p(
            f"UPDATE {ks}.runs SET state = 'cancelled', ended_at_ms = ? WHERE job_id = ? AND run_at_ms = ?"
            " AND attempt_group = 0"
        )
        self._hand_back_schedule = p(
            f"INSERT INTO {ks}.schedule (time_bucket, shard, due_ms, run_id, job_id, run_at_ms, attempt_group,"
            " attempt, fence) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self._bucket = p(
            f"SELECT run_id, due_ms, job_id, run_at_ms, attempt_group, attempt, fence FROM {ks}.schedule"
            " WHERE time_bucket = ? AND shard = ? AND due_ms > ? AND due_ms < ?"
        )
        self._watermarks = p(f"SELECT partition, fired_through_ms FROM {ks}.watermarks")
        self._watermark_fences = p(f"SELECT partition, fence, fired_through_ms FROM {ks}.watermarks")
        # Fenced: a leader that lost its partition (and may not know it yet)
        # cannot move the watermark its successor starts from.
        self._set_watermark = p(
            f"UPDATE {ks}.watermarks SET fired_through_ms = ?, fence = ? WHERE partition = ?"
            " IF fence <= ? AND fired_through_ms < ?"
        )
        self._raise_watermark_fence = p(f"UPDATE {ks}.watermarks SET fence = ? WHERE partition = ? IF fence < ?")
        self._changes = p(f"SELECT partition, n FROM {ks}.changes WHERE k = 0")
        self._bump = p(f"UPDATE {ks}.changes SET n = n + 1 WHERE k = 0 AND partition = ?")
        self._mark_dispatched = p(
            f"UPDATE {ks}.runs SET fence = ?, dispatched_at_ms = ?, delivery = ? WHERE job_id = ? AND run_at_ms = ?"
            " AND attempt_group = ?"
        )
        # An update, not an insert: a row deleted meanwhile (its run was
        # cancelled) comes back with no run in it, which due_runs skips,
        # rather than as the cancelled run.
        self._mark_schedule = p(
            f"UPDATE {ks}.schedule SET attempt = ?, fence = ? WHERE time_bucket = ? AND shard = ? AND due_ms = ?"
            " AND run_id = ?"
        )
        # A plan's write, on the job as the plan read it (NextRuns.planned_from):
        # a job rescheduled, resumed, paused, cancelled or planned by another
        # leader since keeps what that planned.
        self._set_next_as_planned = p(
            f"UPDATE {ks}.jobs SET next_run_at_ms = ?, next_due_ms = ?, updated_at_ms = ? WHERE job_id = ?"
            " IF state = 'active' AND next_run_at_ms = ?"
        )
        self._complete_as_planned = p(
            f"UPDATE {ks}.jobs SET state = 'completed', next_run_at_ms = null, next_due_ms = null, updated_at_ms = ?"
            " WHERE job_id = ? IF state = 'active' AND next_run_at_ms = ?"
        )
        self._history = p(
            f"SELECT run_id, job_id, run_at_ms, due_ms, state, attempt, ended_attempt, fence, dispatched_at_ms,"
            f" started_at_ms, ended_at_ms, worker, error, result FROM {ks}.runs WHERE job_id = ? LIMIT ?"
        )
        self._run_started = p(
            f"UPDATE {ks}.runs SET state = 'running', started_at_ms = ?, worker = ?, attempt = ?, delivery = ?,"
            " error = null,"
            " ended_at_ms = null, result = null WHERE job_id = ? AND run_at_ms = ? AND attempt_group = ?"
        )
        self._run_state = p(
            f"SELECT state, worker, attempt, delivery, ended_attempt FROM {ks}.runs"
            " WHERE job_id = ? AND run_at_ms = ? AND attempt_group = ?"
        )
        self._run_finished = p(
            f"UPDATE {ks}.runs SET state = ?, ended_at_ms = ?, error = ?, result = ?"
            " WHERE job_id = ? AND run_at_ms = ? AND attempt_group = ?"
        )
        self._run_interrupted = p(
            f"UPDATE {ks}.runs SET state = 'interrupted', ended_attempt = ?, ended_at_ms = ?,"
            " error = ?, result = null WHERE job_id = ? AND run_at_ms = ? AND attempt_group = ?"
        )
        self._job_run_states = p(
            f"SELECT run_at_ms, attempt_group, state, dispatched_at_ms FROM {ks}.runs WHERE job_id = ?"
        )
        self._cancel_run_in_group = p(
            f"UPDATE {ks}.runs SET state = 'cancelled', ended_at_ms = ? WHERE job_id = ? AND run_at_ms = ?"
            " AND attempt_group = ?"
        )
        self._job_partitions = p(f"SELECT job_id, partition FROM {ks}.jobs")
        self._run_ends = p(
            f"SELECT run_at_ms, attempt_group, state, ended_at_ms, partition, dead_at_ms FROM {ks}.runs"
            " WHERE job_id = ?"
        )
        self._delete_runs = p(f"DELETE FROM {ks}.runs WHERE job_id = ? AND run_at_ms >= ? AND run_at_ms <= ?")
        self._delete_runs_through = p(f"DELETE FROM {ks}.runs WHERE job_id = ? AND run_at_ms <= ?")
        self._delete_run = p(f"DELETE FROM {ks}.runs WHERE job_id = ? AND run_at_ms = ? AND attempt_group = ?")
        self._delete_claim = p(f"DELETE FROM {ks}.claims WHERE idem_key = ?")
        # A pruned run's claim, made a tombstone that expires once no record
        # of the run can be delivered (retention.py): every other column
        # cleared, so nothing of the row outlives its TTL.
        self._bury_claim = p(
            f"INSERT INTO {ks}.claims (idem_key, run_id, state, holder, fence, lease_expires_ms, result,"
            f" updated_at_ms, checkpoint, delivery) VALUES (?, null, '{PRUNED_STATE}', null, null, null, null, ?,"
            " null, null) USING TTL ?"
        )
        # A registration's run placed again ahead of the watermark (_keep_ahead).
        self._run_handed_on = p(
            f"SELECT state, dispatched_at_ms FROM {ks}.runs WHERE job_id = ? AND run_at_ms = ? AND attempt_group = 0"
        )
        self._set_run_due = p(
            f"UPDATE {ks}.runs SET due_ms = ? WHERE job_id = ? AND run_at_ms = ? AND attempt_group = 0"
        )
        # A row owed again placed again ahead of the watermark (_keep_owed_ahead).
        self._set_owed_due = p(
            f"UPDATE {ks}.runs SET due_ms = ? WHERE job_id = ? AND run_at_ms = ? AND attempt_group = ?"
        )
        # Conditional: a reschedule that replaced the run meanwhile keeps its own.
        self._set_next_due = p(f"UPDATE {ks}.jobs SET next_due_ms = ? WHERE job_id = ? IF next_run_at_ms = ?")
        # Retries and dead letters.
        self._get_run = p(
            f"SELECT {_FULL_RUN_COLUMNS} FROM {ks}.runs WHERE job_id = ? AND run_at_ms = ? AND attempt_group = ?"
        )
        self._job_state = p(f"SELECT state FROM {ks}.jobs WHERE job_id = ?")
        self._add_failure = p(
            f"UPDATE {ks}.runs SET failures[?] = ? WHERE job_id = ? AND run_at_ms = ? AND attempt_group = ?"
        )
        # run_id and partition too: a run pruned meanwhile comes back whole
        # enough to be read, retried and redriven.
        self._end_failed = p(
            f"UPDATE {ks}.runs SET failures[?] = ?, ended_attempt = ?, state = ?, due_ms = ?, ended_at_ms = ?,"
            " error = ?, result = ?,"
            " run_id = ?, partition = ? WHERE job_id = ? AND run_at_ms = ? AND attempt_group = ?"
        )
        self._end_dead = p(
            f"UPDATE {ks}.runs SET failures[?] = ?, ended_attempt = ?, state = 'failed', due_ms = ?, ended_at_ms = ?,"
            " error = ?,"
            " result = ?, run_id = ?, partition = ?, dead_at_ms = ?"
            " WHERE job_id = ? AND run_at_ms = ? AND attempt_group = ?"
        )
        # Conditional on the dead letter as read, as the pruner's delete of
        # it is: of a redrive and a pruning of one run, Paxos lets one win.
        self._redrive_run = p(
            f"UPDATE {ks}.runs SET state = 'retrying', due_ms = ?, ended_at_ms = null, dead_at_ms = null"
            " WHERE job_id = ? AND run_at_ms = ? AND attempt_group = ? IF state = 'failed' AND dead_at_ms = ?"
        )
        self._delete_dead_run = p(
            f"DELETE FROM {ks}.runs WHERE job_id = ? AND run_at_ms = ? AND attempt_group = ?"
            " IF state = 'failed' AND dead_at_ms = ?"
        )
        self._insert_dead_letter = p(
            f"INSERT INTO {ks}.dead_letters (partition, failed_at_ms, job_id, run_at_ms, attempt_group)"
            " VALUES (?, ?, ?, ?, ?)"
        )
        self._get_dead_letter = p(
            f"SELECT job_id FROM {ks}.dead_letters WHERE partition = ? AND failed_at_ms = ? AND job_id = ?"
            " AND run_at_ms = ? AND attempt_group = ?"
        )
        self._delete_dead_letter = p(
            f"DELETE FROM {ks}.dead_letters WHERE partition = ? AND failed_at_ms = ? AND job_id = ?"
            " AND run_at_ms = ? AND attempt_group = ?"
        )
        self._newest_dead_letters = p(
            f"SELECT failed_at_ms, job_id, run_at_ms, attempt_group FROM {ks}.dead_letters WHERE partition = ? LIMIT ?"
        )
        # Written at the span's end as its timestamp: of two writes of one
        # span, the later end holds whichever arrives last.
        self._insert_missed = p(
            f"INSERT INTO {ks}.missed_runs (job_id, first_ms, end_ms, reason) VALUES (?, ?, ?, ?) USING TIMESTAMP ?"
        )
        self._missed_of_job = p(f"SELECT job_id, first_ms, end_ms, reason FROM {ks}.missed_runs WHERE job_id = ?")
        self._run_missed = p(
            f"UPDATE {ks}.runs SET state = 'missed', ended_at_ms = ?, error = ?, result = null"
            " WHERE job_id = ? AND run_at_ms = ? AND attempt_group = ?"
        )
        self._park = p(
            f"UPDATE {ks}.runs SET state = 'parked', due_ms = ?, delivery = ?, error = ?, run_id = ?, partition = ?"
            " WHERE job_id = ? AND run_at_ms = ? AND attempt_group = ?"
        )
        self._breakers = breaker_tables.CassandraBreakers(tables, ks)
        self._slots = slot_tables.CassandraSlots(tables, ks, self._wake_waiting)
        self._sweep = sweep_tables.CassandraSweep(tables, ks, run_held)
        self._swept_run = p(
            f"SELECT state, dispatched_at_ms, due_ms, delivery FROM {ks}.runs"
            " WHERE job_id = ? AND run_at_ms = ? AND attempt_group = ?"
        )
        self._wm_cache: dict[int, int] = {}
        # Per partition, the watermark this client's last sweep read up to.
        self._swept_marks: dict[int, int] = {}

    # -- registration ---------------------------------------------------------

    def add_job(self, job: Job, partition: int, jitter_ms: int, first: PlannedRun | None, now_ms: int) -> JobRecord:
        outcome = self._register([(job, partition, jitter_ms, first)], now_ms)
        if job.id in outcome.refused:
            raise outcome.refused[job.id]
        if job.id in outcome.existing:
            raise JobExists.for_state(job.id, outcome.existing[job.id])
        state, run = outcome.stored[job.id]
        return JobRecord(job, state, partition, jitter_ms, now_ms, run, outcome.runs_since.get(job.id, 0))

    def add_jobs(self, items: Sequence[Registration], now_ms: int) -> list[str]:
        outcome = self._register(items, now_ms)
        existing = {*outcome.existing, *outcome.refused}
        # As one transaction would: an id listed again after its first is
        # an existing job by then.
        seen: set[str] = set()
        out: list[str] = []
        for job, *_ in items:
            if job.id in existing or job.id in seen:
                out.append(job.id)
            seen.add(job.id)
        return out

    def _register(self, items: Sequence[Registration], now_ms: int) -> _Registered:
        """Claim the jobs' ids (cassandra_job_ids: a Paxos round per bucket
        of ids, not per job), then write each job claimed with its first run
        in logged batches, so that an active job always has its next run.
        An id listed twice is registered as its first listing says."""
        owner = self._job_ids.new_owner()
        firsts: dict[str, Registration] = {}
        for item in items:
            firsts.setdefault(item[0].id, item)
        held = self._job_ids.claim(list(firsts), owner, now_ms)
        existing = self._in_the_way(held, owner, now_ms)
        runs_since: dict[str, int] = {}
        refused: dict[str, JobExists] = {}
        for job_id in [j for j, state in existing.items() if state == "cancelled"]:
            try:
                if self._take_cancelled(held[job_id], owner, firsts[job_id][3], now_ms, runs_since):
                    del existing[job_id]
            except JobExists as exc:
                refused[job_id] = exc
        # Read now, right before the writes: the later, the fewer runs the
        # watermark passes while they are written (_keep_ahead).
        marks = self.watermarks()
        stored: dict[str, tuple[str, PlannedRun | None]] = {}
        placed: dict[str, tuple[int, PlannedRun]] = {}
        partitions: set[int] = set()
        batches: list[Batch] = []
        batch: list[Bound] = []
        size = 0
        for job_id, (job, partition, jitter_ms, first) in firsts.items():
            if job_id in existing or job_id in refused:
                continue
            planned = self._not_before_now(first, now_ms)
            first = _ahead_of(planned, marks.get(partition))
            state = "active" if first else "completed"
            spec = job.model_dump_json()
            if size and size + len(spec) > _REGISTRATION_BATCH_BYTES:
                batches.append(Batch(batch, logged=True))
                batch, size = [], 0
            batch.append(
                (
                    self._write_job,
                    (
                        job_id,
                        spec,
                        state,
                        partition,
                        jitter_ms,
                        now_ms,
                        now_ms,
                        first.run_at_ms if first else None,
                        first.due_ms if first else None,
                        runs_since.get(job_id),
                    ),
                )
            )
            size += len(spec) + _ROWS_BYTES
            if first is not None:
                self._add_run_rows(batch, job_id, partition, first)
                placed[job_id] = (partition, first)
            stored[job_id] = (state, first)
            # A run placed ahead of the watermark is due about now to the leader.
            if is_near(first, now_ms) or first != planned:
                partitions.add(partition)
        if size:
            batches.append(Batch(batch, logged=True))
        for ok, result in self.tables.execute_many(batches, concurrency=128):
            if not ok:
                raise result
        self._concurrent(self._bump, [(p,) for p in sorted(partitions)])
        for job_id, run in self._keep_ahead(placed).items():
            stored[job_id] = (stored[job_id][0], run)
        return _Registered(stored, existing, runs_since, refused)

    def _in_the_way(self, held: Mapping[str, job_id_tables.HeldId], owner: str, now_ms: int) -> dict[str, str]:
        """Of the ids another registration holds, those whose job exists or
        whose registration may still be writing it, each with its job's
        state; an id held past the grace by a registration that died before
        writing its job is taken over."""
        if not held:
            return {}
        ids = list(held)
        rows = self.tables.execute_many([(self._job_state, (j,)) for j in ids], concurrency=64)
        existing: dict[str, str] = {}
        for job_id, (ok, result) in zip(ids, rows, strict=True):
            if not ok:
                raise result
            row = result.one()
            # A "registering" row: left by a version that wrote the job row
            # first and activated it after.
            written = row is not None and row.state != "registering"
            stale = held[job_id].claimed_at_ms <= now_ms - job_id_tables.REGISTERING_GRACE_MS
            if written or not stale or not self._job_ids.take_over(held[job_id], owner, now_ms):
                existing[job_id] = row.state if row is not None else "registering"
        return existing

    def _take_cancelled(
        self, held: job_id_tables.HeldId, owner: str, first: PlannedRun | None, now_ms: int, since: dict[str, int]
    ) -> bool:
        """Take the id of the cancelled job ``held`` names for a new job
        whose first run is ``first``: its id claim (a transaction on the
        row as read, so of two registrations one takes it), then every row
        kept of the old job goes; ``since`` gets the new job's
        runs_since_ms (replaced_runs). False when another took the id
        first. A record of the old job written late meets no run row of
        its time and is dropped (_of_replaced); so is one handed on from a
        schedule row not found here (a hand-back's), by the worker."""
        job_id = held.job_id
        # The claim is the cancelled job's own (made with its row, at its
        # creation time) or a newer registration's, which took it over and
        # may still be writing its job: that one is not to be taken from,
        # unless it died, its grace past.
        in_flight = held.claimed_at_ms != self._row(job_id).created_at_ms
        if in_flight and held.claimed_at_ms > now_ms - job_id_tables.REGISTERING_GRACE_MS:
            raise JobExists(f"job {job_id!r} is being registered by another client")
        runs = list(self.tables.execute(self._job_runs, (job_id,)))
        runs_since = replaced_runs(job_id, [(r.run_at_ms, r.state, r.dispatched_at_ms) for r in runs], first, now_ms)
        if not self._job_ids.take_over(held, owner, now_ms):
            return False
        deletes: list[tuple[Prepared, tuple[Any, ...]]] = []
        for r in runs:
            deletes.append((self._delete_claim, (idempotency_key(job_id, r.run_at_ms, r.attempt_group),)))
            # Its schedule row, where the run row says it is due (a retry's
            # or a park's too): no leader hands it on again.
            if r.due_ms is not None and r.partition is not None and r.run_id is not None:
                deletes.append((self._delete_schedule, (r.due_ms // BUCKET_MS, r.partition, r.due_ms, r.run_id)))
            if r.dead_at_ms is not None and r.partition is not None:
                deletes.append(
                    (self._delete_dead_letter, (r.partition, r.dead_at_ms, job_id, r.run_at_ms, r.attempt_group))
                )
        deletes += [(s, (job_id,)) for s in (self._delete_job_runs, self._delete_job_slot)]
        deletes.append((self._delete_job_missed, (now_ms, job_id)))
        for ok, result in self.tables.execute_many(deletes, concurrency=64):
            if not ok:
                raise result
        since[job_id] = runs_since
        return True

    def _of_replaced(self, job_id: str, run_at_ms: int) -> bool:
        """Whether a record of ``job_id``'s run at ``run_at_ms``, which has
        no run row, is of a cancelled job the job now holding the id
        replaced (protocols.of_replaced_job): nothing of it is written.
        Read only for a record that found no row (its own run's row is
        written when it is planned)."""
        row = self.tables.execute(self._runs_since, (job_id,)).one()
        return row is not None and run_at_ms < (row.runs_since_ms or 0)

    def reschedule(self, job: Job, jitter_ms: int, first: PlannedRun | None, now_ms: int) -> JobRecord:
        current = self._row(job.id)
        if current.state != "active":
            raise JobNotActive(f"job {job.id!r} is {current.state}")
        first = _ahead_of(self._not_before_now(first, now_ms), self.watermarks().get(current.partition))
        # Before the new spec is written: a worker that reads it (it reads
        # the job, then records the start) then finds its run cancelled.
        self._cancel_handed_on(job.id, now_ms)
        if first is not None:
            self._write_run(job.id, current.partition, first)
        res = self.tables.execute(
            self._reschedule_job,
            (
                job.model_dump_json(),
                jitter_ms,
                "active" if first else "completed",
                first.run_at_ms if first else None,
                first.due_ms if first else None,
                now_ms,
                job.id,
            ),
        )
        if not applied(res):
            raise JobNotActive(f"job {job.id!r} is {res.one().state}")
        if current.next_run_at_ms is not None and (first is None or first.run_at_ms != current.next_run_at_ms):
            self._drop_pending(job.id, current.partition, current.next_run_at_ms, current.next_due_ms, now_ms)
        self.tables.execute(self._bump, (current.partition,))
        if first is not None:
            self._keep_ahead({job.id: (current.partition, first)})
        return self.get_job(job.id)

    def cancel_job(self, job_id: str, now_ms: int) -> JobRecord:
        current = self._row(job_id)
        if current.state == "cancelled":
            raise JobNotActive(f"job {job_id!r} is already cancelled")
        res = self.tables.execute(self._set_job_state, ("cancelled", now_ms, job_id, current.state))
        if not applied(res):
            raise JobNotActive(f"job {job_id!r} changed while cancelling; try again")
        if current.next_run_at_ms is not None:
            self._drop_pending(job_id, current.partition, current.next_run_at_ms, current.next_due_ms, now_ms)
        self.tables.execute(self._bump, (current.partition,))
        return self.get_job(job_id)

    def pause_job(self, job_id: str, now_ms: int) -> JobRecord:
        current = self._row(job_id)
        if current.state != "active":
            raise JobNotActive(f"job {job_id!r} is {current.state}, not active")
        res = self.tables.execute(self._pause_job, (now_ms, job_id))
        if not applied(res):
            raise JobNotActive(f"job {job_id!r} is {res.one().state}, not active")
        if current.next_run_at_ms is not None and self._hold(job_id, current):
            # Out of the schedule, so no leader reads it again; its run row
            # and the job's pointer say which run it was, for the resume.
            run_id = run_id_for(job_id, current.next_run_at_ms, 0)
            due_ms = current.next_due_ms
            self.tables.execute(self._delete_schedule, (due_ms // BUCKET_MS, current.partition, due_ms, run_id))
        self.tables.execute(self._bump, (current.partition,))
        return self.get_job(job_id)

    def _hold(self, job_id: str, current: Any) -> bool:
        """Whether the pause holds the job's next run: the run its pointer
        names, while it waits to be handed on. Not held (both conditions
        refused): its leader sent it and recorded so, or a worker started
        or ended it, before the pause; it keeps its row and schedule row
        (a new leader may send it again: a worker records it missed while
        the job is paused, or runs it once resumed, the claim making one
        effect of two deliveries), and the resume plans from the
        schedule's time after it (JobRecord.sent_before_pause_ms). A send
        not yet recorded when the hold lands is held, and its record marks
        it sent after: then the same."""
        run_at_ms = current.next_run_at_ms
        run_id = run_id_for(job_id, run_at_ms, 0)
        new = (job_id, run_at_ms, run_id, current.next_due_ms, current.partition)
        if applied(self.tables.execute(self._hold_unwritten_run, new)):
            return True
        return applied(self.tables.execute(self._hold_run, (job_id, run_at_ms)))

    def resume_job(self, job_id: str, next_run: PlannedRun | None, missed: MissedRuns | None, now_ms: int) -> JobRecord:
        current = self._row(job_id)
        if current.state != "paused":
            raise JobNotActive(f"job {job_id!r} is {current.state}, not paused")
        first = _ahead_of(self._not_before_now(next_run, now_ms), self.watermarks().get(current.partition))
        if first is not None:
            self._write_run(job_id, current.partition, first)
        if missed is not None:
            self.tables.execute(self._insert_missed, _missed_row(missed))
        res = self.tables.execute(
            self._resume_job,
            (
                "active" if first else "completed",
                first.run_at_ms if first else None,
                first.due_ms if first else None,
                now_ms,
                job_id,
            ),
        )
        if not applied(res):
            raise JobNotActive(f"job {job_id!r} is {res.one().state}, not paused")
        held = current.next_run_at_ms
        if held is not None and (first is None or first.run_at_ms != held):
            # Refused for a run handed on: its worker records what became of it.
            self.tables.execute(self._missed_while_paused, (now_ms, job_id, held))
        self.tables.execute(self._bump, (current.partition,))
        if first is not None:
            self._keep_ahead({job_id: (current.partition, first)})
        return self.get_job(job_id)

    # -- reading --------------------------------------------------------------

    def writes_together(self) -> AbstractContextManager[None]:
        # Cassandra has no transaction across tables: each write is durable
        # on its own, in the order made.
        return nullcontext()

    def get_job(self, job_id: str) -> JobRecord:
        return self._record(self._row(job_id))

    def list_jobs(self) -> list[JobRecord]:
        rows = [r for r in self.tables.execute(self._all_jobs) if r.state != "registering"]
        return [self._record(r) for r in sorted(rows, key=lambda r: r.job_id)]

    def history(self, job_id: str, limit: int = 50) -> list[RunRecord]:
        since = self._row(job_id).runs_since_ms or 0
        out = []
        for r in self.tables.execute(self._history, (job_id, limit + 1)):
            run = self._run_record(r)
            # A late write of a cancelled job this one replaced, which
            # slipped past the checks: no part of this job's history.
            if run is not None and run.run_at_ms >= since:
                out.append(run)
        return out[:limit]

    def last_runs(self, job_ids: Sequence[str]) -> dict[str, RunRecord]:
        # The newest rows of each job: a pending run, perhaps runs cancelled
        # before they were handed on, then the one wanted.
        out: dict[str, RunRecord] = {}
        results = self.tables.execute_many([(self._history, (job_id, 4)) for job_id in job_ids], concurrency=64)
        for ok, rows in results:
            if not ok:
                raise rows
            for r in rows:
                run = self._run_record(r)
                if run is not None and run.dispatched_at_ms is not None:
                    out[run.job_id] = run
                    break
        return out

    @classmethod
    def _full_record(cls, r: Any) -> RunRecord:
        """A run as get_run and dead_letters return it: found while it waits
        for its first dispatch, with its failed attempts by attempt number."""
        record = cls._run_record(r)
        if record is None:
            record = RunRecord.waiting(r.run_id, r.job_id, r.run_at_ms, r.due_ms, r.state, r.attempt or 0, r.fence)
        failures = r.failures or {}
        return replace(
            record,
            run_id=run_id_for(r.job_id, r.run_at_ms, r.attempt_group) if r.run_id is None else r.run_id,
            failures=tuple(FailedAttempt.from_json(failures[k]) for k in sorted(failures)),
            attempt_group=r.attempt_group,
        )

    @staticmethod
    def _run_record(r: Any) -> RunRecord | None:
        state = r.state
        if state == "scheduled":
            if r.dispatched_at_ms is None:
                return None  # still waiting: not history yet
            state = "dispatched"
        return RunRecord(
            r.run_id,
            r.job_id,
            r.run_at_ms,
            r.due_ms,
            state,
            shown_attempt(state, r.attempt or 0, r.ended_attempt or 0),
            r.fence,
            r.dispatched_at_ms,
            r.started_at_ms,
            r.ended_at_ms,
            r.worker,
            r.error,
            r.result,
        )

    def change_versions(self) -> dict[int, int]:
        return {int(r.partition): int(r.n) for r in self.tables.execute(self._changes)}

    def hand_back(self, record: DispatchRecord, now_ms: int, started_by: str | None = None) -> bool:
        # Its schedule row may lie behind the watermark the new leader reads
        # from (the old leader recorded it sent): a new row, due a moment from
        # now, and a change notice bring it into that leader's wheel.
        mark = self.watermarks().get(record.partition)
        row = self.tables.execute(self._run_state, (record.job_id, record.run_at_ms, record.attempt_group)).one()
        if row is None or not still_owed(row.state, row.worker, started_by):
            return False  # started, finished or cancelled since: nothing owed
        # Ahead of the watermark whatever the worker's clock says.
        due = placed_ahead(now_ms + HAND_BACK_MS, mark)
        self.tables.execute(
            self._hand_back_schedule,
            (
                due // BUCKET_MS,
                record.partition,
                due,
                record.run_id,
                record.job_id,
                record.run_at_ms,
                record.attempt_group,
                record.attempt,
                record.fence,
            ),
        )
        self.tables.execute(self._bump, (record.partition,))
        self._keep_owed_ahead(record, due, record.attempt, record.fence, sets_due=False)
        return True

    def raise_fence(self, partition: int, fence: int) -> None:
        # Conditional on the same row as the watermark moves (IF fence <= f):
        # once this applied, an older leader's move is refused. Not applied
        # means a fence as high or higher is there already.
        self.tables.execute(self._raise_watermark_fence, (fence, partition, fence))

    def watermarks(self) -> dict[int, int]:
        return {int(r.partition): int(r.fired_through_ms) for r in self.tables.execute(self._watermarks)}

    # -- the leader's side ----------------------------------------------------

    def due_runs(self, fences: Fences, horizon_ms: int, now_ms: int) -> list[Run]:
        if not fences:
            return []
        marks = self.watermarks()
        self._wm_cache.update(marks)
        args = []
        for p in fences:
            # No watermark yet: nothing of this partition was ever planned.
            start = marks.get(p, now_ms - SETTLE_MS)
            for bucket in range(start // BUCKET_MS, (horizon_ms - 1) // BUCKET_MS + 1):
                args.append((bucket, p, start, horizon_ms))
        results = self.tables.execute_many([(self._bucket, a) for a in args], concurrency=64)
        rows: dict[int, Run] = {}
        for (_, p, _, _), (ok, result) in zip(args, results, strict=True):
            if not ok:
                raise result
            for r in result:
                if r.job_id is None:
                    continue  # only the dispatch mark of a run cancelled meanwhile
                attempt = delivery_for(r.attempt or 0, r.fence, fences[p])
                add_read_run(rows, Run(r.run_id, r.job_id, r.run_at_ms, r.due_ms, p, attempt, r.attempt_group))
        return sorted(rows.values(), key=lambda r: (r.due_ms, r.run_id))

    def next_lease_expiry(self, fences: Fences, after_ms: int) -> int | None:
        return None  # Kafka delivers a dead worker's run again itself

    # -- the leader's sweep (stores/cassandra_sweep.py) -------------------------

    def sweep_owed(self, fences: Fences, now_ms: int) -> int:
        if not fences:
            return 0
        # As finish_dispatch: nothing of a partition a newer leader took. The
        # fences and the watermarks in one read of the table.
        rows = {int(r.partition): r for r in self.tables.execute(self._watermark_fences)}
        owed = 0
        for p, fence in sorted(fences.items()):
            row = rows.get(p)
            if row is not None and int(row.fence or 0) > fence:
                continue
            mark = None if row is None or row.fired_through_ms is None else int(row.fired_through_ms)
            owed += self._sweep_handed_on(p, mark, now_ms) + self._sweep_behind(p, mark)
        return owed

    def _sweep_handed_on(self, partition: int, mark: int | None, now_ms: int) -> int:
        """(a) of sweep_owed: the looks come due; a bucket is dropped once
        what it asks is done (a sweep that dies half-way reads it again)."""
        owed = 0
        for bucket in buckets_due(self._sweep.swept_through(partition), now_ms):
            looks = self._sweep.looks(partition, bucket)
            args = [(look.job_id, look.run_at_ms, look.attempt_group) for look in looks]
            runs = self.tables.execute_many([(self._swept_run, a) for a in args], 64) if args else []
            claims = self._sweep.claims_seen(looks, now_ms)
            again: list[SweepLook] = []
            for look, (ok, result), claim in zip(looks, runs, claims, strict=True):
                if not ok:
                    raise result
                run = result.one()
                if run is None or run.state is None:
                    continue  # pruned, or of a job replaced since
                seen = None if claim is None else claim[0]
                handed_on = run.dispatched_at_ms is not None
                verdict = sweep_verdict(run.state, handed_on, _delivery(run), look.delivery, seen, now_ms)
                if verdict is SweepVerdict.LOOK_AGAIN:
                    again.append(look)
                elif verdict is SweepVerdict.OWE and claim is not None and self._owe_again(look, *claim, mark, now_ms):
                    owed += 1
                elif verdict is SweepVerdict.RECORD_FAILURE and seen is not None and seen.failure is not None:
                    record_kept_failure(self, look.record(), seen.failure, now_ms)
            self._sweep.look_again(again, now_ms + SWEEP_LOOK_AFTER_MS)
            self._sweep.done(partition, bucket, bool(looks))
        return owed

    def found_behind(self, job_id: str, run_at_ms: int, attempt_group: int, due_ms: int) -> None:
        """A row the sweep found behind its watermark, still owing its run
        (it placed it ahead again): a write placement missed. Logged above;
        the simulator counts each (a hole the sweep heals is still one)."""

    def _owe_again(self, look: SweepLook, seen: ClaimSeen, holder: str, mark: int | None, now_ms: int) -> bool:
        """The dead claim let go of if still as read, then a row ahead of
        the watermark (``mark``, as the sweep read it: _keep_owed_ahead
        reads it again once the row is written), read as the delivery after
        the one looked for."""
        if not self._sweep.let_go(look, seen, holder, now_ms):
            return False  # changed since: taken over, or handed back by its worker
        record = look.record()
        due = placed_ahead(now_ms + HAND_BACK_MS, mark)
        key = (look.job_id, look.run_at_ms, look.attempt_group)
        row = (due // BUCKET_MS, look.partition, due, look.run_id, *key, look.delivery, None)
        self.tables.execute(self._hand_back_schedule, row)
        self.tables.execute(self._bump, (look.partition,))
        log.warning("owed again a run of job %s whose claim is dead: its worker died unheard", look.job_id)
        self._keep_owed_ahead(record, due, look.delivery, None, sets_due=False)
        return True

    def _sweep_behind(self, partition: int, mark: int | None) -> int:
        """(b) of sweep_owed: the rows never handed on (no fence) that the
        watermark passed since this client's last sweep, placed again ahead
        of it where they still owe their run, as a late write of theirs is."""
        if mark is None:
            return 0
        since = self._swept_marks.get(partition, mark - SWEEP_LOOKBACK_MS)
        if mark <= since:
            return 0
        args = [(b, partition, since, mark + 1) for b in range(since // BUCKET_MS, mark // BUCKET_MS + 1)]
        unsent = []
        for ok, result in self.tables.execute_many([(self._bucket, a) for a in args], 64):
            if not ok:
                raise result
            unsent += [r for r in result if r.job_id is not None and r.fence is None]
        keys = [(r.job_id, r.run_at_ms, r.attempt_group) for r in unsent]
        runs = self.tables.execute_many([(self._swept_run, k) for k in keys], 64) if keys else []
        owed = 0
        for r, (ok, result) in zip(unsent, runs, strict=True):
            if not ok:
                raise result
            run = result.one()
            if run is None or run.state is None or run.due_ms is None:
                continue
            if not owed_behind_mark(run.state, run.dispatched_at_ms is not None, int(run.due_ms), int(r.due_ms)):
                continue
            owed += 1
            log.warning("a run of job %s was owed by a row behind the watermark: placed again ahead", r.job_id)
            self.found_behind(r.job_id, r.run_at_ms, r.attempt_group, int(r.due_ms))
            if run.state == "scheduled" and r.attempt_group == 0:
                self._keep_ahead({r.job_id: (partition, PlannedRun(r.run_at_ms, r.due_ms))})
                continue
            delivery = int(r.attempt or 0)
            record = DispatchRecord(
                r.run_id, r.job_id, r.run_at_ms, r.due_ms, partition, delivery, r.attempt_group, 0, 0
            )
            self._keep_owed_ahead(record, r.due_ms, delivery, None, sets_due=True)
        self._swept_marks[partition] = mark
        return owed

    def planning_state(self, job_ids: Collection[str]) -> dict[str, JobPlanState]:
        ids = list(job_ids)
        out: dict[str, JobPlanState] = {}
        results = self.tables.execute_many([(self._get_job, (j,)) for j in ids], concurrency=64)
        for job_id, (ok, result) in zip(ids, results, strict=True):
            if not ok:
                raise result
            row = result.one()
            job = plannable_job(job_id, row.spec) if row is not None and row.state == "active" else None
            if job is not None:
                out[job_id] = JobPlanState(job, row.partition, row.jitter_ms, row.next_run_at_ms, row.next_due_ms)
        return out

    def finish_dispatch(
        self, rows: Sequence[Run], fences: Fences, marks: Mapping[int, int], now_ms: int, next_runs: NextRuns
    ) -> list[Run]:
        # The partitions' fences, read first: a leader a newer one has
        # replaced writes nothing of them. A check, not a transaction (one
        # Paxos round per run would cost the burst its speed): what can still
        # slip between this read and the writes is a leader that lost the
        # partition in those milliseconds, and the watermark moves below
        # stay conditional on the fence (so a record of marks alone needs
        # no read).
        if rows or next_runs.runs or next_runs.completed or next_runs.stored_before:
            floors = {int(r.partition): int(r.fence or 0) for r in self.tables.execute(self._watermark_fences)}
            allowed = within_fences(DispatchOutcome(rows, marks, next_runs), fences, floors)
            rows, marks, next_runs = allowed.rows, allowed.marks, allowed.next_runs
        if rows:
            # One request per run, as before the attempt was kept: the run's
            # history row and the schedule row a new leader reads again.
            marks_batches: list[Batch] = []
            for r in rows:
                fence = fences[r.partition]
                batch: list[Bound] = []
                batch.append(
                    (self._mark_dispatched, (fence, now_ms, r.attempt, r.job_id, r.run_at_ms, r.attempt_group))
                )
                batch.append(
                    (self._mark_schedule, (r.attempt, fence, r.due_ms // BUCKET_MS, r.partition, r.due_ms, r.run_id))
                )
                # The sweep's look at it, in the same request: no round trip more.
                self._sweep.add_look(batch, SweepLook.of(r), now_ms + SWEEP_LOOK_AFTER_MS)
                marks_batches.append(Batch(batch, logged=False))
            for ok, result in self.tables.execute_many(marks_batches, concurrency=128):
                if not ok:
                    raise result
        stored = self._store_next(next_runs, now_ms)
        # Only now, with the next runs stored, may the watermarks move; in
        # steps of a few seconds, which a new leader sends again at most.
        moves = [
            (through, fences[p], p, fences[p], through)
            for p, through in marks.items()
            if self._wm_cache.get(p, -1) < through - WATERMARK_STEP_MS
        ]
        self._concurrent(self._set_watermark, moves)
        for through_ms, _, p, _, _ in moves:
            self._wm_cache[p] = through_ms
        return stored

    def _store_next(self, next_runs: NextRuns, now_ms: int) -> list[Run]:
        """Each plan written to the job it was made from: one lightweight
        transaction on the job's row (still active, its next run the one the
        plan read) moves the job's pointer to the run planned, or completes
        it. The fence check above is a read: a leader that lost the
        partition since, or paused past it, is refused here. The next
        runs of the jobs moved are then stored (_store_planned_rows)."""
        read = next_runs.planned_from
        gates: list[tuple[Prepared, tuple[Any, ...]]] = [
            (self._set_next_as_planned, (n.run.run_at_ms, n.run.due_ms, now_ms, n.job_id, read.get(n.job_id)))
            for n in next_runs.runs
        ]
        gates += [(self._complete_as_planned, (now_ms, job_id, read.get(job_id))) for job_id in next_runs.completed]
        planned_ids = [n.job_id for n in next_runs.runs] + list(next_runs.completed)
        moved: list[NextRun] = []
        stale: list[str] = []
        results = self.tables.execute_many(gates, concurrency=128)
        for i, (job_id, (ok, result)) in enumerate(zip(planned_ids, results, strict=True)):
            if not ok:
                raise result
            if not applied(result):
                stale.append(job_id)
            elif i < len(next_runs.runs):
                moved.append(next_runs.runs[i])
        log_stale_plans(log, stale)
        stored = self._store_planned_rows(moved)
        # A recording that died between the pointers and the rows: its runs
        # are stored here when they were sent again, as far as missing.
        self._store_planned_rows(next_runs.stored_before)
        return stored_runs([*stored, *next_runs.stored_before])

    def _store_planned_rows(self, runs: Sequence[NextRun]) -> list[NextRun]:
        """The run rows of next runs whose job points at them: each where
        no row of it is (IF NOT EXISTS), and only then its schedule row, so
        that a write landing late never takes back a run handed on, run,
        paused or cancelled since. A row cancelled before it was ever
        handed on (a reschedule dropped the run, and the new schedule
        plans the same time) is the job's run again while the job still
        points at it. The runs stored, or found waiting."""
        inserts = [
            (
                self._insert_new_run,
                (n.job_id, n.run.run_at_ms, 0, run_id_for(n.job_id, n.run.run_at_ms, 0), n.run.due_ms, n.partition),
            )
            for n in runs
        ]
        # The runs to store, each with whether its run row is written again.
        stored: list[tuple[NextRun, bool]] = []
        revive: list[NextRun] = []
        for nxt, (ok, result) in zip(runs, self.tables.execute_many(inserts, concurrency=128), strict=True):
            if not ok:
                raise result
            if applied(result):
                stored.append((nxt, False))
                continue
            row = result.one()
            if row.state == "cancelled" and row.dispatched_at_ms is None:
                revive.append(nxt)
            elif row.state == "scheduled" and row.dispatched_at_ms is None:
                stored.append((nxt, False))  # an earlier try's: its schedule row may be missing
        pointers = self.tables.execute_many([(self._get_job, (n.job_id,)) for n in revive])
        for nxt, (ok, result) in zip(revive, pointers, strict=True):
            if not ok:
                raise result
            job = result.one()
            if job is not None and job.state == "active" and job.next_run_at_ms == nxt.run.run_at_ms:
                stored.append((nxt, True))
        batches: list[Batch] = []
        for nxt, revived in stored:
            batch: list[Bound] = []
            run_id = run_id_for(nxt.job_id, nxt.run.run_at_ms, 0)
            if revived:
                batch.append(
                    (self._insert_run, (nxt.job_id, nxt.run.run_at_ms, 0, run_id, nxt.run.due_ms, nxt.partition))
                )
            batch.append(
                (
                    self._insert_schedule,
                    (
                        nxt.run.due_ms // BUCKET_MS,
                        nxt.partition,
                        nxt.run.due_ms,
                        run_id,
                        nxt.job_id,
                        nxt.run.run_at_ms,
                        0,
                    ),
                )
            )
            if nxt.missed is not None:
                batch.append((self._insert_missed, _missed_row(nxt.missed)))
            batches.append(Batch(batch, logged=True))
        for ok, result in self.tables.execute_many(batches, concurrency=128):
            if not ok:
                raise result
        return [nxt for nxt, _ in stored]

    # -- the worker's side ----------------------------------------------------

    def run_started(self, record: DispatchRecord, worker: str, now_ms: int) -> int | None:
        row = self.tables.execute(self._run_state, (record.job_id, record.run_at_ms, record.attempt_group)).one()
        if row is not None and row.state in ("cancelled", "missed"):
            return None
        if row is None and self._of_replaced(record.job_id, record.run_at_ms):
            return None
        attempt = 1 if row is None else next_attempt(row.attempt or 0, row.ended_attempt or 0)
        delivery = max(record.attempt, 0 if row is None else _delivery(row))
        self.tables.execute(
            self._run_started,
            (now_ms, worker, attempt, delivery, record.job_id, record.run_at_ms, record.attempt_group),
        )
        return attempt

    def run_interrupted(self, record: DispatchRecord, error: str, now_ms: int) -> None:
        # Read, then write, as run_finished: no Paxos round for it, and a
        # run that ended (or never started) keeps its record.
        row = self.tables.execute(self._run_state, (record.job_id, record.run_at_ms, record.attempt_group)).one()
        if row is None or row.state != "running":
            return
        self.tables.execute(
            self._run_interrupted,
            (row.attempt or 0, now_ms, error, record.job_id, record.run_at_ms, record.attempt_group),
        )

    def run_finished(
        self, record: DispatchRecord, state: str, error: str | None, result: str | None, now_ms: int
    ) -> None:
        # Read, then write, as run_started: a plain write, not a Paxos round
        # on the run path; only a redelivery of a run that succeeded meets it.
        row = self.tables.execute(self._run_state, (record.job_id, record.run_at_ms, record.attempt_group)).one()
        if row is not None and row.state == "succeeded":
            return
        if row is None and self._of_replaced(record.job_id, record.run_at_ms):
            return
        self.tables.execute(
            self._run_finished,
            (state, now_ms, error, result, record.job_id, record.run_at_ms, record.attempt_group),
        )

    def run_missed(self, record: DispatchRecord, missed: MissedRuns, error: str, now_ms: int) -> None:
        # Read, then plain writes, as run_finished. The span first: a write
        # that fails between the two is repeated whole by the redelivery.
        key = (record.job_id, record.run_at_ms, record.attempt_group)
        row = self.tables.execute(self._run_state, key).one()
        # A parked run never started: missed when its job was paused; so is
        # one a pause held after it was sent, before its send was recorded.
        if row is not None and row.state not in (None, "scheduled", "missed", "parked", "paused"):
            return
        if row is None and self._of_replaced(record.job_id, record.run_at_ms):
            return
        self.tables.execute(self._insert_missed, _missed_row(missed))
        self.tables.execute(self._run_missed, (now_ms, error, *key))

    def missed_runs(self, job_ids: Sequence[str]) -> dict[str, list[MissedRuns]]:
        out: dict[str, list[MissedRuns]] = {}
        args = [(job_id,) for job_id in dict.fromkeys(job_ids)]
        for ok, rows in self.tables.execute_many([(self._missed_of_job, a) for a in args], concurrency=64):
            if not ok:
                raise rows
            for r in rows:
                out.setdefault(r.job_id, []).append(MissedRuns(r.job_id, r.first_ms, r.end_ms, r.reason))
        return out

    def run_failed(self, record: DispatchRecord, failure: FailedAttempt, retry_due_ms: int | None) -> None:
        # Read, then plain writes, as run_finished: no Paxos round on the run
        # path. The failure goes into the run's map by attempt number, so a
        # write repeated after a timeout is still one entry.
        key = (record.job_id, record.run_at_ms, record.attempt_group)
        entry = (failure.attempt, failure.to_json())
        row = self.tables.execute(self._get_run, key).one()
        if row is None and self._of_replaced(record.job_id, record.run_at_ms):
            return
        ended_attempt = max(failure.attempt, 0 if row is None else row.ended_attempt or 0)
        delivery = max(record.attempt, 0 if row is None else _delivery(row))
        state = "scheduled" if row is None or row.state is None else row.state
        if state in ("succeeded", "cancelled"):
            self.tables.execute(self._add_failure, (*entry, *key))
            return
        due = record.due_ms if row is None or row.due_ms is None else int(row.due_ms)
        ended = (failure.ended_at_ms, failure.error, failure.result, record.run_id, record.partition)
        if retry_due_ms is not None:
            job = self.tables.execute(self._job_state, (record.job_id,)).one()
            if job is not None and job.state == "cancelled":
                self.tables.execute(self._end_failed, (*entry, ended_attempt, "cancelled", due, *ended, *key))
                return
        delivered_from = (record.due_ms // BUCKET_MS, record.partition, record.due_ms, record.run_id)
        # Logged batches: the run's row, its schedule rows and its dead
        # letter land together or not at all.
        batch: list[Bound] = []
        if retry_due_ms is None:
            batch.append((self._end_dead, (*entry, ended_attempt, due, *ended, failure.ended_at_ms, *key)))
            batch.append((self._insert_dead_letter, (record.partition, failure.ended_at_ms, *key)))
            old = None if row is None else row.dead_at_ms
            if old is not None and old != failure.ended_at_ms:
                old_partition = record.partition if row.partition is None else row.partition
                batch.append((self._delete_dead_letter, (old_partition, old, *key)))
            # Owed no more: the row it was delivered from goes, so that a
            # leader reading it again (a failover) hands nothing on, and a
            # redrive's row is the only one read.
            batch.append((self._delete_schedule, delivered_from))
            self.tables.batch(batch, logged=True)
            return
        # As a hand-back: a row of its own at the retry's due time, read as
        # the delivery after the latest the run met (no fence: handed on by
        # no leader); the row it was delivered from goes, or a newer leader,
        # which reads both as one delivery, would take the earlier row and
        # hand the run on at once (add_read_run). A write
        # that lands after the watermark passed the retry's time (it was
        # refused for a while) is placed ahead of it: the run's due_ms says
        # when it is owed, the failure's time stays in its failures.
        retry_due = placed_ahead(retry_due_ms, self.watermarks().get(record.partition))
        batch.append(
            (
                self._hand_back_schedule,
                (retry_due // BUCKET_MS, record.partition, retry_due, record.run_id, *key, delivery, None),
            )
        )
        batch.append((self._end_failed, (*entry, ended_attempt, "retrying", retry_due, *ended, *key)))
        if retry_due != record.due_ms:
            batch.append((self._delete_schedule, delivered_from))
        self.tables.batch(batch, logged=True)
        if retry_due != retry_due_ms or retry_due <= failure.ended_at_ms + NEAR_MS:
            self.tables.execute(self._bump, (record.partition,))
        self._keep_owed_ahead(record, retry_due, delivery, None, sets_due=True)

    def run_parked(self, record: DispatchRecord, due_ms: int, reason: str, now_ms: int) -> None:
        # Read, then plain writes, as run_failed's retry: a row of its own at
        # ``due_ms``, read as the delivery after the one parked, and the row
        # it was delivered from goes.
        key = (record.job_id, record.run_at_ms, record.attempt_group)
        row = self.tables.execute(self._run_state, key).one()
        if row is not None and row.state in ("succeeded", "cancelled"):
            return
        if row is None and self._of_replaced(record.job_id, record.run_at_ms):
            return
        job = self.tables.execute(self._job_state, (record.job_id,)).one()
        if job is not None and job.state == "cancelled":
            self.tables.execute(self._cancel_run_in_group, (now_ms, *key))
            return
        delivery = max(record.attempt, 0 if row is None else _delivery(row))
        # ``due_ms`` was set at the run's admission: a write landing after
        # the watermark passed it is placed ahead of it, as a retry's.
        due = placed_ahead(due_ms, self.watermarks().get(record.partition))
        batch: list[Bound] = []
        batch.append(
            (self._hand_back_schedule, (due // BUCKET_MS, record.partition, due, record.run_id, *key, delivery, None))
        )
        batch.append((self._park, (due, delivery, reason, record.run_id, record.partition, *key)))
        if due != record.due_ms:
            batch.append(
                (self._delete_schedule, (record.due_ms // BUCKET_MS, record.partition, record.due_ms, record.run_id))
            )
        self.tables.batch(batch, logged=True)
        if due != due_ms or due <= now_ms + NEAR_MS:
            self.tables.execute(self._bump, (record.partition,))
        self._keep_owed_ahead(record, due, delivery, None, sets_due=True)

    def take_slot(
        self, record: DispatchRecord, holder: str, policy: Overlap | str, now_ms: int, lease_ms: int
    ) -> SlotTake:
        return self._slots.take_slot(record, holder, policy, now_ms, lease_ms)

    def extend_slots(self, holds: Sequence[SlotHold], now_ms: int, lease_ms: int) -> list[SlotHold]:
        return self._slots.extend_slots(holds, now_ms, lease_ms)

    def release_slot(self, hold: SlotHold, now_ms: int) -> None:
        self._slots.release_slot(hold, now_ms)

    def running_slot(self, job_id: str) -> RunningSlot | None:
        return self._slots.running_slot(job_id)

    def _wake_waiting(self, waiting: DispatchRecord, now_ms: int) -> None:
        """Make a run waiting for its job's slot due now, if still parked (a
        run delivered again since, its wait run out, keeps its state)."""
        row = self.tables.execute(self._run_state, (waiting.job_id, waiting.run_at_ms, waiting.attempt_group)).one()
        if row is not None and row.state == "parked":
            self.run_parked(waiting, now_ms, overlap.wake_reason(waiting.job_id), now_ms)

    def breaker(self, downstream: str) -> BreakerRow:
        return self._breakers.breaker(downstream)

    def breakers(self) -> list[BreakerRow]:
        return self._breakers.breakers()

    def swap_breaker(self, expected_version: int, row: BreakerRow) -> bool:
        return self._breakers.swap_breaker(expected_version, row)

    def record_attempts(self, count: AttemptCount) -> None:
        self._breakers.record_attempts(count)

    def attempt_counts(self, downstream: str, since_ms: int) -> list[AttemptCount]:
        return self._breakers.attempt_counts(downstream, since_ms)

    def get_run(self, job_id: str, run_at_ms: int, attempt_group: int = 0) -> RunRecord:
        row = self.tables.execute(self._get_run, (job_id, run_at_ms, attempt_group)).one()
        if row is None:
            raise RunNotFound(f"no run of job {job_id!r} at {run_at_ms}")
        return self._full_record(row)

    def dead_letters(self, limit: int = 1000) -> list[RunRecord]:
        if limit <= 0:
            return []
        # The newest ``limit`` of each partition, merged: no more can be
        # among the newest ``limit`` of all.
        args = [(p, limit) for p in range(self.partitions)]
        entries: list[tuple[int, str, int, int]] = []
        for ok, result in self.tables.execute_many([(self._newest_dead_letters, a) for a in args], concurrency=64):
            if not ok:
                raise result
            entries.extend((int(r.failed_at_ms), r.job_id, int(r.run_at_ms), int(r.attempt_group)) for r in result)
        entries.sort(key=lambda e: (-e[0], e[1], e[2], e[3]))
        newest: dict[tuple[str, int, int], int] = {}
        for failed_at_ms, job_id, run_at_ms, group in entries:
            newest.setdefault((job_id, run_at_ms, group), failed_at_ms)
        chosen = list(newest.items())[:limit]
        read = self.tables.execute_many([(self._get_run, k) for k, _ in chosen], concurrency=64)
        out: list[RunRecord] = []
        for (_, failed_at_ms), (ok, result) in zip(chosen, read, strict=True):
            if not ok:
                raise result
            row = result.one()
            # A run pruned meanwhile, or a row a racing write left behind
            # (its run says another dead letter, or none), is skipped.
            if row is not None and row.dead_at_ms == failed_at_ms:
                out.append(self._full_record(row))
        return out

    def trigger(self, job_id: str, now_ms: int) -> RunRecord:
        current = self._row(job_id)
        check_triggerable(job_id, current.state)
        # The run's row is taken with a conditional insert, so two triggers
        # of one job in the same millisecond are two runs, and a run that
        # already ran is never reset; then its schedule row, due a moment
        # from the client's now and ahead of the watermark whatever the
        # client's clock says, as a redriven run. (A crash between the two
        # leaves an unacknowledged run that never fires.) A job cancelled
        # meanwhile has its run ended cancelled by the worker.
        group = max((r.attempt_group for r in self.tables.execute(self._groups_at, (job_id, now_ms))), default=0) + 1
        due = placed_ahead(now_ms + HAND_BACK_MS, self.watermarks().get(current.partition))
        while True:
            run_id = run_id_for(job_id, now_ms, group)
            taken = self.tables.execute(self._insert_new_run, (job_id, now_ms, group, run_id, due, current.partition))
            if applied(taken):
                break
            group += 1
        self.tables.execute(
            self._insert_schedule, (due // BUCKET_MS, current.partition, due, run_id, job_id, now_ms, group)
        )
        self.tables.execute(self._bump, (current.partition,))
        triggered = DispatchRecord(run_id, job_id, now_ms, due, current.partition, 0, group, 0, 0)
        self._keep_owed_ahead(triggered, due, 0, None, sets_due=True)
        return self.get_run(job_id, now_ms, group)

    def redrive(self, job_id: str, run_at_ms: int, attempt_group: int, now_ms: int) -> bool:
        # The run reopened first, conditional on the dead letter as read:
        # a pruner deleting it (conditionally too) and a second redrive
        # each find it changed, so only one of them goes on. Its schedule
        # row and the dead letter's deletion follow; a redrive that dies
        # between the two leaves the run retrying, owed by no row, and is
        # not acknowledged.
        key = (job_id, run_at_ms, attempt_group)
        row = self.tables.execute(self._get_run, key).one()
        if row is None or row.state != "failed" or row.dead_at_ms is None or row.partition is None:
            return False
        dead = (row.partition, row.dead_at_ms, *key)
        if self.tables.execute(self._get_dead_letter, dead).one() is None:
            return False
        # As a trigger's: a moment from the client's now, ahead of the
        # watermark whatever the client's clock says.
        due = placed_ahead(now_ms + HAND_BACK_MS, self.watermarks().get(row.partition))
        run_id = run_id_for(*key) if row.run_id is None else row.run_id
        if not applied(self.tables.execute(self._redrive_run, (due, *key, row.dead_at_ms))):
            return False  # pruned, or redriven, meanwhile
        batch: list[Bound] = []
        batch.append(
            (self._hand_back_schedule, (due // BUCKET_MS, row.partition, due, run_id, *key, _delivery(row), None))
        )
        batch.append((self._delete_dead_letter, dead))
        self.tables.batch(batch, logged=True)
        self.tables.execute(self._bump, (row.partition,))
        redriven = DispatchRecord(run_id, job_id, run_at_ms, due, row.partition, _delivery(row), attempt_group, 0, 0)
        self._keep_owed_ahead(redriven, due, _delivery(row), None, sets_due=True)
        return True

    # -- retention ------------------------------------------------------------

    def prune_history(
        self,
        partitions: Collection[int],
        finished_before_ms: int | None,
        keep_per_job: int | None,
        limit: int,
        now_ms: int,
    ) -> int:
        # The claims' tombstones expire by their TTL: nothing to sweep here.
        wanted = set(partitions)
        if not wanted or limit <= 0:
            return 0
        job_partitions = {r.job_id: r.partition for r in self.tables.execute(self._job_partitions)}
        job_ids = [j for j, p in job_partitions.items() if p in wanted]
        deleted = 0
        for start in range(0, len(job_ids), _PRUNE_READ_JOBS):
            chunk = job_ids[start : start + _PRUNE_READ_JOBS]
            read = self.tables.execute_many([(self._run_ends, (j,)) for j in chunk], concurrency=32)
            deletes: list[tuple[Prepared, tuple[Any, ...]]] = []
            dead_runs: list[PrunedDeadLetter] = []
            for job_id, (ok, result) in zip(chunk, read, strict=True):
                if not ok:
                    raise result
                rows = list(result)
                runs = [(r.run_at_ms, r.attempt_group, r.state, r.ended_at_ms) for r in rows]
                chosen = prunable(runs, finished_before_ms, keep_per_job, limit - deleted)
                dead = {i for i in chosen if rows[i].state == "failed" and rows[i].dead_at_ms is not None}
                # The dead letters stay in _prune_statements' eyes: they go
                # by _delete_dead_runs alone.
                deletes.extend(self._prune_statements(job_id, runs, chosen - dead, now_ms))
                for i in sorted(dead):
                    r = rows[i]
                    p = job_partitions[job_id] if r.partition is None else r.partition
                    dead_runs.append(PrunedDeadLetter(job_id, r.run_at_ms, r.attempt_group, p, r.dead_at_ms))
                deleted += len(chosen)
                if deleted >= limit:
                    break
            gone = self._delete_dead_runs(dead_runs)
            deleted -= len(dead_runs) - len(gone)
            kept_s = PRUNED_CLAIM_KEPT_MS // 1_000
            for d in gone:
                key = (d.job_id, d.run_at_ms, d.attempt_group)
                deletes.append((self._bury_claim, (idempotency_key(*key), now_ms, kept_s)))
                deletes.append((self._delete_dead_letter, (d.partition, d.dead_at_ms, *key)))
            for ok, result in self.tables.execute_many(deletes, concurrency=64):
                if not ok:
                    raise result
            if deleted >= limit:
                break
        return deleted

    def _delete_dead_runs(self, dead_runs: Sequence[PrunedDeadLetter]) -> list[PrunedDeadLetter]:
        """The dead letters of ``dead_runs`` deleted, each only if still the
        dead letter read (a lightweight transaction each: a redrive reopens
        a dead letter, and no other finished run, so only these pay for
        one). Returns those deleted; a run redriven meanwhile stays, and
        its claim with it."""
        if not dead_runs:
            return []
        statements = [
            (self._delete_dead_run, (d.job_id, d.run_at_ms, d.attempt_group, d.dead_at_ms)) for d in dead_runs
        ]
        outcomes = raise_failed(self.tables.execute_many(statements, concurrency=64))
        return [d for d, result in zip(dead_runs, outcomes, strict=True) if applied(result)]

    def _prune_statements(
        self, job_id: str, runs: Sequence[tuple[int, int, str, int | None]], chosen: set[int], now_ms: int
    ) -> list[tuple[Prepared, tuple[Any, ...]]]:
        """Range deletes over the stretches of a job's runs that go, so a job
        firing every second leaves a range tombstone per pass rather than
        one per run (too many of which make its partition unreadable). The
        oldest stretch is deleted open-ended: each pass's tombstone then
        covers the last one's, which compaction drops. A run sharing its
        run_at with a run that stays goes by itself. Each run's claim
        becomes a tombstone (retention.py). A dead letter that goes is not
        ``chosen`` here and breaks the stretches as a run that stays does:
        it goes by a conditional delete of its own (_delete_dead_runs),
        which a redrive may win."""
        kept_s = PRUNED_CLAIM_KEPT_MS // 1_000
        kept_at = {runs[i][0] for i in range(len(runs)) if i not in chosen}
        out: list[tuple[Prepared, tuple[Any, ...]]] = []
        stretch: list[int] = []
        oldest = True

        def close() -> None:
            nonlocal oldest
            if stretch:
                if oldest:
                    out.append((self._delete_runs_through, (job_id, stretch[-1])))
                else:
                    out.append((self._delete_runs, (job_id, stretch[0], stretch[-1])))
                stretch.clear()
            oldest = False

        for i in reversed(range(len(runs))):  # oldest first
            run_at_ms, attempt_group = runs[i][0], runs[i][1]
            if i in chosen:
                out.append((self._bury_claim, (idempotency_key(job_id, run_at_ms, attempt_group), now_ms, kept_s)))
            if i in chosen and run_at_ms not in kept_at:
                stretch.append(run_at_ms)
                continue
            close()
            if i in chosen:
                out.append((self._delete_run, (job_id, run_at_ms, attempt_group)))
        close()
        return out

    # -- helpers --------------------------------------------------------------

    def _row(self, job_id: str) -> Any:
        row = self.tables.execute(self._get_job, (job_id,)).one()
        if row is None or row.state == "registering":
            raise JobNotFound(f"no job {job_id!r}")
        return row

    def _record(self, row: Any) -> JobRecord:
        nxt = None
        sent = None
        if row.state in ("active", "paused") and row.next_run_at_ms is not None:
            nxt = PlannedRun(row.next_run_at_ms, row.next_due_ms)
        if row.state == "paused" and nxt is not None:
            # One read more, of a paused job only: whether the pause holds
            # its next run, or found it handed on.
            held = self.tables.execute(self._held_state, (row.job_id, nxt.run_at_ms)).one()
            if held is not None and not held_by_pause(held.state, held.dispatched_at_ms):
                nxt, sent = None, row.next_run_at_ms
        return JobRecord(
            job=Job.model_validate_json(row.spec, context=STORED),
            state=row.state,
            partition=row.partition,
            jitter_ms=row.jitter_ms,
            created_at_ms=row.created_at_ms,
            next_run=nxt,
            runs_since_ms=row.runs_since_ms or 0,
            sent_before_pause_ms=sent,
        )

    @staticmethod
    def _not_before_now(run: PlannedRun | None, now_ms: int) -> PlannedRun | None:
        """A run registered for a time already past is due now: the caller's
        now, from its injected clock. A registrant whose clock is behind the
        leader's may still land behind the watermark: _ahead_of places it."""
        if run is None or run.due_ms >= now_ms:
            return run
        return PlannedRun(run.run_at_ms, now_ms)

    def _keep_ahead(self, placed: Mapping[str, tuple[int, PlannedRun]]) -> dict[str, PlannedRun]:
        """After registrations' runs were written (``placed``: job id ->
        partition, run as written), read the watermarks again: a write that
        landed late may find one moved to or past its run's due time by a
        leader whose read missed the row, which no leader would ever read
        then. Such a run gets a second schedule row ahead of the watermark
        (the same run id: the old row, behind the watermark, is not read
        again, and a read of both takes the run once, protocols.add_read_run),
        its run row and its job's next run say the new due time, and its
        partition's change notice makes the leader read it. A run handed on,
        started or cancelled meanwhile is left as it is. Returns the runs
        placed again, by job id."""
        moved: dict[str, PlannedRun] = {}
        pending = dict(placed)
        for attempt in range(_PLACE_ATTEMPTS):
            if not pending:
                break
            marks = self.watermarks()
            behind = runs_behind(pending, marks)
            if not behind:
                break
            if attempt + 1 == _PLACE_ATTEMPTS:
                raise BackendUnavailable(
                    f"cassandra: the watermark of partition {behind[0][1]} kept moving past the run of job"
                    f" {behind[0][0]!r} while it was stored; cancel the job and register it again"
                )
            read = self.tables.execute_many(
                [(self._run_handed_on, (j, run.run_at_ms)) for j, _, run in behind], concurrency=64
            )
            again: dict[str, tuple[int, PlannedRun]] = {}
            for (job_id, p, run), (ok, result) in zip(behind, read, strict=True):
                if not ok:
                    raise result
                row = result.one()
                if row is None or row.state != "scheduled" or row.dispatched_at_ms is not None:
                    continue
                again[job_id] = (p, PlannedRun(run.run_at_ms, marks[p] + AHEAD_OF_WATERMARK_MS))
            batches: list[Batch] = []
            for job_id, (p, run) in again.items():
                run_id = run_id_for(job_id, run.run_at_ms, 0)
                batch: list[Bound] = []
                # Not _add_run_rows: the run row's state and attempt stay.
                batch.append(
                    (self._insert_schedule, (run.due_ms // BUCKET_MS, p, run.due_ms, run_id, job_id, run.run_at_ms, 0))
                )
                batch.append((self._set_run_due, (run.due_ms, job_id, run.run_at_ms)))
                batches.append(Batch(batch, logged=True))
            for ok, result in self.tables.execute_many(batches, concurrency=128):
                if not ok:
                    raise result
            self._concurrent(self._set_next_due, [(run.due_ms, j, run.run_at_ms) for j, (_, run) in again.items()])
            self._concurrent(self._bump, [(p,) for p in sorted({p for p, _ in again.values()})])
            if again:
                log.warning("placed %d registered runs again ahead of a watermark that passed them", len(again))
            moved.update((j, run) for j, (_, run) in again.items())
            pending = again
        return moved

    def _keep_owed_ahead(
        self, record: DispatchRecord, due_ms: int, delivery: int, fence: int | None, sets_due: bool
    ) -> int:
        """After a row owed again was written (``record``'s run, due at
        ``due_ms``, read as the delivery after ``delivery``, handed on under
        ``fence``), read the watermarks again, as _keep_ahead does for a
        registration: one a leader whose read missed the row moved to or
        past it would hide it for good. Such a row gets a second row ahead
        of the watermark (the old one is not read again; a read of both
        takes the run once), its run row the new due time when ``sets_due``
        (all but a hand-back, which leaves the run's due time as it was),
        and its partition a change notice. A run handed on, ended or placed
        elsewhere since is left as it is (protocols.owed_where_written).
        Returns where the row is now."""
        key = (record.job_id, record.run_at_ms, record.attempt_group)
        for attempt in range(_PLACE_ATTEMPTS):
            placed = placed_ahead(due_ms, self.watermarks().get(record.partition))
            if placed == due_ms:
                return due_ms
            if attempt + 1 == _PLACE_ATTEMPTS:
                raise BackendUnavailable(
                    f"cassandra: the watermark of partition {record.partition} kept moving past the run of job"
                    f" {record.job_id!r} while it was stored"
                )
            row = self.tables.execute(self._get_run, key).one()
            if row is None:
                return due_ms  # pruned, or of a cancelled job replaced since
            state = "scheduled" if row.state is None else row.state
            current_due = due_ms if row.due_ms is None else int(row.due_ms)
            if not owed_where_written(state, _delivery(row), current_due, delivery, due_ms, sets_due):
                return due_ms
            batch: list[Bound] = []
            batch.append(
                (
                    self._hand_back_schedule,
                    (placed // BUCKET_MS, record.partition, placed, record.run_id, *key, delivery, fence),
                )
            )
            if sets_due:
                batch.append((self._set_owed_due, (placed, *key)))
            self.tables.batch(batch, logged=True)
            self.tables.execute(self._bump, (record.partition,))
            log.warning("placed a run of job %s again ahead of a watermark that passed it", record.job_id)
            due_ms = placed
        return due_ms

    def _add_run_rows(self, batch: list[Bound], job_id: str, partition: int, run: PlannedRun, group: int = 0) -> None:
        run_id = run_id_for(job_id, run.run_at_ms, group)
        batch.append((self._insert_run, (job_id, run.run_at_ms, group, run_id, run.due_ms, partition)))
        batch.append(
            (
                self._insert_schedule,
                (run.due_ms // BUCKET_MS, partition, run.due_ms, run_id, job_id, run.run_at_ms, group),
            )
        )

    def _write_run(self, job_id: str, partition: int, run: PlannedRun, group: int = 0) -> None:
        batch: list[Bound] = []
        self._add_run_rows(batch, job_id, partition, run, group)
        self.tables.batch(batch, logged=True)

    def _cancel_handed_on(self, job_id: str, now_ms: int) -> None:
        """Cancel the job's runs handed on and not started (a scheduled row
        with a dispatch time), and those interrupted, retrying or parked: they belong
        to the schedule being replaced, and a worker starting one would read
        the new spec. One partition read: a job's runs are bounded by its
        retention."""
        handed_on = [
            (now_ms, job_id, r.run_at_ms, r.attempt_group)
            for r in self.tables.execute(self._job_run_states, (job_id,))
            if (r.state == "scheduled" and r.dispatched_at_ms is not None)
            or r.state in ("interrupted", "retrying", "parked")
        ]
        self._concurrent(self._cancel_run_in_group, handed_on)

    def _drop_pending(self, job_id: str, partition: int, run_at_ms: int, due_ms: int, now_ms: int) -> None:
        run_id = run_id_for(job_id, run_at_ms, 0)
        self.tables.execute(self._delete_schedule, (due_ms // BUCKET_MS, partition, due_ms, run_id))
        self.tables.execute(self._cancel_run, (now_ms, job_id, run_at_ms))

    def _concurrent(self, statement: Prepared, args: list[tuple[Any, ...]]) -> None:
        if not args:
            return
        for ok, result in self.tables.execute_many([(statement, a) for a in args], concurrency=64):
            if not ok:
                raise result


def _missed_row(missed: MissedRuns) -> tuple[str, int, int, str, int]:
    return (missed.job_id, missed.first_ms, missed.end_ms, missed.reason, missed.end_ms)
