"""An in-memory schedule store, modelled on stores/cassandra.py.

The tables are Cassandra's: ``jobs``; ``schedule``, the rows a leader reads
from its partition's watermark up to its horizon, by due time (never deleted
once sent: a reader ahead of the watermark sees them again); ``runs``, each
run's history, where "dispatched" is a scheduled run with a dispatch time;
``watermarks`` with their fence, moved only by a leader whose fence is not
older than the partition's; ``changes``, bumped by registrations due soon.
Writes behave like Cassandra's: an update of a missing run row creates it.

ScheduleTables is the cluster's state; each node talks to it through its own
MemoryScheduleStore, which, like the Cassandra client, remembers the
watermarks it last read or moved.

Where it differs, on purpose: each call is atomic under one lock (on the
cluster a call is several statements, and two leaders' calls interleave);
a registration cannot die half-way (no "registering" rows); "now", where the
cluster uses a server's clock, is the injected Clock. A registration is
three steps, as on the cluster, so that a leader can move a watermark
between them: it reads the watermarks, writes, and reads them again.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace

from pysched import overlap
from pysched.clock import Clock
from pysched.kept_failures import record_kept_failure
from pysched.memory.claims import ClaimTables
from pysched.memory.faults import FaultHook, Guard
from pysched.memory.rows import replace_row
from pysched.memory.sweep import SweepTables
from pysched.model import Job, Overlap
from pysched.overlap import RunningSlot, SlotHold, SlotTake
from pysched.protocols import (
    ABANDONED,
    AHEAD_OF_WATERMARK_MS,
    NEAR_MS,
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

ROLE = "store"
log = logging.getLogger("pysched.memory")
# The same constants as the Cassandra store: what the simulator checks is
# that store's behaviour.
HAND_BACK_MS = 1_000
WATERMARK_STEP_MS = 5_000
# A run registered, or owed again, due at or behind its partition's
# watermark is stored AHEAD_OF_WATERMARK_MS past it instead
# (protocols.placed_ahead), as on the Cassandra store.
_PLACE_ATTEMPTS = 5
_FINISHED = frozenset({"succeeded", "failed", "cancelled", "missed"})
# last_runs reads this many of a job's newest rows, as the Cassandra store.
_LAST_RUNS_READ = 4


@dataclass(frozen=True, slots=True)
class JobRow:
    job: Job
    state: str  # active | cancelled | completed
    partition: int
    jitter_ms: int
    created_at_ms: int
    updated_at_ms: int
    next_run: PlannedRun | None
    runs_since_ms: int = 0  # JobRecord.runs_since_ms


@dataclass(frozen=True, slots=True)
class RunRow:
    job_id: str
    run_at_ms: int
    attempt_group: int
    run_id: int
    due_ms: int
    partition: int
    state: str  # scheduled | running | succeeded | failed | cancelled | interrupted
    attempt: int = 0  # the attempt a user sees (protocols.next_attempt)
    fence: int | None = None
    dispatched_at_ms: int | None = None
    started_at_ms: int | None = None
    ended_at_ms: int | None = None
    worker: str | None = None
    error: str | None = None
    result: str | None = None
    # The delivery last handed on or started (Run.attempt), and the last
    # attempt that failed or was interrupted, as on Cassandra.
    delivery: int = 0
    ended_attempt: int = 0
    # Failed attempts by number (Cassandra's map column).
    failures: tuple[tuple[int, FailedAttempt], ...] = ()


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    partition: int
    due_ms: int
    run_id: int
    job_id: str
    run_at_ms: int
    attempt_group: int
    # The delivery last handed on and its leader's fence (0, None: none yet).
    attempt: int = 0
    fence: int | None = None


@dataclass(frozen=True, slots=True)
class WatermarkRow:
    fired_through_ms: int
    fence: int


RunKey = tuple[int, int]  # (run_at_ms, attempt_group) within a job


class ScheduleTables:
    """The cluster's rows, shared by every node's store. Every partition has
    a watermark from the start, as ``ensure_schema`` writes them: no run can
    be due before the schedule that holds it existed."""

    def __init__(self, partitions: int, clock: Clock, claims: ClaimTables | None = None) -> None:
        self.lock = threading.RLock()
        self.clock = clock
        self.claims = claims  # pruning deletes claims with their runs
        start = clock.now_ms() - SETTLE_MS
        self.jobs: dict[str, JobRow] = {}
        self.runs: dict[str, dict[RunKey, RunRow]] = {}
        # Per partition, (due_ms, run_id) kept sorted, and the rows by it.
        self.schedule_keys: dict[int, list[tuple[int, int]]] = {p: [] for p in range(partitions)}
        self.schedule: dict[tuple[int, int, int], ScheduleRow] = {}
        self.marks: dict[int, WatermarkRow] = {p: WatermarkRow(start, 0) for p in range(partitions)}
        self.changes: dict[int, int] = {}
        # The dead-letter table: (job id, run_at, attempt group) -> when the
        # run failed for good.
        self.dead_letters: dict[tuple[str, int, int], int] = {}
        # The missed-runs table: (job id, first missed time) -> the span.
        self.missed: dict[tuple[str, int], MissedRuns] = {}
        # Circuit breakers by downstream, and the retry budget's counts by
        # (downstream, bucket, node).
        self.breakers: dict[str, BreakerRow] = {}
        self.attempt_counts: dict[tuple[str, int, str], AttemptCount] = {}
        # The overlap policy's running slot of each job (overlap.py).
        self.slots: dict[str, RunningSlot] = {}
        # Each retry granted: (job id, run_at, attempt group) -> the attempt
        # that failed -> when its retry is due (the last recording's). The
        # run's row keeps only the last; a simulator's checker holds every
        # retry to its time.
        self.retries_due: dict[tuple[str, int, int], dict[int, int]] = {}
        # The leader's sweep: the runs handed on, by when each is looked at.
        self.sweep = SweepTables()
        # Each row the sweep found still owing its run at or behind the
        # watermark, by run key: when it was due. Placement ahead of the
        # watermark should leave the sweep none to find; a simulator's
        # checker names each as the hole it is.
        self.found_behind: dict[tuple[str, int, int], int] = {}

    # -- read back by a simulator's checker ------------------------------------

    def run_rows(self, job_id: str) -> list[RunRow]:
        """Every stored run of a job, scheduled ones included, newest first."""
        with self.lock:
            return _newest_first(self.runs.get(job_id, {}))

    def all_run_rows(self) -> list[RunRow]:
        """Every run of every job, by job id, each job's newest first."""
        with self.lock:
            return [row for job_id in sorted(self.runs) for row in _newest_first(self.runs[job_id])]

    def job_rows(self) -> dict[str, JobRow]:
        with self.lock:
            return dict(self.jobs)

    def schedule_rows(self, partition: int) -> list[ScheduleRow]:
        with self.lock:
            keys = self.schedule_keys.get(partition, [])
            return [self.schedule[(partition, due, run_id)] for due, run_id in keys]

    def watermark_rows(self) -> dict[int, WatermarkRow]:
        with self.lock:
            return dict(self.marks)

    # -- writes shared by the store's operations --------------------------------

    def put_schedule(self, row: ScheduleRow) -> None:
        key = (row.partition, row.due_ms, row.run_id)
        if key not in self.schedule:
            bisect.insort(self.schedule_keys.setdefault(row.partition, []), (row.due_ms, row.run_id))
        self.schedule[key] = row

    def delete_schedule(self, partition: int, due_ms: int, run_id: int) -> None:
        if self.schedule.pop((partition, due_ms, run_id), None) is not None:
            keys = self.schedule_keys[partition]
            del keys[bisect.bisect_left(keys, (due_ms, run_id))]

    def read_schedule(self, partition: int, after_ms: int, before_ms: int) -> list[ScheduleRow]:
        """Rows due strictly between the two times, as the bucket query."""
        keys = self.schedule_keys.get(partition, [])
        lo = bisect.bisect_right(keys, (after_ms, 2**63))
        hi = bisect.bisect_left(keys, (before_ms, -1))
        return [self.schedule[(partition, due, run_id)] for due, run_id in keys[lo:hi]]

    def upsert_run(self, job_id: str, key: RunKey, row: RunRow) -> None:
        self.runs.setdefault(job_id, {})[key] = row

    def keep_missed(self, missed: MissedRuns) -> None:
        key = (missed.job_id, missed.first_ms)
        known = self.missed.get(key)
        if known is None or missed.end_ms > known.end_ms:
            self.missed[key] = missed

    def bump(self, partition: int) -> None:
        self.changes[partition] = self.changes.get(partition, 0) + 1


