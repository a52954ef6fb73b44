"""Cron evaluation, macros, seconds, and the documented DST rule."""

from __future__ import annotations

import re
import time
import zoneinfo
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from pysched import cron
from pysched.model import Job
from pysched.planning import jitter_for

NY = ZoneInfo("America/New_York")


def ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def fires(expr: str, tz: str, start: datetime, n: int) -> list[datetime]:
    out, at = [], ms(start)
    for _ in range(n):
        nxt = cron.next_after(expr, tz, at)
        assert nxt is not None
        out.append(datetime.fromtimestamp(nxt / 1000, UTC))
        at = nxt
    return out


def test_seconds_field_comes_first() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert fires("*/20 * * * * *", "UTC", start, 3) == [datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC) for s in (20, 40)] + [
        datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    ]


@pytest.mark.parametrize(
    ("macro", "expected"),
    [
        ("@hourly", datetime(2026, 1, 1, 1, tzinfo=UTC)),
        ("@daily", datetime(2026, 1, 2, tzinfo=UTC)),
        ("@weekly", datetime(2026, 1, 4, tzinfo=UTC)),
        ("@monthly", datetime(2026, 2, 1, tzinfo=UTC)),
        ("@yearly", datetime(2027, 1, 1, tzinfo=UTC)),
    ],
)
def test_macros(macro: str, expected: datetime) -> None:
    assert fires(macro, "UTC", datetime(2026, 1, 1, tzinfo=UTC), 1) == [expected]


def test_strictly_after_a_fractional_start() -> None:
    start = ms(datetime(2026, 1, 1, tzinfo=UTC)) + 1
    assert cron.next_after("* * * * * *", "UTC", start) == start - 1 + 1_000


def test_evaluated_in_the_jobs_zone() -> None:
    (fire,) = fires("0 9 * * *", "America/New_York", datetime(2026, 6, 1, tzinfo=UTC), 1)
    assert fire == datetime(2026, 6, 1, 13, tzinfo=UTC)  # 09:00 EDT


def test_dst_gap_fires_at_the_end_of_the_gap() -> None:
    # 2026-03-08 02:00 EST -> 03:00 EDT: 02:30 does not exist that day.
    got = fires("30 2 * * *", "America/New_York", datetime(2026, 3, 7, 12, tzinfo=UTC), 3)
    assert [g.astimezone(NY).strftime("%m-%d %H:%M") for g in got] == ["03-08 03:00", "03-09 02:30", "03-10 02:30"]


def test_dst_repeat_fires_a_fixed_hour_job_once() -> None:
    # 2026-11-01 02:00 EDT -> 01:00 EST: 01:30 happens twice.
    got = fires("30 1 * * *", "America/New_York", datetime(2026, 10, 31, 12, tzinfo=UTC), 2)
    assert got == [datetime(2026, 11, 1, 5, 30, tzinfo=UTC), datetime(2026, 11, 2, 6, 30, tzinfo=UTC)]


def test_dst_repeat_keeps_hourly_jobs_hourly_in_real_time() -> None:
    got = fires("0 * * * *", "America/New_York", datetime(2026, 11, 1, 4, 30, tzinfo=UTC), 4)
    assert got == [datetime(2026, 11, 1, h, tzinfo=UTC) for h in (5, 6, 7, 8)]


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("61 * * * *", "Bad minute"),
        ("* 25 * * *", "Bad hour"),
        ("* * * *", "expected 5 fields"),
        ("@often", "unknown macro"),
    ],
)
def test_invalid_expressions(expr: str, message: str) -> None:
    with pytest.raises(cron.CronError, match=message):
        cron.validate(expr)


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("*/61 * * * *", "Bad minute: step 61 is outside 1-60"),
        ("0 */25 * * *", "Bad hour: step 25 is outside 1-24"),
        ("0 0 * * */8", "Bad day-of-week: step 8 is outside 1-7"),
        ("0 " + "1" * 3000 + " * * *", "longer than 1,000 characters"),
        ("0 " + "1" * 990 + " * * *", "Bad hour: a number of 990 digits is outside 0-23"),
        ("0 0 1/" + "7" * 900 + " * *", "Bad day-of-month: step"),
        ("* " * 501, "longer than 1,000 characters"),
    ],
)
def test_oversized_input_is_refused_at_once(expr: str, message: str) -> None:
    best = float("inf")
    for _ in range(5):
        cron.compile_expr.cache_clear()
        start = time.perf_counter()
        with pytest.raises(cron.CronError, match=re.escape(message)):
            cron.validate(expr)
        best = min(best, time.perf_counter() - start)
    assert best < 0.001


