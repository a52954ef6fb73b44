"""What a simulated world must show: every owed run executed exactly once,
failed for good with its attempts recorded, or recorded missed with a reason
its job's catch-up policy gives; none before its time, and no retry before
its backoff's; fences that only grow; a catch-up lane within its rate; no
dead letter where the downstream never went down; and, once the faults
stop, every run on time again and, after a settle time, none left under
way or owed.

A world whose workload changes its jobs (``--changes``) is judged by what
each change makes a job owe, worked out from the schedules and the times
of the changes (owed_changes.py), with the rules DESIGN.md and the README
state, and where they are silent what a Kubernetes CronJob or APScheduler
user expects (checked in change_invariants.py):

- cancel at t: the runs of its schedule due after t are not run; one
  handed on and not started is not started (README, Pause and resume), one
  started is stopped (its ``ctx.cancelled`` is set, and it is recorded
  cancelled; the simulated target ignores the event and is killed 2 s
  later, as a Python target with a --timeout is: its effect is there if
  it ended by then, and not otherwise); so no run of the schedule starts
  at t or later. A run
  due before t is owed if it was due long enough before t, with no fault
  active, to have started by then (LATE_BOUND_MS); else it may have run,
  once, or not.
- reschedule at t: the old schedule's runs as a cancel's; the new one's
  are owed from t, as a registration's at t (a time both schedules name
  is the new one's).
- pause at p, resume at r: none of the schedule's runs starts in [p, r)
  (a retry of a run started before p goes on: its first call was before;
  a run due by p may have been taken by a worker before p, and a worker
  checks its job once, when it takes a run: it may start, as a Kubernetes
  Job created before its CronJob's suspend, or an APScheduler job already
  submitted to its executor);
  each time due meanwhile runs after r or is recorded missed, ``paused``,
  as the job's catch-up policy says (run_all replays every time, the others
  pass over some); a run held by the pause is late from r, not its due time.
- trigger: one run more, owed as any (once, on time from its due time).
- redrive of a dead letter: a new attempt of that run, called after the
  redrive; its outcome is judged again as any run's.
- overlap forbid, buffer_one, replace: no two runs of the job are under way
  at once (a target's call from its start to its end, or its node's death);
  a time passed over for it is recorded missed, ``overlap``; a replaced run
  is recorded cancelled, whether its call ended before its kill or not.
- pruning: the rows it takes are judged as they were when it took them."""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from pysched import native
from pysched.memory.coordinator import Election, FenceGrant
from pysched.memory.dispatcher import Broker
from pysched.memory.store import RunRow
from pysched.model import Job
from pysched.protocols import MissedRuns
from pysched.records import idempotency_key
from pysched.retries import LOST
from pysched.sim.faults import MAX_SKEW_MS
from pysched.sim.ledger import Ledger
from pysched.sim.workload import OwedRun

# Once the faults have stopped and this long has passed (a lease TTL, a
# coordinator answer, a reload and a claim lease running out), every run
# starts within LATE_BOUND_MS of its due time.
RECOVERY_MS = 60_000
LATE_BOUND_MS = 5_000


@dataclass(frozen=True, slots=True)
class Violation:
    # lost, doubled, unowed, early, late, fence, failures, unsettled,
    # policy, catch-up, lane, dead, backoff
    kind: str
    detail: str
    at_ms: int  # world time it concerns


class FenceWatch:
    """Checks, as grants arrive, that each partition's fences only grow."""

    def __init__(self) -> None:
        self._seen = 0
        self._last: dict[int, int] = {}

    def check(self, grants: Sequence[FenceGrant]) -> Violation | None:
        for grant in grants[self._seen :]:
            self._seen += 1
            last = self._last.get(grant.partition, -1)
            if grant.fence <= last:
                return Violation(
                    "fence",
                    f"partition {grant.partition} granted fence {grant.fence} to {grant.holder} after {last}",
                    grant.at_ms,
                )
            self._last[grant.partition] = grant.fence
        return None


class LeaderWatch:
    """Checks, as records reach the broker, that each was handed on under a
    leader key alive when it was: a leader that kept leading on an expired
    answer (a pause past its lease, etcd unreachable) sends under a fence
    that no longer leads, and its workers' fence checks would hide it."""

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}  # broker partition -> records checked

    def check(self, broker: Broker, election: Election) -> Violation | None:
        for partition in range(broker.partitions):
            seen = self._seen.get(partition, 0)
            new = broker.records_since(partition, seen)
            self._seen[partition] = seen + len(new)
            for record in new:
                sent = native.decode(record.payload)
                if not election.leading_at(sent.partition, sent.fence, record.appended_at_ms):
                    return Violation(
                        "fence",
                        f"{sent.idempotency_key} handed on under fence {sent.fence} of partition {sent.partition},"
                        " whose leader key had stopped leading",
                        record.appended_at_ms,
                    )
        return None


