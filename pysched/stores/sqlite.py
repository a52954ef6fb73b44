"""The embedded schedule store: SQLite in WAL mode."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from pysched import overlap
from pysched.model import STORED, Job, Overlap, plannable_job
from pysched.overlap import RunningSlot, SlotHold, SlotTake
from pysched.protocols import (
    NEAR_MS,
    PRUNED_STATE,
    AttemptCount,
    BreakerRow,
    DispatchOutcome,
    FailedAttempt,
    Fences,
    JobExists,
    JobNotActive,
    JobNotFound,
    JobPlanState,
    JobRecord,
    MissedRuns,
    NextRuns,
    PlannedRun,
    Registration,
    Run,
    RunNotFound,
    RunRecord,
    check_triggerable,
    is_near,
    log_stale_plans,
    replaced_runs,
    within_fences,
)
from pysched.records import DispatchRecord, idempotency_key
from pysched.retention import PRUNED_CLAIM_KEPT_MS
from pysched.stores.sqlite_db import SQLiteDatabase

log = logging.getLogger("pysched.sqlite")

# Runs a leader holding :fence at :now must hand on. A run dispatched under an
# older fence was in a queue that died with its leader; a running run whose
# worker lease expired was lost with its worker, and so was one whose claim
# ended but whose outcome never reached its row (the worker died between the
# two writes): handed on again, it meets its claim, which records it or runs
# it again as the next delivery. An interrupted run was let go of by its worker,
# claim and all, and is owed again, whatever its fence; so is a failed run
# retrying, at its retry's due time, and a run parked by its downstream's
# breaker, at the time it was parked until. A running run handed on again
# after its lease ran out is, like a dispatched one, in a queue of this
# leader's until its next delivery takes the claim over: not owed again
# at every read meanwhile, but again under a newer fence. One whose hand-on
# was never recorded (its worker started it first, and the node died) has
# neither: nothing says a delivery waits for it, so it is owed.
_ELIGIBLE = """(
    runs.state IN ('scheduled', 'interrupted', 'retrying', 'parked')
    OR (runs.state = 'dispatched' AND runs.fence < :fence)
    OR (runs.state = 'running' AND EXISTS (
        SELECT 1 FROM claims c WHERE c.run_id = runs.run_id
        AND (c.state != 'running' OR (c.lease_expires_ms < :now
            AND (coalesce(runs.fence, -1) < :fence
                OR coalesce(runs.dispatched_at_ms, -1) < c.lease_expires_ms)))))
)"""

# protocols.shown_attempt, in SQL.
_RUN_COLUMNS = (
    "run_id, job_id, run_at_ms, due_ms, state, CASE WHEN state IN ('dispatched', 'parked')"
    " AND ended_attempt >= attempt THEN ended_attempt + 1 ELSE attempt END, fence, dispatched_at_ms,"
    " started_at_ms, ended_at_ms, worker, error, result"
)
_BREAKER_COLUMNS = "downstream, version, state, failures, opened_at_ms, reopens_at_ms, probe_until_ms"
# Attempt counts older than this are dropped: far past the budget's window.
_COUNTS_KEPT_MS = 600_000
# SQLite allows 32766 bound parameters; leave room for the named ones.
_CHUNK = 10_000
_FINISHED = "('succeeded', 'failed', 'cancelled', 'missed')"
# The run_at of the newest finished run of the job of ``runs``: never pruned.
_NEWEST_FINISHED = (
    f"SELECT newest.run_at_ms FROM runs AS newest WHERE newest.job_id = runs.job_id"
    f" AND newest.state IN {_FINISHED} ORDER BY newest.run_at_ms DESC LIMIT 1"
)


class SQLiteScheduleStore:
    def __init__(self, db: SQLiteDatabase | str | Path) -> None:
        self.db = db if isinstance(db, SQLiteDatabase) else SQLiteDatabase(db)
        self.partitions = self.db.partitions

    # -- registration ---------------------------------------------------------

    def add_job(self, job: Job, partition: int, jitter_ms: int, first: PlannedRun | None, now_ms: int) -> JobRecord:
        refused = self._add([(job, partition, jitter_ms, first)], now_ms)
        if job.id in refused:
            raise refused[job.id]
        return self.get_job(job.id)

    def add_jobs(self, items: Sequence[Registration], now_ms: int) -> list[str]:
        return list(self._add(items, now_ms))

    def _add(self, items: Sequence[Registration], now_ms: int) -> dict[str, JobExists]:
        """Register ``items``; the ids refused, each with why. A cancelled
        job's id is taken by the new job: the old job's runs, failures,
        missed times, claims and running slot go in the same transaction
        (replaced_runs)."""
        # The ids already taken are read once, under the write lock, so the
        # rest go in as two statements run over every row, not two a job; an
        # id given twice keeps its first.
        refused: dict[str, JobExists] = {}
        fresh: list[tuple[Job, int, int, PlannedRun | None, int]] = []
        with self.db.transaction() as conn:
            taken = self._taken_ids(conn, [job.id for job, _, _, _ in items])
            for job, partition, jitter, first in items:
                state = taken.get(job.id)
                since = 0
                if state == "cancelled":
                    try:
                        since = self._drop_cancelled(conn, job.id, first, now_ms)
                    except JobExists as exc:
                        refused[job.id] = exc
                        continue
                elif state is not None:
                    refused[job.id] = JobExists.for_state(job.id, state)
                    continue
                taken[job.id] = "registered"
                fresh.append((job, partition, jitter, first, since))
            conn.executemany(
                "INSERT INTO jobs (job_id, spec, state, partition, jitter_ms, created_at_ms, updated_at_ms,"
                " runs_since_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        job.id,
                        job.model_dump_json(),
                        "active" if first else "completed",
                        partition,
                        jitter,
                        now_ms,
                        now_ms,
                        since,
                    )
                    for job, partition, jitter, first, since in fresh
                ],
            )
            conn.executemany(
                "INSERT OR IGNORE INTO runs (job_id, run_at_ms, due_ms, partition, state)"
                " VALUES (?, ?, ?, ?, 'scheduled')",
                [
                    (job.id, first.run_at_ms, first.due_ms, partition)
                    for job, partition, _, first, _ in fresh
                    if first is not None
                ],
            )
            for partition in sorted({partition for _, partition, _, first, _ in fresh if is_near(first, now_ms)}):
                self._bump(conn, partition)
        return refused

    @staticmethod
    def _drop_cancelled(conn: sqlite3.Connection, job_id: str, first: PlannedRun | None, now_ms: int) -> int:
        """Delete the cancelled job ``job_id`` and all that is kept of it,
        for a new job of that id whose first run is ``first``; the new
        job's runs_since_ms. A record of the old job still travelling names
        a run id that no longer exists (ids are never reused): nothing it
        writes lands."""
        runs = conn.execute(
            "SELECT run_id, run_at_ms, attempt_group, state, dispatched_at_ms FROM runs WHERE job_id = ?", (job_id,)
        ).fetchall()
        since = replaced_runs(job_id, [(int(r[1]), str(r[3]), r[4]) for r in runs], first, now_ms)
        keys = [(idempotency_key(job_id, int(r[1]), int(r[2])),) for r in runs]
        conn.executemany("DELETE FROM run_failures WHERE run_id = ?", [(r[0],) for r in runs])
        conn.executemany("DELETE FROM claims WHERE idem_key = ?", keys)
        conn.executemany("DELETE FROM checkpoints WHERE idem_key = ?", keys)
        for table in ("runs", "missed_runs", "running_slots", "jobs"):
            conn.execute(f"DELETE FROM {table} WHERE job_id = ?", (job_id,))
        return since

    @staticmethod
    def _taken_ids(conn: sqlite3.Connection, job_ids: Sequence[str]) -> dict[str, str]:
        """The ids of ``job_ids`` registered, each with its job's state."""
        taken: dict[str, str] = {}
        for start in range(0, len(job_ids), _CHUNK):
            rows = conn.execute(
                "SELECT j.job_id, j.state FROM json_each(?) ids JOIN jobs j ON j.job_id = ids.value",
                (json.dumps(job_ids[start : start + _CHUNK]),),
            )
            taken.update((str(row[0]), str(row[1])) for row in rows)
        return taken

    def reschedule(self, job: Job, jitter_ms: int, first: PlannedRun | None, now_ms: int) -> JobRecord:
        with self.db.transaction() as conn:
            row = conn.execute("SELECT state, partition FROM jobs WHERE job_id = ?", (job.id,)).fetchone()
            if row is None:
                raise JobNotFound(f"no job {job.id!r}")
            if row[0] != "active":
                raise JobNotActive(f"job {job.id!r} is {row[0]}")
            # A run handed on but not started belongs to the old schedule:
            # the worker would read the new spec when it starts it, so it is
            # cancelled with the pending ones (run_started then refuses it);
            # so is an interrupted run, which would start again.
            conn.execute(
                "UPDATE runs SET state = 'cancelled', ended_at_ms = ? WHERE job_id = ?"
                " AND state IN ('scheduled', 'dispatched', 'interrupted', 'retrying', 'parked')",
                (now_ms, job.id),
            )
            conn.execute(
                "UPDATE jobs SET spec = ?, jitter_ms = ?, state = ?, updated_at_ms = ? WHERE job_id = ?",
                (job.model_dump_json(), jitter_ms, "active" if first else "completed", now_ms, job.id),
            )
            if first is not None:
                # A run at the same run_at as a cancelled one revives it.
                conn.execute(
                    "INSERT INTO runs (job_id, run_at_ms, due_ms, partition, state) VALUES (?, ?, ?, ?, 'scheduled')"
                    " ON CONFLICT (job_id, run_at_ms, attempt_group) DO UPDATE SET state = 'scheduled',"
                    " due_ms = excluded.due_ms, ended_at_ms = NULL WHERE runs.state = 'cancelled'",
                    (job.id, first.run_at_ms, first.due_ms, row[1]),
                )
            self._bump(conn, row[1])
        return self.get_job(job.id)

    def cancel_job(self, job_id: str, now_ms: int) -> JobRecord:
        with self.db.transaction() as conn:
            row = conn.execute("SELECT state, partition FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                raise JobNotFound(f"no job {job_id!r}")
            if row[0] == "cancelled":
                raise JobNotActive(f"job {job_id!r} is already cancelled")
            conn.execute(
                "UPDATE runs SET state = 'cancelled', ended_at_ms = ? WHERE job_id = ?"
                " AND state IN ('scheduled', 'retrying', 'parked', 'paused')",
                (now_ms, job_id),
            )
            conn.execute("UPDATE jobs SET state = 'cancelled', updated_at_ms = ? WHERE job_id = ?", (now_ms, job_id))
            self._bump(conn, row[1])
        return self.get_job(job_id)

    def pause_job(self, job_id: str, now_ms: int) -> JobRecord:
        with self.db.transaction() as conn:
            partition = self._state_is(conn, job_id, "active")
            # Its schedule's runs; a run triggered beside it is no part of it.
            conn.execute(
                "UPDATE runs SET state = 'paused' WHERE job_id = ? AND state = 'scheduled' AND attempt_group = 0",
                (job_id,),
            )
            conn.execute("UPDATE jobs SET state = 'paused', updated_at_ms = ? WHERE job_id = ?", (now_ms, job_id))
            self._bump(conn, partition)
        return self.get_job(job_id)

    def resume_job(self, job_id: str, next_run: PlannedRun | None, missed: MissedRuns | None, now_ms: int) -> JobRecord:
        with self.db.transaction() as conn:
            partition = self._state_is(conn, job_id, "paused")
            # protocols.held_by_pause: a run handed on is its worker's.
            conn.execute(
                "UPDATE runs SET state = 'missed', ended_at_ms = ?, error = 'missed: the job was paused'"
                " WHERE job_id = ? AND state = 'paused' AND dispatched_at_ms IS NULL AND run_at_ms != ?",
                (now_ms, job_id, -1 if next_run is None else next_run.run_at_ms),
            )
            if next_run is not None:
                conn.execute(
                    "INSERT INTO runs (job_id, run_at_ms, due_ms, partition, state) VALUES (?, ?, ?, ?, 'scheduled')"
                    " ON CONFLICT (job_id, run_at_ms, attempt_group) DO UPDATE SET state = 'scheduled',"
                    " due_ms = excluded.due_ms, ended_at_ms = NULL WHERE runs.state IN ('paused', 'cancelled')"
                    " AND runs.dispatched_at_ms IS NULL",
                    (job_id, next_run.run_at_ms, next_run.due_ms, partition),
                )
            if missed is not None:
                self._insert_missed(conn, missed)
            conn.execute(
                "UPDATE jobs SET state = ?, updated_at_ms = ? WHERE job_id = ?",
                ("active" if next_run else "completed", now_ms, job_id),
            )
            self._bump(conn, partition)
        return self.get_job(job_id)

    @staticmethod
    def _state_is(conn: sqlite3.Connection, job_id: str, state: str) -> int:
        """The job's partition, if the job is in ``state``."""
        row = conn.execute("SELECT state, partition FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFound(f"no job {job_id!r}")
        if row[0] != state:
            raise JobNotActive(f"job {job_id!r} is {row[0]}, not {state}")
        return int(row[1])

    # -- reading --------------------------------------------------------------

    @contextmanager
    def writes_together(self) -> Iterator[None]:
        with self.db.transaction():
            yield

    def get_job(self, job_id: str) -> JobRecord:
        row = (
            self.db.connection()
            .execute(
                "SELECT spec, state, partition, jitter_ms, created_at_ms, runs_since_ms FROM jobs WHERE job_id = ?",
                (job_id,),
            )
            .fetchone()
        )
        if row is None:
            raise JobNotFound(f"no job {job_id!r}")
        return self._job_record(job_id, row)

    def list_jobs(self) -> list[JobRecord]:
        rows = (
            self.db.connection()
            .execute(
                "SELECT job_id, spec, state, partition, jitter_ms, created_at_ms, runs_since_ms FROM jobs"
                " ORDER BY job_id"
            )
            .fetchall()
        )
        return [self._job_record(r[0], r[1:]) for r in rows]

    def history(self, job_id: str, limit: int = 50) -> list[RunRecord]:
        self.get_job(job_id)
        rows = (
            self.db.connection()
            .execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE job_id = ? AND state != 'scheduled'"
                " ORDER BY run_at_ms DESC, run_id DESC LIMIT ?",
                (job_id, limit),
            )
            .fetchall()
        )
        return [RunRecord(*r) for r in rows]

    def last_runs(self, job_ids: Sequence[str]) -> dict[str, RunRecord]:
        conn = self.db.connection()
        out: dict[str, RunRecord] = {}
        for start in range(0, len(job_ids), _CHUNK):
            chunk = job_ids[start : start + _CHUNK]
            rows = conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id IN (SELECT (SELECT x.run_id FROM runs x"
                " WHERE x.job_id = ids.value AND x.dispatched_at_ms IS NOT NULL"
                " ORDER BY x.run_at_ms DESC, x.run_id DESC LIMIT 1) FROM json_each(?) ids)",
                (json.dumps(list(chunk)),),
            ).fetchall()
            out.update((str(r[1]), RunRecord(*r)) for r in rows)
        return out

    def hand_back(self, record: DispatchRecord, now_ms: int, started_by: str | None = None) -> bool:
        # Nothing to do: a run dispatched under an older fence is eligible
        # again for the leader of a newer one (_ELIGIBLE), and so is one
        # marked running whose claim has ended or run out (until it is
        # handed on again under the current fence).
        return False

    def raise_fence(self, partition: int, fence: int) -> None:
        # The table the claims and the lease share: a store write of an older
        # leader is refused from here on (finish_dispatch). Its watermark
        # hides nothing either way: runs to send are read by their state and
        # fence (_ELIGIBLE), never from the watermarks.
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT INTO fences (partition, fence) VALUES (?, ?)"
                " ON CONFLICT (partition) DO UPDATE SET fence = max(fence, excluded.fence)",
                (partition, fence),
            )

    def change_versions(self) -> dict[int, int]:
        rows = self.db.connection().execute("SELECT partition, version FROM partition_changes").fetchall()
        return {int(p): int(v) for p, v in rows}

    def watermarks(self) -> dict[int, int]:
        rows = self.db.connection().execute("SELECT partition, fired_through_ms FROM watermarks").fetchall()
        return {int(p): int(t) for p, t in rows}

    # -- the leader's side ----------------------------------------------------

    def due_runs(self, fences: Fences, horizon_ms: int, now_ms: int) -> list[Run]:
        if not fences:
            return []
        # One node leads every partition here; its fence is the term.
        fence = max(fences.values())
        rows = (
            self.db.connection()
            .execute(
                "SELECT run_id, job_id, run_at_ms, due_ms, partition, delivery + 1, attempt_group FROM runs"
                " WHERE due_ms < :horizon AND partition IN (SELECT value FROM json_each(:partitions))"
                f" AND {_ELIGIBLE} ORDER BY due_ms, run_id",
                {"horizon": horizon_ms, "partitions": json.dumps(list(fences)), "fence": fence, "now": now_ms},
            )
            .fetchall()
        )
        return [Run(int(r), str(j), int(a), int(d), int(p), int(n), int(g)) for r, j, a, d, p, n, g in rows]

    def next_lease_expiry(self, fences: Fences, after_ms: int) -> int | None:
        if not fences:
            return None
        marks = ",".join("?" * len(fences))
        row = (
            self.db.connection()
            .execute(
                "SELECT min(c.lease_expires_ms) FROM runs JOIN claims c ON c.run_id = runs.run_id"
                f" WHERE runs.state = 'running' AND runs.partition IN ({marks}) AND c.state = 'running'"
                " AND c.lease_expires_ms >= ?",
                [*fences, after_ms],
            )
            .fetchone()
        )
        return None if row is None or row[0] is None else int(row[0])

    def sweep_owed(self, fences: Fences, now_ms: int) -> int:
        # Nothing to sweep: due_runs reads runs by their state and claim
        # (_ELIGIBLE), never from a watermark. A running run whose claim was
        # let go of, or whose lease has run out, is owed again there (and
        # next_lease_expiry has its leader read it then); one dispatched
        # under an older fence too; and a row cannot land behind a mark.
        return 0

    def planning_state(self, job_ids: Collection[str]) -> dict[str, JobPlanState]:
        conn = self.db.connection()
        ids = list(job_ids)
        out: dict[str, JobPlanState] = {}
        for start in range(0, len(ids), _CHUNK):
            # The job's next run: its newest run not cancelled, along the
            # (job_id, run_at_ms, attempt_group) index. A run a worker took
            # before its dispatch was recorded still counts as planned.
            rows = conn.execute(
                "SELECT j.job_id, j.spec, j.partition, j.jitter_ms, (SELECT r.run_at_ms FROM runs r"
                " WHERE r.job_id = j.job_id AND r.attempt_group = 0 AND r.state != 'cancelled'"
                " ORDER BY r.run_at_ms DESC LIMIT 1) FROM json_each(?) ids JOIN jobs j ON j.job_id = ids.value"
                " WHERE j.state = 'active'",
                (json.dumps(ids[start : start + _CHUNK]),),
            ).fetchall()
            for job_id, spec, partition, jitter_ms, next_run_at_ms in rows:
                job = plannable_job(str(job_id), str(spec))
                if job is None:
                    continue
                out[str(job_id)] = JobPlanState(
                    job,
                    int(partition),
                    int(jitter_ms),
                    None if next_run_at_ms is None else int(next_run_at_ms),
                )
        return out

    def finish_dispatch(
        self, rows: Sequence[Run], fences: Fences, marks: Mapping[int, int], now_ms: int, next_runs: NextRuns
    ) -> list[Run]:
        stored: list[Run] = []
        with self.db.transaction() as conn:
            # Fenced in the same transaction as the writes: a leader a newer
            # one has replaced (its term is in ``fences``) writes nothing of it.
            floors = dict(conn.execute("SELECT partition, fence FROM fences").fetchall())
            allowed = within_fences(DispatchOutcome(rows, marks, next_runs), fences, floors)
            rows, marks, next_runs = allowed.rows, allowed.marks, allowed.next_runs
            # Planned from a read before this transaction: of a job whose next
            # run is no longer the one read (a reschedule, a resume), the
            # plan is the old job's; what changed it planned its next run.
            stale = self._moved_since_planned(conn, next_runs)
            if stale:
                log_stale_plans(log, stale)
                next_runs = replace(
                    next_runs,
                    runs=[nxt for nxt in next_runs.runs if nxt.job_id not in stale],
                    completed=[job_id for job_id in next_runs.completed if job_id not in stale],
                )
            # A run retrying (or parked) is dispatched by its next delivery,
            # not by a late record of the one that failed (or was parked): a
            # worker can deal with it before its dispatch is recorded.
            # Handed on before this mark (the in-process queue is no durable
            # step): a crash before this commit leaves the runs scheduled, and
            # the next leader sends them again. A run a pause held after it
            # was sent, before this mark, is no longer the pause's
            # (protocols.held_by_pause): it is its worker's, and owed again
            # as any run handed on.
            conn.executemany(
                "UPDATE runs SET state = CASE WHEN state IN ('scheduled', 'dispatched', 'interrupted', 'paused')"
                " OR (state IN ('retrying', 'parked') AND ? > delivery) THEN 'dispatched' ELSE state END, fence = ?,"
                " dispatched_at_ms = ?, delivery = max(delivery, ?) WHERE run_id = ?",
                [(r.attempt, fences[r.partition], now_ms, r.attempt, r.run_id) for r in rows],
            )
            # Planned from a read before this transaction: a job cancelled or
            # completed since keeps its state and gets no run, nor does a job
            # that has taken the id of the cancelled one whose run was sent
            # (its runs begin after any run of the one it replaced).
            sent_at = {r.job_id: r.run_at_ms for r in rows if r.attempt_group == 0}
            # A run a reschedule dropped before it was ever handed on is the
            # job's again when its new schedule plans the same time.
            for nxt in next_runs.runs:
                row = conn.execute(
                    "INSERT INTO runs (job_id, run_at_ms, due_ms, partition, state)"
                    " SELECT ?, ?, ?, ?, 'scheduled' WHERE EXISTS"
                    " (SELECT 1 FROM jobs WHERE job_id = ? AND state = 'active' AND runs_since_ms <= ?)"
                    " ON CONFLICT (job_id, run_at_ms, attempt_group) DO UPDATE SET state = 'scheduled',"
                    " due_ms = excluded.due_ms, ended_at_ms = NULL"
                    " WHERE runs.state = 'cancelled' AND runs.dispatched_at_ms IS NULL RETURNING run_id",
                    (
                        nxt.job_id,
                        nxt.run.run_at_ms,
                        nxt.run.due_ms,
                        nxt.partition,
                        nxt.job_id,
                        sent_at.get(nxt.job_id, nxt.run.run_at_ms),
                    ),
                ).fetchone()
                if row is not None:
                    stored.append(Run(int(row[0]), nxt.job_id, nxt.run.run_at_ms, nxt.run.due_ms, nxt.partition, 1, 0))
                if nxt.missed is not None:
                    self._insert_missed(conn, nxt.missed)
            conn.executemany(
                "UPDATE jobs SET state = 'completed', updated_at_ms = ? WHERE job_id = ? AND state = 'active'"
                " AND runs_since_ms <= ?",
                [(now_ms, job_id, sent_at.get(job_id, now_ms)) for job_id in next_runs.completed],
            )
            # Shown by `pysched status`; reads go by each run's state, never
            # by the watermark.
            marks_by_partition = dict(marks)
            for r in rows:
                marks_by_partition[r.partition] = max(marks_by_partition.get(r.partition, r.due_ms), r.due_ms)
            conn.executemany(
                "INSERT INTO watermarks (partition, fired_through_ms) VALUES (?, ?) ON CONFLICT (partition)"
                " DO UPDATE SET fired_through_ms = max(fired_through_ms, excluded.fired_through_ms)",
                marks_by_partition.items(),
            )
        return stored

    @staticmethod
    def _moved_since_planned(conn: sqlite3.Connection, next_runs: NextRuns) -> set[str]:
        """The jobs planned for whose next run (as planning_state reads it)
        is not the one their plan was made from (NextRuns.planned_from)."""
        planned = list(dict.fromkeys([*(nxt.job_id for nxt in next_runs.runs), *next_runs.completed]))
        moved: set[str] = set()
        for start in range(0, len(planned), _CHUNK):
            read = {job_id: next_runs.planned_from.get(job_id) for job_id in planned[start : start + _CHUNK]}
            rows = conn.execute(
                "SELECT ids.key FROM json_each(?) ids WHERE (SELECT r.run_at_ms FROM runs r WHERE r.job_id = ids.key"
                " AND r.attempt_group = 0 AND r.state != 'cancelled' ORDER BY r.run_at_ms DESC LIMIT 1)"
                " IS NOT ids.value",
                (json.dumps(read),),
            )
            moved.update(str(row[0]) for row in rows)
        return moved

    # -- the worker's side ----------------------------------------------------

    def run_started(self, record: DispatchRecord, worker: str, now_ms: int) -> int | None:
        # protocols.next_attempt, in SQL.
        with self.db.transaction() as conn:
            row = conn.execute(
                "UPDATE runs SET state = 'running', started_at_ms = ?, worker = ?, delivery = max(delivery, ?),"
                " attempt = CASE WHEN ended_attempt >= attempt THEN ended_attempt + 1 ELSE attempt END,"
                " error = NULL, ended_at_ms = NULL, result = NULL"
                " WHERE run_id = ? AND state NOT IN ('cancelled', 'missed') RETURNING attempt",
                (now_ms, worker, record.attempt, record.run_id),
            ).fetchone()
            return None if row is None else int(row[0])

    def run_interrupted(self, record: DispatchRecord, error: str, now_ms: int) -> None:
        with self.db.transaction() as conn:
            row = conn.execute(
                "UPDATE runs SET state = 'interrupted', ended_attempt = attempt, ended_at_ms = ?, error = ?,"
                " result = NULL WHERE run_id = ? AND state = 'running' RETURNING partition",
                (now_ms, error, record.run_id),
            ).fetchone()
            if row is not None:
                # Owed again at once: its leader reads the partition again.
                self._bump(conn, int(row[0]))

    def run_finished(
        self, record: DispatchRecord, state: str, error: str | None, result: str | None, now_ms: int
    ) -> None:
        with self.db.transaction() as conn:
            conn.execute(
                "UPDATE runs SET state = ?, ended_at_ms = ?, error = ?, result = ? WHERE run_id = ?"
                " AND state != 'succeeded'",
                (state, now_ms, error, result, record.run_id),
            )

    def run_missed(self, record: DispatchRecord, missed: MissedRuns, error: str, now_ms: int) -> None:
        with self.db.transaction() as conn:
            cur = conn.execute(
                "UPDATE runs SET state = 'missed', ended_at_ms = ?, error = ?, result = NULL"
                # A run a pause held after it was sent, and before its send
                # was recorded, is missed too.
                " WHERE run_id = ? AND state IN ('scheduled', 'dispatched', 'parked', 'paused')",
                (now_ms, error, record.run_id),
            )
            if cur.rowcount:
                self._insert_missed(conn, missed)

    @staticmethod
    def _insert_missed(conn: sqlite3.Connection, missed: MissedRuns) -> None:
        conn.execute(
            "INSERT INTO missed_runs (job_id, first_ms, end_ms, reason) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (job_id, first_ms) DO UPDATE SET end_ms = excluded.end_ms, reason = excluded.reason"
            " WHERE excluded.end_ms > missed_runs.end_ms",
            (missed.job_id, missed.first_ms, missed.end_ms, missed.reason),
        )

    def missed_runs(self, job_ids: Sequence[str]) -> dict[str, list[MissedRuns]]:
        out: dict[str, list[MissedRuns]] = {}
        conn = self.db.connection()
        wanted = list(dict.fromkeys(job_ids))
        for i in range(0, len(wanted), 500):
            chunk = wanted[i : i + 500]
            rows = conn.execute(
                "SELECT job_id, first_ms, end_ms, reason FROM missed_runs"
                f" WHERE job_id IN ({','.join('?' * len(chunk))}) ORDER BY job_id, first_ms",
                chunk,
            ).fetchall()
            for job_id, first_ms, end_ms, reason in rows:
                out.setdefault(job_id, []).append(MissedRuns(job_id, int(first_ms), int(end_ms), reason))
        return out

    def run_failed(self, record: DispatchRecord, failure: FailedAttempt, retry_due_ms: int | None) -> None:
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO run_failures (run_id, attempt, failure) VALUES (?, ?, ?)",
                (record.run_id, failure.attempt, failure.to_json()),
            )
            if retry_due_ms is not None and self._job_cancelled(conn, record.job_id):
                state, retry_due_ms = "cancelled", None
            else:
                state = "failed" if retry_due_ms is None else "retrying"
            cur = conn.execute(
                "UPDATE runs SET state = ?, due_ms = coalesce(?, due_ms), ended_attempt = max(ended_attempt, ?),"
                " delivery = max(delivery, ?), ended_at_ms = ?, error = ?, result = ? WHERE run_id = ?"
                " AND state NOT IN ('succeeded', 'cancelled') RETURNING partition",
                (
                    state,
                    retry_due_ms,
                    failure.attempt,
                    record.attempt,
                    failure.ended_at_ms,
                    failure.error,
                    failure.result,
                    record.run_id,
                ),
            ).fetchone()
            if cur is not None and retry_due_ms is not None and retry_due_ms <= failure.ended_at_ms + NEAR_MS:
                self._bump(conn, int(cur[0]))  # its leader reloads now, not at its next full reload

    def run_parked(self, record: DispatchRecord, due_ms: int, reason: str, now_ms: int) -> None:
        with self.db.transaction() as conn:
            state = "cancelled" if self._job_cancelled(conn, record.job_id) else "parked"
            # The delivery parked is its latest: a late record of its
            # dispatch leaves the run parked (finish_dispatch).
            row = conn.execute(
                "UPDATE runs SET state = ?, due_ms = ?, delivery = max(delivery, ?), error = ?,"
                " ended_at_ms = CASE WHEN ? = 'cancelled' THEN ? END"
                " WHERE run_id = ? AND state NOT IN ('succeeded', 'cancelled') RETURNING partition",
                (state, due_ms, record.attempt, reason, state, now_ms, record.run_id),
            ).fetchone()
            if row is not None and state == "parked" and due_ms <= now_ms + NEAR_MS:
                self._bump(conn, int(row[0]))

    # -- the overlap policy's running slots (one transaction each) ---------------

    def take_slot(
        self, record: DispatchRecord, holder: str, policy: Overlap | str, now_ms: int, lease_ms: int
    ) -> SlotTake:
        with self.db.transaction() as conn:
            take, write = overlap.decide(self._slot(conn, record.job_id), record, holder, policy, now_ms, lease_ms)
            if write is not None:
                self._put_slot(conn, write)
            return take

    def extend_slots(self, holds: Sequence[SlotHold], now_ms: int, lease_ms: int) -> list[SlotHold]:
        lost = []
        with self.db.transaction() as conn:
            for hold in holds:
                slot = overlap.extended(self._slot(conn, hold.job_id), hold, now_ms, lease_ms)
                if slot is None:
                    lost.append(hold)
                else:
                    self._put_slot(conn, slot)
        return lost

    def release_slot(self, hold: SlotHold, now_ms: int) -> None:
        with self.db.transaction() as conn:
            slot = self._slot(conn, hold.job_id)
            if slot is None or not overlap.released(slot, hold):
                return
            conn.execute("DELETE FROM running_slots WHERE job_id = ?", (hold.job_id,))
            if slot.waiting is not None:
                # Due now if still parked waiting: a run since delivered
                # again (its wait ran out) keeps its state.
                row = conn.execute(
                    "UPDATE runs SET due_ms = ?, error = ? WHERE run_id = ? AND state = 'parked' RETURNING partition",
                    (now_ms, overlap.wake_reason(hold.job_id), slot.waiting.run_id),
                ).fetchone()
                if row is not None:
                    self._bump(conn, int(row[0]))

    def running_slot(self, job_id: str) -> RunningSlot | None:
        return self._slot(self.db.connection(), job_id)

    @staticmethod
    def _slot(conn: sqlite3.Connection, job_id: str) -> RunningSlot | None:
        row = conn.execute(
            "SELECT idem_key, holder, lease_expires_ms, waiting, version FROM running_slots WHERE job_id = ?",
            (job_id,),
        ).fetchone()
        if row is None:
            return None
        key, holder, lease_expires_ms, waiting, version = row
        record = None if waiting is None else DispatchRecord(*json.loads(waiting))
        return RunningSlot(job_id, key, holder, int(lease_expires_ms), record, int(version))

    @staticmethod
    def _put_slot(conn: sqlite3.Connection, slot: RunningSlot) -> None:
        waiting = None if slot.waiting is None else json.dumps(list(slot.waiting))
        conn.execute(
            "INSERT OR REPLACE INTO running_slots (job_id, idem_key, holder, lease_expires_ms, waiting, version)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (slot.job_id, slot.key, slot.holder, slot.lease_expires_ms, waiting, slot.version),
        )

    # -- circuit breakers and the retry budget ---------------------------------

    def breaker(self, downstream: str) -> BreakerRow:
        row = (
            self.db.connection()
            .execute(f"SELECT {_BREAKER_COLUMNS} FROM breakers WHERE downstream = ?", (downstream,))
            .fetchone()
        )
        return BreakerRow(downstream) if row is None else BreakerRow(*row)

    def breakers(self) -> list[BreakerRow]:
        try:
            rows = (
                self.db.connection().execute(f"SELECT {_BREAKER_COLUMNS} FROM breakers ORDER BY downstream").fetchall()
            )
        except sqlite3.OperationalError:
            return []  # a database no node has opened since breakers existed
        return [BreakerRow(*r) for r in rows]

    def swap_breaker(self, expected_version: int, row: BreakerRow) -> bool:
        values = (
            row.downstream,
            expected_version + 1,
            row.state,
            row.failures,
            row.opened_at_ms,
            row.reopens_at_ms,
            row.probe_until_ms,
        )
        with self.db.transaction() as conn:
            stored = conn.execute("SELECT version FROM breakers WHERE downstream = ?", (row.downstream,)).fetchone()
            if (0 if stored is None else int(stored[0])) != expected_version:
                return False
            conn.execute(f"INSERT OR REPLACE INTO breakers ({_BREAKER_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)", values)
            return True

    def record_attempts(self, count: AttemptCount) -> None:
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT INTO attempt_counts (downstream, bucket_ms, holder, calls, retries) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (downstream, bucket_ms, holder) DO UPDATE SET calls = max(calls, excluded.calls),"
                " retries = max(retries, excluded.retries)",
                (count.downstream, count.bucket_ms, count.holder, count.calls, count.retries),
            )
            # Long past any budget window: a downstream's table stays small.
            conn.execute(
                "DELETE FROM attempt_counts WHERE downstream = ? AND bucket_ms < ?",
                (count.downstream, count.bucket_ms - _COUNTS_KEPT_MS),
            )

    def attempt_counts(self, downstream: str, since_ms: int) -> list[AttemptCount]:
        rows = (
            self.db.connection()
            .execute(
                "SELECT downstream, holder, bucket_ms, calls, retries FROM attempt_counts"
                " WHERE downstream = ? AND bucket_ms >= ?",
                (downstream, since_ms),
            )
            .fetchall()
        )
        return [AttemptCount(*r) for r in rows]

    @staticmethod
    def _job_cancelled(conn: sqlite3.Connection, job_id: str) -> bool:
        row = conn.execute("SELECT state FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return row is not None and row[0] == "cancelled"

    def get_run(self, job_id: str, run_at_ms: int, attempt_group: int = 0) -> RunRecord:
        row = (
            self.db.connection()
            .execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE job_id = ? AND run_at_ms = ? AND attempt_group = ?",
                (job_id, run_at_ms, attempt_group),
            )
            .fetchone()
        )
        if row is None:
            raise RunNotFound(f"no run of job {job_id!r} at {run_at_ms}")
        return self._with_failures(replace(RunRecord(*row), attempt_group=attempt_group))

    def dead_letters(self, limit: int = 1000) -> list[RunRecord]:
        rows = (
            self.db.connection()
            .execute(
                f"SELECT {_RUN_COLUMNS}, attempt_group FROM runs WHERE state = 'failed'"
                " ORDER BY ended_at_ms DESC, run_id DESC LIMIT ?",
                (limit,),
            )
            .fetchall()
        )
        return [self._with_failures(replace(RunRecord(*r[:-1]), attempt_group=int(r[-1]))) for r in rows]

    def redrive(self, job_id: str, run_at_ms: int, attempt_group: int, now_ms: int) -> bool:
        with self.db.transaction() as conn:
            row = conn.execute(
                "UPDATE runs SET state = 'retrying', due_ms = ?, ended_at_ms = NULL WHERE job_id = ?"
                " AND run_at_ms = ? AND attempt_group = ? AND state = 'failed' RETURNING partition",
                (now_ms, job_id, run_at_ms, attempt_group),
            ).fetchone()
            if row is None:
                return False
            self._bump(conn, int(row[0]))
            return True

    def trigger(self, job_id: str, now_ms: int) -> RunRecord:
        with self.db.transaction() as conn:
            row = conn.execute("SELECT state, partition FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                raise JobNotFound(f"no job {job_id!r}")
            check_triggerable(job_id, row[0])
            (group,) = conn.execute(
                "SELECT coalesce(max(attempt_group), 0) + 1 FROM runs WHERE job_id = ? AND run_at_ms = ?",
                (job_id, now_ms),
            ).fetchone()
            conn.execute(
                "INSERT INTO runs (job_id, run_at_ms, due_ms, partition, state, attempt_group)"
                " VALUES (?, ?, ?, ?, 'scheduled', ?)",
                (job_id, now_ms, now_ms, row[1], group),
            )
            self._bump(conn, int(row[1]))
        return self.get_run(job_id, now_ms, int(group))

    def _with_failures(self, run: RunRecord) -> RunRecord:
        rows = (
            self.db.connection()
            .execute("SELECT failure FROM run_failures WHERE run_id = ? ORDER BY attempt", (run.run_id,))
            .fetchall()
        )
        return replace(run, failures=tuple(FailedAttempt.from_json(str(r[0])) for r in rows))

    # -- retention ------------------------------------------------------------

    def prune_history(
        self,
        partitions: Collection[int],
        finished_before_ms: int | None,
        keep_per_job: int | None,
        limit: int,
        now_ms: int,
    ) -> int:
        if not partitions or limit <= 0:
            return 0
        with self.db.transaction() as conn:
            # The tombstones no record can meet any more (retention.py), of
            # every partition: they are no job's history.
            conn.execute(
                "DELETE FROM claims WHERE state = ? AND updated_at_ms < ?",
                (PRUNED_STATE, now_ms - PRUNED_CLAIM_KEPT_MS),
            )
        # Read outside the write lock (WAL readers do not hold up the
        # leader), along indexes: a week of a job firing every second is
        # 600,000 rows, which one pass must not sort. The delete checks
        # each run's state again.
        conn = self.db.connection()
        chosen: dict[int, tuple[str, int, int]] = {}
        if finished_before_ms is not None:
            marks = ",".join("?" * len(partitions))
            # A run that ended before the cut was due before it, except a
            # future run cancelled: that one waits for its due time.
            rows = conn.execute(
                f"SELECT run_id, job_id, run_at_ms, attempt_group FROM runs WHERE state IN {_FINISHED}"
                f" AND due_ms < ? AND coalesce(ended_at_ms, run_at_ms) < ? AND partition IN ({marks})"
                f" AND run_at_ms < ({_NEWEST_FINISHED}) LIMIT ?",
                [finished_before_ms, finished_before_ms, *partitions, limit],
            ).fetchall()
            chosen.update((r[0], (r[1], r[2], r[3])) for r in rows)
        if keep_per_job is not None and len(chosen) < limit:
            wanted = set(partitions)
            # Over-counts (every state): only a candidate list.
            crowded = conn.execute(
                "SELECT job_id FROM runs GROUP BY job_id HAVING count(*) > ?", (keep_per_job,)
            ).fetchall()
            for (job_id,) in crowded:
                row = conn.execute("SELECT partition FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
                if row is None or row[0] not in wanted:
                    continue
                kept_from = conn.execute(
                    f"SELECT run_at_ms FROM runs WHERE job_id = ? AND state IN {_FINISHED}"
                    " ORDER BY run_at_ms DESC LIMIT 1 OFFSET ?",
                    (job_id, max(keep_per_job, 1) - 1),
                ).fetchone()
                if kept_from is None:
                    continue
                rows = conn.execute(
                    f"SELECT run_id, job_id, run_at_ms, attempt_group FROM runs WHERE job_id = ?"
                    f" AND state IN {_FINISHED} AND run_at_ms < ? ORDER BY run_at_ms LIMIT ?",
                    (job_id, kept_from[0], limit),  # the oldest may be chosen already
                ).fetchall()
                chosen.update((r[0], (r[1], r[2], r[3])) for r in rows)
                if len(chosen) >= limit:
                    break
        if not chosen:
            return 0
        deleted = 0
        with self.db.transaction() as conn:
            for run_id, (job_id, run_at_ms, attempt_group) in list(chosen.items())[:limit]:
                # A cancelled run that a reschedule revived is scheduled again.
                if conn.execute(f"DELETE FROM runs WHERE run_id = ? AND state IN {_FINISHED}", (run_id,)).rowcount:
                    conn.execute("DELETE FROM run_failures WHERE run_id = ?", (run_id,))
                    key = idempotency_key(job_id, run_at_ms, attempt_group)
                    # Kept as a tombstone while a record of the run may
                    # still be delivered (retention.py), made if the run
                    # was never claimed (a run cancelled before it ran).
                    conn.execute(
                        "INSERT INTO claims (idem_key, run_id, state, holder, fence, lease_expires_ms, result,"
                        " updated_at_ms) VALUES (?, ?, ?, '', 0, 0, NULL, ?) ON CONFLICT (idem_key) DO UPDATE"
                        " SET state = excluded.state, holder = '', result = NULL, lease_expires_ms = 0,"
                        " updated_at_ms = excluded.updated_at_ms",
                        (key, run_id, PRUNED_STATE, now_ms),
                    )
                    conn.execute("DELETE FROM checkpoints WHERE idem_key = ?", (key,))
                    deleted += 1
        return deleted

    # -- helpers --------------------------------------------------------------

    @staticmethod
    def _bump(conn: sqlite3.Connection, partition: int) -> None:
        conn.execute(
            "INSERT INTO partition_changes (partition, version) VALUES (?, 1)"
            " ON CONFLICT (partition) DO UPDATE SET version = version + 1",
            (partition,),
        )

    def _job_record(self, job_id: str, row: Sequence[object]) -> JobRecord:
        spec, state, partition, jitter_ms, created_at_ms, runs_since_ms = row
        nxt = (
            self.db.connection()
            .execute(
                # The schedule's next run: a triggered one (attempt group 1+)
                # is no part of it.
                "SELECT run_at_ms, due_ms FROM runs WHERE job_id = ? AND state IN ('scheduled', 'paused')"
                " AND attempt_group = 0 ORDER BY run_at_ms LIMIT 1",
                (job_id,),
            )
            .fetchone()
        )
        sent = None
        if nxt is None and state == "paused":
            # Its next run was handed on before the pause reached it (the
            # record of that send plans the next only for an active job):
            # its newest run of the schedule, as planning_state reads it.
            newest = (
                self.db.connection()
                .execute(
                    "SELECT max(run_at_ms) FROM runs WHERE job_id = ? AND attempt_group = 0 AND state != 'cancelled'",
                    (job_id,),
                )
                .fetchone()
            )
            sent = None if newest is None or newest[0] is None else int(newest[0])
        return JobRecord(
            job=Job.model_validate_json(str(spec), context=STORED),
            state=str(state),
            partition=int(str(partition)),
            jitter_ms=int(str(jitter_ms)),
            created_at_ms=int(str(created_at_ms)),
            next_run=PlannedRun(int(nxt[0]), int(nxt[1])) if nxt else None,
            runs_since_ms=int(str(runs_since_ms)),
            sent_before_pause_ms=sent,
        )
