"""Cron evaluation, macros, seconds, and the documented DST rule."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from pysched import cron

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


def test_unknown_zone() -> None:
    with pytest.raises(cron.CronError, match="unknown time zone"):
        cron.validate("* * * * *", "Nowhere/Land")
