"""What a job is, validated on the way in.

A job is stored as its JSON form; the store never interprets the target or
the policies, only the schedule-derived run times the scheduler plans.
"""

from __future__ import annotations

import logging
import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pysched import cron, durations

# No ':' in an id: it separates the parts of the idempotency key.
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
DEFAULT_JITTER_WINDOW_S = 60.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# The context a store reads its jobs back in: a schedule that a later
# version refuses (a zone that is machine-dependent, an expression that never
# fires) is still shown, cancelled and rescheduled; planning reads the same
# spec strictly (plannable_job) and leaves such a job unplanned.
STORED: dict[str, bool] = {"stored": True}


def _is_stored(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get("stored"))


class CronSchedule(_Strict):
    kind: Literal["cron"] = "cron"
    expr: str
    tz: str = "UTC"

    @field_validator("tz")
    @classmethod
    def _known_zone(cls, tz: str, info: ValidationInfo) -> str:
        if not _is_stored(info):
            cron.zone(tz)
        return tz

    @model_validator(mode="after")
    def _valid_expr(self, info: ValidationInfo) -> CronSchedule:
        if _is_stored(info):
            return self
        try:
            cron.validate(self.expr, self.tz)
        except cron.CronError as exc:
            # Raised from a model validator so the message names the field.
            raise ValueError(f"expr: {exc}") from None
        return self


class OnceSchedule(_Strict):
    kind: Literal["once"] = "once"
    run_at_ms: int = Field(ge=0)


class IntervalSchedule(_Strict):
    """Every ``every_s`` seconds of elapsed time (APScheduler's interval
    trigger, Celery beat's ``schedule(run_every)``): at ``start_ms`` and
    each interval after it; without a start, at the multiples of the
    interval since 1970-01-01T00:00Z, so that the same declaration always
    means the same times (``every="1h"`` fires on the hour). Elapsed time
    has no daylight saving: no zone."""

    kind: Literal["every"] = "every"
    # Seconds, or a duration such as "90s", "5m", "1h30m", "2d" on the way in.
    every_s: float = Field(ge=durations.MIN_INTERVAL_S, le=durations.MAX_INTERVAL_S, allow_inf_nan=False)
    start_ms: int | None = Field(default=None, ge=0)

    @field_validator("every_s", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        if isinstance(value, str):
            return durations.parse_seconds(value)
        return value

    @field_validator("every_s")
    @classmethod
    def _to_the_millisecond(cls, every_s: float) -> float:
        # What is stored is what fires and what is shown: times are in ms.
        return round(every_s * 1000) / 1000

    @property
    def every_ms(self) -> int:
        return round(self.every_s * 1000)


Schedule = Annotated[CronSchedule | IntervalSchedule | OnceSchedule, Field(discriminator="kind")]


class ShellTarget(_Strict):
    kind: Literal["shell"] = "shell"
    command: str = Field(min_length=1)
    timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class PythonTarget(_Strict):
    kind: Literal["python"] = "python"
    ref: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", description="module:function")
    timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class HttpTarget(_Strict):
    kind: Literal["http"] = "http"
    url: str
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    timeout_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"not an http(s) URL: {url!r}")
        return url


class TemporalTarget(_Strict):
    """A Temporal workflow, started with the run's idempotency key as its
    workflow id, on the server of the worker's configuration (the cluster
    file's ``temporal_address``, or PYSCHED_TEMPORAL_ADDRESS)."""

    kind: Literal["temporal"] = "temporal"
    workflow: str = Field(min_length=1, max_length=1000, pattern=r"^\S(.*\S)?$", description="workflow type name")
    task_queue: str = Field(min_length=1, max_length=1000, pattern=r"^\S(.*\S)?$")
    # The workflow's positional arguments; none when not given.
    args: tuple[JsonValue, ...] = ()
    namespace: str = Field(default="default", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
    # Also the workflow's execution timeout: the server stops it then.
    timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)


Target = Annotated[ShellTarget | PythonTarget | HttpTarget | TemporalTarget, Field(discriminator="kind")]

# What a failed attempt can be retried for: a timeout, a connection that
# failed, an HTTP 5xx (or 408, 429), an exception (a Python target's, by its
# class name with ``exception:Name``; a shell command's non-zero exit). What
# would fail again is never retried, whatever the list says: an HTTP 4xx, a
# target that cannot be imported, a definition that no longer validates.
RETRY_KINDS = ("timeout", "connect", "5xx", "exception")
_RETRY_ON = re.compile(r"^(timeout|connect|5xx|exception(:[A-Za-z_][A-Za-z0-9_.]*)?)$")