@pytest.mark.parametrize("expr", ["0 0 */8 * 1#5", "0 0 31 2 *", "0 0 30 2 *", "0 0 */10 2 1#5"])
def test_an_expression_that_never_fires_is_refused(expr: str) -> None:
    with pytest.raises(cron.CronError, match="never fires"):
        cron.validate(expr)


@pytest.mark.parametrize("expr", ["0 0 29 2 *", "0 0 * 2 1#5", "0 0 LW 2 *", "0 0 31 * 5L"])
def test_a_rare_expression_is_accepted(expr: str) -> None:
    cron.validate(expr)
    assert cron.next_after(expr, "UTC", ms(datetime(2026, 1, 1, tzinfo=UTC))) is not None


@pytest.mark.parametrize("tz", ["localtime", "posixrules", "Factory", "posix/UTC", "right/UTC"])
def test_machine_dependent_zones_are_refused(tz: str) -> None:
    with pytest.raises(cron.CronError, match="depends on the machine"):
        cron.validate("* * * * *", tz)


def test_a_region_is_not_a_zone() -> None:
    with pytest.raises(cron.CronError, match="a region, not a zone"):
        cron.validate("* * * * *", "America")


def test_unknown_zone() -> None:
    with pytest.raises(cron.CronError, match="unknown time zone"):
        cron.validate("* * * * *", "Nowhere/Land")


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# Issue 11's reproducers: (expr, zone, after, the fires that must follow).
REPRODUCERS = [
    # Fixed hour, every 30 minutes through the repeated hour: once each, then the next day.
    ("*/30 1 * * *", "America/New_York", "2027-11-07T04:00", ["11-07T05:00", "11-07T05:30", "11-08T06:00"]),
    # Every 30 minutes in a skipped hour: one run at the gap's end.
    ("*/30 2 * * *", "America/New_York", "2027-03-14T06:00", ["03-14T07:00", "03-15T06:00", "03-15T06:30"]),
    # Every other hour: 02:00 is skipped and runs at 03:00.
    ("0 */2 * * *", "America/New_York", "2027-03-14T06:30", ["03-14T07:00", "03-14T08:00"]),
    # 02:30 happens twice in Berlin: it runs once.
    ("30 */2 * * *", "Europe/Berlin", "2027-10-30T23:00", ["10-31T00:30", "10-31T03:30"]),
    # The 6-field form follows the same rule.
    ("0 30 1 * * *", "America/New_York", "2027-11-07T05:00", ["11-07T05:30", "11-08T06:30"]),
    # Apia skipped 2011-12-30: its noon runs at the first instant after, in both forms.
    ("0 0 12 * * *", "Pacific/Apia", "2011-12-29T12:00", ["12-29T22:00", "12-30T10:00", "12-30T22:00"]),
    ("0 12 * * *", "Pacific/Apia", "2011-12-29T12:00", ["12-29T22:00", "12-30T10:00", "12-30T22:00"]),
    # Lord Howe's 30-minute change: the 06:00 run is kept.
    ("0 */6 * * *", "Australia/Lord_Howe", "2028-09-30T14:00", ["09-30T19:00", "10-01T01:00"]),
    # Santiago changes at midnight: 00:00 does not exist and runs at 01:00.
    ("0 0 * * *", "America/Santiago", "2026-09-05T12:00", ["09-06T04:00", "09-07T03:00"]),
    # Every hour: both copies of a repeated hour, nothing for a skipped one.
    ("0 * * * *", "America/New_York", "2027-11-07T04:30", ["11-07T05:00", "11-07T06:00", "11-07T07:00"]),
    ("0 * * * *", "America/New_York", "2027-03-14T06:30", ["03-14T07:00", "03-14T08:00"]),
]


@pytest.mark.parametrize(("expr", "tz", "after", "expected"), REPRODUCERS)
def test_dst_reproducers(expr: str, tz: str, after: str, expected: list[str]) -> None:
    got = fires(expr, tz, utc(after), len(expected))
    assert [g.strftime("%m-%dT%H:%M") for g in got] == expected


def test_an_expression_cronsim_loops_on_is_answered_at_once() -> None:
    # cronsim never returns on this one; pysched's evaluation is bounded.
    after = utc("2027-04-03T08:53:44")
    start = time.perf_counter()
    got = fires("*/15 45-53/10 0-22/3 1-6 4 *", "Pacific/Chatham", after, 3)
    assert time.perf_counter() - start < 1.0
    assert got == [utc("2027-04-03T11:00:00"), utc("2027-04-03T11:00:15"), utc("2027-04-03T11:00:30")]


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("5-5/20 * * * *", ["00:05", "01:05"]),  # a step keeps its range's start: {5}
        ("0 0 * * 1/2", ["01-02", "01-04", "01-05", "01-07"]),  # 1,3,5,7: Fri 2, Sun 4, Mon 5, Wed 7
        ("0 0 13 * 5", ["01-02", "01-09"]),  # both day fields restricted: either matches
        ("0 0 */13 * 5", ["02-27", "03-27"]),  # one starts with *: both must (a 1st, 14th, 27th, Friday)
    ],
)
def test_field_semantics(expr: str, expected: list[str]) -> None:
    got = fires(expr, "UTC", datetime(2026, 1, 1, tzinfo=UTC), len(expected))
    fmt = "%H:%M" if ":" in expected[0] else "%m-%d"
    assert [g.strftime(fmt) for g in got] == expected


