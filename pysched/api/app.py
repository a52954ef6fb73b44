"""The routes: each a Client call, its errors as HTTP statuses.

FastAPI, for its OpenAPI from the same pydantic models the jobs are
validated with (the schema a client generator reads is the one the server
checks), served by uvicorn; sync routes run in its thread pool, as the
stores' calls block.

Errors: 422 names each field at fault (``{"detail": [{"field", "message"}]}``),
404 an unknown job or run, 409 an id that exists or a change the job's state
does not allow, 413 a body past the limit, 401 a missing token, 503 a store
that cannot be reached. A refused request stores nothing.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Body, FastAPI, Path, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, ConfigDict, Field, model_validator

from pysched.api.guard import MAX_BODY_BYTES, BearerToken, BodyLimit, CrossSiteWrites, LoopbackHosts
from pysched.api.ui import LOGIN_PATH, OPEN_PATHS, PAGE_PATHS, dashboard
from pysched.client import MAX_PREVIEW, Client, Preview, RunKey
from pysched.model import CronSchedule, IntervalSchedule, Job, OnceSchedule
from pysched.problems import InvalidJob, Problem, problems_from_errors
from pysched.protocols import JobExists, JobNotActive, JobNotFound, RunNotFound
from pysched.views import dead_letter_json, iso, job_json, last_run_json, run_json, slo_json

# No job's id is longer (model.JOB_ID_PATTERN): a longer one is refused, not
# looked up and echoed back.
JobIdPath = Annotated[str, Path(max_length=128, description="The job's id")]
ImportCheckQuery = Annotated[
    bool,
    Query(
        description="Import a Python target's module here to check that it names a function (false: for a target"
        " only the workers can import)"
    ),
]
# Jobs in one batch: a bulk registration's unit; more go in several.
MAX_BATCH = 10_000
_LOCATIONS = frozenset({"body", "query", "path", "header"})


class JobBatch(BaseModel):
    """``{"jobs": [...]}``, or the list of jobs itself."""

    jobs: list[Job] = Field(max_length=MAX_BATCH)

    @model_validator(mode="before")
    @classmethod
    def _bare_list(cls, value: Any) -> Any:
        return {"jobs": value} if isinstance(value, list) else value


class RedriveRequest(BaseModel):
    # A field it does not know is refused, not passed over: a typo would
    # otherwise redrive nothing, or everything.
    model_config = ConfigDict(extra="forbid")

    runs: list[str] = Field(
        default_factory=list, max_length=100_000, description="Run keys, JOB:RUN_AT_MS:GROUP, as dead letters show them"
    )
    all: bool = Field(default=False, description="Every dead letter")


def _problems(problems: tuple[Problem, ...] | list[Problem]) -> JSONResponse:
    return JSONResponse(
        status_code=422, content={"detail": [{"field": p.field, "message": p.message} for p in problems]}
    )


def _request_problems(exc: RequestValidationError) -> JSONResponse:
    errors = list(exc.errors())
    # A body that is no JSON at all, or none: said so, not as a field.
    for err in errors:
        if err.get("type") == "json_invalid":
            reason = (err.get("ctx") or {}).get("error", "")
            return _problems([Problem("", f"the body is not JSON: {reason}".rstrip(": "))])
        if err.get("type") == "missing" and tuple(err.get("loc", ())) == ("body",):
            return _problems([Problem("", "a JSON body is required")])
    return _problems(problems_from_errors(errors, outside=_LOCATIONS))


def _detail(status: int, exc: Exception) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": str(exc)})


def _unavailable(exc: Exception) -> JSONResponse:
    return JSONResponse(
        status_code=503,
        content={"detail": f"the store did not answer: {type(exc).__name__}: {exc}"},
        headers={"retry-after": "1"},
    )


def _store_unavailable_errors() -> tuple[type[Exception], ...]:
    """What a store raises when it is busy or out of reach, not wrong: the
    embedded database locked by another writer past its timeout, the
    cluster's driver without a host or an answer in time."""
    errors: list[type[Exception]] = [ConnectionError, TimeoutError, sqlite3.OperationalError]
    try:
        from cassandra import DriverException, RequestExecutionException
        from cassandra.cluster import NoHostAvailable
    except ImportError:  # the cluster extra is not installed
        return tuple(errors)
    return (*errors, DriverException, RequestExecutionException, NoHostAvailable)


def _run_key(text: str) -> RunKey:
    try:
        return RunKey.parse(text)
    except ValueError as exc:
        raise InvalidJob((Problem("runs", str(exc)),)) from None


