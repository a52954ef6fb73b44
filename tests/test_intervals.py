"""Interval schedules (``every="5m"``, ``--every 5m``): parsed, stored, shown,
previewed and fired as APScheduler's interval trigger and Celery beat's
``schedule(run_every)`` users expect, through every face."""

from __future__ import annotations

import importlib
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

import pysched
from pysched import Client, Scheduler, durations, recurrence
from pysched.api.app import create_app
from pysched.catchup import count_missed, next_run
from pysched.declare import declared_jobs
from pysched.model import IntervalSchedule, Job
from pysched.planning import first_run, jitter_for
from pysched.protocols import MissedRuns
from tests.helpers import cli, wait_for
from tests.test_client import client, declaring_module
from tests.test_client import shell_job as job

store_client = client
LOCAL = "http://127.0.0.1"
HOUR_MS = 3_600_000


def every(seconds: float | str, start_ms: int | None = None) -> IntervalSchedule:
    return IntervalSchedule.model_validate({"every_s": seconds, "start_ms": start_ms})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("5m", 300),
        ("1h30m", 5400),
        ("2d", 172_800),
        ("1w", 604_800),
        ("1.5s", 1.5),
        ("14d6h56m7.25s", 1234567.25),
        ("1h0.001s", 3600.001),
    ],
)
def test_durations_read_as_people_write_them_and_print_back_the_same(text: str, seconds: float) -> None:
    assert durations.parse_seconds(text) == seconds
    assert durations.parse_seconds(durations.format_seconds(seconds)) == seconds


def test_an_interval_is_kept_shown_and_fired_to_the_millisecond() -> None:
    kept = every(1.0004)
    assert (kept.every_s, kept.every_ms, durations.format_seconds(kept.every_s)) == (1.0, 1000, "1s")
    assert durations.format_seconds(every(123456.5).every_s) == "1d10h17m36.5s"