def test_the_jitter_window_does_not_depend_on_the_day_of_registration() -> None:
    job = Job.model_validate(
        {
            "id": "payroll",
            "schedule": {"kind": "cron", "expr": "0 2,3 * * *", "tz": "Australia/Lord_Howe"},
            "target": {"kind": "shell", "command": "true"},
            "jitter_window_s": 3600,
        }
    )
    # On Lord Howe's DST night 02:00 runs at 02:30 and 03:00 half an hour
    # later: a period measured then would halve this job's window.
    dst_night = fires("0 2,3 * * *", "Australia/Lord_Howe", utc("2028-09-30T14:00"), 2)
    assert dst_night[1] - dst_night[0] == timedelta(minutes=30)
    assert cron.nominal_period_ms("0 2,3 * * *") == 3_600_000
    assert job.jitter_window_ms(cron.nominal_period_ms(job.schedule.expr)) == 3_600_000  # type: ignore[union-attr]
    assert jitter_for(job) == jitter_for(Job.model_validate_json(job.model_dump_json()))


@pytest.mark.parametrize(
    ("expr", "note"),
    [
        ("30 2 * * *", "moved: 02:30 did not exist"),
        ("0,30 2 * * *", "merged: 02:00, 02:30 did not exist"),
        ("0 2,3 * * *", "merged: 02:00 did not exist"),  # 03:00 is the same run
        ("0 3 * * *", None),
    ],
)
def test_dst_note_says_what_the_rule_did(expr: str, note: str | None) -> None:
    fire = cron.next_after(expr, "America/New_York", ms(utc("2027-03-14T05:00")))
    assert fire == ms(utc("2027-03-14T07:00"))
    got = cron.dst_note(expr, "America/New_York", fire)
    assert got == note if note is None else (got or "").startswith(note)


def test_a_rare_expression_has_no_nominal_period_and_costs_little() -> None:
    # Fires decades apart (a fifth Monday in February): a period of more than
    # a year caps no jitter window, and finding that must not take seconds.
    start = time.perf_counter()
    assert cron.nominal_period_ms("0 0 * 2 1#5") is None
    assert cron.nominal_period_ms("0 0 1 1 *") == 365 * 86_400_000
    assert time.perf_counter() - start < 0.5


def test_an_offset_change_at_the_first_instant_of_a_year() -> None:
    # Antarctica/Casey went from UTC to +08 at 1969-01-01T00:00Z: its 03:00
    # of that day did not exist and runs at the gap's end.
    got = fires("0 3 * * *", "Antarctica/Casey", utc("1968-12-31T12:00"), 2)
    assert got == [utc("1969-01-01T00:00"), utc("1969-01-01T19:00")]


def test_leading_zeros_keep_a_number_as_it_was() -> None:
    # Stored before pysched parsed its own expressions: cronsim read 00001
    # as minute 1, and such a job must keep firing after an upgrade.
    assert cron.next_after("00001 * * * *", "UTC", 0) == 60_000
    assert cron.next_after("*/015 * * * *", "UTC", 0) == 15 * 60_000


def test_zones_come_from_the_tzdata_package_whatever_the_machine_has(tmp_path: Path) -> None:
    # Nodes with different system tz data must fire a job at one instant: a
    # machine whose own copy says Vancouver is UTC changes nothing.
    from importlib import resources

    from pysched import zones

    fake = tmp_path / "America" / "Vancouver"
    fake.parent.mkdir()
    fake.write_bytes(resources.files("tzdata").joinpath("zoneinfo", "UTC").read_bytes())
    zoneinfo.reset_tzpath(to=[str(tmp_path)])
    zoneinfo.ZoneInfo.clear_cache()
    try:
        assert zoneinfo.ZoneInfo("America/Vancouver").utcoffset(datetime(2026, 1, 15)) == timedelta(0)
        assert zones.load("America/Vancouver").utcoffset(datetime(2026, 1, 15)) == timedelta(hours=-8)
    finally:
        zoneinfo.reset_tzpath()
        zoneinfo.ZoneInfo.clear_cache()
