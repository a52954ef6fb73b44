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
    finally:
        stop_node(node)
    assert json.loads(cli("history", "hello", "--json", db=db).stdout)[0]["result"] == "hello"


def test_the_api_refuses_an_exposed_address_without_a_token_and_a_taken_port(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"
    exposed = subprocess.run(
        [*PYSCHED, "api", "--db", str(db), "--host", "0.0.0.0"], capture_output=True, text=True, timeout=60
    )
    assert exposed.returncode == 2 and exposed.stderr.startswith("error: --host: 0.0.0.0 is not a loopback address")
    node = subprocess.run(
        [*PYSCHED, "up", "--db", str(db), "--api", "1", "--api-host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert node.returncode == 2 and node.stderr.startswith("error: --api-host: 0.0.0.0 is not a loopback address")
    weak = subprocess.run(
        [*PYSCHED, "api", "--db", str(db), "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYSCHED_API_TOKEN": "short"},
    )
    assert weak.returncode == 2 and weak.stderr.startswith("error: PYSCHED_API_TOKEN: at least 16")
    nowhere = subprocess.run(
        [*PYSCHED, "api", "--db", str(db), "--host", "no-such-host.invalid"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYSCHED_API_TOKEN": "a-long-enough-token-0123"},
    )
    assert nowhere.returncode == 2 and nowhere.stderr.startswith("error: --host: 'no-such-host.invalid' is not an")
    with socket_taken() as port:
        taken = subprocess.run(
            [*PYSCHED, "api", "--db", str(db), "--port", str(port)], capture_output=True, text=True, timeout=60
        )
    assert taken.returncode == 2 and "--port: cannot listen on 127.0.0.1" in taken.stderr
    assert "Traceback" not in exposed.stderr + node.stderr + taken.stderr
    assert not db.exists()


@contextmanager
def socket_taken() -> Iterator[int]:
    """A port this test listens on, taken for as long as it runs."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])