class MemoryScheduleStore:
    """One node's client of the ScheduleTables."""

    def __init__(self, tables: ScheduleTables, faults: FaultHook | None = None) -> None:
        self.tables = tables
        self.partitions = len(tables.marks)  # fixed when the tables were made
        self._op = Guard(ROLE, faults, tables.lock)
        # The watermarks this client last read or moved: it moves one only
        # a WATERMARK_STEP_MS past that, as the Cassandra client does.
        self._wm_cache: dict[int, int] = {}
        # Per partition, the watermark this client's last sweep read up to.
        self._swept_marks: dict[int, int] = {}

    # -- registration ---------------------------------------------------------

    def add_job(self, job: Job, partition: int, jitter_ms: int, first: PlannedRun | None, now_ms: int) -> JobRecord:
        marks = self.watermarks()
        with self._op("add_job"):
            since = self._take_id(job.id, first, now_ms)
            first, notify = self._register(job, partition, jitter_ms, first, marks, now_ms, since)
            if notify:
                self.tables.bump(partition)
        if first is not None:
            first = self._keep_ahead({job.id: (partition, first)}).get(job.id, first)
        return JobRecord(job, "active" if first else "completed", partition, jitter_ms, now_ms, first, since)

    def add_jobs(self, items: Sequence[Registration], now_ms: int) -> list[str]:
        existing: list[str] = []
        near: set[int] = set()
        placed: dict[str, tuple[int, PlannedRun]] = {}
        marks = self.watermarks()  # one read for the whole call
        with self._op("add_jobs"):
            for job, partition, jitter_ms, first in items:
                try:
                    since = self._take_id(job.id, first, now_ms)
                except JobExists:
                    existing.append(job.id)
                    continue
                first, notify = self._register(job, partition, jitter_ms, first, marks, now_ms, since)
                if first is not None:
                    placed[job.id] = (partition, first)
                if notify:
                    near.add(partition)
            for partition in sorted(near):
                self.tables.bump(partition)
        self._keep_ahead(placed)
        return existing

    def _register(
        self,
        job: Job,
        partition: int,
        jitter_ms: int,
        first: PlannedRun | None,
        marks: Mapping[int, int],
        now_ms: int,
        runs_since_ms: int,
    ) -> tuple[PlannedRun | None, bool]:
        """Store the job and its first run, placed ahead of the watermark
        read before (``marks``); the run, and whether its leader must hear
        of it now: due soon, or placed ahead of the watermark (due about now
        to the leader)."""
        planned = self._not_before_now(first, now_ms)
        first = _ahead_of(planned, marks.get(partition))
        if first is not None:
            self._write_run(job.id, partition, first)
        state = "active" if first else "completed"
        self.tables.jobs[job.id] = JobRow(job, state, partition, jitter_ms, now_ms, now_ms, first, runs_since_ms)
        return first, is_near(first, now_ms) or first != planned

    def _take_id(self, job_id: str, first: PlannedRun | None, now_ms: int) -> int:
        """The runs_since_ms of a new job ``job_id``: 0 for an id not taken;
        for a cancelled job's, the job and all kept of it (its runs, their
        schedule rows, dead letters, claims, missed times and running slot)
        go (replaced_runs). Raises JobExists for any other job's id."""
        current = self.tables.jobs.get(job_id)
        if current is None:
            return 0
        if current.state != "cancelled":
            raise JobExists.for_state(job_id, current.state)
        runs = self.tables.runs.get(job_id, {})
        since = replaced_runs(
            job_id, [(r.run_at_ms, r.state, r.dispatched_at_ms) for r in runs.values()], first, now_ms
        )
        for row in runs.values():
            self.tables.dead_letters.pop((job_id, row.run_at_ms, row.attempt_group), None)
        if self.tables.claims is not None:
            self.tables.claims.forget([idempotency_key(job_id, at, group) for at, group in runs])
        for (p, due, run_id), sched in list(self.tables.schedule.items()):
            if sched.job_id == job_id:
                self.tables.delete_schedule(p, due, run_id)
        self.tables.runs.pop(job_id, None)
        self.tables.slots.pop(job_id, None)
        for key in [k for k in self.tables.missed if k[0] == job_id]:
            del self.tables.missed[key]
        del self.tables.jobs[job_id]
        return since

    def _of_replaced(self, job_id: str, run_at_ms: int) -> bool:
        """Whether a record of ``job_id``'s run at ``run_at_ms`` is of a
        cancelled job the job now holding the id replaced: nothing it
        writes lands, as on Cassandra."""
        job = self.tables.jobs.get(job_id)
        return job is not None and run_at_ms < job.runs_since_ms

    def _keep_ahead(self, placed: Mapping[str, tuple[int, PlannedRun]]) -> dict[str, PlannedRun]:
        """The Cassandra store's: read the watermarks again after the write;
        a run one has reached meanwhile gets a second schedule row ahead of
        it (the same run id), its run row and its job's next run the new due
        time, and its partition a change notice; a run handed on, started or
        cancelled meanwhile is left as it is. The runs placed again, by job."""
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
                raise RuntimeError(
                    f"the watermark of partition {behind[0][1]} kept moving past the run of job {behind[0][0]!r}"
                    " while it was stored"
                )
            again: dict[str, tuple[int, PlannedRun]] = {}
            with self._op("keep_ahead"):
                for job_id, p, run in behind:
                    key = (run.run_at_ms, 0)
                    row = self.tables.runs.get(job_id, {}).get(key)
                    if row is None or row.state != "scheduled" or row.dispatched_at_ms is not None:
                        continue
                    new = PlannedRun(run.run_at_ms, marks[p] + AHEAD_OF_WATERMARK_MS)
                    self.tables.put_schedule(ScheduleRow(p, new.due_ms, row.run_id, job_id, run.run_at_ms, 0))
                    self.tables.upsert_run(job_id, key, replace_row(row, due_ms=new.due_ms))
                    # IF next_run_at_ms = ?: a reschedule meanwhile keeps its run.
                    job = self.tables.jobs.get(job_id)
                    if job is not None and job.next_run is not None and job.next_run.run_at_ms == run.run_at_ms:
                        self.tables.jobs[job_id] = replace_row(job, next_run=new)
                    again[job_id] = (p, new)
                for p in sorted({p for p, _ in again.values()}):
                    self.tables.bump(p)
            moved.update((j, run) for j, (_, run) in again.items())
            pending = again
        return moved

    def reschedule(self, job: Job, jitter_ms: int, first: PlannedRun | None, now_ms: int) -> JobRecord:
        marks = self.watermarks()
        with self._op("reschedule"):
            current = self._row(job.id)
            if current.state != "active":
                raise JobNotActive(f"job {job.id!r} is {current.state}")
            first = _ahead_of(self._not_before_now(first, now_ms), marks.get(current.partition))
            self._cancel_handed_on(job.id, now_ms)
            self._op.midway("reschedule")
            if first is not None:
                self._write_run(job.id, current.partition, first)
                self._op.midway("reschedule")
            self.tables.jobs[job.id] = replace_row(
                current,
                job=job,
                jitter_ms=jitter_ms,
                state="active" if first else "completed",
                next_run=first,
                updated_at_ms=now_ms,
            )
            old = current.next_run
            if old is not None and (first is None or first.run_at_ms != old.run_at_ms):
                self._drop_pending(job.id, current.partition, old, now_ms)
            self.tables.bump(current.partition)
            record = self._record(self.tables.jobs[job.id])
        if first is not None:
            moved = self._keep_ahead({job.id: (current.partition, first)})
            if job.id in moved:
                record = replace_row(record, next_run=moved[job.id])
        return record

    def pause_job(self, job_id: str, now_ms: int) -> JobRecord:
        with self._op("pause_job"):
            current = self._row(job_id)
            if current.state != "active":
                raise JobNotActive(f"job {job_id!r} is {current.state}, not active")
            self.tables.jobs[job_id] = replace_row(current, state="paused", updated_at_ms=now_ms)
            held = current.next_run
            if held is not None and self._hold(job_id, current.partition, held):
                # Out of the schedule, so no leader reads it again; its run
                # row and the job's pointer say which run it was.
                self.tables.delete_schedule(current.partition, held.due_ms, run_id_for(job_id, held.run_at_ms, 0))
            self.tables.bump(current.partition)
            return self._record(self.tables.jobs[job_id])

    def _hold(self, job_id: str, partition: int, held: PlannedRun) -> bool:
        """The Cassandra store's: the pause holds the job's next run while
        it waits to be handed on, a row not yet written (IF NOT EXISTS) or
        one scheduled and never marked sent (IF state = 'scheduled' AND
        dispatched_at_ms = null); a run handed on, started or ended is not
        held."""
        key = (held.run_at_ms, 0)
        row = self.tables.runs.get(job_id, {}).get(key)
        if row is None:
            run_id = run_id_for(job_id, held.run_at_ms, 0)
            self.tables.upsert_run(job_id, key, RunRow(job_id, *key, run_id, held.due_ms, partition, "paused"))
            return True
        if row.state != "scheduled" or row.dispatched_at_ms is not None:
            return False
        self.tables.upsert_run(job_id, key, replace_row(row, state="paused"))
        return True

    def resume_job(self, job_id: str, next_run: PlannedRun | None, missed: MissedRuns | None, now_ms: int) -> JobRecord:
        marks = self.watermarks()
        with self._op("resume_job"):
            current = self._row(job_id)
            if current.state != "paused":
                raise JobNotActive(f"job {job_id!r} is {current.state}, not paused")
            first = _ahead_of(self._not_before_now(next_run, now_ms), marks.get(current.partition))
            if first is not None:
                self._write_run(job_id, current.partition, first)
            if missed is not None:
                self.tables.keep_missed(missed)
            self.tables.jobs[job_id] = replace_row(
                current, state="active" if first else "completed", next_run=first, updated_at_ms=now_ms
            )
            held = current.next_run
            if held is not None and (first is None or first.run_at_ms != held.run_at_ms):
                key = (held.run_at_ms, 0)
                row = self.tables.runs.get(job_id, {}).get(key)
                # Only a run still held: one handed on is its worker's.
                if row is not None and held_by_pause(row.state, row.dispatched_at_ms):
                    missed_row = replace_row(
                        row, state="missed", ended_at_ms=now_ms, error="missed: the job was paused"
                    )
                    self.tables.upsert_run(job_id, key, missed_row)
            self.tables.bump(current.partition)
            record = self._record(self.tables.jobs[job_id])
        if first is not None:
            moved = self._keep_ahead({job_id: (current.partition, first)})
            if job_id in moved:
                record = replace_row(record, next_run=moved[job_id])
        return record

    def cancel_job(self, job_id: str, now_ms: int) -> JobRecord:
        with self._op("cancel_job"):
            current = self._row(job_id)
            if current.state == "cancelled":
                raise JobNotActive(f"job {job_id!r} is already cancelled")
            self.tables.jobs[job_id] = replace_row(current, state="cancelled", next_run=None, updated_at_ms=now_ms)
            if current.next_run is not None:
                self._drop_pending(job_id, current.partition, current.next_run, now_ms)
            self.tables.bump(current.partition)
            return self._record(self.tables.jobs[job_id])

    # -- reading --------------------------------------------------------------

    def writes_together(self) -> AbstractContextManager[None]:
        # Each write applies at once, as a server's would.
        return nullcontext()

    def get_job(self, job_id: str) -> JobRecord:
        with self._op("get_job"):
            return self._record(self._row(job_id))

    def list_jobs(self) -> list[JobRecord]:
        with self._op("list_jobs"):
            return [self._record(self.tables.jobs[j]) for j in sorted(self.tables.jobs)]

    def history(self, job_id: str, limit: int = 50) -> list[RunRecord]:
        with self._op("history"):
            self._row(job_id)
            out = [r for r in map(_run_record, _newest_first(self.tables.runs.get(job_id, {}))) if r is not None]
            return out[:limit]

    def last_runs(self, job_ids: Sequence[str]) -> dict[str, RunRecord]:
        out: dict[str, RunRecord] = {}
        with self._op("last_runs"):
            for job_id in job_ids:
                for row in _newest_first(self.tables.runs.get(job_id, {}))[:_LAST_RUNS_READ]:
                    run = _run_record(row)
                    if run is not None and run.dispatched_at_ms is not None:
                        out[job_id] = run
                        break
        return out

    def change_versions(self) -> dict[int, int]:
        with self._op("change_versions"):
            return dict(self.tables.changes)

    def watermarks(self) -> dict[int, int]:
        with self._op("watermarks"):
            return {p: m.fired_through_ms for p, m in self.tables.marks.items()}

    # -- fences and hand-backs ------------------------------------------------

    def raise_fence(self, partition: int, fence: int) -> None:
        with self._op("raise_fence"):
            mark = self.tables.marks.get(partition)
            # Conditional on an existing row, like the cluster's IF fence < f.
            if mark is not None and mark.fence < fence:
                self.tables.marks[partition] = replace_row(mark, fence=fence)

    def hand_back(self, record: DispatchRecord, now_ms: int, started_by: str | None = None) -> bool:
        mark = self.watermarks().get(record.partition)
        with self._op("hand_back"):
            if self._of_replaced(record.job_id, record.run_at_ms):
                return False
            row = self.tables.runs.get(record.job_id, {}).get((record.run_at_ms, record.attempt_group))
            if row is None or not still_owed(row.state, row.worker, started_by):
                return False  # started, finished or cancelled since: nothing owed
            # A second schedule row, a moment from the worker's now, ahead of
            # the watermark whatever the worker's clock says; the first stays.
            due = placed_ahead(now_ms + HAND_BACK_MS, mark)
            self.tables.put_schedule(
                ScheduleRow(
                    record.partition,
                    due,
                    record.run_id,
                    record.job_id,
                    record.run_at_ms,
                    record.attempt_group,
                    record.attempt,
                    record.fence,
                )
            )
            self._op.midway("hand_back")
            self.tables.bump(record.partition)
        self._keep_owed_ahead(record, due, record.attempt, record.fence, sets_due=False)
        return True

    # -- the leader's side ----------------------------------------------------

    def due_runs(self, fences: Fences, horizon_ms: int, now_ms: int) -> list[Run]:
        with self._op("due_runs"):
            if not fences:
                return []
            marks = {p: m.fired_through_ms for p, m in self.tables.marks.items()}
            self._wm_cache.update(marks)
            rows: dict[int, Run] = {}
            for p in fences:
                start = marks.get(p, now_ms - SETTLE_MS)
                for r in self.tables.read_schedule(p, start, horizon_ms):
                    attempt = delivery_for(r.attempt, r.fence, fences[p])
                    add_read_run(rows, Run(r.run_id, r.job_id, r.run_at_ms, r.due_ms, p, attempt, r.attempt_group))
            return sorted(rows.values(), key=lambda r: (r.due_ms, r.run_id))

    def next_lease_expiry(self, fences: Fences, after_ms: int) -> int | None:
        return None  # Kafka delivers a dead worker's run again itself

    # -- the leader's sweep (stores/cassandra_sweep.py) -------------------------

    def sweep_owed(self, fences: Fences, now_ms: int) -> int:
        with self._op("sweep_owed"):
            # As finish_dispatch: nothing of a partition a newer leader took.
            led = [p for p, f in sorted(fences.items()) if p in self.tables.marks and self.tables.marks[p].fence <= f]
            marks = {p: self.tables.marks[p].fired_through_ms for p in led}
        owed = 0
        for p in led:
            owed += self._sweep_handed_on(p, now_ms) + self._sweep_behind(p, marks[p])
        return owed

    def _sweep_handed_on(self, partition: int, now_ms: int) -> int:
        """(a) of sweep_owed: the looks come due, each bucket dropped once
        what it asks is done (a sweep that dies half-way reads it again)."""
        owed = 0
        with self._op("sweep_looks"):
            buckets = buckets_due(self.tables.sweep.swept_through.get(partition), now_ms)
            looks = [(b, self.tables.sweep.bucket(partition, b)) for b in buckets]
        for bucket, rows in looks:
            for look in rows:
                with self._op("sweep_look"):
                    verdict, seen = self._verdict(look, now_ms)
                    if verdict is SweepVerdict.LOOK_AGAIN:
                        self.tables.sweep.add(look, now_ms + SWEEP_LOOK_AFTER_MS)
                if verdict is SweepVerdict.OWE and seen is not None and self._owe_again(look, seen, now_ms):
                    owed += 1
                elif verdict is SweepVerdict.RECORD_FAILURE and seen is not None and seen.failure is not None:
                    record_kept_failure(self, look.record(), seen.failure, now_ms)
            with self._op("sweep_done"):
                self.tables.sweep.drop(partition, bucket)
                self.tables.sweep.swept_through[partition] = bucket
        return owed

    def _verdict(self, look: SweepLook, now_ms: int) -> tuple[SweepVerdict, ClaimSeen | None]:
        row = self.tables.runs.get(look.job_id, {}).get((look.run_at_ms, look.attempt_group))
        claims = self.tables.claims
        if row is None or claims is None:
            return SweepVerdict.DROP, None  # pruned, or of a job replaced since
        claim = claims.rows.get(look.record().idempotency_key)
        # The memory claims keep a running claim's lease on its row, moved
        # by every heartbeat: its end is its holder's last sign of life.
        seen = (
            None
            if claim is None
            else ClaimSeen(
                claim.state,
                claim.updated_at_ms,
                claim.delivery,
                claim.lease_expires_ms,
                # A failed claim's result is the failure it keeps.
                claim.result if claim.state == "failed" else None,
            )
        )
        verdict = sweep_verdict(row.state, row.dispatched_at_ms is not None, row.delivery, look.delivery, seen, now_ms)
        return verdict, seen

    def _owe_again(self, look: SweepLook, seen: ClaimSeen, now_ms: int) -> bool:
        """The cluster's: the claim let go of, on the condition that it is
        still as seen (one of two sweeps, or the sweep or the worker's own
        hand-back, wins), then a row ahead of the watermark, read as the
        delivery after the one looked for."""
        claims = self.tables.claims
        assert claims is not None  # _verdict owes nothing without them
        record = look.record()
        mark = self.watermarks().get(look.partition)
        with self._op("sweep_owe"):
            key = record.idempotency_key
            with claims.lock:  # the cluster's lightweight transaction on the claim
                claim = claims.rows.get(key)
                if claim is None or (claim.state, claim.updated_at_ms) != (seen.state, seen.updated_at_ms):
                    return False
                # Its holder taken away too: a worker that was only cut off,
                # and hands the run back now, finds its claim no longer its
                # own (complete is False) and leaves the run to this delivery.
                state = "released" if claim.state == "running" else claim.state
                claims.rows[key] = replace_row(claim, state=state, holder=ABANDONED, updated_at_ms=now_ms)
            self._op.midway("sweep_owe")
            due = placed_ahead(now_ms + HAND_BACK_MS, mark)
            self._schedule_again(record, due, look.delivery)
            self.tables.bump(look.partition)
        log.warning("owed again a run of job %s whose claim is dead: its worker died unheard", look.job_id)
        self._keep_owed_ahead(record, due, look.delivery, None, sets_due=False)
        return True

    def _sweep_behind(self, partition: int, mark: int) -> int:
        """(b) of sweep_owed: the rows never handed on (no fence) that the
        watermark passed since this client's last sweep, placed again ahead
        of it where they still owe their run, as a late write of theirs is."""
        since = self._swept_marks.get(partition, mark - SWEEP_LOOKBACK_MS)
        if mark <= since:
            return 0
        with self._op("sweep_behind"):
            owed: list[tuple[ScheduleRow, RunRow]] = []
            for r in self.tables.read_schedule(partition, since, mark + 1):
                run = self.tables.runs.get(r.job_id, {}).get((r.run_at_ms, r.attempt_group))
                handed_on = run is not None and run.dispatched_at_ms is not None
                if r.fence is None and run is not None and owed_behind_mark(run.state, handed_on, run.due_ms, r.due_ms):
                    owed.append((r, run))
        for r, run in owed:
            log.warning("a run of job %s was owed by a row behind the watermark: placed again ahead", r.job_id)
            with self._op("sweep_found"):
                self.tables.found_behind.setdefault((r.job_id, r.run_at_ms, r.attempt_group), r.due_ms)
            if run.state == "scheduled" and r.attempt_group == 0:
                self._keep_ahead({r.job_id: (partition, PlannedRun(r.run_at_ms, r.due_ms))})
                continue
            record = DispatchRecord(
                r.run_id, r.job_id, r.run_at_ms, r.due_ms, partition, r.attempt, r.attempt_group, 0, 0
            )
            self._keep_owed_ahead(record, r.due_ms, r.attempt, None, sets_due=True)
        self._swept_marks[partition] = mark
        return len(owed)

    def planning_state(self, job_ids: Collection[str]) -> dict[str, JobPlanState]:
        with self._op("planning_state"):
            out: dict[str, JobPlanState] = {}
            for job_id in job_ids:
                row = self.tables.jobs.get(job_id)
                if row is not None and row.state == "active":
                    nxt = row.next_run
                    out[job_id] = JobPlanState(
                        row.job,
                        row.partition,
                        row.jitter_ms,
                        None if nxt is None else nxt.run_at_ms,
                        None if nxt is None else nxt.due_ms,
                    )
            return out

    def finish_dispatch(
        self, rows: Sequence[Run], fences: Fences, marks: Mapping[int, int], now_ms: int, next_runs: NextRuns
    ) -> list[Run]:
        with self._op("finish_dispatch"):
            # As on the cluster: the partitions' fences read first, then the
            # writes of those a newer leader has not taken.
            floors = {p: mark.fence for p, mark in self.tables.marks.items()}
            allowed = within_fences(DispatchOutcome(rows, marks, next_runs), fences, floors)
            rows, marks, next_runs = allowed.rows, allowed.marks, allowed.next_runs
            for run in rows:
                self._mark_dispatched(run, fences[run.partition], now_ms)
            # The cluster's three steps are requests of their own.
            self._op.midway("finish_dispatch")
            stored = self._store_next(next_runs, now_ms)
            self._op.midway("finish_dispatch")
            for p, through in marks.items():
                if self._wm_cache.get(p, -1) < through - WATERMARK_STEP_MS:
                    self._move_watermark(p, through, fences[p])
                    # Assumed moved whether or not it applied, as the Cassandra
                    # client does.
                    self._wm_cache[p] = through
            return stored

    def _mark_dispatched(self, run: Run, fence: int, now_ms: int) -> None:
        if self._of_replaced(run.job_id, run.run_at_ms):
            return
        # In the same batch as its marks on the cluster: the sweep's look.
        self.tables.sweep.add(SweepLook.of(run), now_ms + SWEEP_LOOK_AFTER_MS)
        key = (run.run_at_ms, run.attempt_group)
        row = self.tables.runs.get(run.job_id, {}).get(key)
        if row is None:  # an update creates the row on Cassandra
            row = RunRow(
                run.job_id, run.run_at_ms, run.attempt_group, run.run_id, run.due_ms, run.partition, "scheduled"
            )
        self.tables.upsert_run(
            run.job_id, key, replace_row(row, fence=fence, dispatched_at_ms=now_ms, delivery=run.attempt)
        )
        # On Cassandra an update of a schedule row deleted meanwhile (its run
        # was cancelled) leaves a row with no run, which due_runs skips: as
        # if nothing were written.
        sched = self.tables.schedule.get((run.partition, run.due_ms, run.run_id))
        if sched is not None:
            self.tables.put_schedule(replace_row(sched, attempt=run.attempt, fence=fence))

    def _store_next(self, next_runs: NextRuns, now_ms: int) -> list[Run]:
        # As the Cassandra store: each plan written only to the job it was
        # made from (IF state = 'active' AND next_run_at_ms = the one read),
        # moving its pointer or completing it; then the next runs of the
        # jobs moved, and those of runs sent again, where missing.
        read = next_runs.planned_from
        moved: list[NextRun] = []
        stale: list[str] = []
        for nxt in next_runs.runs:
            current = self._as_planned(nxt.job_id, read.get(nxt.job_id))
            if current is None:
                stale.append(nxt.job_id)
                continue
            self.tables.jobs[nxt.job_id] = replace_row(current, next_run=nxt.run, updated_at_ms=now_ms)
            moved.append(nxt)
        for job_id in next_runs.completed:
            current = self._as_planned(job_id, read.get(job_id))
            if current is None:
                stale.append(job_id)
                continue
            self.tables.jobs[job_id] = replace_row(current, state="completed", next_run=None, updated_at_ms=now_ms)
        log_stale_plans(log, stale)
        stored = self._store_planned_rows(moved)
        self._store_planned_rows(next_runs.stored_before)
        return stored_runs([*stored, *next_runs.stored_before])

    def _as_planned(self, job_id: str, next_run_at_ms: int | None) -> JobRow | None:
        """The job's row, if it is active with the next run a plan was made
        from (the condition of the Cassandra store's write)."""
        job = self.tables.jobs.get(job_id)
        if job is None or job.state != "active":
            return None
        return job if (None if job.next_run is None else job.next_run.run_at_ms) == next_run_at_ms else None

    def _store_planned_rows(self, runs: Sequence[NextRun]) -> list[NextRun]:
        """The Cassandra store's: each run's row where none is (IF NOT
        EXISTS), then its schedule row; a row cancelled before it was ever
        handed on is written again while its job points at it, one waiting
        gets its schedule row again, any other is left as it is."""
        stored: list[NextRun] = []
        for nxt in runs:
            key = (nxt.run.run_at_ms, 0)
            row = self.tables.runs.get(nxt.job_id, {}).get(key)
            job = self.tables.jobs.get(nxt.job_id)
            if row is None:
                self._write_run(nxt.job_id, nxt.partition, nxt.run)
            elif row.state == "cancelled" and row.dispatched_at_ms is None:
                points_here = job is not None and job.next_run is not None and job.next_run.run_at_ms == key[0]
                if not (points_here and job is not None and job.state == "active"):
                    continue
                self._write_run(nxt.job_id, nxt.partition, nxt.run)
            elif row.state == "scheduled" and row.dispatched_at_ms is None:
                run_id = run_id_for(nxt.job_id, nxt.run.run_at_ms, 0)
                self.tables.put_schedule(
                    ScheduleRow(nxt.partition, nxt.run.due_ms, run_id, nxt.job_id, nxt.run.run_at_ms, 0)
                )
            else:
                continue
            if nxt.missed is not None:
                self.tables.keep_missed(nxt.missed)
            stored.append(nxt)
        return stored

    def _move_watermark(self, partition: int, through_ms: int, fence: int) -> None:
        # IF fence <= f AND fired_through_ms < through: refused for a leader
        # older than the partition's fence, and never backwards.
        mark = self.tables.marks.get(partition)
        if mark is not None and mark.fence <= fence and mark.fired_through_ms < through_ms:
            self.tables.marks[partition] = WatermarkRow(through_ms, fence)

    # -- the worker's side ----------------------------------------------------

    def run_started(self, record: DispatchRecord, worker: str, now_ms: int) -> int | None:
        with self._op("run_started"):
            if self._of_replaced(record.job_id, record.run_at_ms):
                return None
            row = self._run_for(record)
            if row.state in ("cancelled", "missed"):
                return None
            attempt = next_attempt(row.attempt, row.ended_attempt)
            self._put_run(
                record,
                replace_row(
                    row,
                    state="running",
                    started_at_ms=now_ms,
                    worker=worker,
                    attempt=attempt,
                    delivery=max(row.delivery, record.attempt),
                    error=None,
                    ended_at_ms=None,
                    result=None,
                ),
            )
            return attempt

    def run_interrupted(self, record: DispatchRecord, error: str, now_ms: int) -> None:
        with self._op("run_interrupted"):
            if self._of_replaced(record.job_id, record.run_at_ms):
                return
            row = self.tables.runs.get(record.job_id, {}).get((record.run_at_ms, record.attempt_group))
            if row is not None and row.state == "running":
                ended = replace_row(row, ended_at_ms=now_ms, error=error, result=None)
                self._put_run(record, replace_row(ended, state="interrupted", ended_attempt=row.attempt))

    def run_finished(
        self, record: DispatchRecord, state: str, error: str | None, result: str | None, now_ms: int
    ) -> None:
        with self._op("run_finished"):
            if self._of_replaced(record.job_id, record.run_at_ms):
                return
            row = self._run_for(record)
            if row.state == "succeeded":
                return
            self._put_run(record, replace_row(row, state=state, ended_at_ms=now_ms, error=error, result=result))

    def run_missed(self, record: DispatchRecord, missed: MissedRuns, error: str, now_ms: int) -> None:
        with self._op("run_missed"):
            if self._of_replaced(record.job_id, record.run_at_ms):
                return
            row = self._run_for(record)
            # A run a pause held after it was sent, before its send was
            # recorded, is missed too.
            if row.state not in ("scheduled", "dispatched", "parked", "paused"):
                return
            self._put_run(record, replace_row(row, state="missed", ended_at_ms=now_ms, error=error, result=None))
            self.tables.keep_missed(missed)

    def missed_runs(self, job_ids: Sequence[str]) -> dict[str, list[MissedRuns]]:
        with self._op("missed_runs"):
            wanted = set(job_ids)
            out: dict[str, list[MissedRuns]] = {}
            for (job_id, _), missed in sorted(self.tables.missed.items()):
                if job_id in wanted:
                    out.setdefault(job_id, []).append(missed)
            return out

    def run_failed(self, record: DispatchRecord, failure: FailedAttempt, retry_due_ms: int | None) -> None:
        mark = None if retry_due_ms is None else self.watermarks().get(record.partition)
        with self._op("run_failed"):
            if self._of_replaced(record.job_id, record.run_at_ms):
                return
            row = self._run_for(record)
            failures = dict(row.failures)
            failures[failure.attempt] = failure
            row = replace_row(row, failures=tuple(sorted(failures.items())))
            delivery = max(row.delivery, record.attempt)
            if row.state in ("succeeded", "cancelled"):
                self._put_run(record, row)
                return
            ended = replace_row(
                row,
                ended_attempt=max(row.ended_attempt, failure.attempt),
                ended_at_ms=failure.ended_at_ms,
                error=failure.error,
                result=failure.result,
            )
            job = self.tables.jobs.get(record.job_id)
            if retry_due_ms is not None and job is not None and job.state == "cancelled":
                self._put_run(record, replace_row(ended, state="cancelled"))
                return
            if retry_due_ms is None:
                self._put_run(record, replace_row(ended, state="failed"))
                self._op.midway("run_failed")
                self.tables.dead_letters[(record.job_id, record.run_at_ms, record.attempt_group)] = failure.ended_at_ms
                # Owed no more, as on Cassandra: the row it was delivered from
                # goes, so a leader reading it again hands nothing on.
                self.tables.delete_schedule(record.partition, record.due_ms, record.run_id)
                return
            # As a hand-back: a row of its own at the retry's due time (or
            # ahead of the watermark, if the write came too late for it),
            # whose delivery is one past the latest the run met; the row it
            # was delivered from goes, or the run would be due again at once.
            due = placed_ahead(retry_due_ms, mark)
            self._schedule_again(record, due, delivery)
            run_key = (record.job_id, record.run_at_ms, record.attempt_group)
            self.tables.retries_due.setdefault(run_key, {})[failure.attempt] = retry_due_ms
            self._op.midway("run_failed")
            self._put_run(record, replace_row(ended, state="retrying", due_ms=due))
            if due != record.due_ms:
                self.tables.delete_schedule(record.partition, record.due_ms, record.run_id)
            if due != retry_due_ms or due <= failure.ended_at_ms + NEAR_MS:
                self.tables.bump(record.partition)
        self._keep_owed_ahead(record, due, delivery, None, sets_due=True)

    def run_parked(self, record: DispatchRecord, due_ms: int, reason: str, now_ms: int) -> None:
        mark = self.watermarks().get(record.partition)
        with self._op("run_parked"):
            if self._of_replaced(record.job_id, record.run_at_ms):
                return
            row = self._run_for(record)
            if row.state in ("succeeded", "cancelled"):
                return
            job = self.tables.jobs.get(record.job_id)
            if job is not None and job.state == "cancelled":
                self._put_run(record, replace_row(row, state="cancelled", ended_at_ms=now_ms))
                return
            # As a retry: a row of its own at ``due_ms`` (or ahead of the
            # watermark), read as the delivery after the one parked; the row
            # it was delivered from goes.
            delivery = max(row.delivery, record.attempt)
            due = placed_ahead(due_ms, mark)
            self._schedule_again(record, due, delivery)
            self._op.midway("run_parked")
            parked = replace_row(row, state="parked", due_ms=due, delivery=delivery)
            self._put_run(record, replace_row(parked, error=reason))
            if due != record.due_ms:
                self.tables.delete_schedule(record.partition, record.due_ms, record.run_id)
            if due != due_ms or due <= now_ms + NEAR_MS:
                self.tables.bump(record.partition)
        self._keep_owed_ahead(record, due, delivery, None, sets_due=True)

    # -- the overlap policy's running slots -----------------------------------

    def take_slot(
        self, record: DispatchRecord, holder: str, policy: Overlap | str, now_ms: int, lease_ms: int
    ) -> SlotTake:
        with self._op("take_slot"):
            take, write = overlap.decide(self.tables.slots.get(record.job_id), record, holder, policy, now_ms, lease_ms)
            if write is not None:
                self.tables.slots[record.job_id] = write
            return take

    def extend_slots(self, holds: Sequence[SlotHold], now_ms: int, lease_ms: int) -> list[SlotHold]:
        lost = []
        with self._op("extend_slots"):
            for hold in holds:
                slot = overlap.extended(self.tables.slots.get(hold.job_id), hold, now_ms, lease_ms)
                if slot is None:
                    lost.append(hold)
                else:
                    self.tables.slots[hold.job_id] = slot
        return lost

    def release_slot(self, hold: SlotHold, now_ms: int) -> None:
        with self._op("release_slot"):
            slot = self.tables.slots.get(hold.job_id)
            if not overlap.released(slot, hold):
                return
            assert slot is not None
            del self.tables.slots[hold.job_id]
            waiting = slot.waiting
            if waiting is not None and self._run_for(waiting).state == "parked":
                self.run_parked(waiting, now_ms, overlap.wake_reason(hold.job_id), now_ms)

    def running_slot(self, job_id: str) -> RunningSlot | None:
        with self._op("running_slot"):
            return self.tables.slots.get(job_id)

    # -- circuit breakers and the retry budget ---------------------------------

    def breaker(self, downstream: str) -> BreakerRow:
        with self._op("breaker"):
            return self.tables.breakers.get(downstream) or BreakerRow(downstream)

    def breakers(self) -> list[BreakerRow]:
        with self._op("breakers"):
            return [self.tables.breakers[d] for d in sorted(self.tables.breakers)]

    def swap_breaker(self, expected_version: int, row: BreakerRow) -> bool:
        # One lock for the cluster's state: the conditional write is atomic.
        with self._op("swap_breaker"):
            stored = self.tables.breakers.get(row.downstream)
            if (0 if stored is None else stored.version) != expected_version:
                return False
            self.tables.breakers[row.downstream] = replace(row, version=expected_version + 1)
            return True

    def record_attempts(self, count: AttemptCount) -> None:
        with self._op("record_attempts"):
            key = (count.downstream, count.bucket_ms, count.holder)
            old = self.tables.attempt_counts.get(key)
            if old is not None:
                count = replace(count, calls=max(old.calls, count.calls), retries=max(old.retries, count.retries))
            self.tables.attempt_counts[key] = count

    def attempt_counts(self, downstream: str, since_ms: int) -> list[AttemptCount]:
        with self._op("attempt_counts"):
            return [
                c for c in self.tables.attempt_counts.values() if c.downstream == downstream and c.bucket_ms >= since_ms
            ]

    def get_run(self, job_id: str, run_at_ms: int, attempt_group: int = 0) -> RunRecord:
        with self._op("get_run"):
            row = self.tables.runs.get(job_id, {}).get((run_at_ms, attempt_group))
            if row is None:
                raise RunNotFound(f"no run of job {job_id!r} at {run_at_ms}")
            return _full_record(row)

    def dead_letters(self, limit: int = 1000) -> list[RunRecord]:
        with self._op("dead_letters"):
            out: list[RunRecord] = []
            newest = sorted(self.tables.dead_letters.items(), key=lambda item: -item[1])
            for (job_id, run_at_ms, group), _ in newest[:limit]:
                row = self.tables.runs.get(job_id, {}).get((run_at_ms, group))
                if row is not None:
                    out.append(_full_record(row))
            return out

    def trigger(self, job_id: str, now_ms: int) -> RunRecord:
        marks = self.watermarks()
        with self._op("trigger"):
            current = self._row(job_id)
            check_triggerable(job_id, current.state)
            group = max((g for at, g in self.tables.runs.get(job_id, {}) if at == now_ms), default=0) + 1
            # Due a moment from the client's now, ahead of the watermark
            # whatever the client's clock says; its schedule time is that now.
            due = placed_ahead(now_ms + HAND_BACK_MS, marks.get(current.partition))
            self._write_run(job_id, current.partition, PlannedRun(now_ms, due), group)
            self.tables.bump(current.partition)
        run_id = run_id_for(job_id, now_ms, group)
        triggered = DispatchRecord(run_id, job_id, now_ms, due, current.partition, 0, group, 0, 0)
        self._keep_owed_ahead(triggered, due, 0, None, sets_due=True)
        return self.get_run(job_id, now_ms, group)

    def redrive(self, job_id: str, run_at_ms: int, attempt_group: int, now_ms: int) -> bool:
        marks = self.watermarks()
        with self._op("redrive"):
            key = (job_id, run_at_ms, attempt_group)
            row = self.tables.runs.get(job_id, {}).get((run_at_ms, attempt_group))
            if key not in self.tables.dead_letters or row is None or row.state != "failed":
                return False
            # As a trigger's: a moment from the client's now, ahead of the
            # watermark whatever the client's clock says.
            due = placed_ahead(now_ms + HAND_BACK_MS, marks.get(row.partition))
            record = DispatchRecord(
                row.run_id, job_id, run_at_ms, row.due_ms, row.partition, row.delivery, attempt_group, 0, 0
            )
            self._schedule_again(record, due, row.delivery)
            self._put_run(record, replace_row(row, state="retrying", due_ms=due, ended_at_ms=None))
            self._op.midway("redrive")
            del self.tables.dead_letters[key]
            self.tables.bump(row.partition)
        self._keep_owed_ahead(record, due, row.delivery, None, sets_due=True)
        return True

    def _schedule_again(self, record: DispatchRecord, due_ms: int, delivery: int, fence: int | None = None) -> None:
        """A schedule row for ``record``'s run at ``due_ms``, read as the
        delivery after ``delivery``, handed on under ``fence`` (None: by no
        leader; a hand-back's row keeps the rejected delivery's)."""
        self.tables.put_schedule(
            ScheduleRow(
                record.partition,
                due_ms,
                record.run_id,
                record.job_id,
                record.run_at_ms,
                record.attempt_group,
                delivery,
                fence,
            )
        )

    def _keep_owed_ahead(
        self, record: DispatchRecord, due_ms: int, delivery: int, fence: int | None, sets_due: bool
    ) -> int:
        """The Cassandra store's: after a row owed again was written
        (``record``'s run due at ``due_ms``, read as the delivery after
        ``delivery``), read the watermarks again; one that reached it
        meanwhile gets a second row ahead of it, its run row the new due
        time when ``sets_due``, its partition a change notice. A run handed
        on, ended or placed elsewhere since is left as it is. Where the row
        is now."""
        for attempt in range(_PLACE_ATTEMPTS):
            placed = placed_ahead(due_ms, self.watermarks().get(record.partition))
            if placed == due_ms:
                return due_ms
            if attempt + 1 == _PLACE_ATTEMPTS:
                raise RuntimeError(
                    f"the watermark of partition {record.partition} kept moving past the run of job"
                    f" {record.job_id!r} while it was stored"
                )
            with self._op("keep_owed_ahead"):
                row = self.tables.runs.get(record.job_id, {}).get((record.run_at_ms, record.attempt_group))
                if row is None or not owed_where_written(
                    row.state, row.delivery, row.due_ms, delivery, due_ms, sets_due
                ):
                    return due_ms
                self._schedule_again(record, placed, delivery, fence)
                if sets_due:
                    self._put_run(record, replace_row(row, due_ms=placed))
                self.tables.bump(record.partition)
            due_ms = placed
        return due_ms

    def _run_for(self, record: DispatchRecord) -> RunRow:
        """The run's row, or the one an update would create on Cassandra (a
        pruned run written to again comes back)."""
        row = self.tables.runs.get(record.job_id, {}).get((record.run_at_ms, record.attempt_group))
        if row is not None:
            return row
        return RunRow(
            record.job_id,
            record.run_at_ms,
            record.attempt_group,
            record.run_id,
            record.due_ms,
            record.partition,
            "scheduled",
        )

    def _put_run(self, record: DispatchRecord, row: RunRow) -> None:
        self.tables.upsert_run(record.job_id, (record.run_at_ms, record.attempt_group), row)

    # -- retention ------------------------------------------------------------

    def prune_history(
        self,
        partitions: Collection[int],
        finished_before_ms: int | None,
        keep_per_job: int | None,
        limit: int,
        now_ms: int,
    ) -> int:
        wanted = set(partitions)
        deleted = 0
        with self._op("prune_history"):
            if not wanted or limit <= 0:
                return 0
            if self.tables.claims is not None:
                self.tables.claims.drop_buried(now_ms - PRUNED_CLAIM_KEPT_MS)
            for job_id in sorted(j for j, row in self.tables.jobs.items() if row.partition in wanted):
                runs = _newest_first(self.tables.runs.get(job_id, {}))
                chosen = _prunable(runs, finished_before_ms, keep_per_job, limit - deleted)
                for i in sorted(chosen):
                    row = runs[i]
                    del self.tables.runs[job_id][(row.run_at_ms, row.attempt_group)]
                    self.tables.dead_letters.pop((job_id, row.run_at_ms, row.attempt_group), None)
                    if self.tables.claims is not None:
                        key = idempotency_key(job_id, row.run_at_ms, row.attempt_group)
                        self.tables.claims.bury([(key, row.run_id)], now_ms)
                deleted += len(chosen)
                if deleted >= limit:
                    break
        return deleted

    # -- helpers --------------------------------------------------------------

    def _row(self, job_id: str) -> JobRow:
        row = self.tables.jobs.get(job_id)
        if row is None:
            raise JobNotFound(f"no job {job_id!r}")
        return row

    def _record(self, row: JobRow) -> JobRecord:
        nxt = row.next_run if row.state in ("active", "paused") else None
        sent = None
        if row.state == "paused" and nxt is not None:
            # Whether the pause holds its next run, or found it handed on.
            held = self.tables.runs.get(row.job.id, {}).get((nxt.run_at_ms, 0))
            if held is not None and not held_by_pause(held.state, held.dispatched_at_ms):
                sent, nxt = nxt.run_at_ms, None
        return JobRecord(
            row.job, row.state, row.partition, row.jitter_ms, row.created_at_ms, nxt, row.runs_since_ms, sent
        )

    @staticmethod
    def _not_before_now(run: PlannedRun | None, now_ms: int) -> PlannedRun | None:
        """A run registered for a time already past is due now: the caller's
        now, as on the Cassandra store (_ahead_of places one that is still
        behind the watermark)."""
        if run is None or run.due_ms >= now_ms:
            return run
        return PlannedRun(run.run_at_ms, now_ms)

    def _write_run(self, job_id: str, partition: int, run: PlannedRun, group: int = 0) -> None:
        # Cassandra's INSERT: the listed columns are overwritten, the others
        # (a revived cancelled run's dispatch time, say) stay.
        run_id = run_id_for(job_id, run.run_at_ms, group)
        key = (run.run_at_ms, group)
        old = self.tables.runs.get(job_id, {}).get(key)
        new = RunRow(job_id, run.run_at_ms, group, run_id, run.due_ms, partition, "scheduled")
        if old is not None:
            new = replace_row(
                old,
                run_id=run_id,
                due_ms=run.due_ms,
                partition=partition,
                state="scheduled",
                attempt=0,
                delivery=0,
                ended_attempt=0,
            )
        self.tables.upsert_run(job_id, key, new)
        self.tables.put_schedule(ScheduleRow(partition, run.due_ms, run_id, job_id, run.run_at_ms, group))

    def _cancel_handed_on(self, job_id: str, now_ms: int) -> None:
        """Cancel the job's runs handed on and not started, and those
        interrupted, retrying or parked: they belong to the schedule being replaced, and a worker
        starting one would read the new spec. Before the job row changes, as on Cassandra: a worker that
        read the new spec finds its run cancelled."""
        for key, row in list(self.tables.runs.get(job_id, {}).items()):
            if (row.state == "scheduled" and row.dispatched_at_ms is not None) or row.state in (
                "interrupted",
                "retrying",
                "parked",
            ):
                self.tables.upsert_run(job_id, key, replace_row(row, state="cancelled", ended_at_ms=now_ms))

    def _drop_pending(self, job_id: str, partition: int, run: PlannedRun, now_ms: int) -> None:
        self.tables.delete_schedule(partition, run.due_ms, run_id_for(job_id, run.run_at_ms, 0))
        key = (run.run_at_ms, 0)
        row = self.tables.runs.get(job_id, {}).get(key)
        if row is None:
            row = RunRow(job_id, run.run_at_ms, 0, run_id_for(job_id, run.run_at_ms, 0), run.due_ms, partition, "")
        self.tables.upsert_run(job_id, key, replace_row(row, state="cancelled", ended_at_ms=now_ms))


