"""pysched.Scheduler: the embedded engine in a thread of the test's own
process, firing the process's own functions."""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import pysched
from pysched import Client, RunKey, Scheduler
from tests.helpers import now_ms, start_node, stop_node, wait_for
from tests.test_client import declaring_module

JOBS = """
import sys
from pathlib import Path

def touch(ctx):
    Path(ctx.payload["path"]).write_text(ctx.job_id)
    return "touched"

def leave(ctx):
    sys.exit(3)

def fail(ctx):
    raise RuntimeError("no luck")
"""


def one_shot(job_id: str, ref: str, in_ms: int, **payload: str) -> dict[str, object]:
    return {
        "id": job_id,
        "schedule": {"kind": "once", "run_at_ms": now_ms() + in_ms},
        "target": {"kind": "python", "ref": ref},
        "payload": payload,
        "retry": {"retries": 0},
    }


def state_of(client: Client, job_id: str) -> str | None:
    runs = client.history(job_id)
    return runs[0].state if runs else None


def test_the_scheduler_fires_the_processes_own_functions_and_outlives_their_failures(tmp_path: Path) -> None:
    module = declaring_module(tmp_path, JOBS)
    with Scheduler(tmp_path / "app.db", workers=2, grace_s=5) as scheduler:
        client = scheduler.client
        client.add(one_shot("exits", f"{module}:leave", 300))
        client.add(one_shot("raises", f"{module}:fail", 300))
        wait_for(lambda: state_of(client, "exits") == "failed", 60, "the run calling sys.exit to fail")
        wait_for(lambda: state_of(client, "raises") == "failed", 60, "the run raising to fail")
        assert scheduler.running
        # Still firing after both.
        client.add(one_shot("touches", f"{module}:touch", 200, path=str(tmp_path / "touched")))
        wait_for(lambda: state_of(client, "touches") == "succeeded", 60, "the run after the failures to succeed")
        # A yearly job run now, once, beside its schedule.
        yearly = client.add(
            {
                "id": "yearly",
                "schedule": {"kind": "cron", "expr": "0 0 1 1 *"},
                "target": {"kind": "python", "ref": f"{module}:touch"},
                "payload": {"path": str(tmp_path / "yearly")},
            }
        )
        run = client.trigger("yearly")
        assert run.idempotency_key.endswith(":1")
        wait_for(lambda: state_of(client, "yearly") == "succeeded", 60, "the triggered run to succeed")
        assert client.get("yearly").next_run == yearly.next_run
    assert not scheduler.running
    assert (tmp_path / "touched").read_text() == "touches"
    assert (tmp_path / "yearly").read_text() == "yearly"
    with Client(tmp_path / "app.db", access="read") as after:
        errors = {job: after.history(job)[0].error or "" for job in ("exits", "raises")}
    assert "SystemExit" in errors["exits"] and "no luck" in errors["raises"]


def test_a_scheduler_starts_once_and_refuses_bad_settings(tmp_path: Path) -> None:
    scheduler = Scheduler(tmp_path / "app.db", workers=1, grace_s=1)
    scheduler.start()
    try:
        with pytest.raises(RuntimeError, match="started already"):
            scheduler.start()
    finally:
        scheduler.stop()
    scheduler.stop()  # a second stop does nothing
    with pytest.raises(ValueError, match="workers"):
        Scheduler(tmp_path / "app.db", workers=0)
    with pytest.raises(ValueError, match="lease_s"):
        Scheduler(tmp_path / "app.db", lease_s=0.1)
    with pytest.raises(pysched.InvalidJob):
        Scheduler(tmp_path / "app.db").client.add({"id": "x"})


