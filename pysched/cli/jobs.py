"""Job commands: add, ls, show, history, cancel, reschedule."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from pysched import cron, recurrence
from pysched.admission import MAX_AHEAD_MS, MAX_AHEAD_YEARS, PAYLOAD_LIMIT_BYTES
from pysched.breakers import BreakerPolicy
from pysched.cli.breakers import budget_json
from pysched.cli.common import (
    CLOCK,
    DEFAULT_DB,
    EXIT_NO_SUCH_JOB,
    ConfigOption,
    DbOption,
    JsonOption,
    console,
    echo_json,
    every_seconds,
    fail,
    fail_invalid,
    open_client,
    opened,
    unopened_client,
    warn_without_scheduler,
)
from pysched.client import Client
from pysched.downstream import downstream_of
from pysched.model import (
    CATCH_UP_POLICIES,
    DEFAULT_MAX_DELAY_S,
    OVERLAP_POLICIES,
    CronSchedule,
    IntervalSchedule,
    Job,
    RetryPolicy,
)
from pysched.problems import ID_RULE, InvalidJob
from pysched.protocols import JobExists, JobNotActive, JobNotFound, JobRecord
from pysched.views import iso, job_json, last_run_json, run_json


def _now_ms() -> int:
    return CLOCK.now_ms()


def _zone_name(tz: str | None) -> str | None:
    """A --tz is checked whatever the schedule it comes with."""
    if tz is not None:
        try:
            cron.zone(tz)
        except cron.CronError as exc:
            fail(f"--tz: {exc}")
    return tz


def _parse_at(value: str, tz: str | None, flag: str) -> int:
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        fail(f"{flag}: not an ISO 8601 time: {value!r}")
    if when.tzinfo is not None and tz is not None:
        fail(f"--tz: does not apply to an {flag} with its own offset ({value})")
    try:
        if when.tzinfo is None:
            when = when.replace(tzinfo=cron.zone(tz)) if tz else when.astimezone()
        at_ms = int(when.timestamp() * 1000)
    except (OverflowError, OSError, ValueError):
        fail(f"{flag}: {value!r} is out of range")
    if at_ms < 0:
        fail(f"{flag}: {value!r} is before 1970")
    return at_ms


@dataclass(frozen=True)
class ScheduleOptions:
    """The flags that say when a job runs: one of --cron, --every, --at and
    --in, with --tz and --start as their companions."""

    cron_expr: str | None = None
    tz: str | None = None
    at: str | None = None
    in_s: float | None = None
    every: str | None = None
    start: str | None = None


def _schedule(flags: ScheduleOptions, keep_tz: str = "UTC") -> dict[str, Any]:
    given = [
        name
        for name, v in (("--cron", flags.cron_expr), ("--every", flags.every), ("--at", flags.at), ("--in", flags.in_s))
        if v is not None
    ]
    # --start alone reads as a schedule of its own: say what it needs first.
    if flags.start is not None and flags.every is None:
        fail("--start: goes with --every")
    if len(given) != 1:
        fail("give exactly one of --cron, --every, --at, --in" + (f" (got {', '.join(given)})" if given else ""))
    tz = _zone_name(flags.tz)
    if flags.cron_expr is not None:
        return {"kind": "cron", "expr": flags.cron_expr, "tz": tz or keep_tz}
    if flags.every is not None:
        return _interval(flags.every, flags.start, tz)
    now = _now_ms()
    if flags.in_s is not None:
        in_s = flags.in_s
        if tz is not None:
            fail("--tz: does not apply to --in, a delay in seconds")
        if not math.isfinite(in_s) or not 0 <= in_s <= MAX_AHEAD_MS / 1000:
            fail(f"--in: seconds from now, from 0 to {MAX_AHEAD_MS // 1000:,} ({MAX_AHEAD_YEARS} years); got {in_s}")
        return {"kind": "once", "run_at_ms": now + round(in_s * 1000)}
    assert flags.at is not None
    run_at = _parse_at(flags.at, tz, "--at")
    if run_at < now - 1_000:
        fail(f"--at: {iso(run_at)} is in the past")
    if run_at > now + MAX_AHEAD_MS:
        fail(f"--at: {flags.at} is more than {MAX_AHEAD_YEARS} years ahead")
    return {"kind": "once", "run_at_ms": run_at}


def _interval(every: str, start: str | None, tz: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"kind": "every", "every_s": every_seconds(every)}
    if start is not None:
        spec["start_ms"] = _parse_at(start, tz, "--start")
    elif tz is not None:
        fail("--tz: an interval counts elapsed time; it applies only to a naive --start")
    return spec


@dataclass(frozen=True)
class WorkflowOptions:
    """--temporal's companions: --task-queue, --temporal-args, --temporal-namespace."""

    task_queue: str | None = None
    args: str | None = None
    namespace: str | None = None