def check_runs(
    owed: Iterable[OwedRun],
    owed_later: Iterable[OwedRun],
    ledger: Ledger,
    quiet_from_ms: int,
    missed: Mapping[str, Sequence[MissedRuns]] | None = None,
    dead: Collection[str] = (),
    lost: Collection[str] = (),
    held: Mapping[str, int] | None = None,
    stopped: Collection[str] = (),
) -> tuple[list[Violation], int]:
    """``owed``: runs that must have executed by the end, failed for good
    (``dead``: the keys of the dead letters; ``lost``: those of them whose
    last attempt was lost with its node, whose call may have been made, once),
    or been recorded missed with a reason (``missed``: the store's spans by job);
    ``owed_later``: runs due too near the end to be judged, which may or may
    not have. Each run owed once; both are read once (a day's runs are
    millions: no set of them is kept). ``held``: runs a pause held, by key,
    and the resume they waited for: late from then, not from their due
    time. Returns the violations and how many runs owed were recorded
    missed: each nominal time ends in exactly one recorded outcome."""
    first_start = ledger.first_start
    first_try = ledger.first_try  # a flaky run is on time when its first attempt is
    spans = missed or {}
    held_until = held or {}
    out: list[Violation] = []
    known = 0  # runs owed that executed: every key the ledger holds, unless one is unowed
    missed_count = 0
    for run in owed:
        started = first_start.get(run.key)
        reasons = _missed_reasons(spans.get(run.job_id, ()), run.run_at_ms)
        if len(reasons) > 1:
            out.append(
                Violation("doubled", f"{run.key} was recorded missed {len(reasons)} times {reasons}", run.due_ms)
            )
        orphaned = ledger.orphaned.get(run.key, 0) >= ledger.count(run.key) > 0
        if run.key in dead and (reasons or (started is not None and run.key not in lost and not orphaned)):
            outcome = "ran" if started is not None else f"was recorded missed ({reasons[0]})"
            out.append(Violation("doubled", f"{run.key} failed for good and also {outcome}", run.due_ms))
        if reasons:
            if started is not None:
                out.append(Violation("doubled", f"{run.key} ran and was also recorded missed ({reasons[0]})", started))
            else:
                missed_count += 1
            continue
        if run.key in dead:
            if ledger.counted(run.key) > 1:
                out.append(Violation("doubled", f"{run.key} ran {ledger.count(run.key)} times", run.due_ms))
            continue
        if started is None and run.key in stopped:
            continue  # started, then stopped by its job's change before its effect (stopped_by_change)
        if started is None:
            out.append(Violation("lost", f"{run.key} (due {run.due_ms}) never ran", run.due_ms))
            continue
        known += 1
        n = ledger.count(run.key)
        if ledger.counted(run.key) > 1:
            out.append(Violation("doubled", f"{run.key} ran {n} times", run.due_ms))
        started = first_try.get(run.key, started)
        if started < run.due_ms - MAX_SKEW_MS:
            out.append(Violation("early", f"{run.key} started {run.due_ms - started} ms before its time", started))
        late_from = max(run.due_ms, held_until.get(run.key, run.due_ms))
        if run.due_ms >= quiet_from_ms + RECOVERY_MS and started - late_from > LATE_BOUND_MS:
            out.append(
                Violation("late", f"{run.key} started {started - run.due_ms} ms late with no fault active", started)
            )
    owed_keys: set[str] | None = None
    later = list(owed_later)  # a couple of minutes' runs
    for run in later:
        if run.key in first_start:
            known += 1
        n = ledger.count(run.key)
        if ledger.counted(run.key) > 1:
            out.append(Violation("doubled", f"{run.key} ran {n} times", run.due_ms))
    if known < len(first_start):
        # Some run executed that nobody owes: name it, from the runs owed again.
        owed_keys = {run.key for run in owed} | {run.key for run in later}
        for key, started in first_start.items():
            if key not in owed_keys:
                out.append(Violation("unowed", f"{key} ran {ledger.count(key)} times but no schedule owes it", started))
    return sorted(out, key=lambda v: (v.at_ms, v.kind, v.detail)), missed_count


def _missed_reasons(spans: Sequence[MissedRuns], run_at_ms: int) -> list[str]:
    """The reasons of every span that counts ``run_at_ms`` missed: one at
    most, since each nominal time ends in one outcome."""
    return [span.reason for span in spans if span.first_ms <= run_at_ms < span.end_ms]


