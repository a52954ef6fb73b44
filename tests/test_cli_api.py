"""`pysched api` and `pysched up --api` as a user starts them."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import PYSCHED, cli, now_ms, start_node, stop_node, wait_for


def api_url(log: Path) -> str | None:
    found = re.search(r"API on (http://[0-9.]+:\d+)", log.read_text(errors="replace")) if log.exists() else None
    return found.group(1) if found else None


def call(url: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.slow
def test_a_node_serves_the_api_and_fires_what_it_adds(tmp_path: Path) -> None:
    db, log = tmp_path / "jobs.db", tmp_path / "node.log"
    node = start_node(db, tmp_path, log, "--api", "0", "--workers", "1", "--quiet")
    try:
        wait_for(lambda: api_url(log) is not None, 60, "the API's address in the log", log)
        url = api_url(log)
        assert url is not None
        wait_for(lambda: call(f"{url}/health")[0] == 200, 60, "the node to lead every partition", log)
        job = {
            "id": "hello",
            "schedule": {"kind": "once", "run_at_ms": now_ms() + 500},
            "target": {"kind": "shell", "command": "echo hello"},
        }
        assert call(f"{url}/jobs", "POST", job)[0] == 201
        assert call(f"{url}/jobs", "POST", job)[0] == 409

        def succeeded() -> bool:
            runs = call(f"{url}/jobs/hello/runs")[1]
            return bool(runs) and runs[0]["state"] == "succeeded"

        wait_for(succeeded, 60, "the job added over HTTP to run", log)
        assert call(f"{url}/openapi.json")[1]["info"]["title"] == "pysched"
        # pysched status reads the same leases as /partitions.
        (holder,) = json.loads(cli("status", "--json", db=db).stdout)["leaders"].values()
        assert holder["partitions"] == len(call(f"{url}/partitions")[1])
    finally:
        stop_node(node)
    assert json.loads(cli("history", "hello", "--json", db=db).stdout)[0]["result"] == "hello"


def refused(db: Path, *args: str, token: str | None = None) -> str:
    """``pysched ARGS --db DB`` run to its refusal: exit 2, one line, no
    traceback, nothing created; its message."""
    env = {k: v for k, v in os.environ.items() if k != "PYSCHED_API_TOKEN"}
    if token is not None:
        env["PYSCHED_API_TOKEN"] = token
    proc = subprocess.run([*PYSCHED, *args, "--db", str(db)], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and not db.exists()
    return proc.stderr


def test_the_api_refuses_an_exposed_address_without_a_token_and_a_taken_port(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"
    assert refused(db, "api", "--host", "0.0.0.0").startswith("error: --host: 0.0.0.0 is not a loopback address")
    assert refused(db, "up", "--api", "1", "--api-host", "0.0.0.0").startswith(
        "error: --api-host: 0.0.0.0 is not a loopback address"
    )
    weak = refused(db, "api", "--host", "0.0.0.0", token="short")
    assert weak.startswith("error: PYSCHED_API_TOKEN: at least 16")
    nowhere = refused(db, "api", "--host", "no-such-host.invalid", token="a-long-enough-token-0123")
    assert nowhere.startswith("error: --host: 'no-such-host.invalid' is not an")
    with socket_taken() as port:
        assert "--port: cannot listen on 127.0.0.1" in refused(db, "api", "--port", str(port))


@contextmanager
def socket_taken() -> Iterator[int]:
    """A port this test listens on, taken for as long as it runs."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])
