"""What a new job must satisfy, checked before anything is stored, whichever
face registers it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pysched.admission import MAX_AHEAD_MS, SHELL_STRING_LIMIT_BYTES, JobRejected
from pysched.model import Job, OnceSchedule
from pysched.registry import register, register_many, reschedule
from pysched.stores.sqlite import SQLiteScheduleStore

NOW = 1_800_000_000_000


def job(job_id: str, **spec: object) -> Job:
    base: dict[str, object] = {
        "id": job_id,
        "schedule": {"kind": "once", "run_at_ms": NOW + 60_000},
        "target": {"kind": "shell", "command": "true"},
    }
    return Job.model_validate({**base, **spec})


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"schedule": {"kind": "once", "run_at_ms": NOW + MAX_AHEAD_MS + 1}}, "schedule.run_at_ms"),
        ({"critical": True, "jitter_window_s": 30}, "jitter_window_s"),
        ({"target": {"kind": "http", "url": "http://exa mple.org/"}}, "target.url"),
        ({"target": {"kind": "http", "url": "http://example.org:99999/"}}, "target.url"),
        ({"target": {"kind": "shell", "command": "x" * (SHELL_STRING_LIMIT_BYTES + 1)}}, "target.command"),
        ({"payload": {"blob": "x" * SHELL_STRING_LIMIT_BYTES}}, "payload"),
        ({"target": {"kind": "python", "ref": "m:f"}, "payload": {"blob": "x" * 1024 * 1024}}, "payload"),
    ],
)
def test_a_job_that_could_never_run_is_refused_and_nothing_is_stored(
    tmp_path: Path, spec: dict[str, object], field: str
) -> None:
    store = SQLiteScheduleStore(tmp_path / "db")
    with pytest.raises(JobRejected) as refused:
        register(store, job("bad", **spec), NOW)
    assert refused.value.field == field
    # One bad job in a bulk registration: none of it is stored.
    with pytest.raises(JobRejected):
        register_many(store, [job("good"), job("bad", **spec)], NOW)
    assert store.list_jobs() == []


def test_what_fits_is_accepted(tmp_path: Path) -> None:
    store = SQLiteScheduleStore(tmp_path / "db")
    register(store, job("far", schedule={"kind": "once", "run_at_ms": NOW + MAX_AHEAD_MS}), NOW)
    register(store, job("py", target={"kind": "python", "ref": "m:f"}, payload={"blob": "x" * 500_000}), NOW)
    register(store, job("web", target={"kind": "http", "url": "https://example.org:8443/a%20b?q=1"}), NOW)
    assert [r.job.id for r in store.list_jobs()] == ["far", "py", "web"]


def test_a_reschedule_beyond_the_horizon_changes_nothing(tmp_path: Path) -> None:
    store = SQLiteScheduleStore(tmp_path / "db")
    before = register(store, job("j"), NOW)
    with pytest.raises(JobRejected):
        reschedule(store, "j", OnceSchedule(run_at_ms=NOW + MAX_AHEAD_MS + 1), NOW)
    assert store.get_job("j") == before