def _missed_reason(spans: Sequence[MissedRuns], run_at_ms: int) -> str | None:
    reasons = _missed_reasons(spans, run_at_ms)
    return reasons[0] if reasons else None


def check_ends(
    owed: Iterable[OwedRun],
    ledger: Ledger,
    runs: Mapping[str, Mapping[tuple[int, int], RunRow]],
    cancelled_ok: Collection[str] = (),
) -> list[Violation]:
    """What the store holds of each run owed, against what the downstream
    saw: as many failed attempts recorded as calls that failed (a parked
    run made no call, and counts no failure; an attempt lost with its
    node's crash is recorded failed, though its call may have returned), a
    run that ran recorded succeeded, or a dead letter for having been lost
    with its node twice (retries.LOST_LIMIT: the crashes of a world are
    indistinguishable from a job that crashes its node), and a dead
    letter's last failed attempt recorded as its last. A run of a job in
    ``cancelled_ok`` (cancelled or rescheduled while it ran), or one
    replaced by its job's next run (overlap replace), is rightly recorded
    cancelled once its target was called, whether its effect landed before
    the call was killed or not."""
    out: list[Violation] = []
    # Every attempt group of a time is judged, not only the first: a later
    # group (a redrive) is the same time's run again.
    later_groups: dict[tuple[str, int], list[int]] = {}
    for job_id, rows in runs.items():
        for run_at, group in rows:
            if group:
                later_groups.setdefault((job_id, run_at), []).append(group)
    for run in owed:
        rows = runs.get(run.job_id, {})
        groups = [0, *sorted(later_groups.get((run.job_id, run.run_at_ms), ()))]
        for group in groups:
            key = idempotency_key(run.job_id, run.run_at_ms, group)
            row = rows.get((run.run_at_ms, group))
            if _cancelled_as_told(row, key, ledger, run.job_id in cancelled_ok):
                continue
            out += _ends_of(key, row, ledger, run.due_ms)
    return sorted(out, key=lambda v: (v.at_ms, v.kind, v.detail))


def _cancelled_as_told(row: RunRow | None, key: str, ledger: Ledger, job_changed: bool) -> bool:
    """A run that ran (or was called, and killed when stopped) and is
    recorded cancelled because its job was cancelled or rescheduled
    meanwhile, or its job's next run replaced it."""
    if row is None or row.state != "cancelled" or (key not in ledger.first_start and key not in ledger.killed):
        return False
    return job_changed or (row.error or "").startswith("replaced:")


def stopped_by_change(
    ledger: Ledger, runs: Mapping[str, Mapping[tuple[int, int], RunRow]], changed: Collection[str]
) -> set[str]:
    """The runs whose call was killed, with no effect, after their job's
    change stopped them (cancelled, rescheduled, replaced by its next run),
    and so rightly recorded cancelled: started, and owed nothing more."""
    out = set()
    for key in ledger.killed:
        if key in ledger.first_start:
            continue
        job_id, run_at, group = key.rsplit(":", 2)
        row = runs.get(job_id, {}).get((int(run_at), int(group)))
        if _cancelled_as_told(row, key, ledger, job_id in changed):
            out.add(key)
    return out


def _ends_of(key: str, row: RunRow | None, ledger: Ledger, due_ms: int) -> list[Violation]:
    out: list[Violation] = []
    failures = [] if row is None else [f for _, f in row.failures]
    recorded = sum(1 for f in failures if f.kind != LOST)
    lost = len(failures) - recorded
    failed = ledger.failed.get(key, 0)
    # A call that failed and whose node died before it recorded so (its
    # attempt then recorded lost, by the node taking the run over) counts
    # as the downstream saw it: at most one for each attempt recorded lost.
    if not recorded <= failed <= recorded + lost:
        out.append(Violation("failures", f"{key}: {failed} calls failed, {recorded} failed attempts recorded", due_ms))
    if row is None:
        return out
    lost_for_good = row.state == "failed" and bool(failures) and failures[-1].kind == LOST
    still_running = row.state == "running" and key in ledger.under_way_at_end
    if key in ledger.first_start and row.state != "succeeded" and not lost_for_good and not still_running:
        out.append(Violation("unsettled", f"{key} ran but is recorded {row.state}", due_ms))
    if row.state == "failed" and not (row.failures and row.failures[-1][1].dead_lettered):
        out.append(Violation("unsettled", f"{key} failed for good without its last failure", due_ms))
    return out


