"""The jobs of a simulated world and the runs they owe."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pysched import cron
from pysched.model import CATCH_UP_POLICIES, OVERLAP_POLICIES, CronSchedule, IntervalSchedule, Job, OnceSchedule
from pysched.planning import jitter_for
from pysched.records import idempotency_key
from pysched.sim.ledger import TARGET

# What every job's runs call: the ledger's simulated downstream.
DOWNSTREAM = "sim:downstream"

# Kinds of job and how often each is drawn: the finest period is a minute,
# so that a node's failover (a lease TTL and a poll) never makes the run_once
# catch-up skip a run, and every nominal time is owed.
_KINDS: tuple[tuple[str, float], ...] = (("minutely", 0.01), ("hourly", 0.3), ("daily", 0.4), ("once", 0.29))
# A world whose jobs each follow a catch-up policy drawn from all four: a
# third are minutely, so that a cluster's outage passes over many of their
# times and each policy has plenty to decide.
_CATCH_UP_KINDS: tuple[tuple[str, float], ...] = (("minutely", 0.35), ("hourly", 0.35), ("daily", 0.2), ("once", 0.1))
# The max delays drawn for skip and deadline jobs, in seconds (None: the
# job's default, 60 s): several, so that each splits an outage differently.
_MAX_DELAYS_S: tuple[float | None, ...] = (None, 300.0, 600.0, 1_800.0)


@dataclass(frozen=True, slots=True)
class OwedRun:
    """A nominal fire time of a job: it must run exactly once, or be
    recorded missed with a reason."""

    key: str
    job_id: str
    due_ms: int
    run_at_ms: int


# A flaky job's retry policy: short, so that its runs succeed within the
# late bound of the invariants, counted from their first attempt.
FLAKY_RETRY = {"retries": 3, "backoff_base_s": 0.5, "backoff_cap_s": 2.0}


def make_jobs(
    rng: random.Random,
    count: int,
    world_id: str,
    start_ms: int,
    span_ms: int,
    flaky: float = 0.0,
    catch_up: bool = False,
) -> list[Job]:
    """``flaky``: the fraction of jobs whose every run fails its first one
    or two attempts; ``catch_up``: each job draws its catch-up policy (and,
    for skip and deadline, its max delay). Each is drawn from a generator of
    its own, so that a world without them is the world it always was."""
    flaky_rng = random.Random(rng.random()) if flaky else None
    policy_rng = random.Random(rng.random()) if catch_up else None
    kinds = [k for k, _ in (_CATCH_UP_KINDS if catch_up else _KINDS)]
    weights = [w for _, w in (_CATCH_UP_KINDS if catch_up else _KINDS)]
    jobs = []
    for i, kind in enumerate(rng.choices(kinds, weights, k=count)):
        spec: dict[str, object] = {
            "id": f"{kind}-{i:06d}",
            "target": {"kind": "python", "ref": TARGET},
            "payload": {"world": world_id},
            # Every job calls the world's one downstream, and says so: its
            # outage is one breaker's, as jobs calling one database share.
            "downstream": DOWNSTREAM,
        }
        if kind == "once":
            spec["schedule"] = {"kind": "once", "run_at_ms": start_ms + rng.randrange(1_000, span_ms)}
        else:
            minute = rng.randrange(60)
            hour = rng.randrange(24)
            expr = {"minutely": "* * * * *", "hourly": f"{minute} * * * *", "daily": f"{minute} {hour} * * *"}[kind]
            spec["schedule"] = {"kind": "cron", "expr": expr}
            if i % 2:
                # Every other one as the interval that names the same UTC
                # times: both kinds of schedule, from one draw, so that a
                # seed's world is the same as before intervals were drawn.
                spec["schedule"] = _interval_like(kind, minute, hour)
            if rng.random() < 0.5:
                spec["jitter_window_s"] = {"minutely": 30, "hourly": 300, "daily": 600}[kind]
        if flaky_rng is not None and flaky_rng.random() < flaky:
            spec["payload"] = {"world": world_id, "fail_first": flaky_rng.randint(1, 2)}
            spec["retry"] = FLAKY_RETRY
        if policy_rng is not None:
            spec.update(_catch_up_spec(policy_rng))
        jobs.append(Job.model_validate(spec))
    return jobs


def _interval_like(kind: str, minute: int, hour: int) -> dict[str, object]:
    if kind == "minutely":
        return {"kind": "every", "every_s": 60}
    if kind == "hourly":
        return {"kind": "every", "every_s": 3600, "start_ms": minute * 60_000}
    return {"kind": "every", "every_s": 86_400, "start_ms": (hour * 60 + minute) * 60_000}


def _catch_up_spec(rng: random.Random) -> dict[str, object]:
    policy = rng.choice(CATCH_UP_POLICIES)
    spec: dict[str, object] = {"catch_up": policy}
    if policy in ("skip", "deadline"):
        max_delay_s = rng.choice(_MAX_DELAYS_S)
        if max_delay_s is not None:
            spec["max_delay_s"] = max_delay_s
    return spec


def owed_runs(job: Job, registered_ms: int, until_ms: int, after_ms: int | None = None) -> Iterator[OwedRun]:
    """Every run of ``job`` due by ``until_ms`` (and after ``after_ms``, if
    given), as the schedule says."""
    jitter = jitter_for(job)
    match job.schedule:
        case OnceSchedule(run_at_ms=run_at):
            if run_at + jitter <= until_ms and (after_ms is None or run_at + jitter > after_ms):
                yield OwedRun(idempotency_key(job.id, run_at, 0), job.id, run_at + jitter, run_at)
        case CronSchedule(expr=expr, tz=tz):
            # A fire after ``after_ms - jitter`` is due after ``after_ms``.
            since = registered_ms if after_ms is None else max(registered_ms, after_ms - jitter)
            t = cron.next_after(expr, tz, since)
            while t is not None and t + jitter <= until_ms:
                yield OwedRun(idempotency_key(job.id, t, 0), job.id, t + jitter, t)
                t = cron.next_after(expr, tz, t)
        case IntervalSchedule(start_ms=start):
            # Counted here from the definition, not by the planner's code.
            since = registered_ms if after_ms is None else max(registered_ms, after_ms - jitter)
            every, anchor = job.schedule.every_ms, start or 0
            t = anchor if since < anchor else anchor + every * ((since - anchor) // every + 1)
            while t + jitter <= until_ms:
                yield OwedRun(idempotency_key(job.id, t, 0), job.id, t + jitter, t)
                t += every


class OwedRuns:
    """The runs a world's jobs owe in (``after_ms``, ``until_ms``], job by
    job, made as they are read: a day's are millions. Each iteration makes
    them again."""

    def __init__(self, jobs: Sequence[Job], registered_ms: int, until_ms: int, after_ms: int | None = None) -> None:
        self.jobs = jobs
        self.registered_ms = registered_ms
        self.until_ms = until_ms
        self.after_ms = after_ms
        self.count: int | None = None  # how many, once read to the end

    def __iter__(self) -> Iterator[OwedRun]:
        n = 0
        for job in self.jobs:
            for run in owed_runs(job, self.registered_ms, self.until_ms, self.after_ms):
                n += 1
                yield run
        self.count = n


# How long a world's targets take with --target-time, drawn per job: most
# are short; some outlast their claim's lease, so the heartbeat meets them
# running; a few take minutes, past several leases and later runs' due
# times (overlap, take-over, grace).
_SHORT_MS = (0, 2_000)
_LONG_SHARE, _VERY_LONG_SHARE = 0.05, 0.01
_VERY_LONG_MS = (120_000, 300_000)
LONGEST_TARGET_MS = _VERY_LONG_MS[1]


def with_durations(jobs: Sequence[Job], rng: random.Random, lease_ms: int) -> list[Job]:
    """The jobs, each with a ``duration_ms`` in its payload drawn from
    ``rng`` (a generator of its own: the world's other draws stay as they
    were): short, longer than ``lease_ms`` (up to two leases), or
    minutes."""
    out = []
    for job in jobs:
        share = rng.random()
        if share < _VERY_LONG_SHARE:
            duration = rng.randint(*_VERY_LONG_MS)
        elif share < _VERY_LONG_SHARE + _LONG_SHARE:
            duration = rng.randint(lease_ms + 1, 2 * lease_ms)
        else:
            duration = rng.randint(*_SHORT_MS)
        out.append(job.model_copy(update={"payload": {**job.payload, "duration_ms": duration}}))
    return out


def with_overlap(jobs: Sequence[Job], rng: random.Random) -> list[Job]:
    """The jobs, each with an overlap policy drawn from all four by ``rng``
    (a generator of its own: the world's other draws stay as they were)."""
    return [job.model_copy(update={"overlap": rng.choice(OVERLAP_POLICIES)}) for job in jobs]