def _target(
    shell: str | None,
    python: str | None,
    http: str | None,
    method: str | None,
    temporal: str | None,
    workflow: WorkflowOptions,
) -> dict[str, Any]:
    kinds = (("--shell", shell), ("--python", python), ("--http", http), ("--temporal", temporal))
    given = [name for name, v in kinds if v is not None]
    if len(given) != 1:
        fail(
            "give exactly one of --shell, --python, --http, --temporal"
            + (f" (got {', '.join(given)})" if given else "")
        )
    if method is not None and not method.strip():
        fail("--method: an HTTP method such as GET or POST")
    if method is not None and http is None:
        fail(f"--method: applies only to --http, not to {given[0]}")
    if temporal is None:
        for flag, value in (
            ("--task-queue", workflow.task_queue),
            ("--temporal-args", workflow.args),
            ("--temporal-namespace", workflow.namespace),
        ):
            if value is not None:
                fail(f"{flag}: applies only to --temporal, not to {given[0]}")
    if shell is not None:
        return {"kind": "shell", "command": shell}
    if python is not None:
        return {"kind": "python", "ref": python}
    if temporal is not None:
        return _workflow_target(temporal, workflow)
    return {"kind": "http", "url": http, "method": (method or "POST").upper()}


def _workflow_target(workflow_type: str, options: WorkflowOptions) -> dict[str, Any]:
    if options.task_queue is None:
        fail("--task-queue: required with --temporal: the queue the workflow's workers poll")
    target: dict[str, Any] = {"kind": "temporal", "workflow": workflow_type, "task_queue": options.task_queue}
    if options.namespace is not None:
        target["namespace"] = options.namespace
    if options.args is not None:
        if len(options.args.encode()) > PAYLOAD_LIMIT_BYTES:
            fail(f"--temporal-args: more than {PAYLOAD_LIMIT_BYTES:,} bytes")
        try:
            args = json.loads(options.args, parse_constant=_not_json)
        except (json.JSONDecodeError, ValueError) as exc:
            fail(f"--temporal-args: not JSON: {exc}")
        if not isinstance(args, list):
            fail(
                f"--temporal-args: a JSON array of the workflow's arguments, such as '[\"world\"]'; got {options.args}"
            )
        target["args"] = args
    return target


def _retry_policy(retries: int | None, backoff: str | None, retry_on: str | None) -> dict[str, Any]:
    """--retries, --backoff BASE_S:CAP_S, --retry-on LIST, as the job's
    retry policy; what is not given keeps its default."""
    policy: dict[str, Any] = {}
    if retries is not None:
        policy["retries"] = retries
    if backoff is not None:
        base, sep, cap = backoff.partition(":")
        try:
            if not sep:
                raise ValueError
            policy["backoff_base_s"], policy["backoff_cap_s"] = float(base), float(cap)
        except ValueError:
            fail(f"--backoff: BASE_S:CAP_S, two numbers of seconds such as 10:600; got {backoff!r}")
    if retry_on is not None:
        kinds = tuple(dict.fromkeys(kind.strip() for kind in retry_on.split(",") if kind.strip()))
        if not kinds:
            fail("--retry-on: name at least one kind of failure (--retries 0 turns retries off)")
        policy["retry_on"] = kinds
    return policy