# A run's row in these states is under way, or owed again.
_UNDER_WAY = frozenset({"scheduled", "dispatched", "running", "retrying", "parked", "interrupted"})


def check_settled(runs: Mapping[str, Mapping[tuple[int, int], RunRow]], horizon_ms: int) -> list[Violation]:
    """Every run due by ``horizon_ms`` has ended: none is left running,
    retrying, parked or owed. The caller gives a horizon that the faults
    stopped, and the world then ran for its settle time (the longest
    target, a lease, a recovery), before."""
    out: list[Violation] = []
    for job_id, rows in runs.items():
        for (run_at, group), row in rows.items():
            if row.due_ms <= horizon_ms and row.state in _UNDER_WAY:
                key = idempotency_key(job_id, run_at, group)
                detail = f"{key} is still {row.state} (due {row.due_ms}) after the world settled"
                out.append(Violation("unsettled", detail, row.due_ms))
    return sorted(out, key=lambda v: (v.at_ms, v.kind, v.detail))


def check_found_behind(found: Mapping[tuple[str, int, int], int]) -> list[Violation]:
    """No run is owed by a row its watermark has passed: each write of one
    is placed ahead, and checked again after. The leaders' sweep places
    such a row again (``found``: run key -> the row's due time), so the run
    is late, not lost; that it had one to find is the hole."""
    out = [
        Violation("behind", f"{idempotency_key(*run)} was owed by a row behind the watermark (due {due})", due)
        for run, due in found.items()
    ]
    return sorted(out, key=lambda v: (v.at_ms, v.kind, v.detail))


def check_dead_letters(dead: Mapping[str, int], lost: Collection[str]) -> list[Violation]:
    """In a world whose downstream never went down, no run fails for good:
    a flaky run's retries outnumber its failures. ``dead``: the dead
    letters' run keys and when each failed for good; ``lost``: those whose
    last attempt was lost with its node, which retries.LOST_LIMIT
    dead-letters by design (a world's crashes are indistinguishable from a
    job that crashes its node)."""
    out = [
        Violation("dead", f"{key} failed for good, its downstream never down", at_ms)
        for key, at_ms in dead.items()
        if key not in lost
    ]
    return sorted(out, key=lambda v: (v.at_ms, v.kind, v.detail))


def check_retry_waits(
    retries_due: Mapping[tuple[str, int, int], Mapping[int, int]], tries: Mapping[str, Sequence[tuple[int, int]]]
) -> list[Violation]:
    """No attempt after a failed one calls the downstream before the
    failure's retry was due (``retries_due``: the store's, by run and
    failed attempt; ``tries``: the ledger's calls of each run that failed,
    as (attempt, world time)). Clocks may differ by MAX_SKEW_MS each way
    between the node that set the time and the one that kept it."""
    out: list[Violation] = []
    for (job_id, run_at, group), due_by_attempt in retries_due.items():
        key = idempotency_key(job_id, run_at, group)
        calls = tries.get(key, ())
        for failed, due_ms in due_by_attempt.items():
            for attempt, started in calls:
                if attempt > failed and started < due_ms - 2 * MAX_SKEW_MS:
                    early_ms = due_ms - started
                    detail = f"{key} attempt {attempt} called {early_ms} ms before attempt {failed}'s retry was due"
                    out.append(Violation("backoff", detail, started))
    return sorted(out, key=lambda v: (v.at_ms, v.kind, v.detail))


# The reasons for a missed time that each catch-up policy can give: run_all
# replays every time, skip and run_once pass over times as skipped, deadline
# as past its deadline.
_CATCH_UP_REASONS: dict[str, frozenset[str]] = {
    "run_all": frozenset(),
    "run_once": frozenset({"skipped"}),
    "skip": frozenset({"skipped"}),
    "deadline": frozenset({"past_deadline"}),
}


def check_policies(
    owed: Iterable[OwedRun],
    missed: Mapping[str, Sequence[MissedRuns]],
    jobs: Mapping[str, Job],
    paused: Collection[str] = (),
) -> list[Violation]:
    """Each time recorded missed, for a reason its job's catch-up policy
    gives, its pause (``paused``: the jobs paused) or its overlap policy
    (any but allow)."""
    out: list[Violation] = []
    for run in owed:
        reason = _missed_reason(missed.get(run.job_id, ()), run.run_at_ms)
        job = jobs[run.job_id]
        policy = job.catch_up
        if reason == "paused" and run.job_id in paused:
            continue
        if reason == "overlap" and job.overlap != "allow":
            continue
        if reason is not None and reason not in _CATCH_UP_REASONS[policy]:
            out.append(Violation("policy", f"{run.key} recorded missed ({reason}) under catch-up {policy}", run.due_ms))
    return out


