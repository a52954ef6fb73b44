"""Targets receive the run's identity and pass the idempotency key downstream."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from pysched.model import Job
from pysched.records import DispatchRecord
from pysched.shell import stop_commands
from pysched.targets import Outcome, RunContext, context_for, run_target
from tests.helpers import wait_for

CTX = RunContext(
    job_id="j",
    run_id=5,
    run_at=datetime(2026, 1, 1, tzinfo=UTC),
    attempt=2,
    fence=3,
    idempotency_key="j:1767225600000:0",
    payload={"x": 1},
)


def make(target: dict[str, Any], payload: dict[str, Any] | None = None) -> Job:
    return Job.model_validate(
        {"id": "j", "schedule": {"kind": "once", "run_at_ms": 0}, "target": target, "payload": payload or {}}
    )


RECORD = DispatchRecord(5, "j", 1_767_225_600_000, 1_767_225_600_000, 0, 2, 0, 3, 0)


@pytest.fixture
def http_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append({"key": self.headers["Idempotency-Key"], "body": json.loads(body), "path": self.path})
            status = {"/fail": 500, "/missing": 404, "/slow-down": 429}.get(self.path, 200)
            self.send_response(status)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", seen
    server.shutdown()
    server.server_close()


def test_http_sends_the_idempotency_key(http_server: tuple[str, list[dict[str, Any]]]) -> None:
    url, seen = http_server
    out = run_target(make({"kind": "http", "url": f"{url}/hook"}), CTX)
    assert out.succeeded and out.result == "HTTP 200: ok"
    assert seen == [
        {
            "key": "j:1767225600000:0",
            "path": "/hook",
            "body": {"job_id": "j", "run_at": "2026-01-01T00:00:00+00:00", "attempt": 2, "payload": {"x": 1}},
        }
    ]


def test_http_error_status_fails_the_run(http_server: tuple[str, list[dict[str, Any]]]) -> None:
    url, _ = http_server
    out = run_target(make({"kind": "http", "url": f"{url}/fail"}), CTX)
    assert not out.succeeded and out.error is not None and out.error.startswith("HTTP 500")


def test_shell_sees_the_run_in_its_environment() -> None:
    out = run_target(make({"kind": "shell", "command": 'echo "$PYSCHED_IDEMPOTENCY_KEY $PYSCHED_ATTEMPT"'}), CTX)
    assert out.succeeded and out.result == "j:1767225600000:0 2"


def test_shell_failure_reports_status_and_stderr() -> None:
    out = run_target(make({"kind": "shell", "command": "echo broken >&2; exit 3"}), CTX)
    assert not out.succeeded and out.error == "exit status 3: broken"


def test_a_shell_success_keeps_its_stderr_beside_its_stdout() -> None:
    out = run_target(make({"kind": "shell", "command": "echo done; echo careful >&2"}), CTX)
    assert (out.succeeded, out.result, out.error) == (True, "done", "careful")
    quiet = run_target(make({"kind": "shell", "command": "echo done"}), CTX)
    assert (quiet.result, quiet.error) == ("done", None)


def test_shell_timeout() -> None:
    out = run_target(make({"kind": "shell", "command": "sleep 5", "timeout_s": 0.2}), CTX)
    assert not out.succeeded and out.error == "timed out after 0.2 s"


def test_shell_output_is_streamed_and_only_its_tail_kept() -> None:
    # 200 MB on stdout, 50 MB on stderr: the run keeps the last 4,000
    # characters of each, and the node never holds the rest.
    command = (
        "head -c 200000000 /dev/zero | tr '\\0' x; echo; echo out-end;"
        " (head -c 50000000 /dev/zero | tr '\\0' y; echo; echo err-end) >&2; exit 1"
    )
    tracemalloc.start()
    try:
        out = run_target(make({"kind": "shell", "command": command}), CTX)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5_000_000, f"peak {peak / 1e6:.1f} MB"
    assert out.result == "x" * 3_992 + "\nout-end"
    assert out.error == "exit status 1: " + "y" * 3_992 + "\nerr-end"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has ended; its reaping is init's business


def test_shell_timeout_kills_the_command_and_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    command = f"sleep 60 & echo $! > {pid_file}; wait"
    out = run_target(make({"kind": "shell", "command": command, "timeout_s": 0.5}), CTX)
    assert not out.succeeded and out.error == "timed out after 0.5 s"
    child = int(pid_file.read_text())
    try:
        wait_for(lambda: not _alive(child), 10, "the command's child to be killed")
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def _in_thread(command: str, stopping: threading.Event) -> tuple[threading.Thread, list[Outcome]]:
    outcomes: list[Outcome] = []
    thread = threading.Thread(
        target=lambda: outcomes.append(run_target(make({"kind": "shell", "command": command}), CTX, stopping))
    )
    thread.start()
    return thread, outcomes


def _pid_in(path: Path) -> int | None:
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text else None


@pytest.mark.parametrize("ignores_term", [False, True])
def test_a_stop_ends_the_command_and_its_children_asking_first(tmp_path: Path, ignores_term: bool) -> None:
    # SIGTERM to the group first; what ignores it (a trap is inherited by
    # the children) is killed when the wait is over.
    trap = "trap '' TERM; " if ignores_term else ""
    pid_file = tmp_path / "child.pid"
    stopping = threading.Event()
    thread, outcomes = _in_thread(f"{trap}sleep 60 & echo $! > {pid_file}; wait", stopping)
    child = None
    try:
        wait_for(lambda: _pid_in(pid_file) is not None, 10, "the command to start")
        child = _pid_in(pid_file)
        assert child is not None
        stopping.set()
        assert stop_commands(stopping, 1.0 if ignores_term else 60.0) == 1
        thread.join(10)
        assert not thread.is_alive()
        (out,) = outcomes
        assert not out.succeeded
        # Its pipes closed as it exited; it is gone a moment later.
        wait_for(lambda: not _alive(child), 10, "the command's child to end")
    finally:
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_command_starting_after_the_stop_is_killed_at_once(tmp_path: Path) -> None:
    stopping = threading.Event()
    stopping.set()
    assert stop_commands(stopping, 0.1) == 0
    marker = tmp_path / "ran"
    thread, outcomes = _in_thread(f"sleep 2; touch {marker}", stopping)
    thread.join(30)
    (out,) = outcomes
    assert not out.succeeded and not marker.exists()


def test_a_stop_leaves_the_commands_of_other_callers_alone(tmp_path: Path) -> None:
    ours, theirs = threading.Event(), threading.Event()
    thread, outcomes = _in_thread(f"sleep 1; touch {tmp_path / 'done'}", theirs)
    ours.set()
    assert stop_commands(ours, 0.1) == 0
    thread.join(30)
    assert outcomes[0].succeeded and (tmp_path / "done").exists()


def test_python_receives_the_context() -> None:
    out = run_target(make({"kind": "python", "ref": "pysched.demo:hello"}), CTX)
    assert out.succeeded and json.loads(out.result or "") == {
        "hello": "j",
        "run_at": "2026-01-01T00:00:00+00:00",
        "key": "j:1767225600000:0",
    }


def test_python_import_error_fails_the_run() -> None:
    out = run_target(make({"kind": "python", "ref": "no_such_module_here:f"}), CTX)
    assert not out.succeeded and out.error is not None and "ModuleNotFoundError" in out.error


class _Unprintable(BaseException):
    def __str__(self) -> str:
        raise SystemExit("not even a message")


def exits(ctx: RunContext) -> None:
    sys.exit(3)


def interrupts(ctx: RunContext) -> None:
    raise KeyboardInterrupt


def raises_the_unprintable(ctx: RunContext) -> None:
    raise _Unprintable


@pytest.mark.parametrize(
    ("function", "error"),
    [
        ("exits", "SystemExit: 3"),
        ("interrupts", "KeyboardInterrupt"),
        ("raises_the_unprintable", "_Unprintable: (its message could not be read)"),
    ],
)
def test_python_base_exceptions_fail_the_run(function: str, error: str) -> None:
    out = run_target(make({"kind": "python", "ref": f"tests.test_targets:{function}"}), CTX)
    assert not out.succeeded and out.error == error


def test_each_failure_says_its_kind_for_the_retry_policy(http_server: tuple[str, list[dict[str, Any]]]) -> None:
    url, _ = http_server
    kinds = {
        "5xx": run_target(make({"kind": "http", "url": f"{url}/fail"}), CTX),
        "429": run_target(make({"kind": "http", "url": f"{url}/slow-down"}), CTX),
        "4xx": run_target(make({"kind": "http", "url": f"{url}/missing"}), CTX),
        # Nothing listens on port 9 of loopback here: refused at once.
        "connect": run_target(make({"kind": "http", "url": "http://127.0.0.1:9/"}), CTX),
        "exit": run_target(make({"kind": "shell", "command": "exit 3"}), CTX),
        "timeout": run_target(make({"kind": "shell", "command": "sleep 5", "timeout_s": 0.2}), CTX),
        "no module": run_target(make({"kind": "python", "ref": "no_such_module_here:f"}), CTX),
        "no function": run_target(make({"kind": "python", "ref": "json:no_such_function"}), CTX),
        "raises": run_target(make({"kind": "python", "ref": f"{__name__}:raises_key_error"}), CTX),
    }
    assert {name: outcome.kind for name, outcome in kinds.items()} == {
        "5xx": "5xx",
        "429": "5xx",
        "4xx": "4xx",
        "connect": "connect",
        "exit": "exception",
        "timeout": "timeout",
        "no module": "import",
        "no function": "import",
        "raises": "exception",
    }
    assert kinds["raises"].exception_names[:3] == ("KeyError", "LookupError", "Exception")


def test_a_module_that_imports_something_missing_fails_as_its_own_exception(tmp_path: Path) -> None:
    (tmp_path / "broken_dep_mod.py").write_text("import no_such_dependency_here\n\ndef f(ctx):\n    pass\n")
    sys.path.insert(0, str(tmp_path))
    try:
        outcome = run_target(make({"kind": "python", "ref": "broken_dep_mod:f"}), CTX)
    finally:
        sys.path.remove(str(tmp_path))
    assert (outcome.succeeded, outcome.kind) == (False, "exception")
    assert "ModuleNotFoundError" in (outcome.error or "")


def raises_key_error(ctx: RunContext) -> None:
    raise KeyError("missing")


def sleeps_until_cancelled(ctx: RunContext) -> None:
    if ctx.cancelled.wait(30):
        Path(ctx.payload["dir"], "saw-cancel").write_text("yes")


def ignores_cancel(ctx: RunContext) -> None:
    Path(ctx.payload["dir"], "pid").write_text(str(os.getpid()))
    while True:
        time.sleep(0.05)


def checkpoints(ctx: RunContext) -> object:
    ctx.checkpoint({"step": 2})
    return ctx.checkpoint_state


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_python_target_past_its_timeout_fails_and_is_told_to_stop(tmp_path: Path) -> None:
    job = make(
        {"kind": "python", "ref": f"{__name__}:sleeps_until_cancelled", "timeout_s": 0.5},
        payload={"dir": str(tmp_path)},
    )
    ctx = context_for(job, RECORD)
    outcome = run_target(job, ctx)
    assert (outcome.succeeded, outcome.kind) == (False, "timeout")
    assert "timed out after 0.5 s (it returned " in (outcome.error or "")
    assert "s after SIGTERM set ctx.cancelled)" in (outcome.error or "")
    # Its process got SIGTERM: the target saw ctx.cancelled and returned.
    assert (tmp_path / "saw-cancel").read_text() == "yes"
    assert ctx.cancelled.is_set()


def test_a_python_target_that_ignores_its_timeout_is_killed(tmp_path: Path) -> None:
    job = make(
        {"kind": "python", "ref": f"{__name__}:ignores_cancel", "timeout_s": 0.5}, payload={"dir": str(tmp_path)}
    )
    outcome = run_target(job, context_for(job, RECORD))
    assert outcome.kind == "timeout"
    assert outcome.error == "TimeoutError: timed out after 0.5 s (stopped: SIGTERM, then SIGKILL 2 s later)"
    # SIGKILL after the 2 s it had to return: gone, not running on.
    assert not _alive(int((tmp_path / "pid").read_text()))


def test_a_timed_python_target_checkpoints_through_its_worker() -> None:
    saved: list[str] = []
    job = make({"kind": "python", "ref": f"{__name__}:checkpoints", "timeout_s": 30})
    ctx = context_for(job, RECORD, checkpoint='{"step": 1}', save_checkpoint=lambda text: saved.append(text) is None)
    outcome = run_target(job, ctx)
    assert (outcome.succeeded, outcome.result) == (True, '{"step": 1}')
    assert saved == ['{"step":2}']


def test_a_timed_python_target_is_stopped_with_its_node(tmp_path: Path) -> None:
    stopping = threading.Event()
    job = make(
        {"kind": "python", "ref": f"{__name__}:ignores_cancel", "timeout_s": 600}, payload={"dir": str(tmp_path)}
    )
    threading.Timer(0.5, stopping.set).start()
    outcome = run_target(job, context_for(job, RECORD), stopping)
    assert not outcome.succeeded and "stopped" in (outcome.error or "")
    assert not _alive(int((tmp_path / "pid").read_text()))


def test_a_python_target_within_its_timeout_returns_its_value() -> None:
    job = make({"kind": "python", "ref": f"{__name__}:raises_key_error", "timeout_s": 10})
    assert run_target(job, CTX).error == "KeyError: 'missing'"
    ok = make({"kind": "python", "ref": "os:getpid", "timeout_s": 10})
    assert run_target(ok, CTX).kind == "exception"  # getpid takes no argument: the call raises
