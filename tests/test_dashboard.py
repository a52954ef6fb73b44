"""The dashboard's pages through FastAPI's TestClient: each renders with
data, stored text stays text, an unknown job is a 404, the login cookie
opens what the token opens, and a write from another site is refused."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from pysched import Client
from pysched.api.app import create_app
from pysched.api.guard import COOKIE_TTL_S, TOKEN_COOKIE, cookie_value
from pysched.api.ui.pages import MAX_FIRES_PER_JOB, partitions_part
from pysched.client import PartitionLeader, Redriven, RunKey
from pysched.clock import ManualClock
from pysched.coord.local import SQLiteLeaseCoordinator
from pysched.protocols import FailedAttempt, RunRecord

# 2026-03-25 12:00 UTC: Paris moves its clocks forward on the 29th, at 02:00.
NOW_MS = int(datetime(2026, 3, 25, 12, tzinfo=UTC).timestamp() * 1000)
EVIL = "<script>alert('x')</script> & more"
TOKEN = "s3cret-token-0123456789"


def run(job_id: str, n: int, state: str, *, lag_ms: int = 5, error: str | None = None, group: int = 0) -> RunRecord:
    due = NOW_MS - 600_000 + n * 60_000
    dispatched = due + lag_ms
    return RunRecord(
        n, job_id, due, due, state, 1, 1, dispatched, dispatched + 2, dispatched + 1_500, "w1", error, None,
        failures=(FailedAttempt(1, "w1", dispatched + 2, dispatched + 1_500, error, "exit", True),)
        if state == "failed"
        else (),
        attempt_group=group,
    )  # fmt: skip


class Seeded(Client):
    """A real store for jobs, with the runs a node would have recorded given
    here (the browser test has a real node make them); redrives noted."""

    runs: list[RunRecord]
    redriven: list[RunKey]

    def last_runs(self, job_ids: Sequence[str]) -> dict[str, RunRecord]:
        return {r.job_id: r for r in reversed(self.runs) if r.job_id in job_ids}

    def history(self, job_id: str, limit: int = 50) -> list[RunRecord]:
        self.get(job_id)
        return [r for r in reversed(self.runs) if r.job_id == job_id][:limit]

    def dead_letters(self, limit: int = 1000) -> list[RunRecord]:
        return [r for r in self.runs if r.state == "failed"][:limit]

    def redrive(self, keys: Iterable[RunKey]) -> Redriven:
        keys = list(keys)
        self.redriven.extend(keys)
        return Redriven(tuple(keys), ())


@pytest.fixture
def seeded(tmp_path: Path) -> Iterator[Seeded]:
    with Seeded(tmp_path / "d.db", clock=ManualClock(NOW_MS)) as client:
        client.redriven = []
        for job_id, expr in (("nightly", "30 2 * * *"), ("often", "*/10 * * * *")):
            client.add(
                {
                    "id": job_id,
                    "schedule": {"kind": "cron", "expr": expr, "tz": "Europe/Paris"},
                    "target": {"kind": "shell", "command": "exit 3"},
                }
            )
        client.runs = [
            run("often", 1, "succeeded", lag_ms=3),
            run("often", 2, "succeeded", lag_ms=40),
            run("often", 3, "succeeded", lag_ms=700),
            run("nightly", 4, "failed", error=EVIL, group=0),
        ]
        yield client


@pytest.fixture
def http(seeded: Seeded) -> Iterator[TestClient]:
    with TestClient(create_app(seeded), base_url="http://127.0.0.1") as client:
        yield client


def cells(page: dict[str, Any], part: str) -> list[list[str]]:
    return [[c["text"] for c in row] for row in page["parts"][part]["rows"]]


def test_the_overview_shows_upcoming_fires_the_lag_distribution_and_recent_runs(http: TestClient) -> None:
    page = http.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert '<a href="/ui/jobs/often">often</a>' in page.text
    # What happened first, then the fires to come, which are the longest part.
    headings = re.findall(r"<h2>([^<]+)", page.text)
    assert headings == ["Fire lag", "Recent runs", "Jobs", "Upcoming fires"]
    live = http.get("/", params={"parts": 1}).json()
    # A row a job: six fires of */10 in the next hour folded under their
    # count, the first the job's stored next run.
    (often,) = live["parts"]["upcoming"]["rows"]
    assert [often[0]["text"], often[1]["text"]] == ["often", "6 fires"]
    assert len(often[1]["details"]) == 6 and often[1]["details"][0].startswith(often[2]["text"] + " · due ")
    assert "<details><summary>6 fires</summary><ul><li>" in page.text
    assert live["parts"]["upcoming"]["caption"] == "6 fires of 1 job in the next 60 minutes"
    # A day: often's next run first; nightly's one fire; often's fires
    # counted whole, MAX_FIRES_PER_JOB of them listed.
    day_page = http.get("/", params={"parts": 1, "minutes": 24 * 60}).json()
    day = {row[0]["text"]: row[1] for row in day_page["parts"]["upcoming"]["rows"]}
    assert list(day) == ["often", "nightly"]
    assert (day["nightly"]["text"], len(day["nightly"]["details"])) == ("1 fire", 1)
    # 143 of */10 in the day from its next, and nightly's.
    assert day["often"]["text"] == "143 fires"
    assert day["often"]["details"][MAX_FIRES_PER_JOB:] == [f"… and {143 - MAX_FIRES_PER_JOB} more"]
    assert day_page["parts"]["upcoming"]["caption"].startswith("144 fires of 2 jobs in the next 1440 minutes")
    # Times say their zone.
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+", often[2]["text"])
    # A bad window is a page that says so, not JSON in its place.
    bad = http.get("/", params={"minutes": "abc"})
    assert bad.status_code == 422 and bad.headers["content-type"].startswith("text/html")
    assert "window, minutes: a whole number from 1" in bad.text
    lag = {row[0]: row[1] for row in cells(live, "lag")}
    assert (lag["0 ms to 10 ms"], lag["10 ms to 50 ms"], lag["500 ms to 1.00 s"]) == ("2", "1", "1")
    assert live["parts"]["lag"]["caption"].startswith("4 runs sampled · p50 5 ms")
    recent = cells(live, "recent")
    assert [(r[0], r[2]) for r in recent][:2] == [("nightly", "failed"), ("often", "succeeded")]
    assert recent[0][5] == "1.50 s"


def test_stored_text_is_shown_as_text(http: TestClient) -> None:
    for path in ("/", "/ui/jobs/nightly", "/ui/dead-letters"):
        page = http.get(path).text
        assert "<script>alert" not in page, path
        assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in page, path
    # The script writes cells with textContent: the JSON carries the text as it is.
    assert cells(http.get("/", params={"parts": 1}).json(), "recent")[0][6] == EVIL
    shown = http.get("/ui/dead-letters", params={"notice": "<b>hi</b>"}).text
    assert "<b>hi</b>" not in shown and "&lt;b&gt;hi&lt;/b&gt;" in shown


def test_the_job_page_shows_the_definition_history_and_next_fires_with_dst_notes(http: TestClient) -> None:
    page = http.get("/ui/jobs/nightly")
    assert page.status_code == 200
    assert "30 2 * * *" in page.text and "Europe/Paris" in page.text and "exit 3" in page.text
    # JSON's words, as `pysched show` prints them.
    assert "<td>false</td>" in page.text and "False" not in page.text
    live = http.get("/ui/jobs/nightly", params={"parts": 1}).json()
    fires = cells(live, "fires")
    assert len(fires) == 10
    # 02:30 on the 29th does not exist in Paris: the fire moves to 03:00.
    noted = [row for row in fires if row[3]]
    assert len(noted) == 1 and noted[0][3].startswith("moved: 02:30 did not exist")
    assert [row[2] for row in cells(live, "runs")] == ["failed"]


def test_an_unknown_job_is_a_404_page(http: TestClient) -> None:
    page = http.get("/ui/jobs/nope")
    assert page.status_code == 404 and "There is no job <code>nope</code>" in page.text
    assert http.get("/ui/jobs/nope", params={"parts": 1}).status_code == 404


def test_partitions_show_their_leaders(http: TestClient, seeded: Seeded) -> None:
    page = http.get("/ui/partitions", params={"parts": 1}).json()
    assert cells(page, "partitions") == [["none", "unled", "0-63", "64", "", ""]]
    assert page["parts"]["partitions"]["caption"] == "0 of 64 partitions led"
    # One row for the node leading all 64, one for the node standing by.
    coordinator = SQLiteLeaseCoordinator(seeded.db)
    coordinator.poll("node-a", NOW_MS)
    coordinator.poll("node-b", NOW_MS)
    page = http.get("/ui/partitions", params={"parts": 1}).json()
    led, standby = cells(page, "partitions")
    assert led[:5] == ["node-a", "leading", "0-63", "64", "1"] and led[5].endswith("(in 5.00 s)")
    assert standby == ["node-b", "standing by", "", "0", "", ""]
    assert page["parts"]["partitions"]["caption"] == "64 of 64 partitions led · 1 node standing by"
    assert "node-b" in http.get("/ui/partitions").text


def test_a_nodes_partitions_are_one_row_with_each_fence_folded_under_them_where_they_differ() -> None:
    leaders = [PartitionLeader(p, "node-a" if p % 4 else "node-b", 100 + p, None) for p in range(8)]
    leaders[5] = PartitionLeader(5, None, None, None)
    rows = partitions_part(leaders, [], NOW_MS).rows
    shown = [[c.text for c in row] for row in rows]
    assert shown == [
        ["node-b", "leading", "0,4", "2", "100..104", ""],
        ["node-a", "leading", "1-3,6-7", "5", "101..107", ""],
        ["none", "unled", "5", "1", "", ""],
    ]
    assert rows[0][4].details == ("partition 0: fence 100", "partition 4: fence 104")
    one = partitions_part([PartitionLeader(p, "node-a", 7, None) for p in range(64)], [], NOW_MS).rows
    assert [[c.text for c in row] for row in one] == [["node-a", "leading", "0-63", "64", "7", ""]]
    assert one[0][4].details is None


def test_a_dead_letter_is_redriven_from_its_button_but_not_from_another_site(http: TestClient, seeded: Seeded) -> None:
    page = http.get("/ui/dead-letters")
    form = re.search(r'<form method="post" action="(/ui/dead-letters/redrive)">(.*?)</form>', page.text)
    assert form is not None
    fields = dict(re.findall(r'name="(\w+)" value="([^"]*)"', form.group(2)))
    assert fields == {"job_id": "nightly", "run_at_ms": str(seeded.runs[3].run_at_ms), "group": "0"}
    for origin in ({"origin": "http://evil.example"}, {}, {"referer": "http://evil.example/x"}):
        refused = http.post(form.group(1), data=fields, headers=origin, follow_redirects=False)
        assert refused.status_code == 403, origin
    assert seeded.redriven == []
    done = http.post(form.group(1), data=fields, headers={"origin": "http://127.0.0.1"}, follow_redirects=False)
    assert done.status_code == 303
    assert seeded.redriven == [RunKey("nightly", seeded.runs[3].run_at_ms, 0)]
    assert "Redriven: nightly:" in http.get(done.headers["location"]).text
    bad = http.post(form.group(1), data={"job_id": "x"}, headers={"origin": "http://127.0.0.1"})
    assert bad.status_code == 400


def test_without_a_token_there_is_no_login(http: TestClient) -> None:
    assert http.get("/login", follow_redirects=False).headers["location"] == "/"
    assert "Log out" not in http.get("/").text


def test_with_a_token_the_login_cookie_opens_the_pages_and_api_and_guards_writes(seeded: Seeded) -> None:
    with TestClient(create_app(seeded, token=TOKEN)) as http:
        assert http.get("/", follow_redirects=False).headers["location"] == "/login"
        assert http.get("/ui/jobs/often", follow_redirects=False).status_code == 303
        assert http.get("/jobs").status_code == 401
        assert http.get("/ui/static/dashboard.css").status_code == 200
        assert http.get("/login").status_code == 200
        same = {"origin": "http://testserver"}
        assert http.post("/login", data={"token": TOKEN}, headers={"origin": "http://evil.example"}).status_code == 403
        wrong = http.post("/login", data={"token": "not-the-token-at-all"}, headers=same, follow_redirects=False)
        assert wrong.status_code == 401 and TOKEN_COOKIE not in wrong.cookies
        ok = http.post("/login", data={"token": TOKEN}, headers=same, follow_redirects=False)
        assert ok.status_code == 303
        cookie = ok.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and TOKEN not in cookie
        assert http.get("/").status_code == 200 and "Log out" in http.get("/").text
        assert http.get("/jobs").status_code == 200
        # A write with the cookie alone needs this origin; the bearer token does not.
        body = {"runs": ["ghost:1:0"]}
        assert http.post("/dead-letters/redrive", json=body).status_code == 403
        assert http.post("/dead-letters/redrive", json=body, headers=same).status_code == 200
        http.cookies.clear()
        assert http.get("/jobs").status_code == 401
        assert http.get("/jobs", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
        http.cookies.set(TOKEN_COOKIE, "0" * 64)
        assert http.get("/jobs").status_code == 401
        # A login is good for COOKIE_TTL_S.
        now = int(time.time())
        http.cookies.set(TOKEN_COOKIE, cookie_value(TOKEN, now - 60))
        assert http.get("/jobs").status_code == 200
        http.cookies.set(TOKEN_COOKIE, cookie_value(TOKEN, now - COOKIE_TTL_S - 60))
        assert http.get("/jobs").status_code == 401
        assert "Max-Age=43200" in cookie


def test_a_run_cancelled_while_waiting_for_its_retry_shows_no_lag_and_is_not_sampled(
    http: TestClient, seeded: Seeded
) -> None:
    # Handed on and failed ten minutes ago, owed again in an hour, then
    # cancelled: the row keeps the first delivery's times.
    dispatched = NOW_MS - 600_000
    cancelled = RunRecord(
        9, "nightly", dispatched, NOW_MS + 3_600_000, "cancelled", 1, 1, dispatched, dispatched + 2, NOW_MS,
        "w1", "exit status 3", None,
    )  # fmt: skip
    seeded.runs.append(cancelled)
    live = http.get("/ui/jobs/nightly", params={"parts": 1}).json()
    shown = [row for row in cells(live, "runs") if row[2] == "cancelled"]
    assert [(row[4], row[5]) for row in shown] == [("", "")]
    overview = http.get("/", params={"parts": 1}).json()
    assert overview["parts"]["lag"]["caption"].startswith("4 runs sampled · p50 5 ms")
    assert {row[0]: row[1] for row in cells(overview, "lag")}["early (< 0)"] == "0"