def check_catch_up(
    owed: Iterable[OwedRun],
    ledger: Ledger,
    jobs: Mapping[str, Job],
    down_ms: int,
    up_ms: int,
    sent_before: Collection[str] = (),
) -> list[Violation]:
    """The nominal times of recurring jobs due while the whole cluster was
    down, from ``down_ms`` (the last round before it, whose runs were not
    handed on either) to its return at ``up_ms``: what each policy makes of
    them on the return. Each time's one outcome is check_runs'; this checks
    which outcome. A run handed on before the outage (``sent_before``, run
    keys: a node whose clock runs ahead fires a little early) was not missed
    by it, and is owed as any run is.

    - run_all: every one ran;
    - run_once: the first ran, once, and no other;
    - skip: one that ran started within its max delay of its due time (a
      time due near the return may);
    - deadline: one that ran started within its max delay of its due time,
      and each whose max delay outlasts the return by RECOVERY_MS ran.
    """
    inside: dict[str, list[OwedRun]] = {}
    for run in owed:
        if down_ms < run.due_ms <= up_ms and jobs[run.job_id].schedule.kind != "once" and run.key not in sent_before:
            inside.setdefault(run.job_id, []).append(run)
    out: list[Violation] = []
    for job_id, runs in inside.items():
        out += _policy_kept(jobs[job_id], runs, ledger, up_ms)
    return sorted(out, key=lambda v: (v.at_ms, v.kind, v.detail))


def _policy_kept(job: Job, runs: Sequence[OwedRun], ledger: Ledger, up_ms: int) -> list[Violation]:
    ran = [run for run in runs if run.key in ledger.first_start]
    policy = job.catch_up

    def violation(detail: str, run: OwedRun) -> Violation:
        return Violation("catch-up", f"{job.id} ({policy}): {detail}", run.due_ms)

    if policy == "run_all":
        return [violation(f"{run.key} of the outage did not run", run) for run in runs if run not in ran]
    if policy == "run_once":
        if ran != runs[:1]:
            return [violation(f"{len(ran)} of its {len(runs)} times in the outage ran, not the first alone", runs[0])]
        return []
    out = []
    for run in ran:
        late_ms = ledger.first_start[run.key] - run.due_ms
        if late_ms > job.max_delay_ms + MAX_SKEW_MS:
            out.append(violation(f"{run.key} ran {late_ms} ms after its due time", run))
    if policy == "deadline":
        due_to_run = [run for run in runs if run.due_ms + job.max_delay_ms >= up_ms + RECOVERY_MS]
        out += [violation(f"{run.key} within its deadline did not run", run) for run in due_to_run if run not in ran]
    return out


def check_lane(
    broker: Broker, election: Election, rate_per_s: int, late_after_ms: int, skews_ms: Mapping[str, int]
) -> tuple[list[Violation], int]:
    """The catch-up lane of each leader hands on at most ``rate_per_s`` runs
    in any one second: the runs it sent more than ``late_after_ms`` after
    their due time, by its own clock (``skews_ms``: each node's offset, by
    the node part of a holder's name), counted by the broker's clock.
    Returns the violations and the most any lane sent in one second."""
    holder_of = {(g.partition, g.fence): g.holder for g in election.grants()}
    late: dict[str, list[int]] = {}
    for partition in range(broker.partitions):
        for record in broker.records_since(partition, 0):
            sent = native.decode(record.payload)
            holder = holder_of.get((sent.partition, sent.fence), "unknown")
            skew = skews_ms.get(holder.split(".")[0], 0)
            if sent.due_ms < record.appended_at_ms + skew - late_after_ms:
                late.setdefault(holder, []).append(record.appended_at_ms)
    out = []
    peak = 0
    for holder, times in sorted(late.items()):
        busiest, at = _busiest_second(sorted(times))
        peak = max(peak, busiest)
        if busiest > rate_per_s:
            detail = f"{holder}'s catch-up lane handed on {busiest} runs in the second from {at}, over {rate_per_s}"
            out.append(Violation("lane", detail, at))
    return out, peak


def _busiest_second(times: Sequence[int]) -> tuple[int, int]:
    """The most of ``times`` (sorted) within one second [t, t + 1 s), and t."""
    window: deque[int] = deque()
    busiest, at = 0, 0
    for t in reversed(times):
        window.appendleft(t)
        while window[-1] >= t + 1_000:
            window.pop()
        if len(window) >= busiest:
            busiest, at = len(window), t
    return busiest, at
