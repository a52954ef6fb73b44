"""What the jobs of a world owe once its workload changed them
(changes.py), worked out from the schedules and the times of the changes,
never from what the store made of them. The rules are invariants.py's."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from pysched.model import Job
from pysched.sim.changes import AppliedChange
from pysched.sim.faults import MAX_SKEW_MS
from pysched.sim.workload import OwedRun, OwedRuns, owed_runs

# A run due this long before a change that took it away must have started
# by then, if no fault was active: LATE_BOUND_MS and two rounds.
_STARTED_BY_MS = 5_000 + 200


@dataclass(frozen=True, slots=True)
class Pause:
    """A job paused at ``at_ms`` and resumed at ``until_ms``; in calls made
    before each (Ledger.calls), ``from_call`` and ``until_call``.
    ``taken_before``: the keys of its schedule's runs due by the pause (on
    a node's clock, MAX_SKEW_MS ahead), which a worker may have taken
    before it: such a run may start while the job is paused (README, Pause
    and resume)."""

    at_ms: int
    until_ms: int
    from_call: int
    until_call: int
    taken_before: frozenset[str] = frozenset()


@dataclass
class ChangedOwed:
    """``certain``: runs owed once (or recorded missed, or dead);
    ``optional``: runs that may have run, once, or not; ``superseded``: run
    key -> the change that took its schedule away (cancel, reschedule), as
    the count of calls made before it (Ledger.calls): it may not start
    after; ``pauses``: job -> its pauses, in which none of its schedule's
    runs may start; ``held``: run
    key -> the resume its start waited for (its lateness counts from
    there); ``redriven``: dead letters' keys and when each was redriven;
    ``changed``: jobs cancelled or rescheduled (a run under way then is
    rightly recorded cancelled, though its target ran on)."""

    certain: list[OwedRun] = field(default_factory=list)
    optional: list[OwedRun] = field(default_factory=list)
    superseded: dict[str, int] = field(default_factory=dict)
    pauses: dict[str, list[Pause]] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)
    redriven: list[tuple[str, int]] = field(default_factory=list)
    changed: set[str] = field(default_factory=set)
    paused: set[str] = field(default_factory=set)
    followed: set[str] = field(default_factory=set)  # the jobs judged here


def owed_after_changes(
    jobs: Sequence[Job],
    applied: Sequence[AppliedChange],
    start_ms: int,
    judged_until_ms: int,
    end_ms: int,
    quiet_from_ms: int,
) -> ChangedOwed:
    """The runs of the jobs the changes touched, as each change left them
    (the others' are OwedRuns'). A job's schedule owes its runs from when
    it took effect until a cancel or reschedule took it away; the runs due
    before that are owed if they were due long enough before it, in a quiet
    time, and may or may not have run otherwise; a trigger owes its run."""
    out = ChangedOwed()
    by_id = {job.id: job for job in jobs}
    stories: dict[str, list[AppliedChange]] = {}
    for done in applied:
        if done.refused is None and done.change.job_id:
            stories.setdefault(done.change.job_id, []).append(done)
        elif done.change.kind == "redrive" and done.key is not None:
            out.redriven.append((done.key, done.at_ms))
    out.followed = set(stories)
    for job_id, story in stories.items():
        _follow(out, by_id[job_id], story, start_ms, judged_until_ms, end_ms, quiet_from_ms)
    return out


def _follow(
    out: ChangedOwed,
    job: Job,
    story: Sequence[AppliedChange],
    start_ms: int,
    judged_until_ms: int,
    end_ms: int,
    quiet_from_ms: int,
) -> None:
    # The schedules the job had: (job, from, until: None while it lasts,
    # and the calls made before it ended).
    spans: list[tuple[Job, int, int | None, int]] = []
    current, since = job, start_ms
    paused: AppliedChange | None = None
    for done in story:
        kind = done.change.kind
        if kind in ("cancel", "reschedule"):
            out.changed.add(job.id)
            spans.append((current, since, done.at_ms, done.calls_before))
            current, since = (done.job, done.at_ms) if done.job is not None else (current, -1)
        elif kind == "pause":
            paused = done
            out.paused.add(job.id)
        elif kind == "resume" and paused is not None:
            pause = Pause(paused.at_ms, done.at_ms, paused.calls_before, done.calls_before)
            out.pauses.setdefault(job.id, []).append(pause)
            paused = None
        elif kind == "trigger" and done.key is not None and done.due_ms is not None:
            run_at = int(done.key.rsplit(":", 2)[1])
            run = OwedRun(done.key, job.id, done.due_ms, run_at)
            (out.certain if done.due_ms <= judged_until_ms else out.optional).append(run)
    if since >= 0:
        spans.append((current, since, None, 0))
    if paused is not None:
        # Never resumed: from the pause on, it is as if cancelled.
        last, since, _, _ = spans.pop()
        spans.append((last, since, paused.at_ms, paused.calls_before))
    later_keys: set[str] = set()
    for spec, since, until, calls in reversed(spans):
        keys = _place(out, spec, since, (until, calls), later_keys, judged_until_ms, end_ms, quiet_from_ms)
        later_keys |= keys
    pauses = out.pauses.get(job.id, [])
    for i, pause in enumerate(pauses):
        runs = list(owed_runs(job, start_ms, pause.until_ms))
        for run in runs:
            if run.due_ms > pause.at_ms - _STARTED_BY_MS:
                out.held[run.key] = pause.until_ms
        taken = frozenset(run.key for run in runs if run.due_ms <= pause.at_ms + MAX_SKEW_MS)
        pauses[i] = replace(pause, taken_before=taken)


def _place(
    out: ChangedOwed,
    spec: Job,
    since: int,
    ended: tuple[int | None, int],
    later_keys: set[str],
    judged_until_ms: int,
    end_ms: int,
    quiet_from_ms: int,
) -> set[str]:
    """Where each run of ``spec`` goes: in effect from ``since`` until
    ``ended`` (the time, None while it lasts, and the calls made before).
    The keys it owes; a key a later schedule owes is that one's."""
    until, calls_before = ended
    keys: set[str] = set()
    for run in owed_runs(spec, since, end_ms + MAX_SKEW_MS):
        if run.key in later_keys:
            continue
        if until is not None and run.due_ms > until + MAX_SKEW_MS:
            out.superseded[run.key] = calls_before
            continue
        keys.add(run.key)
        if until is not None:
            out.superseded[run.key] = calls_before
            quiet = run.due_ms >= quiet_from_ms
            sure = quiet and run.due_ms < until - _STARTED_BY_MS and run.due_ms <= judged_until_ms
            (out.certain if sure else out.optional).append(run)
        else:
            (out.certain if run.due_ms <= judged_until_ms else out.optional).append(run)
    return keys


class WorldOwed:
    """Every run a world owes: OwedRuns' for the jobs no change touched,
    then the changed jobs' (``extra``); made again at each iteration."""

    def __init__(self, unchanged: OwedRuns, extra: Sequence[OwedRun]) -> None:
        self.unchanged = unchanged
        self.extra = extra
        self.count: int | None = None

    def __iter__(self) -> Iterator[OwedRun]:
        yield from self.unchanged
        yield from self.extra
        self.count = (self.unchanged.count or 0) + len(self.extra)
