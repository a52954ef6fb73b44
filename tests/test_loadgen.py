"""loadgen: its shapes, its figures, and a small spike end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pysched import native
from pysched.catchup import next_run
from pysched.planning import first_run, jitter_for
from pysched.protocols import Run
from pysched_loadgen.measure import Observed, percentiles, report
from pysched_loadgen.runner import TappedDispatcher
from pysched_loadgen.shapes import Load, spike_jobs, sustain_jobs, sustain_recurring

LOADGEN = [sys.executable, "-m", "pysched_loadgen"]
T = 1_800_000_000_000


def test_shapes(tmp_path: Path) -> None:
    ledger = tmp_path / "l"
    instant = list(spike_jobs(10, T, "instant", 60, ledger, "a"))
    assert {due for _, due in instant} == {T} and all(job.critical for job, _ in instant)
    jittered = list(spike_jobs(50, T, "jittered", 60, ledger, "b"))
    assert all(due == T + native.jitter_offset(job.id, 60_000) for job, due in jittered)
    assert len({due for _, due in jittered}) > 40  # spread, deterministically
    realistic = list(spike_jobs(100, T, "realistic", 60, ledger, "c"))
    assert sum(1 for _, due in realistic if due == T) >= 80
    steady = [due for _, due in sustain_jobs(100, 2, T, ledger, "d")]
    assert len(steady) == 200 and steady[0] == T and steady[-1] == T + 1_990


def test_one_shot_loads_expect_each_run_once(tmp_path: Path) -> None:
    load = Load.one_shots(spike_jobs(5, T, "instant", 0, tmp_path / "l", "a"))
    assert load.expected == {f"a{k:07d}:{T}:0": T for k in range(5)} and not load.recurring


def test_recurring_sustain_expects_what_pysched_plans(tmp_path: Path) -> None:
    start = (T // 60_000 + 1) * 60_000
    load = sustain_recurring(2, 3, start, tmp_path / "l", "r")
    assert len(load.jobs) == 120 and len(load.expected) == 360 and load.recurring
    dues = sorted(load.expected.values())
    # 120 runs a minute spread over the minute: about 2 a second.
    assert dues[0] >= start and dues[-1] < start + 3 * 60_000 + 60_000
    assert len({d // 1000 for d in dues if d < start + 60_000}) > 40
    for job in load.jobs:
        jitter = jitter_for(job)
        planned = first_run(job, jitter, start - 5_000)
        assert planned is not None
        for _ in range(3):
            assert load.expected[f"{job.id}:{planned.run_at_ms}:0"] == planned.due_ms
            planned = next_run(job, jitter, planned.run_at_ms, planned.due_ms)[0]
            assert planned is not None
    with pytest.raises(ValueError, match="minute boundary"):
        sustain_recurring(1, 1, start + 1, tmp_path / "l", "x")


def test_figures_count_from_the_ledger(tmp_path: Path) -> None:
    observed = Observed({"a:1:0": 100, "b:1:0": 100, "c:1:0": 100})
    observed.saw_dispatch("a:1:0", 110)
    observed.saw_dispatch("b:1:0", 130)
    observed.saw_dispatch("b:1:0", 150)  # a second delivery
    observed.saw_dispatch("zzz", 1)  # not ours
    ledger = tmp_path / "ledger"
    ledger.write_text("a:1:0 100 120\nb:1:0 100 140\nb:1:0 100 160\n")
    out = report(observed, ledger, 1.5, {})
    assert (out["n"], out["fired"], out["missed"], out["executed"]) == (3, 2, 1, 2)
    assert (out["duplicates"], out["redispatched"]) == (1, 1)
    assert sorted(out.pop("_fire_lags")) == [10, 30]
    assert out["max_ms"] == 30 and out["start"]["max_ms"] == 40


def test_percentiles_of_nothing_are_none() -> None:
    assert set(percentiles([]).values()) == {None}
    assert percentiles([5] * 10)["p99_ms"] == 5


# From outside the checkout and without PYTHONPATH, so only what the install
# provides is importable.
INSTALLED_NAMES = """
import importlib.util
from pathlib import Path

import pysched_loadgen