def _start_ms(text: str) -> int:
    """GET /preview's start as epoch ms: UTC unless it gives an offset,
    since a request has no local zone."""
    accepted = "an ISO 8601 time from 1970 on, such as 2027-01-01T00:00:07Z"
    try:
        when = datetime.fromisoformat(text)
        at_ms = int((when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp() * 1000)
    except (ValueError, OverflowError, OSError):
        raise InvalidJob((Problem("start", f"{accepted}; got {text!r}"),)) from None
    if at_ms < 0:
        raise InvalidJob((Problem("start", f"{accepted}; got {text!r}"),))
    return at_ms


def _preview_json(shown: Preview) -> dict[str, Any]:
    schedule = shown.schedule
    if isinstance(schedule, CronSchedule):
        what: dict[str, Any] = {"expr": schedule.expr, "tz": schedule.tz}
    else:
        what = {"every_s": schedule.every_s, "start_at": iso(schedule.start_ms)}
    return {
        **what,
        "jitter_ms": shown.jitter_ms,
        "fires": [{"at": iso(f.at_ms), "due_at": iso(f.due_ms), "dst": f.dst} for f in shown.fires],
    }


def create_app(client: Client, *, token: str | None = None, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The API over ``client``'s store (opened now: a store that cannot be
    opened fails here, not at the first request)."""
    client.store  # noqa: B018
    app = FastAPIOffline(
        redoc_url=None,
        title="pysched",
        summary="Jobs, runs, dead letters and partitions of a pysched scheduler.",
        version="1",
    )
    app.add_exception_handler(RequestValidationError, lambda _r, e: _request_problems(e))
    app.add_exception_handler(InvalidJob, lambda _r, e: _problems(e.problems))
    app.add_exception_handler(JobNotFound, lambda _r, e: _detail(404, e))
    app.add_exception_handler(RunNotFound, lambda _r, e: _detail(404, e))
    app.add_exception_handler(JobExists, lambda _r, e: _detail(409, e))
    app.add_exception_handler(JobNotActive, lambda _r, e: _detail(409, e))
    for unavailable in _store_unavailable_errors():
        app.add_exception_handler(unavailable, lambda _r, e: _unavailable(e))

    @app.get("/jobs", tags=["jobs"])
    def list_jobs() -> list[dict[str, Any]]:
        records = client.ls()
        last = client.last_runs([r.job.id for r in records])
        return [{**job_json(r), "last_run": last_run_json(last.get(r.job.id))} for r in records]

    @app.post("/jobs", status_code=201, tags=["jobs"])
    def add_job(job: Job, import_check: ImportCheckQuery = True) -> dict[str, Any]:
        return job_json(client.add(job, import_target=import_check))

    @app.post("/jobs/batch", tags=["jobs"])
    def add_jobs(batch: JobBatch, import_check: ImportCheckQuery = True) -> dict[str, list[str]]:
        """Every job checked before any is stored; ids that exist are left.
        The body is ``{"jobs": [...]}``, or the list of jobs itself."""
        done = client.add_many(batch.jobs, import_target=import_check)
        return {"added": list(done.added), "existing": list(done.existing)}

    @app.get("/jobs/{job_id}", tags=["jobs"])
    def get_job(job_id: JobIdPath) -> dict[str, Any]:
        rec = client.get(job_id)
        return {
            **job_json(rec),
            "last_run": last_run_json(client.last_runs([job_id]).get(job_id)),
            "missed": client.missed([rec])[job_id],
        }

    @app.get("/jobs/{job_id}/runs", tags=["jobs"])
    def job_runs(job_id: JobIdPath, limit: Annotated[int, Query(ge=1, le=100_000)] = 50) -> list[dict[str, Any]]:
        return [run_json(r) for r in client.history(job_id, limit)]

    @app.get("/jobs/{job_id}/preview", tags=["jobs"])
    def job_preview(job_id: JobIdPath, count: Annotated[int, Query(ge=1, le=MAX_PREVIEW)] = 10) -> dict[str, Any]:
        return _preview_json(client.preview(job_id, count=count))

    @app.get("/jobs/{job_id}/slo", tags=["slo"])
    def job_slo(job_id: JobIdPath) -> dict[str, Any]:
        """The job's fire-lag objective: attainment, error budget, burn rates."""
        return slo_json(client.slo(job_id))

    @app.get("/slo", tags=["slo"])
    def every_slo() -> list[dict[str, Any]]:
        return [slo_json(r) for r in client.slos()]

    @app.post("/jobs/{job_id}/trigger", status_code=201, tags=["jobs"])
    def trigger_job(job_id: JobIdPath) -> dict[str, Any]:
        """Run the job now, once, beside its schedule."""
        run = client.trigger(job_id)
        return {"key": run.idempotency_key, **run_json(run)}

    @app.post("/jobs/{job_id}/cancel", tags=["jobs"])
    def cancel_job(job_id: JobIdPath) -> dict[str, Any]:
        return job_json(client.cancel(job_id))

    @app.post("/jobs/{job_id}/pause", tags=["jobs"])
    def pause_job(job_id: JobIdPath) -> dict[str, Any]:
        return job_json(client.pause(job_id))

    @app.post("/jobs/{job_id}/resume", tags=["jobs"])
    def resume_job(job_id: JobIdPath) -> dict[str, Any]:
        return job_json(client.resume(job_id))

    @app.put("/jobs/{job_id}/schedule", tags=["jobs"])
    def reschedule_job(
        job_id: JobIdPath,
        schedule: Annotated[CronSchedule | IntervalSchedule | OnceSchedule, Body(discriminator="kind")],
    ) -> dict[str, Any]:
        return job_json(client.reschedule(job_id, schedule))

    @app.get("/preview", tags=["jobs"])
    def preview(
        cron: Annotated[str | None, Query(max_length=1000)] = None,
        tz: Annotated[str | None, Query(max_length=100)] = None,
        every: Annotated[str | None, Query(max_length=100, description="seconds, or such as 90s, 5m, 1h30m")] = None,
        count: Annotated[int, Query(ge=1, le=MAX_PREVIEW)] = 10,
        start: Annotated[
            str | None,
            Query(max_length=100, description="ISO 8601 time of every's first fire; without an offset, UTC"),
        ] = None,
    ) -> dict[str, Any]:
        """The next fires of a cron expression (in zone ``tz``, default UTC)
        or of an interval (``every``), which counts from ``start`` when given:
        an ISO 8601 time such as 2027-01-01T00:00:07Z (without an offset,
        UTC), as a job's ``start_ms`` does; without it, from 1970-01-01."""
        if cron is not None and every is not None:
            raise InvalidJob((Problem("cron", "give a cron expression or an interval as every, not both"),))
        if cron is None and every is None:
            raise InvalidJob((Problem("cron", "give a cron expression, or an interval as every"),))
        if start is not None and every is None:
            raise InvalidJob((Problem("start", "goes with every"),))
        if every is not None:
            start_ms = None if start is None else _start_ms(start)
            return _preview_json(client.preview(every=every, tz=tz, count=count, start_ms=start_ms))
        return _preview_json(client.preview(cron_expr=cron, tz=tz or "UTC", count=count))

    @app.get("/dead-letters", tags=["dead letters"])
    def dead_letters(limit: Annotated[int, Query(ge=1, le=100_000)] = 1000) -> list[dict[str, Any]]:
        return [dead_letter_json(r) for r in client.dead_letters(limit)]

    @app.get("/runs/{key}", tags=["dead letters"])
    def get_run(key: Annotated[str, Path(max_length=200)]) -> dict[str, Any]:
        return dead_letter_json(client.get_run(_run_key(key)))

    @app.post("/dead-letters/redrive", tags=["dead letters"])
    def redrive(request: RedriveRequest) -> dict[str, list[str]]:
        """Run dead letters again now, as their next attempt."""
        if bool(request.runs) == request.all:
            raise InvalidJob((Problem("runs", "give run keys or all, not both" if request.runs else "give run keys"),))
        keys = (
            [RunKey.of(r) for r in client.dead_letters(100_000)] if request.all else [_run_key(k) for k in request.runs]
        )
        done = client.redrive(keys)
        return {
            "redriven": [str(k) for k in done.redriven],
            "not_dead_letters": [str(k) for k in done.not_dead_letters],
        }

    @app.get("/partitions", tags=["cluster"])
    def partitions() -> list[dict[str, Any]]:
        """Each partition's leader and fence (none: nobody leads it now)."""
        return [
            {"partition": p.partition, "leader": p.holder, "fence": p.fence, "lease_expires_at": iso(p.expires_at_ms)}
            for p in client.leaders()
        ]

    @app.get("/health", tags=["cluster"])
    def health() -> JSONResponse:
        """200 when the store answers and every partition has a leader; 503
        with what is wrong otherwise."""
        leaders = client.leaders()
        unled = [p.partition for p in leaders if p.holder is None]
        body = {
            "engine": "embedded" if client.config is None else "cluster",
            "partitions": len(leaders),
            "unled_partitions": unled,
            "status": "ok" if not unled else "degraded",
        }
        return JSONResponse(status_code=200 if not unled else 503, content=body)

    app.include_router(dashboard(client, token=token))

    # The last added runs first: the host and the token are checked before
    # anything else, the body is read last.
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    app.add_middleware(CrossSiteWrites)
    if token is not None:
        app.add_middleware(BearerToken, token=token, login=LOGIN_PATH, open_paths=OPEN_PATHS, pages=PAGE_PATHS)
    else:
        app.add_middleware(LoopbackHosts)
    return app
