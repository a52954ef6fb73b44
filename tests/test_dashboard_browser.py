"""The dashboard in a real browser: Debian's headless Chromium, driven by
Playwright, against a real `pysched up --api 0` node. A job added over the
API appears on the overview by the page's own refresh; a job that fails for
good shows in the dead letters, and its Redrive button runs it again.

Chromium comes from apt (scripts/browser, run by scripts/test); Playwright's
own browser download is never used. Screenshots go to the test's temporary
folder; with PYSCHED_SCREENSHOTS=1 the overview's is also copied to
docs/dashboard.png, the README's picture."""

from __future__ import annotations

import os
import shlex
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, now_ms, start_node, stop_node, wait_for
from tests.test_cli_api import api_url, call

CHROMIUM = Path("/usr/bin/chromium")
# Without the networking flags Chromium keeps calling out, and this
# machine's closed network refuses it; as root it needs --no-sandbox.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 60_000


@pytest.fixture
def chromium() -> Path:
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: install it with scripts/browser (Debian's chromium package)"
        if os.environ.get("PYSCHED_REQUIRE_SERVICES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM


@pytest.fixture
def node_url(tmp_path: Path) -> Iterator[str]:
    log = tmp_path / "node.log"
    node = start_node(tmp_path / "jobs.db", tmp_path, log, "--api", "0", "--workers", "1")
    try:
        wait_for(lambda: api_url(log) is not None, 60, "the API's address in the log", log)
        url = api_url(log)
        assert url is not None
        wait_for(lambda: call(f"{url}/health")[0] == 200, 60, "the node to lead every partition", log)
        yield url
    finally:
        stop_node(node)


def shell_job(job_id: str, command: str, schedule: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"id": job_id, "schedule": schedule, "target": {"kind": "shell", "command": command}, **more}


def in_ms(ms: int) -> dict[str, Any]:
    return {"kind": "once", "run_at_ms": now_ms() + ms}


@pytest.mark.slow
def test_the_dashboard_shows_jobs_as_they_come_and_redrives_a_dead_letter(
    chromium: Path, node_url: str, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    shots = tmp_path / "screenshots"
    shots.mkdir()
    started = time.monotonic()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(WAIT_MS)
            page.goto(f"{node_url}/")
            assert page.locator("h1").inner_text() == "Overview"
            assert "no jobs yet" in page.locator('tbody[data-part="jobs"]').inner_text()

            # Added over the API: the page's script shows it, no reload.
            sync = shell_job("inventory-sync", "echo synced", {"kind": "cron", "expr": "*/5 * * * *"})
            assert call(f"{node_url}/jobs", "POST", sync)[0] == 201
            page.locator('tbody[data-part="jobs"] a', has_text="inventory-sync").wait_for()
            page.locator('tbody[data-part="upcoming"] a', has_text="inventory-sync").first.wait_for()

            # Fails for good on its first attempt (no retries); runs clean once redriven.
            marker = shlex.quote(str(tmp_path / "failed-once"))
            flaky = shell_job(
                "flaky-export",
                f"test -e {marker} || {{ touch {marker}; echo 'disk full' >&2; exit 3; }}",
                in_ms(1_000),
                retry={"retries": 0},
            )
            assert call(f"{node_url}/jobs", "POST", flaky)[0] == 201
            for n in range(4):
                assert (
                    call(f"{node_url}/jobs", "POST", shell_job(f"hello-{n}", "echo hi", in_ms(500 + 300 * n)))[0] == 201
                )

            def dead_letter() -> list[dict[str, Any]]:
                return [d for d in call(f"{node_url}/dead-letters")[1] if d["job_id"] == "flaky-export"]

            wait_for(lambda: bool(dead_letter()), 60, "flaky-export to fail for good")
            key = dead_letter()[0]["key"]
            page.goto(f"{node_url}/ui/dead-letters")
            row = page.locator('tbody[data-part="dead"] tr', has_text="flaky-export")
            row.wait_for()
            page.screenshot(path=str(shots / "dead-letters.png"), full_page=True)
            row.get_by_role("button", name="Redrive").click()
            page.locator(".notice", has_text="Redriven: flaky-export:").wait_for()

            def redriven() -> bool:
                status, run = call(f"{node_url}/runs/{key}")
                return status == 200 and run["state"] in ("scheduled", "dispatched", "running", "succeeded")

            wait_for(redriven, 60, "the redriven run to be handed on again")
            wait_for(
                lambda: call(f"{node_url}/runs/{key}")[1]["state"] == "succeeded", 60, "the redriven run to succeed"
            )
            assert dead_letter() == []

            page.goto(f"{node_url}/ui/jobs/flaky-export")
            page.locator('tbody[data-part="runs"] td', has_text="succeeded").wait_for()
            page.screenshot(path=str(shots / "job.png"), full_page=True)
            page.goto(f"{node_url}/ui/partitions")
            page.locator('tbody[data-part="partitions"] tr').first.wait_for()
            page.screenshot(path=str(shots / "partitions.png"), full_page=True)

            page.goto(f"{node_url}/")
            for n in range(4):
                page.locator('tbody[data-part="recent"] a', has_text=f"hello-{n}").wait_for()
            page.screenshot(path=str(shots / "overview.png"), full_page=True)
        finally:
            browser.close()
    print(f"browser test: {time.monotonic() - started:.1f} s; screenshots in {shots}")
    if os.environ.get("PYSCHED_SCREENSHOTS") == "1":
        (ROOT / "docs").mkdir(exist_ok=True)
        shutil.copyfile(shots / "overview.png", ROOT / "docs" / "dashboard.png")