def _ahead_of(run: PlannedRun | None, mark: int | None) -> PlannedRun | None:
    """The Cassandra store's: a run due at or behind its partition's
    watermark goes ahead of it (placed_ahead), at the same schedule time."""
    if run is None:
        return None
    due_ms = placed_ahead(run.due_ms, mark)
    return run if due_ms == run.due_ms else PlannedRun(run.run_at_ms, due_ms)


def _newest_first(runs: Mapping[RunKey, RunRow]) -> list[RunRow]:
    """Cassandra's clustering order: run_at descending, attempt group ascending."""
    return [runs[k] for k in sorted(runs, key=lambda k: (-k[0], k[1]))]


def _run_record(row: RunRow) -> RunRecord | None:
    state = row.state
    if state == "scheduled":
        if row.dispatched_at_ms is None:
            return None  # still waiting: not history yet
        state = "dispatched"
    return RunRecord(
        row.run_id,
        row.job_id,
        row.run_at_ms,
        row.due_ms,
        state,
        shown_attempt(state, row.attempt, row.ended_attempt),
        row.fence,
        row.dispatched_at_ms,
        row.started_at_ms,
        row.ended_at_ms,
        row.worker,
        row.error,
        row.result,
        attempt_group=row.attempt_group,
    )


def _full_record(row: RunRow) -> RunRecord:
    """A run as get_run and dead_letters return it: found while it waits
    for its first dispatch, with its failed attempts."""
    record = _run_record(row)
    if record is None:
        record = RunRecord.waiting(row.run_id, row.job_id, row.run_at_ms, row.due_ms, row.state, row.attempt, row.fence)
    return replace(record, failures=tuple(f for _, f in row.failures), attempt_group=row.attempt_group)


def _prunable(runs: Sequence[RunRow], finished_before_ms: int | None, keep: int | None, limit: int) -> set[int]:
    """Of one job's runs, newest first, the positions of at most ``limit``
    that go, oldest first: the Cassandra store's ``prunable``."""
    out: list[int] = []
    newer = 0
    for i, row in enumerate(runs):
        if row.state not in _FINISHED:
            continue
        newer += 1
        ended = row.run_at_ms if row.ended_at_ms is None else row.ended_at_ms
        if newer > 1 and (
            (keep is not None and newer > keep) or (finished_before_ms is not None and ended < finished_before_ms)
        ):
            out.append(i)
    return set(out[-limit:]) if limit > 0 else set()