print(Path(pysched_loadgen.__file__).resolve().parent.name)
print(importlib.util.find_spec("loadgen") is not None)
"""


def test_the_loadgen_folder_installs_as_pysched_loadgen_alone(tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", INSTALLED_NAMES], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, proc.stderr
    folder, loadgen_importable = proc.stdout.split()
    assert folder == "loadgen", f"pysched_loadgen is installed from a folder named {folder!r}"
    assert loadgen_importable == "False", "the install provides a top-level loadgen module"


@pytest.mark.slow
def test_a_small_embedded_spike_fires_and_runs_everything_once(tmp_path: Path) -> None:
    out = tmp_path / "spike.json"
    png = tmp_path / "spike.png"
    proc = subprocess.run(
        [*LOADGEN, "spike", "--n", "300", "--in", "2", "--embedded", "--quiet", "--json", str(out), "--plot", str(png)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(out.read_text())
    for key in ("n", "fired", "missed", "duplicates", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms", "register_s"):
        assert key in figures
    assert (figures["n"], figures["fired"], figures["missed"], figures["duplicates"]) == (300, 300, 0, 0)
    assert figures["executed"] == 300
    assert png.stat().st_size > 10_000


@pytest.mark.slow
def test_a_small_recurring_sustain_fires_every_minute_and_cancels_its_jobs(tmp_path: Path) -> None:
    out = tmp_path / "sustain.json"
    args = ["sustain", "--shape", "recurring", "--rate", "1", "--duration", "60", "--in", "1", "--embedded"]
    proc = subprocess.run(
        [*LOADGEN, *args, "--quiet", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(out.read_text())
    assert (figures["n"], figures["fired"], figures["missed"], figures["duplicates"]) == (60, 60, 0, 0)
    assert figures["executed"] == 60 and figures["shape"] == "recurring"


# A machine slower than loadgen assumes (cold servers, a busy core): every
# bulk registration takes 3 s, beyond the lead allowed for 100 jobs.
SLOW_REGISTRATION = """
import sys, time
import pysched.registry as registry
fast = registry.register_many
def slow(*args, **kwargs):
    time.sleep(3)
    return fast(*args, **kwargs)
registry.register_many = slow
from pysched_loadgen.cli import main
main()
"""


def _slowed_loadgen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SLOW_REGISTRATION, *args, "--embedded", "--quiet"],
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.slow
def test_a_registration_slower_than_assumed_is_done_again_later_not_failed(tmp_path: Path) -> None:
    out = tmp_path / "sustain.json"
    proc = _slowed_loadgen("sustain", "--rate", "100", "--duration", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(out.read_text())
    assert (figures["n"], figures["fired"], figures["missed"], figures["duplicates"]) == (100, 100, 0, 0)
    assert figures["executed"] == 100 and figures["attempts"] >= 2
    assert figures["register_s"] >= 3  # the attempt that counted, not a discarded one


@pytest.mark.slow
def test_an_instant_the_user_chose_too_close_is_an_error() -> None:
    proc = _slowed_loadgen("spike", "--n", "100", "--in", "1")
    assert proc.returncode == 2 and "start the runs later (--in, --at)" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["spike", "--embedded", "--shape", "square"], "--shape"),
        (["sustain", "--embedded", "--shape", "square"], "--shape"),
        (["spike", "--embedded", "--config", "x.toml", "--in", "1"], "exactly one of --embedded, --config"),
        (["spike", "--embedded", "--at", "soon"], "--at: not an ISO 8601 time"),
        (["spike", "--config", "/nonexistent.toml", "--in", "1"], "--config"),
        (["spike", "--embedded", "--in", "nan"], "--in: seconds from now"),
        (["sustain", "--embedded", "--in", "-3"], "--in: seconds from now"),
    ],
)
def test_bad_input_is_named(args: list[str], message: str) -> None:
    proc = subprocess.run([*LOADGEN, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_a_batch_handed_over_while_the_observer_looks_is_seen() -> None:
    tap = TappedDispatcher()
    runs = [Run(k, f"job-{k}", 1_000, 1_000, 0, 1, 0) for k in (1, 2)]
    first, second = native.encode_batch(runs, 1, 1_000)
    observed = Observed({native.decode(p).idempotency_key: 1_000 for p in (first, second)})
    tap.publish([0], [first])
    held = tap.handed  # the leader's thread has the queue in hand to append to it,
    tap.observe(observed)  # the observer takes what was handed over,
    held.append((1_001, [second]))  # and the leader's append lands
    tap.observe(observed)
    assert observed.dispatched.keys() == observed.expected.keys()
    assert observed.dispatched[native.decode(second).idempotency_key] == 1_001