def _payload(value: str) -> Any:
    """--payload JSON, @FILE or - (standard input), at most PAYLOAD_LIMIT_BYTES."""
    if value == "-":
        text = sys.stdin.buffer.read(PAYLOAD_LIMIT_BYTES + 1)
    elif value.startswith("@"):
        try:
            with Path(value[1:]).open("rb") as f:
                text = f.read(PAYLOAD_LIMIT_BYTES + 1)
        except OSError as exc:
            fail(f"--payload: cannot read {value[1:]!r}: {exc.strerror}")
    else:
        try:
            text = value.encode()
        except UnicodeEncodeError:
            fail("--payload: not UTF-8 text")
    if len(text) > PAYLOAD_LIMIT_BYTES:
        fail(f"--payload: more than {PAYLOAD_LIMIT_BYTES:,} bytes")
    try:
        return json.loads(text, parse_constant=_not_json)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        fail(f"--payload: not JSON: {exc}")


def _not_json(name: str) -> Any:
    """Python's json reads NaN and Infinity, which JSON does not have."""
    raise ValueError(f"{name} is not a JSON value")


def _describe(rec: JobRecord) -> str:
    sched = rec.job.schedule
    if isinstance(sched, CronSchedule):
        return f"cron {sched.expr!r} {sched.tz}"
    if isinstance(sched, IntervalSchedule):
        return recurrence.describe(sched, None if sched.start_ms is None else iso(sched.start_ms))
    return f"once at {iso(sched.run_at_ms)}"


def describe_retry(policy: RetryPolicy) -> str:
    if policy.retries == 0:
        return "no retries"
    return (
        f"up to {policy.retries} retries on {', '.join(policy.retry_on) or 'nothing'},"
        f" full-jitter backoff from {policy.backoff_base_s:g} s capped at {policy.backoff_cap_s:g} s"
    )


def describe_catch_up(job: Job) -> str:
    delay = f"{job.max_delay_ms / 1000:g} s"
    return {
        "run_once": "run_once: after downtime one run for the missed times (the first; after a pause, the latest),"
        " the others skipped",
        "skip": f"skip: missed times do not run (nor a run more than {delay} late); the schedule resumes at the next"
        " time ahead",
        "run_all": "run_all: every missed time runs, through the catch-up lane",
        "deadline": f"deadline: missed times within {delay} run, older ones do not",
    }[job.catch_up]


def describe_overlap(job: Job) -> str:
    return {
        "allow": "allow: a run due while the previous one runs starts beside it",
        "forbid": "forbid: a run due while the previous one runs is missed (counted as overlap)",
        "replace": "replace: a run due while the previous one runs cancels it, then starts",
        "buffer_one": "buffer_one: a run due while the previous one runs waits for it to end;"
        " one more while one waits is missed (counted as overlap)",
    }[job.overlap]


def describe_missed(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in counts.items() if n) or "none"


def describe_next_run(rec: JobRecord) -> str:
    """Its next run: when it is due, and, for a job with jitter, the time
    its schedule names and the jitter added to it."""
    if rec.next_run is None:
        return "nothing held" if rec.state == "paused" else "no further runs"
    due = iso(rec.next_run.due_ms)
    nxt = f"holding its run of {due} until resumed" if rec.state == "paused" else f"next run {due}"
    if rec.jitter_ms:
        nxt += (
            f" ({iso(rec.next_run.run_at_ms)} on its schedule + {rec.jitter_ms / 1000:g} s of jitter, the same"
            " every run; --critical for none)"
        )
    return nxt


