"""`pysched.Client`: jobs added, read and changed from Python code.

The same operations, checks and errors as the `pysched` command, which is a
thin layer over this class: a job is validated and admitted before the store
is opened (a refused job creates no database file), and acknowledged once its
first run is committed. One client talks to one store, the embedded database
or, given a cluster config, the cluster's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from pysched import cron, recurrence
from pysched.admission import JobRejected, admit
from pysched.catchup import count_missed
from pysched.clock import Clock, SystemClock
from pysched.declare import job_of
from pysched.leader.guard import ranges
from pysched.model import CronSchedule, IntervalSchedule, Job, OnceSchedule, PythonTarget
from pysched.problems import InvalidJob, Problem, in_batch, invalid_from_rejection, invalid_from_validation
from pysched.protocols import MISSED_REASONS, JobRecord, Lease, RunRecord, ScheduleStore
from pysched.registry import register, register_many, reschedule
from pysched.registry import replace as replace_job
from pysched.registry import resume as resume_job
from pysched.slo import SloReport, slo_report
from pysched.stores.sqlite_db import Access
from pysched.sync import SyncReport, sync_module
from pysched.targets import import_problem
from pysched.views import iso

if TYPE_CHECKING:
    from pysched.coord.etcd import EtcdCoordinator as Coordinator

DEFAULT_DB = "pysched.db"
# How far `preview` looks: a schedule with no fire in a century has none.
MAX_PREVIEW = 1_000
# How far in the past a one-shot's time may be: the CLI's --at allows as much.
PAST_SLACK_MS = 1_000
# The newest runs of a job an SLO report reads: a month of a run a minute.
MAX_SLO_RUNS = 50_000


@dataclass(frozen=True, slots=True)
class AddedMany:
    """What `Client.add_many` did: the ids it added and those that existed
    already (left as they were)."""

    added: tuple[str, ...]
    existing: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Fire:
    """One coming fire of a recurring schedule: its schedule time, its due time
    with the job's jitter (None for an expression alone), and what the zone's
    DST rule did to it (moved, merged, repeated), if anything."""

    at_ms: int
    due_ms: int | None
    dst: str | None


@dataclass(frozen=True, slots=True)
class Preview:
    schedule: recurrence.Recurring
    jitter_ms: int | None
    fires: tuple[Fire, ...]


@dataclass(frozen=True, slots=True)
class RunKey:
    """A run's identity, printed as JOB:RUN_AT_MS:GROUP."""

    job_id: str
    run_at_ms: int
    attempt_group: int = 0

    def __str__(self) -> str:
        return f"{self.job_id}:{self.run_at_ms}:{self.attempt_group}"

    @classmethod
    def of(cls, run: RunRecord) -> RunKey:
        return cls(run.job_id, run.run_at_ms, run.attempt_group)

    @classmethod
    def parse(cls, text: str) -> RunKey:
        """JOB:RUN_AT_MS:GROUP, as dead letters show it; ValueError for
        anything else (digits alone, within the stores' integers)."""
        job_id, sep, rest = text.partition(":")
        run_at, sep2, group = rest.partition(":")
        if not (
            job_id
            and sep
            and sep2
            and run_at.isascii()
            and run_at.isdigit()
            and group.isascii()
            and group.isdigit()
            and int(run_at) < 2**63
            and int(group) < 2**31
        ):
            raise ValueError(f"a run's key, JOB:RUN_AT_MS:GROUP such as nightly:1764806400000:0; got {text!r}")
        return cls(job_id, int(run_at), int(group))


@dataclass(frozen=True, slots=True)
class Redriven:
    """What `Client.redrive` did: runs put back to run now, and keys that
    named no dead letter (no such run, or one not failed for good)."""

    redriven: tuple[RunKey, ...]
    not_dead_letters: tuple[RunKey, ...]


@dataclass(frozen=True, slots=True)
class PartitionLeader:
    """Who leads a partition, under which fence, until when (its lease);
    ``holder`` None: nobody leads it now."""

    partition: int
    holder: str | None
    fence: int | None
    expires_at_ms: int | None


@dataclass(frozen=True, slots=True)
class LedTogether:
    """The partitions one node leads (``holder`` None: those nobody leads),
    for listings of a row a node rather than a row a partition."""

    holder: str | None
    partitions: tuple[int, ...]
    # Each partition's fence, in the order of ``partitions`` (unled: none).
    fences: tuple[int, ...]
    # The soonest its leases run out (None: unled, or a lease with no set end).
    expires_at_ms: int | None

    @property
    def partition_ranges(self) -> str:
        """0-31,40,42-63"""
        return ranges(self.partitions)

    @property
    def fence_span(self) -> str:
        """The one fence, or the lowest and highest: 7, or 12..40."""
        if not self.fences:
            return ""
        low, high = min(self.fences), max(self.fences)
        return str(low) if low == high else f"{low}..{high}"


