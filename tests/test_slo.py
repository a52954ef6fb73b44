"""Fire-lag objectives: attainment, error budget and burn rates from runs."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from pysched.model import Job
from pysched.protocols import RunRecord
from pysched.slo import slo_report
from tests.helpers import cli, cli_json

NOW = 1_800_000_000_000
HOUR = 3_600_000


def job(**slo: float) -> Job:
    return Job.model_validate(
        {
            "id": "j",
            "schedule": {"kind": "cron", "expr": "* * * * *"},
            "target": {"kind": "shell", "command": "true"},
            "slo": slo,
        }
    )


def run(due: int, lag_ms: int | None, state: str = "succeeded", run_id: int = 0) -> RunRecord:
    dispatched = None if lag_ms is None else due + lag_ms
    return RunRecord(run_id, "j", due, due, state, 1, 1, dispatched, dispatched, dispatched, "w", None, None)


def test_a_late_run_in_a_hundred_spends_the_whole_budget_of_a_p99() -> None:
    runs = [run(NOW - i * 60_000, 5, run_id=i) for i in range(1, 99)]
    runs += [run(NOW - 30 * 60_000, 1_500), run(NOW - 5 * HOUR, 2_000)]
    # Not counted: owed again (its handing-on was an earlier attempt's), or
    # cancelled so, never handed on, or outside the 30-day window.
    runs += [run(NOW - 60_000, -50_000, state="retrying"), run(NOW - 60_000, None, state="missed")]
    runs += [run(NOW - 60_000, -50_000, state="cancelled")]
    runs += [run(NOW - 31 * 24 * HOUR, 99_000)]
    report = slo_report(job(), runs, NOW)
    assert (report.runs, report.late, report.fire_lag_ms, report.objective) == (100, 2, 1_000, 0.99)
    assert report.attainment == 0.98 and report.met is False
    assert report.budget_remaining is not None and abs(report.budget_remaining - (-1.0)) < 1e-9
    burns = {b.window: b for b in report.burn_rates}
    # The last hour: 60 on time and one late, against a 1% budget.
    assert (burns["1h"].runs, burns["1h"].late) == (61, 1)
    assert burns["1h"].rate is not None and abs(burns["1h"].rate - (1 / 61) / 0.01) < 1e-9
    assert (burns["6h"].runs, burns["6h"].late) == (100, 2)


def test_a_job_without_runs_has_no_attainment_yet() -> None:
    report = slo_report(job(fire_lag_s=0.25, objective=0.999, window_days=7), [], NOW)
    assert (report.runs, report.attainment, report.met, report.budget_remaining) == (0, None, None, None)
    assert report.fire_lag_ms == 250 and all(b.rate is None for b in report.burn_rates)


@given(st.lists(st.tuples(st.integers(0, 40 * 24 * HOUR), st.integers(-5_000, 5_000)), max_size=200))
def test_the_figures_agree_with_each_other(lags: list[tuple[int, int]]) -> None:
    runs = [run(NOW - age, lag, run_id=i) for i, (age, lag) in enumerate(lags)]
    report = slo_report(job(), runs, NOW)
    inside = [lag for age, lag in lags if age <= 30 * 24 * HOUR]
    assert report.runs == len(inside) and report.late == sum(1 for lag in inside if lag > 1_000)
    if report.runs:
        assert report.attainment is not None and 0 <= report.attainment <= 1
        assert report.budget_remaining is not None
        assert abs((1 - report.budget_remaining) * 0.01 - report.late / report.runs) < 1e-9
    for burn in report.burn_rates:
        assert burn.late <= burn.runs <= report.runs


def test_the_cli_shows_a_jobs_objective_and_refuses_a_bad_one(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"
    cli(
        "add",
        "tight",
        "--cron",
        "* * * * *",
        "--shell",
        "true",
        "--slo-fire-lag",
        "0.5",
        "--slo-objective",
        "0.999",
        db=db,
    )
    shown = cli_json("slo", "tight", db=db)
    assert shown["target_fire_lag_ms"] == 500 and shown["objective"] == 0.999 and shown["runs"] == 0
    assert shown["attainment"] is None and set(shown["burn_rates"]) == {"1h", "6h", "3d"}
    assert [r["job_id"] for r in cli_json("slo", db=db)] == ["tight"]
    assert "tight" in cli("slo", db=db).stdout
    bad = cli("add", "x", "--in", "5", "--shell", "true", "--slo-objective", "1.5", db=db, check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --slo-objective:")
    triggered = cli("trigger", "tight", db=db)
    assert triggered.stdout.startswith("triggered tight: run tight:")
    assert cli("trigger", "ghost", db=db, check=False).returncode == 3
    missing = cli("slo", "ghost", db=db, check=False)
    assert missing.returncode == 3 and "ghost" in missing.stderr
    assert json.loads(cli("show", "tight", "--json", db=db).stdout)["slo"]["window_days"] == 30