def _print_job(rec: JobRecord, as_json: bool, verb: str) -> None:
    if as_json:
        echo_json(job_json(rec))
        return
    typer.echo(f"{verb} {rec.job.id}: {_describe(rec)}; {describe_next_run(rec)}")


def add(
    job_id: Annotated[str, typer.Argument(metavar="ID", help=f"Job id: {ID_RULE}.")],
    cron_expr: Annotated[
        str | None, typer.Option("--cron", help="Cron expression, 5 fields or 6 with seconds first.")
    ] = None,
    tz: Annotated[
        str | None, typer.Option("--tz", help="Time zone of --cron (and of a naive --at or --start).")
    ] = None,
    every: Annotated[
        str | None,
        typer.Option(
            "--every",
            metavar="DURATION",
            help="Run at this interval: seconds, or such as 90s, 5m, 1h30m, 2d (on its multiples since 1970 UTC"
            " unless --start is given).",
        ),
    ] = None,
    start: Annotated[
        str | None, typer.Option("--start", help="ISO 8601 time of --every's first run (default: see --every).")
    ] = None,
    at: Annotated[str | None, typer.Option("--at", help="One run at this ISO 8601 time.")] = None,
    in_s: Annotated[float | None, typer.Option("--in", help="One run this many seconds from now.")] = None,
    shell: Annotated[str | None, typer.Option("--shell", help="Shell command to run.")] = None,
    python: Annotated[str | None, typer.Option("--python", help="module:function to call with a RunContext.")] = None,
    http: Annotated[str | None, typer.Option("--http", help="URL to call, with an Idempotency-Key header.")] = None,
    method: Annotated[str | None, typer.Option("--method", help="HTTP method for --http (default POST).")] = None,
    temporal: Annotated[
        str | None,
        typer.Option(
            "--temporal",
            metavar="WORKFLOW",
            help="Temporal workflow type to start, with the run's idempotency key as its workflow id.",
        ),
    ] = None,
    task_queue: Annotated[
        str | None, typer.Option("--task-queue", help="Task queue of --temporal's workflow (required with it).")
    ] = None,
    temporal_args: Annotated[
        str | None,
        typer.Option("--temporal-args", metavar="JSON", help="The workflow's arguments, a JSON array (default none)."),
    ] = None,
    temporal_namespace: Annotated[
        str | None, typer.Option("--temporal-namespace", help="Temporal namespace of --temporal (default 'default').")
    ] = None,
    payload: Annotated[
        str | None,
        typer.Option(
            "--payload",
            help=f"JSON object handed to the target; @FILE reads a file, - standard input"
            f" (at most {PAYLOAD_LIMIT_BYTES // 1024 // 1024} MiB).",
        ),
    ] = None,
    jitter: Annotated[
        float | None, typer.Option("--jitter", help="Jitter window in seconds (default 60 for --cron and --every).")
    ] = None,
    critical: Annotated[bool, typer.Option("--critical", help="Time-critical: no jitter.")] = False,
    retries: Annotated[
        int | None, typer.Option("--retries", help="Times a failed run is tried again (default 3; 0: never).")
    ] = None,
    backoff: Annotated[
        str | None,
        typer.Option(
            "--backoff",
            metavar="BASE_S:CAP_S",
            help="Full-jitter backoff: retry n waits random(0, min(CAP, BASE * 2**n)) s (default 10:600).",
        ),
    ] = None,
    retry_on: Annotated[
        str | None,
        typer.Option(
            "--retry-on",
            help="Failures retried, comma-separated: timeout, connect, 5xx, exception, exception:ClassName"
            " (default all four kinds; an HTTP 4xx or a target that cannot be imported never is).",
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", help="Seconds a run may take before it is stopped (HTTP default 30)."),
    ] = None,
    catch_up: Annotated[
        str | None,
        typer.Option(
            "--catch-up",
            help="Schedule times missed while down: run_once (default: one run, the rest skipped), skip,"
            " run_all, or deadline (those within --max-delay).",
        ),
    ] = None,
    max_delay: Annotated[
        float | None,
        typer.Option(
            "--max-delay",
            help="Seconds late a run may start and still run, for skip and deadline"
            f" (default {DEFAULT_MAX_DELAY_S:g}).",
        ),
    ] = None,
    overlap: Annotated[
        str | None,
        typer.Option(
            "--overlap",
            help="A run due while the job's previous run still runs: allow (default: both run), forbid (it is"
            " missed), replace (the running one is cancelled), or buffer_one (it waits; at most one waits).",
        ),
    ] = None,
    slo_fire_lag: Annotated[
        float | None,
        typer.Option("--slo-fire-lag", help="Fire-lag objective: seconds a run may leave late (default 1)."),
    ] = None,
    slo_objective: Annotated[
        float | None,
        typer.Option(
            "--slo-objective", help="Share of runs within --slo-fire-lag, above 0 and below 1 (default 0.99)."
        ),
    ] = None,
    slo_window: Annotated[
        int | None, typer.Option("--slo-window", help="Days the objective is measured over (default 30).")
    ] = None,
    no_import_check: Annotated[
        bool,
        typer.Option(
            "--no-import-check",
            help="Do not import --python's module here to check it names a function (for a target only the"
            " workers can import).",
        ),
    ] = False,
    downstream: Annotated[
        str | None,
        typer.Option(
            "--downstream",
            help="What its runs call (a database, a queue, a service), for the circuit breaker and retry budget"
            " it shares with other jobs naming it (default: an --http URL's host, else the job itself).",
        ),
    ] = None,
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Register a job; acknowledged once it is committed."""
    if critical and jitter is not None:
        fail("--jitter: does not apply to a --critical job, which has no jitter")
    target = _target(
        shell, python, http, method, temporal, WorkflowOptions(task_queue, temporal_args, temporal_namespace)
    )
    if timeout is not None:
        target["timeout_s"] = timeout
    spec: dict[str, Any] = {
        "id": job_id,
        "schedule": _schedule(ScheduleOptions(cron_expr, tz, at, in_s, every, start)),
        "target": target,
        "critical": critical,
        "retry": _retry_policy(retries, backoff, retry_on),
    }
    if jitter is not None:
        spec["jitter_window_s"] = jitter
    if catch_up is not None:
        if catch_up not in CATCH_UP_POLICIES:
            fail(f"--catch-up: {catch_up!r} is not one of {', '.join(CATCH_UP_POLICIES)}")
        spec["catch_up"] = catch_up
    if max_delay is not None:
        spec["max_delay_s"] = max_delay
    if overlap is not None:
        if overlap not in OVERLAP_POLICIES:
            fail(f"--overlap: {overlap!r} is not one of {', '.join(OVERLAP_POLICIES)}")
        spec["overlap"] = overlap
    if payload is not None:
        spec["payload"] = _payload(payload)
    if downstream is not None:
        spec["downstream"] = downstream
    slo = {
        key: value
        for key, value in (("fire_lag_s", slo_fire_lag), ("objective", slo_objective), ("window_days", slo_window))
        if value is not None
    }
    if slo:
        spec["slo"] = slo
    client = unopened_client(db, config, access="create")
    if not no_import_check:
        # Found from here, as the workers of `pysched up` find it.
        sys.path.insert(0, str(Path.cwd()))
    try:
        # Before the database is opened: a refused job creates no file.
        job = client.check(spec, import_target=not no_import_check)
        rec = opened(client).add(job, import_target=False)  # checked above
    except InvalidJob as exc:
        fail_invalid(exc)
    except JobExists as exc:
        fail(f"id: {exc}")
    _print_job(rec, as_json, "added")
    warn_without_scheduler(client.store, db)


def ls(db: DbOption = DEFAULT_DB, config: ConfigOption = None, as_json: JsonOption = False) -> None:
    """List jobs: the schedule's state (active; paused; completed: no runs
    to come; cancelled) and, apart from it, how the last run handed on
    went."""
    client = open_client(db, config, access="read")
    records = client.ls()
    last = client.last_runs([r.job.id for r in records])
    if as_json:
        missed = client.missed(records)
        echo_json(
            [
                {**job_json(r), "last_run": last_run_json(last.get(r.job.id)), "missed": missed[r.job.id]}
                for r in records
            ]
        )
        return
    table = Table("id", "state", "schedule", "target", "next run", "last run")
    for r in records:
        run = last.get(r.job.id)
        table.add_row(
            r.job.id,
            r.state,
            _describe(r),
            r.job.target.kind,
            iso(r.next_run.due_ms) if r.next_run else "-",
            f"{run.state} {iso(run.run_at_ms)}" if run else "-",
        )
    console().print(table)


# What `show` says in words rather than as the stored value.
_DESCRIBED = frozenset({"retry", "catch_up", "overlap", "missed"})


def _shown(value: object) -> str:
    """A value as `show` prints it: JSON's words, not Python's."""
    if isinstance(value, dict | bool) or value is None:
        return json.dumps(value)
    return str(value)


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def show(
    job_id: Annotated[str, typer.Argument(metavar="ID")],
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one job."""
    client = open_client(db, config, access="read")
    try:
        rec = client.get(job_id)
    except JobNotFound as exc:
        fail(str(exc), EXIT_NO_SUCH_JOB)
    data = job_json(rec)
    data["last_run"] = last_run_json(client.last_runs([job_id]).get(job_id))
    data["missed"] = client.missed([rec])[job_id]
    policy = BreakerPolicy()
    data["retry_budget"] = budget_json(client.store, downstream_of(rec.job), _now_ms(), policy)
    if as_json:
        echo_json(data)
        return
    budget = data.pop("retry_budget")
    for key, value in data.items():
        if key in _DESCRIBED:
            continue  # said in words below
        typer.echo(f"{key:>14}: {_describe(rec) if key == 'schedule' else _shown(value)}")
    typer.echo(
        f"{'retry budget':>14}: {budget['retries_last_minute']} of {budget['retry_budget_last_minute']} retries"
        f" of {data['downstream']} used in the last minute ({policy.budget_ratio:.0%} of first attempts plus"
        f" {policy.budget_floor} a minute, unless the nodes set --retry-budget; a retry beyond it waits a minute)"
    )
    typer.echo(f"{'retry policy':>14}: {describe_retry(rec.job.retry)}")
    typer.echo(f"{'catch-up':>14}: {describe_catch_up(rec.job)}")
    typer.echo(f"{'overlap':>14}: {describe_overlap(rec.job)}")
    typer.echo(f"{'missed':>14}: {describe_missed(data['missed'])}")


def history(
    job_id: Annotated[str, typer.Argument(metavar="ID")],
    limit: Annotated[int, typer.Option("--limit", min=1, max=1_000_000, help="Newest runs to show.")] = 50,
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Runs of a job, newest first: when each was handed on (fire lag) and
    when it started (start lag) against its due time, and its output."""
    try:
        runs = open_client(db, config, access="read").history(job_id, limit)
    except JobNotFound as exc:
        fail(str(exc), EXIT_NO_SUCH_JOB)
    if as_json:
        echo_json([run_json(r) for r in runs])
        return
    table = Table("run_at", "state", "fire lag ms", "start lag ms", "duration ms", "attempt", "fence", "output")
    for r in runs:
        j = run_json(r)
        table.add_row(
            j["run_at"],
            j["state"],
            *(_cell(j[k]) for k in ("fire_lag_ms", "start_lag_ms", "duration_ms", "attempt", "fence")),
            "; ".join(part for part in (j["error"], j["result"]) if part) or "-",
        )
    console().print(table)


def _change_job(change: Callable[[Client, str], JobRecord], job_id: str, db: str, config: str | None) -> JobRecord:
    """One change of a job's state: exit 3 for an unknown job, 2 for one
    not in the state the change needs."""
    try:
        return change(open_client(db, config, access="write"), job_id)
    except JobNotFound as exc:
        fail(str(exc), EXIT_NO_SUCH_JOB)
    except JobNotActive as exc:
        fail(str(exc))


def cancel(
    job_id: Annotated[str, typer.Argument(metavar="ID")],
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a job's pending runs; its history stays."""
    rec = _change_job(Client.cancel, job_id, db, config)
    _print_job(rec, as_json, "cancelled")


def pause(
    job_id: Annotated[str, typer.Argument(metavar="ID")],
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Stop a job firing until `pysched resume`; the times it passes over
    are counted missed (paused)."""
    rec = _change_job(Client.pause, job_id, db, config)
    _print_job(rec, as_json, "paused")


def resume(
    job_id: Annotated[str, typer.Argument(metavar="ID")],
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Let a paused job fire again; what it missed follows its --catch-up
    policy (run_once: one run now for the times passed over)."""
    _print_job(_change_job(Client.resume, job_id, db, config), as_json, "resumed")


def trigger(
    job_id: Annotated[str, typer.Argument(metavar="ID")],
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run a job now, once, beside its schedule (which it does not move):
    a run with an idempotency key of its own. A completed one-shot runs
    again; a paused job must be resumed first."""
    client = open_client(db, config, access="write")
    try:
        run = client.trigger(job_id)
    except JobNotFound as exc:
        fail(str(exc), EXIT_NO_SUCH_JOB)
    except JobNotActive as exc:
        fail(str(exc))
    if as_json:
        echo_json({"key": run.idempotency_key, **run_json(run)})
        return
    typer.echo(f"triggered {job_id}: run {run.idempotency_key}, due {iso(run.due_ms)}")
    warn_without_scheduler(client.store, db)


def reschedule_cmd(
    job_id: Annotated[str, typer.Argument(metavar="ID")],
    cron_expr: Annotated[str | None, typer.Option("--cron", help="New cron expression.")] = None,
    tz: Annotated[
        str | None, typer.Option("--tz", help="Time zone of --cron (and of a naive --at or --start).")
    ] = None,
    every: Annotated[
        str | None, typer.Option("--every", metavar="DURATION", help="New interval, such as 90s, 5m, 1h30m.")
    ] = None,
    start: Annotated[str | None, typer.Option("--start", help="ISO 8601 time of --every's first run.")] = None,
    at: Annotated[str | None, typer.Option("--at", help="New one-shot ISO 8601 time.")] = None,
    in_s: Annotated[float | None, typer.Option("--in", help="New one-shot delay in seconds.")] = None,
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Give a job a new schedule; pending runs are replaced. A new --cron
    keeps the job's time zone unless --tz is given."""
    client = open_client(db, config, access="write")
    try:
        current = client.get(job_id).job.schedule
    except JobNotFound as exc:
        fail(str(exc), EXIT_NO_SUCH_JOB)
    spec = _schedule(
        ScheduleOptions(cron_expr, tz, at, in_s, every, start),
        keep_tz=current.tz if isinstance(current, CronSchedule) else "UTC",
    )
    try:
        rec = client.reschedule(job_id, spec)
    except InvalidJob as exc:
        fail_invalid(exc)
    except JobNotFound as exc:
        fail(str(exc), EXIT_NO_SUCH_JOB)
    except JobNotActive as exc:
        fail(str(exc))
    _print_job(rec, as_json, "rescheduled")


def register_commands(app: typer.Typer) -> None:
    app.command()(add)
    app.command()(ls)
    app.command()(show)
    app.command()(history)
    app.command()(cancel)
    app.command()(pause)
    app.command()(resume)
    app.command("reschedule")(reschedule_cmd)
    app.command()(trigger)
