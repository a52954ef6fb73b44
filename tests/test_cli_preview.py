"""`pysched preview`: next fires, local and UTC, with the DST rule's marks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import cli, cli_json


def test_preview_an_expression_marks_the_merged_gap(db_path: Path) -> None:
    got = cli_json(
        "preview", "--cron", "*/30 2 * * *", "--tz", "America/New_York", "--from", "2027-03-14T00:00", db=db_path
    )
    assert got["tz"] == "America/New_York" and got["jitter_ms"] is None
    first, second = got["fires"][:2]
    assert first["utc"] == "2027-03-14T07:00:00.000Z" and first["local"] == "2027-03-14T03:00:00-04:00"
    assert first["dst"].startswith("merged: 02:00, 02:30 did not exist")
    assert second["utc"] == "2027-03-15T06:00:00.000Z" and second["dst"] is None
    assert not db_path.exists()  # an expression alone needs no database


def test_preview_marks_both_copies_of_a_repeated_hour(db_path: Path) -> None:
    got = cli_json(
        "preview", "--cron", "0 * * * *", "--tz", "America/New_York", "--from", "2027-11-07T00:30",
        "--count", "3", db=db_path,
    )  # fmt: skip
    assert [f["utc"][11:16] for f in got["fires"]] == ["05:00", "06:00", "07:00"]
    assert [f["dst"] for f in got["fires"]][:2] == [
        "repeated wall time: its first occurrence",
        "repeated wall time: its second occurrence",
    ]


def test_preview_a_registered_job_shows_its_due_times(db_path: Path) -> None:
    cli("add", "nightly", "--cron", "30 1 * * *", "--tz", "Europe/Berlin", "--shell", "true", db=db_path)
    got = cli_json("preview", "nightly", "--from", "2027-10-30T12:00", "--count", "2", db=db_path)
    jitter = got["jitter_ms"]
    assert got["expr"] == "30 1 * * *" and 0 <= jitter <= 60_000
    assert [f["utc"] for f in got["fires"]] == ["2027-10-30T23:30:00.000Z", "2027-11-01T00:30:00.000Z"]
    assert got["fires"][0]["due_utc"] != got["fires"][0]["utc"] or jitter == 0
    text = cli("preview", "nightly", "--from", "2027-10-30T12:00", "--count", "2", db=db_path).stdout
    assert "due (UTC)" in text and "2027-10-31T01:30:00+02:00" in text


def test_preview_an_interval_from_its_start(db_path: Path) -> None:
    args = ("--every", "10s", "--start", "2027-01-01T00:00:07", "--from", "2027-01-01T00:00:00", "--count", "3")
    got = cli_json("preview", *args, db=db_path)
    assert got["start_utc"] == "2027-01-01T00:00:07.000Z"
    assert [f["utc"] for f in got["fires"]] == [
        "2027-01-01T00:00:07.000Z",
        "2027-01-01T00:00:17.000Z",
        "2027-01-01T00:00:27.000Z",
    ]
    assert not db_path.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cron", "0 0 */8 * 1#5"], "--cron: '0 0 */8 * 1#5' never fires"),
        (["--cron", "* * * * *", "--tz", "America"], "--tz: unknown time zone 'America'"),
        (["--cron", "* * * * *", "--from", "soon"], "--from: not an ISO 8601 time"),
        (["--cron", "* * * * *", "--count", "0"], "--count"),
        ([], "give one of a job ID, --cron and --every"),
        (["--every", "fortnightly"], "--every: 'fortnightly' is not a duration"),
        (["--every", "5m", "--cron", "* * * * *"], "(got --cron, --every)"),
        (["--cron", "* * * * *", "--start", "2027-01-01T00:00"], "--start: goes with --every"),
        (["--every", "10s", "--start", "soon"], "--start: not an ISO 8601 time"),
    ],
)
def test_preview_refuses_bad_input(db_path: Path, args: list[str], message: str) -> None:
    proc = cli("preview", *args, db=db_path, check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_preview_of_an_unknown_job(db_path: Path) -> None:
    cli("add", "x", "--in", "100", "--shell", "true", db=db_path)
    proc = cli("preview", "ghost", db=db_path, check=False)
    assert proc.returncode == 3