@pytest.mark.parametrize("text", ["", "abc", "5 minutes", "m5", "5mm", "-5m", "inf", "nan"])
def test_a_duration_that_is_not_one_is_refused_saying_what_is(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        durations.parse_seconds(text)


@given(
    every_s=st.integers(1, 400 * 86_400),
    start_ms=st.none() | st.integers(0, 2**41),
    after_ms=st.integers(0, 2**42),
)
def test_an_interval_fires_on_its_grid_first_at_its_start(every_s: int, start_ms: int | None, after_ms: int) -> None:
    every_s = min(every_s, int(durations.MAX_INTERVAL_S))
    schedule = every(every_s, start_ms)
    nxt = recurrence.next_after(schedule, after_ms)
    assert nxt is not None and nxt > after_ms
    anchor = start_ms or 0
    assert (nxt - anchor) % (every_s * 1000) == 0 and nxt >= anchor
    # Nothing of its own is skipped between.
    assert nxt - every_s * 1000 <= after_ms or nxt == anchor


def test_an_interval_without_a_start_fires_on_its_multiples_since_1970() -> None:
    noon = int(datetime(2026, 12, 7, 12, 0, 7, tzinfo=UTC).timestamp() * 1000)
    assert recurrence.next_after(every("5m"), noon) == noon - 7_000 + 300_000
    assert recurrence.next_after(every("1h"), noon) == noon - 7_000 + HOUR_MS
    # With a start ahead: the start itself, then each interval after it.
    start = noon + 10 * HOUR_MS + 123
    assert recurrence.next_after(every("1h", start), noon) == start
    assert recurrence.next_after(every("1h", start), start) == start + HOUR_MS


def test_an_interval_job_is_planned_jittered_within_its_period_and_caught_up_by_its_policy() -> None:
    spec = {"id": "tick", "schedule": {"kind": "every", "every_s": "10s"}, "target": {"kind": "shell", "command": "x"}}
    ticking = Job.model_validate(spec)
    assert ticking.schedule == every(10)
    # The default window of a recurring job, capped by its period.
    jitter = jitter_for(ticking)
    assert 0 <= jitter < 10_000
    assert jitter_for(Job.model_validate({**spec, "critical": True})) == 0
    now = 1_000_000_000_003
    planned = first_run(ticking, jitter, now)
    assert (
        planned is not None and planned.run_at_ms == 1_000_000_010_000 and planned.due_ms == planned.run_at_ms + jitter
    )
    # Handed on an hour late: run_once runs it, skips the 359 times passed
    # over, and the next is the time due now.
    later, missed = next_run(ticking, jitter, planned.run_at_ms, planned.run_at_ms + HOUR_MS + jitter)
    assert later is not None and later.run_at_ms == planned.run_at_ms + HOUR_MS
    assert missed is not None and count_missed(ticking, missed) == 359
    assert count_missed(ticking, MissedRuns("tick", 0, 100_000, "skipped")) == 10


@pytest.mark.parametrize(
    ("every_s", "words"),
    [(0.5, "greater than or equal to 1"), (10**9, "less than or equal to"), ("soon", "not a duration")],
)
def test_an_interval_out_of_bounds_is_refused_naming_its_field(every_s: object, words: str) -> None:
    with pytest.raises(pysched.InvalidJob, match=words) as refused:
        Client(":memory:").check(job("x", schedule={"kind": "every", "every_s": every_s}))
    assert [p.field for p in refused.value.problems] == ["schedule.every_s"]


def test_the_client_stores_and_previews_an_interval_job_on_each_engine(store_client: Client) -> None:
    added = store_client.add(job("every-5m", schedule={"kind": "every", "every_s": "5m"}))
    assert added.job.schedule == every(300)
    assert added.next_run is not None and added.next_run.run_at_ms % 300_000 == 0
    fires = store_client.preview("every-5m", count=3).fires
    assert [f.at_ms - fires[0].at_ms for f in fires] == [0, 300_000, 600_000]
    assert fires[0].at_ms == added.next_run.run_at_ms
    assert {f.dst for f in fires} == {None}
    moved = store_client.reschedule("every-5m", {"kind": "every", "every_s": 3600, "start_ms": 4_000_000_000_000})
    assert moved.next_run is not None and moved.next_run.run_at_ms == 4_000_000_000_000


def test_the_http_api_takes_and_previews_an_interval(store_client: Client) -> None:
    with TestClient(create_app(store_client), base_url=LOCAL) as api:
        added = api.post("/jobs", json=job("api-tick", schedule={"kind": "every", "every_s": "90s"}))
        assert added.status_code == 201, added.text
        assert added.json()["schedule"] == {"kind": "every", "every_s": 90.0, "start_ms": None}
        preview = api.get("/preview", params={"every": "1h", "count": 2}).json()
        assert preview["every_s"] == 3600 and len(preview["fires"]) == 2
        bad = api.get("/preview", params={"every": "fortnightly"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "every_s"
        neither = api.get("/preview")
        assert neither.status_code == 422 and neither.json()["detail"][0]["field"] == "cron"
        moved = api.put("/jobs/api-tick/schedule", json={"kind": "every", "every_s": 120})
        assert moved.status_code == 200 and moved.json()["schedule"]["every_s"] == 120


def test_a_declared_interval_job_takes_a_timedelta_or_a_duration_and_a_start(tmp_path: Path) -> None:
    module = importlib.import_module(
        declaring_module(
            tmp_path,
            """
            from datetime import datetime, timedelta

            @pysched.job(every=timedelta(minutes=5))
            def five(ctx): ...

            @pysched.job(every="1d", start=datetime(2030, 1, 1, 9, 0), tz="Europe/Paris")
            def daily(ctx): ...
            """,
        )
    )
    declared = {j.id.rsplit(".", 1)[-1]: j.schedule for j in declared_jobs(module)}
    assert declared["five"] == every(300)
    paris_nine = int(datetime(2030, 1, 1, 8, 0, tzinfo=UTC).timestamp() * 1000)
    assert declared["daily"] == every(86_400, paris_nine)
    with pytest.raises(pysched.InvalidJob, match="exactly one of cron=, every= and at="):
        pysched.job(every="5m", cron="* * * * *")(module.five)
    with pytest.raises(pysched.InvalidJob, match="start= goes with every="):
        pysched.job(cron="* * * * *", start=datetime(2030, 1, 1))(module.five)


def test_the_cli_adds_shows_and_previews_an_interval_and_refuses_a_bad_one(tmp_path: Path) -> None:
    db = tmp_path / "i.db"
    added = cli("add", "tick", "--every", "1h30m", "--shell", "true", db=db)
    assert added.stdout.startswith("added tick: every 1h30m; next run "), added.stdout
    shown = json.loads(cli("show", "tick", "--json", db=db).stdout)
    assert shown["schedule"] == {"kind": "every", "every_s": 5400.0, "start_ms": None}
    cli("add", "later", "--every", "10m", "--start", "2031-05-01T10:00:00Z", "--shell", "true", db=db)
    assert "every 10m from 2031-05-01T10:00:00" in cli("show", "later", db=db).stdout
    fires = json.loads(cli("preview", "later", "--count", "2", "--json", db=db).stdout)["fires"]
    assert [f["utc"] for f in fires] == ["2031-05-01T10:00:00.000Z", "2031-05-01T10:10:00.000Z"]
    shown_alone = json.loads(
        cli("preview", "--every", "90s", "--from", "2030-01-01T00:00:00Z", "--count", "2", "--json", db=db).stdout
    )
    assert [f["utc"] for f in shown_alone["fires"]] == ["2030-01-01T00:01:30.000Z", "2030-01-01T00:03:00.000Z"]
    for args, words in (
        (("--every", "soon"), "--every: 'soon' is not a duration"),
        (("--every", "0.2s"), "--every: from 1s to 366d"),
        (("--every", "5m", "--cron", "* * * * *"), "give exactly one of --cron, --every, --at, --in"),
        (("--cron", "* * * * *", "--start", "2031-01-01T00:00:00Z"), "--start: goes with --every"),
        (("--every", "5m", "--start", "tomorrow"), "--start: not an ISO 8601 time"),
        (("--every", "5m", "--tz", "Europe/Paris"), "--tz: an interval counts elapsed time"),
    ):
        refused = cli("add", "bad", *args, "--shell", "true", db=db, check=False)
        assert refused.returncode == 2 and words in refused.stderr, (args, refused.stderr)
        assert "Traceback" not in refused.stderr
    assert [j["id"] for j in json.loads(cli("ls", "--json", db=db).stdout)] == ["later", "tick"]


def test_the_scheduler_fires_an_interval_job_every_interval(tmp_path: Path) -> None:
    module = declaring_module(
        tmp_path,
        """
        from pathlib import Path

        def tick(ctx):
            with Path(ctx.payload["path"]).open("a") as out:
                out.write(f"{round(ctx.run_at.timestamp() * 1000)}\\n")
        """,
    )
    ticks = tmp_path / "ticks"
    # On a grid of its own: half past a second, every 2 s.
    start_ms = (int(datetime.now(UTC).timestamp()) + 2) * 1000 + 500
    start = datetime.fromtimestamp(start_ms / 1000, UTC)
    with Scheduler(tmp_path / "app.db", workers=2, grace_s=5) as scheduler:
        scheduler.add_job(
            f"{module}:tick", every="2s", start=start, critical=True, id="tick", payload={"path": str(ticks)}
        )
        wait_for(lambda: ticks.exists() and len(ticks.read_text().split()) >= 3, 60, "three ticks")
    times = [int(t) for t in ticks.read_text().split()]
    # Its start, then times on its grid, none twice; how many a busy
    # machine's catch-up passed over is not this test's business.
    assert times[0] == start_ms
    assert times == sorted(set(times)) and all((t - start_ms) % 2000 == 0 for t in times)
