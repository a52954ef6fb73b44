"""History is pruned by the running node: finished runs past the retention
go, the newest finished run of a job stays; `history --limit` shows the
newest runs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pysched.leader.recording import record_sent
from pysched.model import Job
from pysched.node import open_embedded
from pysched.planning import partition_for
from pysched.protocols import PlannedRun
from pysched.records import DispatchRecord
from tests.helpers import cli, cli_json, start_node, stop_node, wait_for

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


def old_history(db_path: Path, runs: int = 5) -> None:
    """An hourly job whose ``runs`` runs succeeded ten days ago, then was
    cancelled: ``runs`` + 1 finished runs, the cancelled one the newest."""
    start = (time.time_ns() // 1_000_000 - 10 * DAY_MS) // HOUR_MS * HOUR_MS
    job = Job.model_validate(
        {
            "id": "hourly",
            "schedule": {"kind": "cron", "expr": "0 * * * *"},
            "target": {"kind": "shell", "command": "true"},
        }
    )
    backends = open_embedded(db_path)
    store = backends.store
    try:
        store.add_job(job, partition_for(job.id, store.partitions), 0, PlannedRun(start, start), start - 1_000)
        fences = dict.fromkeys(range(64), 1)
        for k in range(runs):
            now = start + k * HOUR_MS
            rows = list(store.due_runs(fences, now + 1, now))
            record_sent(store, rows, fences, {}, now)
            for row in rows:
                record = DispatchRecord(*row, 1, now)
                store.run_started(record, "w", now)
                store.run_finished(record, "succeeded", None, None, now + 1_000)
        store.cancel_job(job.id, start + runs * HOUR_MS)
    finally:
        backends.close()


def history_states(db_path: Path) -> list[str]:
    return [run["state"] for run in cli_json("history", "hourly", "--limit", "100", db=db_path)]


def test_history_limit_shows_the_newest_runs(db_path: Path) -> None:
    old_history(db_path)
    assert history_states(db_path) == ["cancelled"] + ["succeeded"] * 5
    newest = cli_json("history", "hourly", "--limit", "2", db=db_path)
    assert [run["state"] for run in newest] == ["cancelled", "succeeded"]
    assert newest[0]["run_at"] > newest[1]["run_at"]
    refused = cli("history", "hourly", "--limit", "0", db=db_path, check=False)
    assert refused.returncode == 2 and "--limit" in refused.stderr


def test_bad_retention_is_refused(db_path: Path) -> None:
    for flag in ("--history-days", "--history-keep"):
        proc = cli("up", flag, "-1", db=db_path, check=False)
        assert proc.returncode == 2 and flag in proc.stderr, proc.stderr
    assert not db_path.exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "left"),
    [
        ((), ["cancelled"]),  # 7 days by default: only the newest finished run stays
        (("--history-days", "30", "--history-keep", "2"), ["cancelled", "succeeded"]),
    ],
)
def test_a_running_node_prunes_history_beyond_the_retention(
    tmp_path: Path, db_path: Path, flags: tuple[str, ...], left: list[str]
) -> None:
    old_history(db_path)
    node = start_node(db_path, tmp_path, tmp_path / "node.log", *flags)
    try:
        wait_for(lambda: history_states(db_path) == left, 30, f"history pruned to {left}")
    finally:
        stop_node(node)
    assert "pruned" in (tmp_path / "node.log").read_text()
