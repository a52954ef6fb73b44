"""pysched.Client against both engines: the same calls, results and errors
on the embedded database and on the cluster's servers."""

from __future__ import annotations

import importlib
import shutil
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import pysched
from pysched import Client, InvalidJob, JobExists, JobNotActive, JobNotFound
from pysched.client import RunKey
from pysched.clock import ManualClock
from pysched.leader.recording import record_sent
from pysched.protocols import SETTLE_MS
from tests.conftest import cluster_config_for
from tests.helpers import now_ms, write_config


@pytest.fixture(params=["sqlite", pytest.param("cluster", marks=pytest.mark.cluster)])
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Client]:
    if request.param == "sqlite":
        opened = Client(tmp_path / "client.db")
    else:
        services = request.getfixturevalue("services")
        config = cluster_config_for(services, request.getfixturevalue("keyspace"), partitions=4, kafka_partitions=2)
        opened = Client(config=write_config(tmp_path / "cluster.toml", config.model_dump()))
    with opened:
        yield opened


def shell_job(job_id: str, **changes: Any) -> dict[str, Any]:
    return {
        "id": job_id,
        "schedule": {"kind": "cron", "expr": "0 9 * * *", "tz": "Europe/Paris"},
        "target": {"kind": "shell", "command": "true"},
        **changes,
    }


def test_a_job_added_is_read_back_with_its_first_run(client: Client) -> None:
    rec = client.add(shell_job("report", retry={"retries": 5}))
    assert rec.state == "active" and rec.next_run is not None
    got = client.get("report")
    assert got.job == rec.job and got.job.retry.retries == 5
    assert got.next_run == rec.next_run
    assert [r.job.id for r in client.ls()] == ["report"]
    assert client.history("report") == []
    assert client.missed([got]) == {"report": dict.fromkeys(client.missed([got])["report"], 0)}


def test_a_refused_job_names_its_fields_and_stores_nothing(client: Client) -> None:
    with pytest.raises(InvalidJob) as refused:
        client.add(shell_job("Bad id!", schedule={"kind": "cron", "expr": "61 * * * *"}, jitter_window_s=-1))
    fields = {p.field for p in refused.value.problems}
    assert fields == {"id", "schedule.expr", "jitter_window_s"}
    assert "ASCII letters" in str(refused.value)
    # Admission, past the model: a payload too large for the limit.
    with pytest.raises(InvalidJob) as too_big:
        client.add(shell_job("big", payload={"x": "y" * (1024 * 1024)}))
    assert [p.field for p in too_big.value.problems] == ["payload"]
    assert client.ls() == []


def test_an_id_is_added_once(client: Client) -> None:
    client.add(shell_job("once"))
    with pytest.raises(JobExists):
        client.add(shell_job("once", target={"kind": "shell", "command": "false"}))
    assert client.get("once").job.target.model_dump()["command"] == "true"


def test_add_many_checks_every_job_before_storing_any(client: Client) -> None:
    client.add(shell_job("a"))
    with pytest.raises(InvalidJob):
        client.add_many([shell_job("b"), shell_job("c", schedule={"kind": "cron", "expr": "nope"})])
    assert [r.job.id for r in client.ls()] == ["a"]
    with pytest.raises(InvalidJob, match="given more than once: b"):
        client.add_many([shell_job("b"), shell_job("b")])
    # The job at fault is named as POST /jobs/batch names it: by its place.
    every_0 = shell_job("m2", schedule={"kind": "every", "every_s": "0"})
    with pytest.raises(InvalidJob) as at_fault:
        client.add_many([shell_job("m1"), every_0])
    assert [p.field for p in at_fault.value.problems] == ["jobs.1.schedule.every_s"]
    with pytest.raises(InvalidJob) as importing:
        client.add_many([shell_job("m1", target={"kind": "python", "ref": "nosuchmod:f"})])
    assert [p.field for p in importing.value.problems] == ["jobs.0.target.ref"]
    added = client.add_many([shell_job("a"), shell_job("b"), pysched.Job.model_validate(shell_job("c"))])
    assert added == pysched.AddedMany(added=("b", "c"), existing=("a",))
    assert sorted(r.job.id for r in client.ls()) == ["a", "b", "c"]


