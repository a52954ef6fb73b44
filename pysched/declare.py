"""`@pysched.job`: jobs declared in code, next to the functions they run.

A declaration is checked when its module is imported (a bad cron expression
fails there, as a bad manifest fails to apply) and stored nowhere: `pysched
sync MODULE` or `Client.sync` makes the store hold the module's declarations,
like Celery beat's schedule or a CronJob manifest. The function is returned
unchanged and is called with a `RunContext` when its job runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from types import ModuleType
from typing import Any, TypeVar

from pydantic import ValidationError

from pysched.admission import JobRejected, admit
from pysched.clock import SystemClock
from pysched.model import CatchUp, Job, Overlap, SloPolicy
from pysched.problems import InvalidJob, Problem, invalid_from_rejection, invalid_from_validation

F = TypeVar("F", bound=Callable[..., Any])

# Where a declaration is kept on its function.
_ATTRIBUTE = "__pysched_job__"


class InvalidDeclaration(InvalidJob):
    """A declaration that cannot be a job, named by its function."""

    def __init__(self, ref: str, problems: tuple[Problem, ...]) -> None:
        super().__init__(problems)
        self.ref = ref
        self.args = (f"@pysched.job on {ref}: {'; '.join(str(p) for p in problems)}",)


def job(
    *,
    cron: str | None = None,
    every: str | float | timedelta | None = None,
    at: datetime | None = None,
    start: datetime | None = None,
    tz: str = "UTC",
    id: str | None = None,
    jitter: float | None = None,
    critical: bool = False,
    retries: int | None = None,
    backoff: tuple[float, float] | None = None,
    retry_on: Sequence[str] | None = None,
    timeout: float | None = None,
    catch_up: CatchUp | None = None,
    max_delay: float | None = None,
    overlap: Overlap | None = None,
    payload: Mapping[str, Any] | None = None,
    slo: SloPolicy | Mapping[str, Any] | None = None,
    downstream: str | None = None,
) -> Callable[[F], F]:
    """Declare the decorated module-level function a job: on ``cron`` (in
    zone ``tz``), ``every`` an interval (seconds, a `timedelta` or a
    duration such as "90s", "5m", "1h30m"; from ``start`` if given, else
    on the interval's multiples since 1970 UTC) or once ``at`` a time
    (naive times in ``tz``). Its id is
    ``module.function`` unless ``id`` is given. The other arguments are
    the job's policies, as `pysched add` takes them: ``jitter`` (window in
    seconds), ``critical``, ``retries``, ``backoff`` (base and cap in
    seconds), ``retry_on``, ``timeout`` (seconds), ``catch_up``,
    ``max_delay`` (seconds), ``overlap``, ``payload`` and ``slo`` (a
    `SloPolicy` or its fields: ``fire_lag_s``, ``objective``, ``window_days``)
    and ``downstream`` (what it calls, for its circuit breaker and retry
    budget; default: the job itself)."""

    options = {
        "cron": cron,
        "every": every,
        "at": at,
        "start": start,
        "tz": tz,
        "id": id,
        "jitter": jitter,
        "critical": critical,
        "retries": retries,
        "backoff": backoff,
        "retry_on": retry_on,
        "timeout": timeout,
        "catch_up": catch_up,
        "max_delay": max_delay,
        "overlap": overlap,
        "payload": payload,
        "slo": slo,
        "downstream": downstream,
    }

    def declare(func: F) -> F:
        setattr(func, _ATTRIBUTE, job_of(func, **options))
        return func

    return declare


# What job_of takes: the decorator's options, named once, in its signature.
_OPTIONS = frozenset(inspect.signature(job).parameters)


def job_of(target: Callable[..., Any] | str, **options: Any) -> Job:
    """The job that runs ``target`` (a module-level function, or its
    ``"module:function"``) with ``@pysched.job``'s options, checked now;
    what `Client.add(func, cron=...)` and `Scheduler.add_job` register.
    Raises InvalidDeclaration naming the function and every problem: a
    lambda, a closure or a script's ``__main__`` function is refused, since
    a worker in another process imports its target by name."""
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise TypeError(f"unexpected options {', '.join(unknown)}; the options are {', '.join(sorted(_OPTIONS))}")
    if isinstance(target, str):
        ref, default_id = target, target.replace(":", ".")
    else:
        ref = f"{getattr(target, '__module__', '?')}:{getattr(target, '__name__', '?')}"
        default_id = f"{getattr(target, '__module__', '?')}.{getattr(target, '__name__', '?')}"
        name = getattr(target, "__name__", None)
        if getattr(target, "__module__", None) == "__main__" or not (isinstance(name, str) and name.isidentifier()):
            # Its id and ref would be refused too: this says why.
            raise InvalidDeclaration(ref, _where_problems(target))
    cron, every, at = options.get("cron"), options.get("every"), options.get("at")
    # start= alone reads as a schedule of its own: say what it needs first.
    if options.get("start") is not None and every is None:
        raise InvalidDeclaration(ref, (Problem("schedule.start", "start= goes with every="),))
    if sum(value is not None for value in (cron, every, at)) != 1:
        raise InvalidDeclaration(ref, (Problem("schedule", "give exactly one of cron=, every= and at="),))
    slo = options.get("slo")
    spec: dict[str, Any] = {
        "id": options.get("id") or default_id,
        "schedule": _schedule(options, ref),
        "target": {"kind": "python", "ref": ref},
        "critical": bool(options.get("critical")),
        "retry": _retry(options.get("retries"), options.get("backoff"), options.get("retry_on"), ref),
    }
    if options.get("timeout") is not None:
        spec["target"]["timeout_s"] = options["timeout"]
    for key, value in (
        ("jitter_window_s", options.get("jitter")),
        ("catch_up", options.get("catch_up")),
        ("max_delay_s", options.get("max_delay")),
        ("overlap", options.get("overlap")),
        ("payload", options.get("payload")),
        ("slo", slo.model_dump() if isinstance(slo, SloPolicy) else slo),
        ("downstream", options.get("downstream")),
    ):
        if value is not None:
            spec[key] = value
    try:
        declared = Job.model_validate(spec)
        # What a registration would refuse, refused where it is written:
        # a payload that is no JSON, jitter on a critical job, a URL.
        admit(declared, SystemClock().now_ms())
    except ValidationError as exc:
        raise InvalidDeclaration(ref, invalid_from_validation(exc).problems) from None
    except JobRejected as exc:
        raise InvalidDeclaration(ref, invalid_from_rejection(exc).problems) from None
    where = () if isinstance(target, str) else _where_problems(target)
    if where:
        raise InvalidDeclaration(ref, where)
    return declared


def _where_problems(func: Callable[..., Any]) -> tuple[Problem, ...]:
    """A worker finds the function by importing its module and reading the
    name: it must be defined at a module's top level, and not in a script."""
    module = getattr(func, "__module__", None)
    name = getattr(func, "__name__", None)
    qualname = getattr(func, "__qualname__", name)
    if not isinstance(name, str) or not isinstance(module, str):
        return (Problem("target.ref", f"{func!r} has no module and name: a worker imports its target by name"),)
    # A lambda or a nested function has no name to import even once moved
    # into a module: that is said first, and __main__ only of a top-level one.
    if name == "<lambda>":
        return (Problem("target.ref", "a lambda: a worker in another process imports its target by name"),)
    if "<locals>" in str(qualname):
        return (
            Problem(
                "target.ref",
                f"{qualname} is defined inside another function: a worker in another process can only import"
                " a function at its module's top level",
            ),
        )
    if module == "__main__":
        return (
            Problem(
                "target.ref",
                "defined in a script run as __main__: a worker in another process cannot import it;"
                " move it into a module",
            ),
        )
    if qualname != name or not name.isidentifier():
        return (Problem("target.ref", f"{qualname} is not a function at its module's top level"),)
    return ()


