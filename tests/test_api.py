"""The HTTP API in-process (FastAPI's TestClient), on both engines: every
route's happy path and its 4xx, the token and the body limit, and a
property test from /openapi.json that finds no 5xx and no partial write."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from starlette.types import ASGIApp, Receive, Scope, Send

from pysched import Client
from pysched.api.app import create_app
from tests.test_client import client
from tests.test_client import shell_job as job

# Without a token the API answers only to loopback names.
LOCAL = "http://127.0.0.1"

# The Client on each engine, as the Client's own tests have it.
store_client = client


@pytest.fixture
def api(store_client: Client) -> Iterator[TestClient]:
    with TestClient(create_app(store_client), base_url=LOCAL) as http:
        yield http


def test_jobs_are_added_read_changed_and_cancelled(api: TestClient) -> None:
    added = api.post("/jobs", json=job("report"))
    assert added.status_code == 201, added.text
    assert added.json()["id"] == "report" and added.json()["next_run_at"] is not None
    assert [j["id"] for j in api.get("/jobs").json()] == ["report"]
    shown = api.get("/jobs/report").json()
    assert shown["state"] == "active" and shown["last_run"] is None and shown["missed"]["paused"] == 0
    assert api.get("/jobs/report/runs").json() == []
    assert len(api.get("/jobs/report/preview", params={"count": 3}).json()["fires"]) == 3
    objective = api.get("/jobs/report/slo").json()
    assert (objective["runs"], objective["attainment"], objective["objective"]) == (0, None, 0.99)
    assert [r["job_id"] for r in api.get("/slo").json()] == ["report"]
    triggered = api.post("/jobs/report/trigger")
    assert triggered.status_code == 201 and triggered.json()["key"].startswith("report:")
    assert api.post("/jobs/report/pause").json()["state"] == "paused"
    assert api.post("/jobs/report/trigger").status_code == 409
    assert api.post("/jobs/report/resume").json()["state"] == "active"
    moved = api.put("/jobs/report/schedule", json={"kind": "cron", "expr": "30 8 * * 1-5", "tz": "UTC"})
    assert moved.status_code == 200 and moved.json()["schedule"]["expr"] == "30 8 * * 1-5"
    assert api.post("/jobs/report/cancel").json()["state"] == "cancelled"
    batch = api.post("/jobs/batch", json={"jobs": [job("report"), job("b"), job("c")]})
    # A cancelled job's id is taken by the new job; an active one's is not.
    assert batch.json() == {"added": ["report", "b", "c"], "existing": []}
    assert api.get("/jobs/report").json()["state"] == "active" and api.get("/jobs/report/runs").json() == []
    assert api.post("/jobs/batch", json=[job("c"), job("d")]).json() == {"added": ["d"], "existing": ["c"]}
    assert api.get("/preview", params={"cron": "0 0 1 1 *", "count": 2}).json()["tz"] == "UTC"


def test_bad_requests_name_their_field_and_change_nothing(api: TestClient) -> None:
    api.post("/jobs", json=job("kept"))
    bad = api.post("/jobs", json=job("Bad id!", schedule={"kind": "cron", "expr": "61 * * * *"}))
    assert bad.status_code == 422
    assert {p["field"] for p in bad.json()["detail"]} == {"id", "schedule.expr"}
    big = api.post("/jobs", json=job("big", payload={"x": "y" * (1024 * 1024)}))
    assert big.status_code == 422 and big.json()["detail"][0]["field"] == "payload"
    assert api.post("/jobs", json=job("kept")).status_code == 409
    past = api.post("/jobs", json=job("late", schedule={"kind": "once", "run_at_ms": 1}))
    assert past.status_code == 422 and past.json()["detail"] == [
        {"field": "schedule.run_at_ms", "message": "1970-01-01T00:00:00.001+00:00 is in the past"}
    ]
    not_json = api.post("/jobs", content=b"{not json", headers={"content-type": "application/json"})
    assert not_json.status_code == 422 and not_json.json()["detail"][0]["message"].startswith("the body is not JSON")
    empty = api.post("/jobs", headers={"content-type": "application/json"})
    assert empty.json()["detail"] == [{"field": "", "message": "a JSON body is required"}]
    batch = api.post("/jobs/batch", json={"jobs": [job("fine"), job("nope", schedule={"kind": "cron", "expr": "x"})]})
    assert batch.status_code == 422 and batch.json()["detail"][0]["field"] == "jobs.1.schedule.expr"
    assert api.put("/jobs/kept/schedule", json={"kind": "cron", "expr": "* * 32 * *"}).status_code == 422
    assert api.get("/jobs/kept/runs", params={"limit": 0}).json()["detail"][0]["field"] == "limit"
    assert api.get("/preview", params={"cron": "* *"}).status_code == 422
    assert api.get("/preview").json()["detail"] == [
        {"field": "cron", "message": "give a cron expression, or an interval as every"}
    ]
    both = api.get("/preview", params={"cron": "* * * * *", "every": "5m"})
    assert both.json()["detail"] == [
        {"field": "cron", "message": "give a cron expression or an interval as every, not both"}
    ]
    for params in ({"cron": "* * * * *", "start": "2027-01-01T00:00:07Z"}, {"every": "10s", "start": "soon"}):
        refused = api.get("/preview", params=params)
        assert refused.status_code == 422 and refused.json()["detail"][0]["field"] == "start", params
    started = api.get("/preview", params={"every": "10s", "start": "2027-01-01T00:00:07", "count": 2}).json()
    assert started["start_at"] == "2027-01-01T00:00:07.000+00:00"
    assert [f["at"] for f in started["fires"]] == ["2027-01-01T00:00:07.000+00:00", "2027-01-01T00:00:17.000+00:00"]
    typo = api.post("/dead-letters/redrive", json={"al": True})
    assert typo.status_code == 422 and typo.json()["detail"][0]["field"] == "al"
    # A bare list is the batch itself; its fields are named as in {"jobs": [...]}.
    bare = api.post("/jobs/batch", json=[job("fine2"), job("nope", schedule={"kind": "cron", "expr": "x"})])
    assert bare.status_code == 422 and bare.json()["detail"][0]["field"] == "jobs.1.schedule.expr"
    for method, path in (
        ("get", "/jobs/ghost"),
        ("get", "/jobs/ghost/runs"),
        ("post", "/jobs/ghost/pause"),
        ("post", "/jobs/ghost/trigger"),
    ):
        missing = api.request(method, path)
        assert missing.status_code == 404 and missing.json()["detail"] == "no job 'ghost'"
    assert api.get("/runs/ghost:1:0").status_code == 404
    too_long = api.get("/jobs/" + "x" * 5000)
    assert too_long.status_code == 422 and too_long.json()["detail"][0]["field"] == "job_id"
    assert "x" * 200 not in too_long.text
    assert api.get("/runs/not-a-key").status_code == 422
    worker_only = {**job("py"), "target": {"kind": "python", "ref": "nosuchmod:run"}}
    unimportable = api.post("/jobs", json=worker_only)
    assert unimportable.status_code == 422 and unimportable.json()["detail"][0]["field"] == "target.ref"
    assert "No module named 'nosuchmod'" in unimportable.json()["detail"][0]["message"]
    api.post("/jobs/kept/cancel")
    assert api.post("/jobs/kept/cancel").status_code == 409
    assert [j["id"] for j in api.get("/jobs").json()] == ["kept"]
    # A target only the workers can import, said so.
    assert api.post("/jobs", params={"import_check": "false"}, json=worker_only).status_code == 201


def test_dead_letters_and_partitions_are_listed(api: TestClient, store_client: Client) -> None:
    assert api.get("/dead-letters").json() == []
    none = api.post("/dead-letters/redrive", json={"runs": ["ghost:1:0"]})
    assert none.json() == {"redriven": [], "not_dead_letters": ["ghost:1:0"]}
    assert api.post("/dead-letters/redrive", json={}).status_code == 422
    assert api.post("/dead-letters/redrive", json={"all": True}).json() == {"redriven": [], "not_dead_letters": []}
    parts = api.get("/partitions").json()
    assert [p["partition"] for p in parts] == list(range(store_client.store.partitions))
    health = api.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "degraded"  # no node leads here


def test_a_token_guards_every_request_and_a_body_past_the_limit_is_refused(tmp_path: Path) -> None:
    with (
        Client(tmp_path / "api.db") as client,
        TestClient(create_app(client, token="s3cret", max_body_bytes=2048), base_url=LOCAL) as http,
    ):
        for path in ("/jobs", "/openapi.json", "/docs"):
            refused = http.get(path)
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert http.post("/jobs", json=job("sneaky")).status_code == 401
        wrong = http.get("/jobs", headers={"Authorization": "Bearer wrong"})
        assert wrong.status_code == 401 and wrong.json()["detail"].startswith("the bearer token is wrong")
        assert http.get("/jobs").json()["detail"].startswith("a bearer token is required")
        auth = {"Authorization": "Bearer s3cret"}
        assert http.post("/jobs", json=job("fine"), headers=auth).status_code == 201
        too_big = http.post("/jobs", json=job("big", payload={"x": "y" * 4096}), headers=auth)
        assert too_big.status_code == 413 and "2,048 bytes" in too_big.json()["detail"]

        def chunks() -> Iterator[bytes]:
            yield b'{"id": "chunked", "payload": {"x": "'
            yield b"y" * 4096
            yield b'"}}'

        chunked = http.post("/jobs", content=chunks(), headers={**auth, "content-type": "application/json"})
        assert chunked.status_code == 413
        assert [j["id"] for j in http.get("/jobs", headers=auth).json()] == ["fine"]
        assert http.get("/openapi.json", headers=auth).json()["info"]["title"] == "pysched"


def test_the_docs_page_needs_nothing_from_outside_the_machine(api: TestClient) -> None:
    page = api.get("/docs")
    assert page.status_code == 200
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert assets and all(a.startswith("/") for a in assets), assets
    for asset in assets:
        assert api.get(asset).status_code == 200, asset


def test_without_a_token_only_loopback_names_and_no_other_site_may_write(tmp_path: Path) -> None:
    client = Client(tmp_path / "api.db")
    client.add(job("hello"))
    with client, TestClient(create_app(client, max_body_bytes=2048), base_url=LOCAL) as http:
        # DNS rebinding: another site's name pointed at 127.0.0.1.
        rebound = {"host": "rebind.evil.example:8080", "origin": "http://rebind.evil.example:8080"}
        assert http.get("/jobs", headers=rebound).status_code == 421
        assert http.post("/jobs", json=job("pwned"), headers=rebound).status_code == 421
        for name in ("localhost:8080", "127.0.0.1", "[::1]:80"):
            assert http.get("/jobs", headers={"host": name}).status_code == 200, name
        # A form another site's page posts: no body, no preflight.
        foreign = {"origin": "https://evil.example", "content-type": "application/x-www-form-urlencoded"}
        assert http.post("/jobs/hello/trigger", headers=foreign).status_code == 403
        assert http.post("/jobs/hello/pause", headers={"sec-fetch-site": "cross-site"}).status_code == 403
        # A body sent in chunks to a route that reads none.
        chunked = http.post("/jobs/hello/pause", content=iter([b"x" * 1500, b"y" * 1500]))
        assert chunked.status_code == 413
        assert client.get("hello").state == "active"
        assert client.history("hello") == []
        # Scripts (no Origin) and this origin's pages may.
        assert http.post("/jobs/hello/pause").status_code == 200
        assert http.post("/jobs/hello/resume", headers={"origin": LOCAL}).status_code == 200


def test_a_store_that_does_not_answer_is_a_503(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = Client(tmp_path / "api.db")

    def locked(job: object, **options: object) -> None:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(client, "add", locked)
    with client, TestClient(create_app(client), base_url=LOCAL) as http:
        busy = http.post("/jobs", json=job("hello"))
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
    assert busy.json()["detail"] == "the store did not answer: OperationalError: database is locked"


# -- generated requests ------------------------------------------------------------------


def _state(client: Client) -> list[tuple[str, str, int | None]]:
    return [(r.job.id, r.state, r.next_run.due_ms if r.next_run else None) for r in client.ls()]


def addressed_to_loopback(app: ASGIApp) -> ASGIApp:
    """Requests as a local client sends them (schemathesis names its own
    host; the host check has its own test)."""

    async def local(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = [(k, v) for k, v in scope["headers"] if k != b"host"]
            scope = {**scope, "headers": [*headers, (b"host", b"127.0.0.1")]}
        await app(scope, receive, send)

    return local


def test_generated_requests_find_no_server_error_and_no_partial_write(tmp_path: Path) -> None:
    client = Client(tmp_path / "gen.db")
    client.add(job("seed"))
    app = addressed_to_loopback(create_app(client))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    failures: list[str] = []
    # /health answers 503 by design when no node leads (a readiness probe).
    operations = [op.ok() for op in schema.get_all_operations() if op.ok().path != "/health"]
    assert len(operations) >= 14
    for operation in operations:

        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=operation.as_strategy())
        def check(case: Any) -> None:
            before = _state(client)
            response = case.call()
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:200]}")
                return
            case.validate_response(response, checks=[not_a_server_error])
            if response.status_code >= 400:
                assert _state(client) == before, f"{case.method} {case.path} answered {response.status_code} but wrote"

        check()
    assert failures == []
    client.close()