def test_a_job_is_paused_resumed_rescheduled_and_cancelled(client: Client) -> None:
    client.add(shell_job("life"))
    assert client.pause("life").state == "paused"
    with pytest.raises(JobNotActive):
        client.pause("life")
    assert client.resume("life").state == "active"
    moved = client.reschedule("life", {"kind": "cron", "expr": "30 10 * * *", "tz": "UTC"})
    assert moved.job.schedule == pysched.CronSchedule(expr="30 10 * * *", tz="UTC")
    with pytest.raises(InvalidJob) as bad:
        client.reschedule("life", {"kind": "cron", "expr": "30 25 * * *"})
    assert [p.field for p in bad.value.problems] == ["expr"]
    at = now_ms() + 3_600_000
    once = client.reschedule("life", pysched.OnceSchedule(run_at_ms=at))
    assert once.next_run is not None and once.next_run.run_at_ms == at
    assert client.cancel("life").state == "cancelled"
    with pytest.raises(JobNotActive):
        client.cancel("life")
    for change in (client.get, client.cancel, client.pause, client.resume, client.history):
        with pytest.raises(JobNotFound):
            change("nobody")


def test_preview_shows_a_jobs_next_fires_with_its_jitter(client: Client) -> None:
    rec = client.add(shell_job("daily", schedule={"kind": "cron", "expr": "0 9 * * *", "tz": "UTC"}))
    shown = client.preview("daily", count=3)
    assert shown.jitter_ms == rec.jitter_ms and len(shown.fires) == 3
    assert all(f.due_ms == f.at_ms + rec.jitter_ms for f in shown.fires)
    assert [f.at_ms % 86_400_000 for f in shown.fires] == [9 * 3_600_000] * 3
    bare = client.preview(cron_expr="30 2 * * *", tz="Europe/Paris", count=400, after_ms=1_774_000_000_000)
    assert any(f.dst for f in bare.fires)  # the spring-forward night has no 02:30
    with pytest.raises(InvalidJob) as bad:
        client.preview(cron_expr="* * *")
    assert [p.field for p in bad.value.problems] == ["expr"]
    start_ms = 1_798_761_607_000  # 2027-01-01T00:00:07Z
    started = client.preview(every="10s", start_ms=start_ms, after_ms=start_ms - 60_000, count=2)
    assert [f.at_ms for f in started.fires] == [start_ms, start_ms + 10_000]
    with pytest.raises(InvalidJob) as alone:
        client.preview(cron_expr="* * * * *", start_ms=start_ms)
    assert [p.field for p in alone.value.problems] == ["start_ms"]


def test_a_redrive_of_no_dead_letter_says_so(client: Client) -> None:
    assert client.dead_letters() == []
    client.add(shell_job("fine"))
    key = RunKey("fine", 1, 0)
    assert client.redrive([key]) == pysched.Redriven(redriven=(), not_dead_letters=(key,))