def led_together(leaders: Iterable[PartitionLeader]) -> list[LedTogether]:
    """`Client.leaders` grouped by node, in the order of their first
    partitions; the partitions nobody leads last."""
    by_holder: dict[str | None, list[PartitionLeader]] = {}
    for led in sorted(leaders, key=lambda led: led.partition):
        by_holder.setdefault(led.holder, []).append(led)
    unled = by_holder.pop(None, [])
    groups = [
        LedTogether(
            holder,
            tuple(led.partition for led in led_here),
            tuple(led.fence for led in led_here if led.fence is not None),
            min((led.expires_at_ms for led in led_here if led.expires_at_ms), default=None),
        )
        for holder, led_here in by_holder.items()
    ]
    if unled:
        groups.append(LedTogether(None, tuple(led.partition for led in unled), (), None))
    return groups


def coming_fires(
    schedule: recurrence.Recurring, after_ms: int, count: int, jitter_ms: int | None = None
) -> tuple[Fire, ...]:
    """The next ``count`` fires of a valid schedule after ``after_ms``
    (fewer if it has no more), with their due times when ``jitter_ms`` is
    given."""
    fires: list[Fire] = []
    at: int | None = after_ms
    while len(fires) < count:
        at = recurrence.next_after(schedule, at) if at is not None else None
        if at is None:
            break
        fires.append(Fire(at, None if jitter_ms is None else at + jitter_ms, recurrence.dst_note(schedule, at)))
    return tuple(fires)


def _not_past(schedule: CronSchedule | IntervalSchedule | OnceSchedule, now_ms: int, field: str) -> None:
    """A one-shot's time is now or ahead (a second's slack for the clocks of
    the caller and this machine); one long past would fire at once, late."""
    if isinstance(schedule, OnceSchedule) and schedule.run_at_ms < now_ms - PAST_SLACK_MS:
        raise InvalidJob((Problem(field, f"{iso(schedule.run_at_ms)} is in the past"),))


