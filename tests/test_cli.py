"""The CLI as a user runs it: good input registers, bad input names the field
and stores nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pysched.model import Job
from pysched.protocols import PlannedRun
from pysched.stores.sqlite import SQLiteScheduleStore
from tests.helpers import PYSCHED, cli, cli_json


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--cron", "61 * * * *", "--shell", "true"], "--cron: Bad minute"),
        (["--cron", "* * *", "--shell", "true"], "--cron: expected 5 fields"),
        (["--cron", "@sometimes", "--shell", "true"], "--cron: unknown macro"),
        (["--cron", "* * * * *", "--tz", "Mars/Olympus", "--shell", "true"], "--tz: unknown time zone"),
        (["--at", "tomorrow-ish", "--shell", "true"], "--at: not an ISO 8601 time"),
        (["--at", "2001-01-01T00:00:00+00:00", "--shell", "true"], "--at:"),
        (["--in", "-3", "--shell", "true"], "--in: seconds from now, from 0 to"),
        (["--in", "3"], "give exactly one of --shell, --python, --http"),
        (["--in", "3", "--cron", "* * * * *", "--shell", "true"], "give exactly one of --cron, --every, --at, --in"),
        (["--in", "3", "--python", "not a ref"], "--python: module:function"),
        (["--in", "3", "--http", "ftp://example.org/x"], "--http:"),
        (["--in", "3", "--shell", "true", "--jitter", "-1"], "--jitter: seconds, a number from 0 to 3600"),
        (["--in", "3", "--shell", "true", "--payload", "{nope"], "--payload: not JSON"),
        # Times that no date can show, or not numbers at all.
        (["--in", "1e12", "--shell", "true"], "--in: seconds from now, from 0 to"),
        (["--in", "1e20", "--shell", "true"], "--in: seconds from now"),
        (["--in", "nan", "--shell", "true"], "--in: seconds from now"),
        (["--in", "inf", "--shell", "true"], "--in: seconds from now"),
        (["--at", "9999-12-31T23:59:59-01:00", "--shell", "true"], "--at: 9999-12-31T23:59:59-01:00 is more than 100"),
        # A bad zone is refused whatever the schedule; flags that do not apply are refused.
        (["--in", "100", "--tz", "Mars/Olympus", "--shell", "true"], "--tz: unknown time zone 'Mars/Olympus'"),
        (["--in", "100", "--tz", "Europe/Paris", "--shell", "true"], "--tz: does not apply to --in"),
        (["--in", "3", "--shell", "true", "--jitter", "30", "--critical"], "--jitter: does not apply to a --critical"),
        (["--in", "3", "--shell", "true", "--method", "GET"], "--method: applies only to --http"),
        (["--in", "3", "--python", "m:f", "--method", "GET"], "--method: applies only to --http"),
        (["--in", "3", "--shell", "true", "--jitter", "nan"], "--jitter: seconds, a number from 0 to 3600"),
        # What would fail only at run time is refused now.
        (["--in", "3", "--http", "http://exa mple.org/"], "--http: 'http://exa mple.org/' contains spaces"),
        (["--in", "3", "--http", "http://example.org:99999/"], "--http: 'http://example.org:99999/' is not a valid"),
        (["--in", "3", "--shell", "true", "--payload", "[1, 2]"], "--payload: must be a JSON object"),
        (["--in", "3", "--shell", "true", "--payload", '{"a": NaN}'], "--payload: not JSON: NaN is not a JSON value"),
        (
            ["--at", "2030-01-01T00:00:00Z", "--tz", "Europe/Paris", "--shell", "true"],
            "--tz: does not apply to an --at",
        ),
        (["--in", "3", "--http", "http://example.org/", "--method", ""], "--method: an HTTP method"),
        (["--in", "3", "--shell", "true", "--payload", "@/nonexistent/payload.json"], "--payload: cannot read"),
        # What no file, zone or stored text can hold.
        (["--every", "5m", "--shell", "true", "--tz", "a" * 300], "--tz: unknown time zone"),
        (["--in", "3", "--shell", "true", "--payload", '{"a": "\\ud800"}'], "--payload: holds text that is not valid"),
        (["--in", "3", "--shell", "true", "--payload", "\udcff"], "--payload: not UTF-8 text"),
        # Cron expressions and zones that cannot mean one thing on every node, or ever fire.
        (["--cron", "0 0 * * *", "--tz", "America", "--shell", "true"], "--tz: unknown time zone 'America': a region"),
        (["--cron", "0 0 * * *", "--tz", "localtime", "--shell", "true"], "--tz: time zone 'localtime' depends on"),
        (["--cron", "0 0 * * *", "--tz", "Factory", "--shell", "true"], "--tz: time zone 'Factory' depends on"),
        (["--cron", "0 0 * * *", "--tz", "posixrules", "--shell", "true"], "--tz: time zone 'posixrules' depends"),
        (["--cron", "0 0 */8 * 1#5", "--shell", "true"], "--cron: '0 0 */8 * 1#5' never fires"),
        (["--cron", "*/61 * * * *", "--shell", "true"], "--cron: Bad minute: step 61 is outside 1-60"),
        (["--cron", "0 " + "9" * 990 + " * * *", "--shell", "true"], "--cron: Bad hour: a number of 990 digits"),
        (["--cron", "* " * 600, "--shell", "true"], "--cron: longer than 1,000 characters"),
        # A target that cannot be called fails here, not at run time.
        (
            ["--in", "60", "--python", "nosuchmod:f"],
            "--python: cannot be imported here: ModuleNotFoundError: No module named 'nosuchmod'",
        ),
        (["--in", "60", "--python", "os:nope"], "--python: cannot be imported here: AttributeError: module 'os' has"),
        (["--in", "60", "--python", "os:sep"], "--python: cannot be imported here: os:sep is a str, not a function"),
    ],
)
def test_bad_input_names_the_field_and_stores_nothing(db_path: Path, args: list[str], field: str) -> None:
    proc = cli("add", "job", *args, db=db_path, check=False)
    assert proc.returncode == 2, proc.stderr
    assert field in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not db_path.exists()


def test_a_target_only_the_workers_can_import_is_added_without_the_check(db_path: Path) -> None:
    added = cli_json("add", "w", "--in", "60", "--python", "workeronly:run", "--no-import-check", db=db_path)
    assert added["target"]["ref"] == "workeronly:run"


def test_commands_that_do_not_create_a_database_leave_none_behind(tmp_path: Path) -> None:
    typo = tmp_path / "typo.db"
    proc = cli("api", "--port", "0", db=typo, check=False, timeout_s=30)
    assert proc.returncode == 2 and "no such file" in proc.stderr and "Traceback" not in proc.stderr
    assert not typo.exists()
    synced = cli("sync", "os", db=typo, cwd=tmp_path)
    assert "0 declared" in synced.stdout
    assert not typo.exists()
    # `up` creates its database, but not to refuse a flag.
    refused = cli("up", "--lease", "-1", db=typo, check=False, timeout_s=30)
    assert refused.returncode == 2 and refused.stderr.startswith("error: --lease:")
    assert not typo.exists()


def test_bad_id_is_refused_in_words(db_path: Path) -> None:
    proc = cli("add", "a:b", "--in", "3", "--shell", "true", db=db_path, check=False)
    assert proc.returncode == 2
    assert "id: ASCII letters, digits, '.', '_' or '-', at most 128, starting with a letter or digit" in proc.stderr


def test_a_shell_payload_beyond_the_environment_limit_is_refused(tmp_path: Path, db_path: Path) -> None:
    # A shell target receives the payload in one environment variable, which
    # Linux caps at 128 KiB: the job could never start.
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"blob": "x" * 200_000}))
    proc = cli("add", "job", "--in", "3", "--shell", "true", "--payload", f"@{big}", db=db_path, check=False)
    assert proc.returncode == 2 and "--payload:" in proc.stderr and "environment variable" in proc.stderr
    # The same payload suits a Python target, read from a file or standard input.
    cli("add", "py", "--in", "60", "--python", "m:f", "--no-import-check", "--payload", f"@{big}", db=db_path)
    piped = subprocess.run(
        [
            *PYSCHED,
            "add",
            "piped",
            "--in",
            "60",
            "--python",
            "m:f",
            "--no-import-check",
            "--payload",
            "-",
            "--db",
            str(db_path),
            "--json",
        ],
        input=big.read_text(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(piped.stdout)["payload"]["blob"] == "x" * 200_000
    over = tmp_path / "over.json"
    over.write_text(json.dumps({"blob": "x" * (1024 * 1024)}))
    proc = cli(
        "add",
        "huge",
        "--in",
        "3",
        "--python",
        "m:f",
        "--no-import-check",
        "--payload",
        f"@{over}",
        db=db_path,
        check=False,
    )
    assert proc.returncode == 2 and "--payload: more than 1,048,576 bytes" in proc.stderr
    assert sorted(j["id"] for j in cli_json("ls", db=db_path)) == ["piped", "py"]


def test_tables_are_not_cut_when_piped(db_path: Path) -> None:
    long_id = "a-job-whose-id-is-long-enough-to-be-cut-at-eighty-columns"
    cli("add", long_id, "--cron", "0 9 * * *", "--tz", "Europe/Paris", "--shell", "true", db=db_path)
    assert long_id in cli("ls", db=db_path).stdout
    proc = cli("history", long_id, "--limit", "99999999999999999999", db=db_path, check=False)
    assert proc.returncode == 2 and "--limit" in proc.stderr


def test_no_such_job_exits_3(db_path: Path) -> None:
    cli("add", "real", "--in", "60", "--shell", "true", db=db_path)
    for args in (["show", "ghost"], ["history", "ghost"], ["cancel", "ghost"], ["reschedule", "ghost", "--in", "5"]):
        proc = cli(*args, db=db_path, check=False)
        assert proc.returncode == 3 and "no job 'ghost'" in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_any_stored_time_can_be_shown(db_path: Path) -> None:
    # A job stored before run times were bounded (or by another tool): every
    # command that shows it still works, and cancelling it too.
    store = SQLiteScheduleStore(db_path)
    far = 10**15  # year ~33,700: beyond any date
    job = Job.model_validate(
        {"id": "far", "schedule": {"kind": "once", "run_at_ms": far}, "target": {"kind": "shell", "command": "true"}}
    )
    store.add_job(job, 0, 0, PlannedRun(far, far), 0)
    cli("add", "near", "--in", "60", "--shell", "true", db=db_path)
    assert "far" in cli("ls", db=db_path).stdout
    (far_json, _) = cli_json("ls", db=db_path)
    assert far_json["next_run_at"] == f"{far} ms after 1970-01-01T00:00Z"
    cli("show", "far", db=db_path)
    cli("cancel", "far", db=db_path)
    assert [j["state"] for j in cli_json("ls", db=db_path)] == ["cancelled", "active"]
    assert "Traceback" not in cli("history", "far", db=db_path).stderr


def test_reschedule_keeps_the_jobs_zone(db_path: Path) -> None:
    cli("add", "report", "--cron", "0 9 * * 1-5", "--tz", "Europe/Paris", "--shell", "true", db=db_path)
    moved = cli_json("reschedule", "report", "--cron", "30 8 * * 1-5", db=db_path)
    assert moved["schedule"] == {"kind": "cron", "expr": "30 8 * * 1-5", "tz": "Europe/Paris"}
    moved = cli_json("reschedule", "report", "--cron", "30 8 * * 1-5", "--tz", "Asia/Tokyo", db=db_path)
    assert moved["schedule"]["tz"] == "Asia/Tokyo"
    proc = cli("reschedule", "report", "--cron", "61 * * * *", db=db_path, check=False)
    assert proc.returncode == 2 and "--cron: Bad minute" in proc.stderr
    proc = cli("reschedule", "report", "--in", "1e12", db=db_path, check=False)
    assert proc.returncode == 2 and "--in:" in proc.stderr
    assert cli_json("show", "report", db=db_path)["schedule"]["tz"] == "Asia/Tokyo"


def test_duplicate_id_is_refused_and_keeps_the_first(db_path: Path) -> None:
    cli("add", "nightly", "--cron", "0 2 * * *", "--tz", "Europe/Paris", "--shell", "true", db=db_path)
    proc = cli("add", "nightly", "--cron", "0 3 * * *", "--shell", "false", db=db_path, check=False)
    assert proc.returncode != 0 and "id: job 'nightly' already exists" in proc.stderr
    (job,) = cli_json("ls", db=db_path)
    assert job["schedule"] == {"kind": "cron", "expr": "0 2 * * *", "tz": "Europe/Paris"}
    assert job["target"]["command"] == "true"


def test_job_lifecycle_through_the_cli(db_path: Path) -> None:
    added = cli_json(
        "add", "report", "--cron", "*/15 * * * *", "--python", "mymod:run", "--no-import-check", "--jitter", "30",
        db=db_path,
    )  # fmt: skip
    assert added["state"] == "active" and added["next_run_at"] is not None
    assert 0 <= added["jitter_ms"] < 30_000
    shown = cli_json("show", "report", db=db_path)
    assert shown["id"] == "report" and shown["last_run"] is None
    # Minute 7 never meets */15, so the old pending run is cancelled, not revived.
    moved = cli_json("reschedule", "report", "--cron", "7 * * * *", db=db_path)
    assert moved["schedule"]["expr"] == "7 * * * *"
    assert ":07:00.000" in moved["next_run_at"]
    assert [r["state"] for r in cli_json("history", "report", db=db_path)] == ["cancelled"]
    gone = cli_json("cancel", "report", db=db_path)
    assert gone["state"] == "cancelled" and gone["next_run_at"] is None
    assert cli("cancel", "report", db=db_path, check=False).returncode != 0
    assert "no job 'ghost'" in cli("show", "ghost", db=db_path, check=False).stderr


def test_critical_jobs_have_no_jitter(db_path: Path) -> None:
    job = cli_json("add", "payroll", "--cron", "0 9 * * 1-5", "--critical", "--http", "http://127.0.0.1:9/", db=db_path)
    assert job["jitter_ms"] == 0 and job["critical"] is True


def test_up_without_workers_on_the_embedded_engine_is_refused(tmp_path: Path, db_path: Path) -> None:
    # Bounded here: before the refusal, `up --workers 0` served forever.
    proc = subprocess.run(
        [*PYSCHED, "up", "--workers", "0", "--db", str(db_path)], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2, proc.stderr
    assert "--workers: 0 only makes sense with --config and separate `pysched worker` processes" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not db_path.exists()


@pytest.mark.parametrize("batch", ["0", "1001", "many"])
def test_up_with_a_bad_batch_is_refused_in_words(db_path: Path, batch: str) -> None:
    proc = subprocess.run(
        [*PYSCHED, "up", "--batch", batch, "--db", str(db_path)], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2, proc.stderr
    assert "--batch" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not db_path.exists()


def test_a_cancelled_id_is_added_again_as_a_new_job_and_a_live_one_is_refused(db_path: Path) -> None:
    cli("add", "nightly", "--cron", "0 2 * * *", "--shell", "true", db=db_path)
    refused = cli("add", "nightly", "--cron", "0 3 * * *", "--shell", "false", db=db_path, check=False)
    assert refused.returncode == 2 and "id: job 'nightly' already exists" in refused.stderr, refused.stderr
    cli("cancel", "nightly", db=db_path)
    cli("add", "nightly", "--cron", "0 3 * * *", "--shell", "false", db=db_path)
    (job,) = cli_json("ls", db=db_path)
    assert job["state"] == "active" and job["target"]["command"] == "false"
    assert cli_json("history", "nightly", db=db_path) == []


def test_the_faces_say_each_thing_once_and_in_words(db_path: Path) -> None:
    cli("add", "tick", "--cron", "*/5 * * * *", "--shell", "true", db=db_path)
    shown = cli("show", "tick", db=db_path).stdout
    keys = [line.split(":", 1)[0].strip() for line in shown.splitlines()]
    assert len(keys) == len(set(keys)), shown
    assert "critical: false" in shown and "True" not in shown and "False" not in shown
    assert "paused" in cli("ls", "--help", db=db_path).stdout
    # A docstring's line breaks are not the terminal's.
    assert "come,\n" not in cli("--help", db=db_path, check=False).stdout
    cli("cancel", "tick", db=db_path)
    assert cli("preview", "tick", db=db_path).stdout.strip() == "tick is cancelled: it fires no more"
    assert cli_json("preview", "tick", db=db_path)["fires"] == []
    import pysched
    from pysched.cli.slo import _budget_left

    assert issubclass(pysched.DatabaseUnusable, OSError)
    assert (_budget_left(0.5), _budget_left(-99.0), _budget_left(None)) == ("50.000%", "none: 100x spent", "-")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["add", "x1", "--in", "abc", "--shell", "true"], "error: --in: Input should be a valid number"),
        (["history", "hello", "--limit", "0"], "error: --limit: Input should be greater than or equal to 1"),
        (["history", "hello", "--limit", "abc"], "error: --limit: Input should be a valid integer"),
        (["preview", "--cron", "* * * * *", "--count", "0"], "error: --count: Input should be greater than"),
        (["up", "--workers", "abc"], "error: --workers: Input should be a valid integer"),
        (["up", "--api", "99999"], "error: --api: Input should be less than or equal to 65535"),
        (["up", "--api"], "error: --api: requires a value"),
        (["api", "--port", "abc"], "error: --port: Input should be a valid integer"),
        (["add", "x", "--bogus"], "error: no such option: --bogus"),
        (["sync"], "error: missing argument MODULE"),
        (["add"], "error: missing argument ID"),
        (["nosuchcmd"], "error: no such command 'nosuchcmd'"),
    ],
)
def test_a_usage_error_is_one_line_naming_the_flag(tmp_path: Path, args: list[str], said: str) -> None:
    # Not cli(): its trailing --db would be the value of a flag left without one.
    proc = subprocess.run([*PYSCHED, *args], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith(said), proc.stderr
    assert "╭" not in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_help_and_no_arguments_still_show_the_help(tmp_path: Path) -> None:
    shown = subprocess.run([*PYSCHED, "history", "--help"], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert shown.returncode == 0 and "--limit" in shown.stdout and shown.stderr == ""
    bare = subprocess.run([*PYSCHED], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert bare.returncode == 2 and "Commands" in bare.stdout and bare.stderr == ""


def test_start_without_every_says_it_goes_with_every(db_path: Path) -> None:
    cli("add", "hello", "--every", "5m", "--shell", "true", db=db_path)
    for args in (
        ("add", "x1", "--start", "2027-01-01T00:00", "--shell", "true"),
        ("reschedule", "hello", "--start", "2027-01-01T00:00"),
        ("add", "x2", "--start", "2027-01-01T00:00", "--cron", "* * * * *", "--shell", "true"),
    ):
        proc = cli(*args, db=db_path, check=False)
        assert proc.returncode == 2 and proc.stderr == "error: --start: goes with --every\n", proc.stderr


def test_a_config_that_is_not_a_toml_file_is_refused_in_one_line(tmp_path: Path) -> None:
    binary = tmp_path / "cluster.toml"
    binary.write_bytes(b"[cluster]\n\xd0\xff\x00")
    for config, words in ((binary, "not TOML"), (tmp_path, "Is a directory")):
        proc = subprocess.run(
            [*PYSCHED, "ls", "--config", str(config)], capture_output=True, text=True, timeout=60, check=False
        )
        assert proc.returncode == 2 and proc.stderr.startswith("error: --config: ") and words in proc.stderr
        assert len(proc.stderr.splitlines()) == 1, proc.stderr