class RetryPolicy(_Strict):
    """Celery's ``max_retries=3`` with ``retry_backoff``, capped at its
    ``retry_backoff_max`` of 10 minutes: a failed run is tried again up to
    ``retries`` times, each after a full-jitter delay, for the kinds of
    failure in ``retry_on``."""

    retries: int = Field(default=3, ge=0, le=100)
    backoff_base_s: float = Field(default=10.0, gt=0, le=86_400, allow_inf_nan=False)
    backoff_cap_s: float = Field(default=600.0, gt=0, le=86_400, allow_inf_nan=False)
    retry_on: tuple[str, ...] = RETRY_KINDS

    @field_validator("retry_on")
    @classmethod
    def _known_kinds(cls, kinds: tuple[str, ...]) -> tuple[str, ...]:
        for kind in kinds:
            if not _RETRY_ON.match(kind):
                raise ValueError(f"{kind!r} is not one of timeout, connect, 5xx, exception, exception:ClassName")
        return kinds

    @model_validator(mode="after")
    def _cap_above_base(self) -> RetryPolicy:
        if self.backoff_cap_s < self.backoff_base_s:
            raise ValueError(f"the cap ({self.backoff_cap_s} s) is below the base ({self.backoff_base_s} s)")
        return self


class SloPolicy(_Strict):
    """The job's fire-lag objective: ``objective`` of its runs handed on
    within ``fire_lag_s`` of their due time, over ``window_days`` (the
    default: P99 within 1 s over 30 days)."""

    fire_lag_s: float = Field(default=1.0, gt=0, le=86_400, allow_inf_nan=False)
    objective: float = Field(default=0.99, gt=0, lt=1, allow_inf_nan=False)
    window_days: int = Field(default=30, ge=1, le=366)


CatchUp = Literal["skip", "run_once", "run_all", "deadline"]
CATCH_UP_POLICIES: tuple[CatchUp, ...] = ("skip", "run_once", "run_all", "deadline")
DEFAULT_MAX_DELAY_S = 60.0
Overlap = Literal["allow", "forbid", "replace", "buffer_one"]
OVERLAP_POLICIES: tuple[Overlap, ...] = ("allow", "forbid", "replace", "buffer_one")


class Job(_Strict):
    id: str = Field(pattern=JOB_ID_PATTERN)
    schedule: Schedule
    target: Target
    payload: dict[str, Any] = Field(default_factory=dict)
    # None: 60 s for a recurring job, none for a one-shot; a critical job has none.
    jitter_window_s: float | None = Field(default=None, ge=0, le=3600, allow_inf_nan=False)
    critical: bool = False
    # What happens to schedule times missed while no scheduler was up (see
    # pysched/catchup.py): run_once (the default, as Celery beat and
    # APScheduler's coalesce do), skip, run_all or deadline.
    catch_up: CatchUp = "run_once"
    # How late a run may start and still run, for skip and deadline (as a
    # CronJob's startingDeadlineSeconds); None: DEFAULT_MAX_DELAY_S.
    max_delay_s: float | None = Field(default=None, gt=0, le=30 * 86_400, allow_inf_nan=False)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    # What a run due while the job's previous run still runs does (see
    # pysched/overlap.py): allow (the default, as a CronJob's
    # concurrencyPolicy and Celery beat: runs may overlap, and no job pays
    # for a per-job slot it did not ask for), forbid, replace or buffer_one.
    overlap: Overlap = "allow"
    slo: SloPolicy = Field(default_factory=SloPolicy)
    # What its runs call, whose failures they share with other jobs': the
    # circuit breaker and the retry budget are kept per downstream (see
    # pysched/downstream.py). None: an HTTP target's host, a Temporal
    # target's task queue, and for a Python or shell target the job itself.
    downstream: str | None = Field(default=None, min_length=1, max_length=200, pattern=r"^[!-~]+$")

    @property
    def max_delay_ms(self) -> int:
        return round((DEFAULT_MAX_DELAY_S if self.max_delay_s is None else self.max_delay_s) * 1000)

    def jitter_window_ms(self, period_ms: int | None) -> int:
        """The window this job's runs spread over, capped by its period so
        that jitter never reorders a job's own runs."""
        if self.critical:
            return 0
        window_s = self.jitter_window_s
        if window_s is None:
            window_s = 0.0 if isinstance(self.schedule, OnceSchedule) else DEFAULT_JITTER_WINDOW_S
        window = round(window_s * 1000)
        if period_ms is not None:
            window = min(window, period_ms)
        return max(window, 0)


def plannable_job(job_id: str, spec: str) -> Job | None:
    """A stored job to plan runs for, or None, logged at error, when its
    definition no longer validates (written by another version, edited by
    hand): that job is left unplanned, and the others in its batch are not
    held up by it."""
    try:
        return Job.model_validate_json(spec)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error.get("loc", ())) or "job"
        logging.getLogger("pysched.model").error(
            "job %r: its stored definition no longer validates (%s: %s): no next run is planned;"
            " reschedule or cancel it",
            job_id,
            where,
            error.get("msg", exc),
        )
        return None


def job_id_is_valid(job_id: str) -> bool:
    return re.fullmatch(JOB_ID_PATTERN, job_id) is not None