def test_a_scheduler_whose_node_fails_says_so_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pysched.leader import PartitionLeader

    def broken(self: PartitionLeader, stop: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(PartitionLeader, "run", broken)
    failures: list[BaseException] = []
    scheduler = Scheduler(tmp_path / "app.db", workers=1, grace_s=1, on_failure=failures.append)
    scheduler.start()
    wait_for(lambda: bool(failures), 30, "the failure to be reported")
    assert isinstance(failures[0], OSError)
    wait_for(lambda: not scheduler.running, 30, "the scheduler to stop running")
    with pytest.raises(pysched.SchedulerStopped, match="disk gone"):
        scheduler.stop()


# Runs until the test releases it, ignoring ctx.cancelled (as a careless job
# does), and says which attempt started, which attempts had ended by then,
# and whether it was told to stop.
LINGERS = """
import time
from pathlib import Path

def lingers(ctx):
    where = Path(ctx.payload["dir"])
    (where / f"run.{ctx.attempt}").write_text(" ".join(sorted(p.name for p in where.glob("ended.*"))))
    deadline = time.monotonic() + 120
    while not (where / "release").exists() and time.monotonic() < deadline:
        if ctx.cancelled.is_set():
            (where / f"cancelled.{ctx.attempt}").touch()
        time.sleep(0.05)
    (where / f"ended.{ctx.attempt}").touch()
    return "done"
"""


def test_a_stopped_scheduler_keeps_the_claim_of_a_python_run_still_going_so_no_node_runs_it_beside_it(
    tmp_path: Path,
) -> None:
    module = declaring_module(tmp_path, LINGERS)
    db = tmp_path / "l.db"
    scheduler = Scheduler(db, workers=2, grace_s=1, lease_s=1.5)
    scheduler.start()
    scheduler.client.add(one_shot("lingers", f"{module}:lingers", 200, dir=str(tmp_path)))
    wait_for(lambda: (tmp_path / "run.1").exists(), 60, "the run to start")
    scheduler.stop()
    # Past the grace: told to stop, and still running, in this process.
    wait_for(lambda: (tmp_path / "cancelled.1").exists(), 30, "ctx.cancelled to be set")
    log = tmp_path / "node.log"
    node = start_node(db, tmp_path, log, "--lease", "1.5")
    try:
        wait_for(lambda: "leading partitions" in log.read_text(), 60, "the other node to lead", log)
        # Several leases long: the first run's claim is kept alive meanwhile,
        # and the other node does not run it again beside it.
        time.sleep(6)
        assert not (tmp_path / "run.2").exists()
        (tmp_path / "release").touch()
        # Told to stop, it returned: recorded interrupted, it runs again as
        # its next attempt, once the first had ended.
        wait_for(lambda: (tmp_path / "run.2").exists(), 60, "the next attempt", log)
        assert (tmp_path / "run.2").read_text() == "ended.1"
        with Client(db, access="read") as reader:
            wait_for(lambda: state_of(reader, "lingers") == "succeeded", 60, "the next attempt's end", log)
            (run,) = reader.history("lingers")
        assert (run.attempt, run.result) == (2, '"done"')
    finally:
        (tmp_path / "release").touch()
        stop_node(node)


# An application that stops its scheduler while a Python job runs on, then
# exits: the exit ends the job.
EXITING_APP = """
import sys
import time
from pathlib import Path

import pysched

where = Path(sys.argv[1])
scheduler = pysched.Scheduler(where / "app.db", workers=1, grace_s=0.5, lease_s=60)
scheduler.start()
scheduler.client.add({
    "id": "lingers",
    "schedule": {"kind": "once", "run_at_ms": time.time_ns() // 1_000_000 + 300},
    "target": {"kind": "python", "ref": "lingering:lingers"},
    "payload": {"dir": str(where)},
})
while not (where / "run.1").exists():
    time.sleep(0.05)
scheduler.stop()
"""


def test_an_application_that_exits_after_the_stop_records_its_running_job_interrupted(tmp_path: Path) -> None:
    (tmp_path / "lingering.py").write_text(LINGERS)
    (tmp_path / "app.py").write_text(EXITING_APP)
    subprocess.run([sys.executable, "app.py", str(tmp_path)], cwd=tmp_path, check=True, timeout=120)
    assert (tmp_path / "run.1").exists() and not (tmp_path / "ended.1").exists()
    with Client(tmp_path / "app.db", access="read") as reader:
        (run,) = reader.history("lingers")
        failures = reader.get_run(RunKey.of(run)).failures
    # Not left to be found lost when its 60 s lease runs out: let go of at
    # the exit, it runs again at once wherever a node is up.
    assert (run.state, run.attempt) == ("interrupted", 1)
    assert run.error is not None and "the application exited" in run.error
    assert failures == ()


APPENDS = """
from pathlib import Path

def append(ctx):
    with Path(ctx.payload["path"]).open("a") as out:
        out.write(f"{ctx.idempotency_key}\\n")
"""


def test_trigger_pause_and_resume_run_the_triggered_run_once_and_keep_the_schedule(tmp_path: Path) -> None:
    module = declaring_module(tmp_path, APPENDS)
    ran = tmp_path / "ran"
    with Scheduler(tmp_path / "app.db", workers=2, grace_s=5) as scheduler:
        client = scheduler.client
        yearly = client.add(
            {
                "id": "yearly",
                "schedule": {"kind": "cron", "expr": "0 0 1 1 *"},
                "target": {"kind": "python", "ref": f"{module}:append"},
                "payload": {"path": str(ran)},
            }
        )
        triggered = client.trigger("yearly")
        client.pause("yearly")
        resumed = client.resume("yearly")
        assert resumed.next_run == yearly.next_run
        wait_for(lambda: ran.exists(), 60, "the triggered run to run")
        wait_for(lambda: state_of(client, "yearly") == "succeeded", 60, "its end to be recorded")
        time.sleep(2)  # a second run at its time would come now
        assert ran.read_text().splitlines() == [triggered.idempotency_key]
        assert [(r.run_at_ms, r.state) for r in client.history("yearly")] == [(triggered.run_at_ms, "succeeded")]
        assert client.get("yearly").next_run == yearly.next_run
        assert set(client.missed([client.get("yearly")])["yearly"].values()) == {0}


def test_add_job_takes_a_function_as_apscheduler_does_and_refuses_one_no_worker_can_import(tmp_path: Path) -> None:
    module = importlib.import_module(declaring_module(tmp_path, JOBS))
    with Scheduler(tmp_path / "app.db", workers=1, grace_s=5) as scheduler:
        soon = datetime.now(UTC) + timedelta(milliseconds=300)
        added = scheduler.add_job(module.touch, at=soon, id="touches", payload={"path": str(tmp_path / "t")})
        assert added.job.target.ref == f"{module.__name__}:touch"
        wait_for(lambda: state_of(scheduler.client, "touches") == "succeeded", 60, "the function's run")
        with pytest.raises(pysched.InvalidJob, match="a lambda"):
            scheduler.add_job(lambda ctx: None, cron="* * * * *")
    assert (tmp_path / "t").read_text() == "touches"