class Client:
    """Jobs of one store: ``Client()`` is the embedded database
    (``$PYSCHED_DB``, else ``pysched.db``); ``Client(db="jobs.db")`` another
    one; ``Client(config="cluster.toml")`` the cluster the file names;
    ``Client(store=...)`` a store already open, which the caller closes.

    Errors: `InvalidJob` (nothing stored; each problem names the field),
    `JobExists`, `JobNotFound`, `JobNotActive` (a change the job's state does
    not allow), and, when the store cannot be opened, `DatabaseUnusable`,
    `ConfigError`, `PartitionsMismatch` or `ConnectionError`."""

    def __init__(
        self,
        db: str | os.PathLike[str] | None = None,
        *,
        config: str | os.PathLike[str] | None = None,
        clock: Clock | None = None,
        access: Access = "create",
        store: ScheduleStore | None = None,
    ) -> None:
        if sum(given is not None for given in (db, config, store)) > 1:
            raise ValueError("give a database, a cluster config or a store, not two")
        self.db = str(db) if db is not None else os.environ.get("PYSCHED_DB", DEFAULT_DB)
        self.config = None if config is None else str(config)
        self.clock: Clock = clock or SystemClock()
        self.access: Access = access
        self._store: ScheduleStore | None = store
        self._close: Callable[[], None] = lambda: None
        self._coordinator: Coordinator | None = None

    # -- the store, opened on first use ------------------------------------

    @property
    def store(self) -> ScheduleStore:
        if self._store is None:
            self._store, self._close = self._open()
        return self._store

    def _open(self) -> tuple[ScheduleStore, Callable[[], None]]:
        if self.config is None:
            from pysched.stores.sqlite import SQLiteScheduleStore
            from pysched.stores.sqlite_db import SQLiteDatabase

            database = SQLiteDatabase(self.db, access=self.access)
            return SQLiteScheduleStore(database), database.close
        from pysched.config import load
        from pysched.node import open_cluster_store

        return open_cluster_store(load(Path(self.config)), clock=self.clock)

    def close(self) -> None:
        if self._coordinator is not None:
            coordinator, self._coordinator = self._coordinator, None
            coordinator.close()
        if self._store is not None:
            self._store = None
            self._close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- adding -------------------------------------------------------------

    def add(
        self,
        job: Job | Mapping[str, Any] | Callable[..., Any],
        /,
        *,
        import_target: bool = True,
        **options: Any,
    ) -> JobRecord:
        """Register a job, given as a `Job`, its JSON form (a mapping), or
        a module-level function with `@pysched.job`'s options
        (``client.add(report, cron="0 9 * * 1-5", tz="Europe/Paris")``);
        returns it as stored, with its first run. Raises InvalidJob (for a
        lambda, a closure or a script's ``__main__`` function too, which a
        worker cannot import) or JobExists, and then nothing is stored.
        ``import_target``: see `check`."""
        if not isinstance(job, Job | Mapping):
            job = job_of(job, **options)
        elif options:
            raise TypeError(f"{', '.join(sorted(options))}: options go with a function; a job carries its own")
        checked = self.check(job, import_target=import_target)
        try:
            return register(self.store, checked, self.clock.now_ms())
        except JobRejected as exc:
            raise invalid_from_rejection(exc) from None

    def add_many(self, jobs: Iterable[Job | Mapping[str, Any]], *, import_target: bool = True) -> AddedMany:
        """Register jobs in bulk: every one is checked before any is stored
        (one refused: InvalidJob, nothing stored); ids that exist already are
        left as they are and reported."""
        checked = []
        for index, job in enumerate(jobs):
            try:
                checked.append(self.check(job, import_target=import_target))
            except InvalidJob as exc:
                raise in_batch(index, exc) from None
        ids = [job.id for job in checked]
        if len(set(ids)) != len(ids):
            twice = sorted({i for i in ids if ids.count(i) > 1})
            raise InvalidJob((Problem("id", f"given more than once: {', '.join(twice)}"),))
        if not checked:
            return AddedMany((), ())
        try:
            existing = register_many(self.store, checked, self.clock.now_ms())
        except JobRejected as exc:
            raise invalid_from_rejection(exc) from None
        known = set(existing)
        return AddedMany(tuple(i for i in ids if i not in known), tuple(existing))

    def check(self, job: Job | Mapping[str, Any], *, allow_past: bool = False, import_target: bool = True) -> Job:
        """The job validated and admitted now, without storing it; raises
        InvalidJob naming every field at fault. ``allow_past``: a one-shot
        whose time has passed is no fault (a declaration that already ran).
        ``import_target``: a Python target's module is imported here and
        must name a function, so that a typo fails now rather than at run
        time; False for a target only the workers can import."""
        now = self.clock.now_ms()
        try:
            model = job if isinstance(job, Job) else Job.model_validate(job)
            admit(model, now)
        except ValidationError as exc:
            raise invalid_from_validation(exc) from None
        except JobRejected as exc:
            raise invalid_from_rejection(exc) from None
        if not allow_past:
            _not_past(model.schedule, now, "schedule.run_at_ms")
        if import_target and isinstance(model.target, PythonTarget):
            problem = import_problem(model.target.ref)
            if problem is not None:
                raise InvalidJob((Problem("target.ref", f"cannot be imported here: {problem}"),))
        return model

    # -- reading ------------------------------------------------------------

    def get(self, job_id: str) -> JobRecord:
        """Raises JobNotFound."""
        return self.store.get_job(job_id)

    def ls(self) -> list[JobRecord]:
        return self.store.list_jobs()

    def history(self, job_id: str, limit: int = 50) -> list[RunRecord]:
        """A job's runs, newest first. Raises JobNotFound."""
        if limit < 1:
            raise ValueError("limit: at least 1")
        return self.store.history(job_id, limit)

    def last_runs(self, job_ids: Sequence[str]) -> dict[str, RunRecord]:
        """The last run handed on of each job that has one."""
        return self.store.last_runs(job_ids)

    def missed(self, jobs: Sequence[JobRecord]) -> dict[str, dict[str, int]]:
        """Schedule times each job missed, counted by reason (every reason,
        zero when none)."""
        spans = self.store.missed_runs([r.job.id for r in jobs])
        counts: dict[str, dict[str, int]] = {}
        for rec in jobs:
            counted = dict.fromkeys(MISSED_REASONS, 0)
            for span in spans.get(rec.job.id, []):
                counted[span.reason] = counted.get(span.reason, 0) + count_missed(rec.job, span)
            counts[rec.job.id] = counted
        return counts

    def preview(
        self,
        job_id: str | None = None,
        *,
        cron_expr: str | None = None,
        tz: str | None = None,
        every: str | float | None = None,
        count: int = 10,
        after_ms: int | None = None,
        start_ms: int | None = None,
    ) -> Preview:
        """The next ``count`` fires of a registered recurring job (with its
        jittered due times), of a cron expression (in zone ``tz``) or of an
        interval (``every``: seconds or a duration such as "5m"; from
        ``start_ms``, epoch ms, as a job's ``start`` counts it). Raises
        InvalidJob for a bad expression, zone or interval, or a one-shot
        job; JobNotFound."""
        given = [
            name for name, value in (("job id", job_id), ("cron", cron_expr), ("every", every)) if value is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "give one of a job id, a cron expression and an interval" + (f"; got {given}" if given else "")
            )
        if not 1 <= count <= MAX_PREVIEW:
            raise InvalidJob((Problem("count", f"from 1 to {MAX_PREVIEW:,}; got {count}"),))
        if start_ms is not None and every is None:
            raise InvalidJob((Problem("start_ms", "goes with every"),))
        jitter_ms: int | None = None
        schedule: recurrence.Recurring
        if job_id is not None:
            if tz is not None:
                raise InvalidJob((Problem("tz", "a registered job has its own zone"),))
            rec = self.store.get_job(job_id)
            if not recurrence.is_recurring(rec.job.schedule):
                raise InvalidJob((Problem("schedule", f"{job_id} is a one-shot job, not a recurring schedule"),))
            schedule, jitter_ms = rec.job.schedule, rec.jitter_ms
        elif every is not None:
            if tz is not None:
                raise InvalidJob((Problem("tz", "an interval counts elapsed time, in no zone"),))
            try:
                schedule = IntervalSchedule.model_validate({"every_s": every, "start_ms": start_ms})
            except ValidationError as exc:
                raise invalid_from_validation(exc) from None
        else:
            assert cron_expr is not None
            expr, zone = cron_expr, tz or "UTC"
            for field, check in (("tz", lambda: cron.zone(zone)), ("expr", lambda: cron.validate(expr, zone))):
                try:
                    check()
                except cron.CronError as exc:
                    raise InvalidJob((Problem(field, str(exc)),)) from None
            schedule = CronSchedule(expr=expr, tz=zone)
        start = self.clock.now_ms() if after_ms is None else after_ms
        return Preview(schedule, jitter_ms, coming_fires(schedule, start, count, jitter_ms))

    def slo(self, job_id: str) -> SloReport:
        """The job's fire-lag objective against the runs the store keeps of
        it (pysched.slo). Raises JobNotFound."""
        job = self.store.get_job(job_id).job
        return slo_report(job, self.store.history(job_id, MAX_SLO_RUNS), self.clock.now_ms())

    def slos(self) -> list[SloReport]:
        """`slo` for every job that is not cancelled."""
        return [self.slo(rec.job.id) for rec in self.store.list_jobs() if rec.state != "cancelled"]

    def leaders(self) -> list[PartitionLeader]:
        """Each partition's leader now (a lease that ran out leads nothing)."""
        now = self.clock.now_ms()
        leases = self._coordinator_leases()
        shown = []
        for partition in range(self.store.partitions):
            lease = leases.get(partition)
            if lease is None or (lease.expires_at_ms and lease.expires_at_ms <= now):
                shown.append(PartitionLeader(partition, None, None, None))
            else:
                shown.append(PartitionLeader(partition, lease.holder, lease.fence, lease.expires_at_ms or None))
        return shown

    def standing_by(self) -> list[str]:
        """The nodes up that lead no partition now, sorted: an embedded node
        waiting for the lease another holds, or a cluster node with no
        share of the partitions (more nodes than partitions, or its share
        still being handed over). One that stopped is gone at once; one that
        died, once its lease's TTL has passed."""
        if self.config is None:
            from pysched.coord.local import SQLiteLeaseCoordinator

            local = SQLiteLeaseCoordinator(self.store.db)  # type: ignore[attr-defined]
            return local.standing_by(self.clock.now_ms())
        leading = {lease.holder for lease in self._etcd().leaders().values()}
        return [node for node in self._etcd().members() if node not in leading]

    def _coordinator_leases(self) -> dict[int, Lease]:
        if self.config is None:
            from pysched.coord.local import SQLiteLeaseCoordinator

            return SQLiteLeaseCoordinator(self.store.db).leaders()  # type: ignore[attr-defined]
        return self._etcd().leaders()

    def _etcd(self) -> Coordinator:
        if self._coordinator is None:
            from pysched.config import load
            from pysched.coord.etcd import EtcdCoordinator

            # Opened once and kept: a dashboard asks every few seconds.
            assert self.config is not None  # the embedded engine has no etcd
            self._coordinator = EtcdCoordinator(load(Path(self.config)), partitions=self.store.partitions)
        return self._coordinator

    # -- changing -----------------------------------------------------------

    def cancel(self, job_id: str) -> JobRecord:
        """Cancel a job's pending runs; its history stays. Raises
        JobNotFound, JobNotActive (cancelled already)."""
        return self.store.cancel_job(job_id, self.clock.now_ms())

    def pause(self, job_id: str) -> JobRecord:
        """Stop a job firing until `resume`; the times passed over count as
        missed (paused)."""
        return self.store.pause_job(job_id, self.clock.now_ms())

    def resume(self, job_id: str) -> JobRecord:
        """Let a paused job fire again; what it missed follows its catch-up
        policy."""
        return resume_job(self.store, job_id, self.clock.now_ms())

    def reschedule(
        self, job_id: str, schedule: CronSchedule | IntervalSchedule | OnceSchedule | Mapping[str, Any]
    ) -> JobRecord:
        """Give a job a new schedule (a schedule model or its JSON form);
        pending runs are replaced."""
        new: CronSchedule | IntervalSchedule | OnceSchedule
        try:
            if isinstance(schedule, CronSchedule | IntervalSchedule | OnceSchedule):
                new = schedule
            elif schedule.get("kind") == "once":
                new = OnceSchedule.model_validate(schedule)
            elif schedule.get("kind") == "every":
                new = IntervalSchedule.model_validate(schedule)
            else:
                new = CronSchedule.model_validate(schedule)
        except ValidationError as exc:
            raise invalid_from_validation(exc) from None
        _not_past(new, self.clock.now_ms(), "run_at_ms")
        try:
            return reschedule(self.store, job_id, new, self.clock.now_ms())
        except JobRejected as exc:
            raise invalid_from_rejection(exc) from None

    def trigger(self, job_id: str) -> RunRecord:
        """Run the job now, once, beside its schedule (which it does not
        move), as `kubectl create job --from=cronjob/...` does: a run with an
        idempotency key of its own, handed on at once. A completed one-shot
        may be run again; a paused job must be resumed first. Raises
        JobNotFound, JobNotActive."""
        # Never before the job took its id: a client whose clock is behind
        # the registering one's would give the run a time of the job it
        # replaced, and a worker would take it for that job's.
        since = self.store.get_job(job_id).runs_since_ms
        return self.store.trigger(job_id, max(self.clock.now_ms(), since))

    def replace(self, job: Job | Mapping[str, Any], *, import_target: bool = True) -> JobRecord:
        """Give an active job a new definition, schedule and all (what
        `sync` does for a declaration that changed); pending runs are
        replaced."""
        return replace_job(self.store, self.check(job, import_target=import_target), self.clock.now_ms())

    # -- dead letters -------------------------------------------------------

    def dead_letters(self, limit: int = 1000) -> list[RunRecord]:
        """Runs that failed for good, newest failure first, each with its
        failed attempts."""
        return self.store.dead_letters(limit)

    def get_run(self, key: RunKey) -> RunRecord:
        """One run with its failed attempts. Raises RunNotFound."""
        return self.store.get_run(key.job_id, key.run_at_ms, key.attempt_group)

    def redrive(self, keys: Iterable[RunKey | str]) -> Redriven:
        """Run dead letters again, now, as their next attempt (the same
        idempotency key: an effect that did commit is not repeated). A key
        is a RunKey or its text, JOB:RUN_AT_MS:GROUP (ValueError if not)."""
        now = self.clock.now_ms()
        done: list[RunKey] = []
        not_dead: list[RunKey] = []
        for given in keys:
            key = RunKey.parse(given) if isinstance(given, str) else given
            ok = self.store.redrive(key.job_id, key.run_at_ms, key.attempt_group, now)
            (done if ok else not_dead).append(key)
        return Redriven(tuple(done), tuple(not_dead))

    # -- declared jobs ------------------------------------------------------

    def sync(self, module: ModuleType | str, *, prune: bool = False, dry_run: bool = False) -> SyncReport:
        """Make the store hold the jobs ``module`` declares with
        ``@pysched.job``: add the new, update the changed; with ``prune``,
        cancel the jobs of the module's functions no longer declared."""
        return sync_module(self, module, prune=prune, dry_run=dry_run)
