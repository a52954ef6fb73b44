"""A workload that changes its jobs while they run (``--changes``): what a
user does to them through the Client, at times drawn from the world's seed.

Each job drawn for a change gets one story: cancelled; rescheduled (cron to
cron, one-shot to cron, cron to one-shot); paused, then resumed; or
triggered beside its schedule. Besides, dead letters are redriven and the
history pruned, now and then. Half the cancels, reschedules and pauses are
drawn at a time one of the job's runs comes due, and land between a
leader's read of its plan and its write (``JobChanges.between_plan_and_write``,
called by the nodes' fault hooks): the race of issue 29's C4."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pysched.client import Client
from pysched.clock import Clock
from pysched.memory.store import MemoryScheduleStore, RunRow, ScheduleTables
from pysched.model import CronSchedule, IntervalSchedule, Job, OnceSchedule
from pysched.protocols import JobNotActive
from pysched.retention import HistoryPruner, Retention
from pysched.sim.ledger import Ledger
from pysched.sim.workload import owed_runs

ChangeKind = Literal["cancel", "reschedule", "pause", "resume", "trigger", "redrive", "prune"]
# The stories a job drawn for a change gets, as likely each.
_STORIES: tuple[ChangeKind, ...] = ("cancel", "reschedule", "pause", "trigger")
# The crons a job is rescheduled to: often, so that their runs are many.
_NEW_CRONS = ("* * * * *", "*/2 * * * *", "*/5 * * * *")
# A pause lasts this long, drawn.
_PAUSE_MS = (30_000, 600_000)
# A racing change waits at most this long for a recording to land in.
_RACE_WAIT_MS = 60_000
# What a prune keeps of each job: few, so that it prunes runs that matter.
_KEEP_PER_JOB = 3

Schedule = CronSchedule | IntervalSchedule | OnceSchedule


@dataclass(frozen=True, slots=True)
class JobChange:
    """What a user asks, and when: ``job_id`` is empty for a redrive (of the
    newest dead letter then) and a prune (of every partition's history)."""

    kind: ChangeKind
    at_ms: int
    job_id: str = ""
    schedule: Schedule | None = None  # a reschedule's new schedule
    # Applied between a leader's read of its plan and its write.
    racing: bool = False


@dataclass(frozen=True, slots=True)
class AppliedChange:
    """A change as it took effect: the job it made (a reschedule's), or the
    run a trigger or redrive owes (``key``), or why it was refused."""

    change: JobChange
    at_ms: int  # world time it took effect
    job: Job | None = None
    key: str | None = None
    due_ms: int | None = None  # a trigger's run's due time
    refused: str | None = None
    # The calls the world's downstream had seen before it (Ledger.calls):
    # a call in the same round is before or after it, as it came.
    calls_before: int = 0


def plan_changes(rng: random.Random, jobs: Sequence[Job], start_ms: int, until_ms: int) -> list[JobChange]:
    """A tenth of the jobs (at most), among those with a run due in [start,
    until), each with a story drawn from ``rng`` in that time; a redrive
    and a prune every ten minutes or so. Sorted by time."""
    changes: list[JobChange] = []
    span = until_ms - start_ms
    busy = [job for job in jobs if next(iter(owed_runs(job, start_ms, until_ms)), None) is not None]
    for job in rng.sample(busy, min(len(busy), max(1, len(jobs) // 10))):
        story = rng.choice(_STORIES)
        at = start_ms + rng.randrange(span)
        racing = story != "trigger" and rng.random() < 0.5
        if racing:
            # At a time one of its runs comes due: the change lands within
            # the recording of that run.
            due = next((r.due_ms for r in owed_runs(job, at, until_ms)), None)
            racing, at = (True, due) if due is not None else (False, at)
        if story == "reschedule":
            changes.append(JobChange("reschedule", at, job.id, _new_schedule(rng, job, at), racing))
        elif story == "pause":
            changes.append(JobChange("pause", at, job.id, racing=racing))
            # Resumed within the world, so that what it held is judged.
            changes.append(JobChange("resume", min(until_ms, at + rng.randrange(*_PAUSE_MS)), job.id))
        else:
            changes.append(JobChange(story, at, job.id, racing=racing))
    for at in range(start_ms + rng.randrange(600_000), until_ms, 600_000):
        changes.append(JobChange("redrive", at))
        changes.append(JobChange("prune", at + rng.randrange(600_000)))
    return sorted(changes, key=lambda c: c.at_ms)


def _new_schedule(rng: random.Random, job: Job, at_ms: int) -> Schedule:
    """One-shot to cron; cron (or interval) to cron, or to a one-shot a
    few minutes after the change."""
    if isinstance(job.schedule, OnceSchedule) or rng.random() < 0.7:
        return CronSchedule(expr=rng.choice(_NEW_CRONS))
    return OnceSchedule(run_at_ms=at_ms + rng.randrange(60_000, 1_200_000))


class JobChanges:
    """Applies a world's changes as its time comes, through a Client on the
    world's clock, as a user would; keeps what each did (``applied``) and
    the history rows each prune took (``pruned``), for the judge."""

    def __init__(self, changes: Sequence[JobChange], store: MemoryScheduleStore, clock: Clock, ledger: Ledger) -> None:
        self._pending = list(changes)
        self.ledger = ledger
        # Each call of these jobs' runs numbered, to be ordered against the changes.
        ledger.numbered = frozenset(c.job_id for c in changes if c.job_id)
        self._armed: list[JobChange] = []  # racing changes due, waiting for a recording
        self.client = Client(store=store, clock=clock)
        self.clock = clock
        self.tables: ScheduleTables = store.tables
        self.applied: list[AppliedChange] = []
        self.pruned: dict[str, dict[tuple[int, int], RunRow]] = {}
        self.pruned_dead: dict[tuple[str, int, int], int] = {}

    def round(self, now_ms: int) -> None:
        """The changes due now, but those racing a recording: armed, each
        lands in the next one (or, if none comes within a minute, now)."""
        while self._pending and self._pending[0].at_ms <= now_ms:
            change = self._pending.pop(0)
            if change.racing:
                self._armed.append(change)
            else:
                self._apply(change)
        for change in [c for c in self._armed if c.at_ms + _RACE_WAIT_MS <= now_ms]:
            self._armed.remove(change)
            self._apply(change)

    def between_plan_and_write(self) -> None:
        """A leader read its plans and has not written them: the armed
        changes land now."""
        armed, self._armed = self._armed, []
        for change in armed:
            self._apply(change)

    def _apply(self, change: JobChange) -> None:
        now = self.clock.now_ms()
        client = self.client
        calls = self.ledger.calls
        try:
            match change.kind:
                case "cancel":
                    client.cancel(change.job_id)
                case "pause":
                    client.pause(change.job_id)
                case "resume":
                    client.resume(change.job_id)
                case "reschedule":
                    assert change.schedule is not None
                    job = client.reschedule(change.job_id, change.schedule).job
                    self.applied.append(AppliedChange(change, now, job=job, calls_before=calls))
                    return
                case "trigger":
                    run = client.trigger(change.job_id)
                    key = f"{run.job_id}:{run.run_at_ms}:{run.attempt_group}"
                    self.applied.append(AppliedChange(change, now, key=key, due_ms=run.due_ms))
                    return
                case "redrive":
                    self._redrive(change, now)
                    return
                case "prune":
                    self._prune()
        except JobNotActive as exc:
            self.applied.append(AppliedChange(change, now, refused=str(exc), calls_before=calls))
            return
        self.applied.append(AppliedChange(change, now, calls_before=calls))

    def _redrive(self, change: JobChange, now_ms: int) -> None:
        dead = self.client.dead_letters(1)
        if dead:
            run = dead[0]
            done = self.client.redrive([f"{run.job_id}:{run.run_at_ms}:{run.attempt_group}"])
            if done.redriven:
                key = f"{run.job_id}:{run.run_at_ms}:{run.attempt_group}"
                self.applied.append(AppliedChange(change, now_ms, key=key))

    def _prune(self) -> None:
        """One pass of the history's pruning, as a node's background pruner
        makes; the rows it took kept aside, as they were, for the judge."""
        before = {job_id: dict(rows) for job_id, rows in self.tables.runs.items()}
        dead = dict(self.tables.dead_letters)
        HistoryPruner(self.client.store, self.clock, Retention(days=0, keep_per_job=_KEEP_PER_JOB)).prune(
            range(self.client.store.partitions)
        )
        for job_id, rows in before.items():
            now = self.tables.runs.get(job_id, {})
            for key, row in rows.items():
                if key not in now:
                    self.pruned.setdefault(job_id, {})[key] = row
        for run, at_ms in dead.items():
            if run not in self.tables.dead_letters:
                self.pruned_dead[run] = at_ms
