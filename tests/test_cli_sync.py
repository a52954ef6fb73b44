"""`pysched sync MODULE` as a user runs it, from the module's directory."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.helpers import cli

DECLARED = """
import pysched

@pysched.job(cron="0 9 * * 1-5", tz="Europe/Paris", retries=5)
def report(ctx):
    return "report"

@pysched.job(cron="*/15 * * * *", id="cleanup")
def clean(ctx):
    return None
"""


def write(tmp_path: Path, name: str, body: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))


def test_sync_adds_then_changes_nothing_then_prunes(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"
    write(tmp_path, "myjobs", DECLARED)
    first = cli("sync", "myjobs", db=db, cwd=tmp_path)
    assert "added myjobs.report: next run " in first.stdout and "added cleanup" in first.stdout
    # The jittered time beside the one the schedule names.
    assert "on its schedule + " in first.stdout and "s of jitter, the same every run" in first.stdout
    assert "myjobs: 2 declared: 2 added, 0 updated, 0 unchanged" in first.stdout
    assert "no scheduler has run" in first.stderr
    again = json.loads(cli("sync", "myjobs", "--json", db=db, cwd=tmp_path).stdout)
    assert again["added"] == [] and sorted(again["unchanged"]) == ["cleanup", "myjobs.report"]
    write(tmp_path, "myjobs", DECLARED.split('@pysched.job(cron="*/15')[0])
    dry = json.loads(cli("sync", "myjobs", "--prune", "--dry-run", "--json", db=db, cwd=tmp_path).stdout)
    assert dry["pruned"] == ["cleanup"] and dry["dry_run"] is True
    shown = json.loads(cli("show", "cleanup", "--json", db=db).stdout)
    assert shown["state"] == "active"
    pruned = cli("sync", "myjobs", "--prune", db=db, cwd=tmp_path)
    assert "cancelled cleanup" in pruned.stdout
    assert "myjobs: 1 declared: 0 added, 0 updated, 1 unchanged; 1 no longer declared cancelled" in pruned.stdout
    assert json.loads(cli("show", "cleanup", "--json", db=db).stdout)["state"] == "cancelled"
    # The declaration restored, a sync adds the job again: an accidental
    # prune undone.
    write(tmp_path, "myjobs", DECLARED)
    restored = cli("sync", "myjobs", "--prune", db=db, cwd=tmp_path)
    assert "added cleanup: next run " in restored.stdout
    assert "myjobs: 2 declared: 1 added, 0 updated, 1 unchanged" in restored.stdout
    assert json.loads(cli("show", "cleanup", "--json", db=db).stdout)["state"] == "active"
    report = json.loads(cli("show", "myjobs.report", "--json", db=db).stdout)
    assert report["target"] == {"kind": "python", "ref": "myjobs:report", "timeout_s": None}
    assert report["retry"]["retries"] == 5


def test_a_module_that_cannot_be_synced_is_an_error_naming_it_and_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"
    write(tmp_path, "badcron", 'import pysched\n\n@pysched.job(cron="61 * * * *")\ndef f(ctx):\n    pass\n')
    write(tmp_path, "broken", "raise RuntimeError('not today')\n")
    write(tmp_path, "imports_missing", "import no_such_dependency_anywhere\n")
    cases = {
        "badcron": "error: @pysched.job on badcron:f: schedule.expr: Bad minute",
        "broken": "error: MODULE: importing broken failed: RuntimeError: not today",
        "nosuchmodule": "error: MODULE: no module named 'nosuchmodule'",
        "imports_missing": "error: MODULE: importing imports_missing failed: ModuleNotFoundError",
    }
    # A file's name for the module's: the hint gives the name to import.
    write(tmp_path, "myjobs", "import pysched\n")
    cases["myjobs.py"] = "error: MODULE: 'myjobs.py' is a file's path"
    cases["./jobs/nightly.py"] = "error: MODULE: './jobs/nightly.py' is a file's path"
    hints = {
        "myjobs.py": "give the module's name, without .py: myjobs\n",
        "./jobs/nightly.py": "give the module's name, without .py: jobs.nightly\n",
    }
    for module, message in cases.items():
        proc = cli("sync", module, db=db, cwd=tmp_path, check=False)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(message), proc.stderr
        assert proc.stderr.endswith(hints.get(module, "\n")), proc.stderr
        assert "Traceback" not in proc.stderr
    assert not db.exists()
