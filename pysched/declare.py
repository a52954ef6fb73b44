"""`@pysched.job`: jobs declared in code, next to the functions they run.

A declaration is checked when its module is imported (a bad cron expression
fails there, as a bad manifest fails to apply) and stored nowhere: `pysched
sync MODULE` or `Client.sync` makes the store hold the module's declarations,
like Celery beat's schedule or a CronJob manifest. The function is returned
unchanged and is called with a `RunContext` when its job runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
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
    at: datetime | None = None,
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
    zone ``tz``) or once ``at`` a time (naive: in ``tz``). Its id is
    ``module.function`` unless ``id`` is given. The other arguments are
    the job's policies, as `pysched add` takes them: ``jitter`` (window in
    seconds), ``critical``, ``retries``, ``backoff`` (base and cap in
    seconds), ``retry_on``, ``timeout`` (seconds), ``catch_up``,
    ``max_delay`` (seconds), ``overlap``, ``payload`` and ``slo`` (a
    `SloPolicy` or its fields: ``fire_lag_s``, ``objective``, ``window_days``)
    and ``downstream`` (what it calls, for its circuit breaker and retry
    budget; default: the job itself)."""

    def declare(func: F) -> F:
        ref = f"{getattr(func, '__module__', '?')}:{getattr(func, '__name__', '?')}"
        if getattr(func, "__module__", None) == "__main__":
            raise InvalidDeclaration(ref, _where_problems(func))
        if (cron is None) == (at is None):
            raise InvalidDeclaration(ref, (Problem("schedule", "give exactly one of cron= and at="),))
        spec: dict[str, Any] = {
            "id": id if id is not None else f"{func.__module__}.{func.__name__}",
            "schedule": _schedule(cron, at, tz, ref),
            "target": {"kind": "python", "ref": ref},
            "critical": critical,
            "retry": _retry(retries, backoff, retry_on, ref),
        }
        if timeout is not None:
            spec["target"]["timeout_s"] = timeout
        for key, value in (
            ("jitter_window_s", jitter),
            ("catch_up", catch_up),
            ("max_delay_s", max_delay),
            ("overlap", overlap),
            ("payload", payload),
            ("slo", slo.model_dump() if isinstance(slo, SloPolicy) else slo),
            ("downstream", downstream),
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
        problems = _where_problems(func)
        if problems:
            raise InvalidDeclaration(ref, problems)
        setattr(func, _ATTRIBUTE, declared)
        return func

    return declare


def _where_problems(func: Callable[..., Any]) -> tuple[Problem, ...]:
    """A worker finds the function by importing its module and reading the
    name: it must be defined at a module's top level, and not in a script."""
    if func.__module__ == "__main__":
        return (Problem("target.ref", "defined in a script run as __main__: a worker cannot import it"),)
    if func.__qualname__ != func.__name__ or not func.__name__.isidentifier():
        return (Problem("target.ref", f"{func.__qualname__} is not a function at its module's top level"),)
    return ()


def _schedule(cron: str | None, at: datetime | None, tz: str, ref: str) -> dict[str, Any]:
    if cron is not None:
        return {"kind": "cron", "expr": cron, "tz": tz}
    assert at is not None
    if at.tzinfo is None:
        from pysched import cron as cron_rules

        try:
            at = at.replace(tzinfo=cron_rules.zone(tz))
        except cron_rules.CronError as exc:
            raise InvalidDeclaration(ref, (Problem("schedule.tz", str(exc)),)) from None
    return {"kind": "once", "run_at_ms": int(at.timestamp() * 1000)}


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