def _schedule(options: Mapping[str, Any], ref: str) -> dict[str, Any]:
    tz = options.get("tz") or "UTC"
    if options.get("cron") is not None:
        return {"kind": "cron", "expr": options["cron"], "tz": tz}
    every = options.get("every")
    if every is not None:
        interval: dict[str, Any] = {
            "kind": "every",
            "every_s": every.total_seconds() if isinstance(every, timedelta) else every,
        }
        if options.get("start") is not None:
            interval["start_ms"] = _epoch_ms(options["start"], tz, "schedule.start", ref)
        return interval
    return {"kind": "once", "run_at_ms": _epoch_ms(options["at"], tz, "schedule.at", ref)}


def _epoch_ms(when: datetime, tz: str, field: str, ref: str) -> int:
    if not isinstance(when, datetime):
        raise InvalidDeclaration(ref, (Problem(field, f"a datetime; got {when!r}"),))
    if when.tzinfo is None:
        from pysched import cron as cron_rules

        try:
            when = when.replace(tzinfo=cron_rules.zone(tz))
        except cron_rules.CronError as exc:
            raise InvalidDeclaration(ref, (Problem("schedule.tz", str(exc)),)) from None
    return int(when.timestamp() * 1000)


def _retry(
    retries: int | None, backoff: tuple[float, float] | None, retry_on: Sequence[str] | None, ref: str
) -> dict[str, Any]:
    policy: dict[str, Any] = {}
    if retries is not None:
        policy["retries"] = retries
    if backoff is not None:
        if not isinstance(backoff, tuple | list) or len(backoff) != 2:
            raise InvalidDeclaration(ref, (Problem("retry.backoff", f"(base_s, cap_s), two numbers; got {backoff!r}"),))
        policy["backoff_base_s"], policy["backoff_cap_s"] = backoff
    if retry_on is not None:
        if isinstance(retry_on, str):
            raise InvalidDeclaration(ref, (Problem("retry.retry_on", "a list of kinds, such as ['timeout', '5xx']"),))
        policy["retry_on"] = tuple(retry_on)
    return policy


def declared_jobs(module: ModuleType) -> list[Job]:
    """The jobs ``module``'s own functions declare (not those it imports
    from elsewhere), by id; two with one id are refused."""
    found: dict[str, tuple[object, Job]] = {}
    for value in vars(module).values():
        declared = getattr(value, _ATTRIBUTE, None)
        if not isinstance(declared, Job) or getattr(value, "__module__", None) != module.__name__:
            continue
        # One function under two names (``b = a``) is one declaration.
        if declared.id in found and found[declared.id][0] is not value:
            raise InvalidJob((Problem("id", f"{declared.id!r} is declared twice in {module.__name__}"),))
        found[declared.id] = (value, declared)
    return [found[key][1] for key in sorted(found)]