def test_a_run_triggered_from_a_clock_behind_the_leaders_is_still_handed_on(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The trigger's row is due a moment after the client's now; 15 s behind
    # the leader's, that is behind the watermark the leader keeps SETTLE_MS
    # behind its own, which no leader reads from.
    client.add(shell_job("report"))
    leader_now = now_ms()
    fences = dict.fromkeys(range(client.store.partitions), 1)
    record_sent(client.store, [], fences, dict.fromkeys(fences, leader_now - SETTLE_MS), leader_now)
    monkeypatch.setattr(client, "clock", ManualClock(leader_now - 15_000))
    run = client.trigger("report")
    owed = client.store.due_runs(fences, leader_now + 900_000, leader_now + 1_000)
    read = [r for r in owed if r.run_id == run.run_id]
    assert [(r.run_at_ms, r.attempt_group) for r in read] == [(run.run_at_ms, run.attempt_group)]
    assert client.get_run(RunKey.of(run)).due_ms == read[0].due_ms


# -- declared jobs ------------------------------------------------------------


def declaring_module(tmp_path: Path, body: str) -> str:
    """A module of ``@pysched.job`` functions, importable by a fresh name
    (imported from its new text when written again)."""
    name = f"declared_{uuid.uuid4().hex[:8]}"
    write_module(tmp_path, name, body)
    return name


def write_module(tmp_path: Path, name: str, body: str) -> None:
    (tmp_path / f"{name}.py").write_text("import pysched\n\n" + textwrap.dedent(body))
    # Its cached bytecode could pass for the new text's (same size, same second).
    shutil.rmtree(tmp_path / "__pycache__", ignore_errors=True)
    if str(tmp_path) not in sys.path:
        sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    # Imported afresh by the next sync, as by a new `pysched sync` process
    # (a reload would keep the functions the new text no longer has).
    sys.modules.pop(name, None)


TWO_JOBS = """
@pysched.job(cron="0 9 * * 1-5", tz="Europe/Paris", retries=5)
def report(ctx):
    return "report"

@pysched.job(cron="*/15 * * * *", id="cleanup", critical=True)
def clean(ctx):
    return None
"""


def test_sync_adds_what_a_module_declares_and_then_changes_nothing(client: Client, tmp_path: Path) -> None:
    module = declaring_module(tmp_path, TWO_JOBS)
    first = client.sync(module)
    assert (first.added, first.updated, first.unchanged) == (("cleanup", f"{module}.report"), (), ())
    report = client.get(f"{module}.report").job
    assert report.target == pysched.PythonTarget(ref=f"{module}:report")
    assert report.retry.retries == 5 and report.schedule == pysched.CronSchedule(expr="0 9 * * 1-5", tz="Europe/Paris")
    assert client.get("cleanup").job.critical
    again = client.sync(module)
    assert (again.added, again.updated, again.unchanged) == ((), (), ("cleanup", f"{module}.report"))


def test_sync_updates_a_changed_declaration_and_prunes_a_removed_one(client: Client, tmp_path: Path) -> None:
    module = declaring_module(tmp_path, TWO_JOBS)
    client.add(shell_job("unrelated"))
    client.sync(module)
    write_module(
        tmp_path,
        module,
        """
        @pysched.job(cron="0 10 * * 1-5", tz="Europe/Paris", retries=2)
        def report(ctx):
            return "report"
        """,
    )
    planned = client.sync(module, prune=True, dry_run=True)
    assert (planned.updated, planned.pruned, planned.dry_run) == ((f"{module}.report",), ("cleanup",), True)
    assert client.get("cleanup").state == "active"
    done = client.sync(module, prune=True)
    assert (done.updated, done.pruned) == ((f"{module}.report",), ("cleanup",))
    report = client.get(f"{module}.report").job
    assert report.retry.retries == 2 and report.schedule == pysched.CronSchedule(expr="0 10 * * 1-5", tz="Europe/Paris")
    assert client.get("cleanup").state == "cancelled"
    # A job that is not one of the module's functions is never pruned.
    assert client.get("unrelated").state == "active"


def test_sync_leaves_a_paused_job_it_would_change_and_says_why(client: Client, tmp_path: Path) -> None:
    module = declaring_module(tmp_path, TWO_JOBS)
    client.sync(module)
    client.pause("cleanup")
    write_module(tmp_path, module, TWO_JOBS.replace("*/15", "*/20"))
    report = client.sync(module)
    assert [s.job_id for s in report.skipped] == ["cleanup"] and "paused" in report.skipped[0].reason
    assert client.get("cleanup").job.schedule == pysched.CronSchedule(expr="*/15 * * * *")


def test_sync_changes_only_the_modules_own_jobs_and_says_why_it_skips(client: Client, tmp_path: Path) -> None:
    module = declaring_module(tmp_path, TWO_JOBS)
    # An id the module declares, held by a job of the CLI's.
    client.add(shell_job("cleanup"))
    report = client.sync(module)
    assert report.added == (f"{module}.report",)
    assert [s.job_id for s in report.skipped] == ["cleanup"] and "not one of" in report.skipped[0].reason
    assert client.get("cleanup").job.target == pysched.ShellTarget(command="true")
    # A cancelled job of the module, still declared, is added again.
    client.cancel(f"{module}.report")
    again = client.sync(module)
    assert (again.added, [s.job_id for s in again.skipped]) == ((f"{module}.report",), ["cleanup"])
    assert client.get(f"{module}.report").state == "active"


def test_a_sync_after_the_declaration_is_restored_undoes_a_prune(client: Client, tmp_path: Path) -> None:
    module = declaring_module(tmp_path, TWO_JOBS)
    client.sync(module)
    write_module(tmp_path, module, TWO_JOBS.split('@pysched.job(cron="*/15')[0])
    assert client.sync(module, prune=True).pruned == ("cleanup",)
    # Its pending run, cancelled with it, is the old job's history.
    assert [r.state for r in client.history("cleanup")] == ["cancelled"]
    write_module(tmp_path, module, TWO_JOBS)
    restored = client.sync(module, prune=True)
    assert (restored.added, restored.unchanged, restored.pruned) == (("cleanup",), (f"{module}.report",), ())
    job = client.get("cleanup")
    assert job.state == "active" and job.next_run is not None and job.job.critical
    assert client.history("cleanup") == []


def test_sync_goes_on_once_a_declared_one_shot_has_run(client: Client, tmp_path: Path) -> None:
    # Ahead by more than a busy machine takes to import and sync it.
    soon = now_ms() + 5_000
    module = declaring_module(
        tmp_path,
        f"""
        from datetime import datetime, timezone

        @pysched.job(at=datetime.fromtimestamp({soon} / 1000, timezone.utc))
        def once(ctx):
            return None
        """,
    )
    assert client.sync(module).added == (f"{module}.once",)
    time.sleep(max(0.0, (soon - now_ms()) / 1000 + 1.2))
    # Its time has passed: unchanged, and the sync goes on (before, every
    # later sync of the module was refused).
    assert client.sync(module).unchanged == (f"{module}.once",)


# -- the decorator alone ---------------------------------------------------------


def test_a_declaration_that_cannot_be_a_job_fails_where_it_is_written() -> None:
    with pytest.raises(pysched.InvalidDeclaration) as bad:

        @pysched.job(cron="61 * * * *")
        def nightly(ctx: pysched.RunContext) -> None: ...

    assert [p.field for p in bad.value.problems] == ["schedule.expr"]
    assert "@pysched.job on tests.test_client:nightly: schedule.expr: Bad minute" in str(bad.value)
    with pytest.raises(pysched.InvalidDeclaration, match="defined inside another function: a worker in another"):

        @pysched.job(cron="* * * * *")
        def inner(ctx: pysched.RunContext) -> None: ...

    with pytest.raises(pysched.InvalidDeclaration, match="exactly one of cron=, every= and at="):
        pysched.job()(print)
    with pytest.raises(pysched.InvalidDeclaration) as alone:
        pysched.job(start=datetime(2027, 1, 1, tzinfo=UTC))(print)
    assert [(p.field, p.message) for p in alone.value.problems] == [("schedule.start", "start= goes with every=")]
    # What a registration refuses is refused here too, each naming its field.
    for options, field in (
        ({"cron": "* * * * *", "jitter": 5, "critical": True}, "jitter_window_s"),
        ({"cron": "* * * * *", "payload": {"x": object()}}, "payload"),
        ({"cron": "* * * * *", "payload": [1, 2]}, "payload"),
        ({"cron": "* * * * *", "backoff": (1, 2, 3)}, "retry.backoff"),
        ({"cron": "* * * * *", "retries": -1}, "retry.retries"),
        ({"cron": "* * * * *", "id": "a:b"}, "id"),
    ):
        with pytest.raises(pysched.InvalidDeclaration) as refused:
            pysched.job(**options)(print)
        assert [p.field for p in refused.value.problems] == [field], options


def test_a_function_is_added_as_it_is_declared_and_one_no_worker_can_import_is_refused_saying_why(
    tmp_path: Path,
) -> None:
    module = importlib.import_module(declaring_module(tmp_path, TWO_JOBS))
    with Client(tmp_path / "f.db") as client:
        added = client.add(module.report, cron="0 9 * * 1-5", tz="Europe/Paris", id="weekday-report", retries=2)
        assert (added.job.id, added.job.target.ref, added.job.retry.retries) == (
            "weekday-report",
            f"{module.__name__}:report",
            2,
        )
        by_name = client.add(f"{module.__name__}:report", at=datetime.now(UTC) + timedelta(hours=1))
        assert by_name.job.id == f"{module.__name__}.report"

        def closure(ctx: pysched.RunContext) -> None: ...

        for target, why in (
            (lambda ctx: None, "a lambda: a worker in another process imports its target by name"),
            (closure, "defined inside another function"),
        ):
            with pytest.raises(pysched.InvalidJob, match=why):
                client.add(target, cron="* * * * *")
        with pytest.raises(TypeError, match="options go with a function"):
            client.add(added.job, cron="* * * * *")
        assert [r.job.id for r in client.ls()] == [f"{module.__name__}.report", "weekday-report"]


def test_a_lambda_or_nested_function_in_a_script_is_refused_as_such(client: Client) -> None:
    script: dict[str, Any] = {"__name__": "__main__"}
    # A script's functions, as `python script.py` defines them.
    source = """
        lam = lambda ctx: None
        def outer():
            def inner(ctx): ...
            return inner
        def top(ctx): ...
    """
    exec(textwrap.dedent(source), script)
    for target, why in (
        (script["lam"], "a lambda: "),
        (script["outer"](), "outer.<locals>.inner is defined inside another function: "),
        (script["top"], "defined in a script run as __main__: "),
    ):
        with pytest.raises(InvalidJob) as refused:
            client.add(target, every="5m", id="lam")
        (problem,) = refused.value.problems
        assert (problem.field, problem.message.startswith(why)) == ("target.ref", True), problem
    assert client.ls() == []


def test_a_module_declares_only_its_own_functions(tmp_path: Path) -> None:
    source = declaring_module(tmp_path, TWO_JOBS)
    importer = declaring_module(tmp_path, f"from {source} import report\n")
    from pysched.declare import declared_jobs

    assert declared_jobs(importlib.import_module(importer)) == []
    assert [j.id for j in declared_jobs(importlib.import_module(source))] == ["cleanup", f"{source}.report"]


def test_a_node_up_that_leads_nothing_is_listed_standing_by_until_it_stops(client: Client) -> None:
    coordinator: Any
    if client.config is None:
        from pysched.coord.local import SQLiteLeaseCoordinator

        coordinator = SQLiteLeaseCoordinator(client.db)
    else:
        from pysched.config import load
        from pysched.coord.etcd import EtcdCoordinator

        coordinator = EtcdCoordinator(load(Path(client.config)), partitions=client.store.partitions)
    try:
        assert coordinator.poll("node-a", now_ms())
        # Embedded: the lease is held. Cluster: node-b's share is node-a's
        # until node-a's next poll hands it over.
        assert coordinator.poll("node-b", now_ms()) == {}
        assert client.standing_by() == ["node-b"]
        assert {led.holder for led in client.leaders()} == {"node-a"}
        coordinator.release("node-b")
        assert client.standing_by() == []
        if client.config is None:
            # A standby that died: listed while its last poll's lease lasts.
            coordinator.poll("node-c", now_ms() - coordinator.ttl_ms - 1)
            assert client.standing_by() == []
        coordinator.release("node-a")
        assert {led.holder for led in client.leaders()} == {None}
    finally:
        for holder in ("node-a", "node-b"):
            coordinator.release(holder)
        if client.config is not None:
            coordinator.close()
