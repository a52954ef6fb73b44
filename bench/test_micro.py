"""Native vs pure-Python reference, side by side in one run.

Each benchmark group holds the two implementations of one piece on the same
input (native and reference; for cron, pysched and cronsim); `python -m bench
micro` turns the groups into ratios.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import pytest
from cronsim import CronSim

from pysched import _codec, _loader, _native, cron
from pysched._reference import codec as ref_codec
from pysched._reference import jitter as ref_jitter
from pysched._reference import loader as ref_loader
from pysched._reference import wheel as ref_wheel
from pysched.protocols import Run

IMPLS = {"native": "native", "reference": "reference"}
WHEELS: dict[str, Callable[[int], Any]] = {"native": _native.TimingWheel, "reference": ref_wheel.TimingWheel}
T0 = 1_800_000_000_000


def arrays(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(n)
    handles = np.arange(n, dtype=np.int64)
    due = T0 + rng.integers(1, 60_000, size=n, dtype=np.int64)  # the leader's 60 s horizon
    return handles, due


@pytest.mark.parametrize("n", [10_000, 100_000, 1_000_000])
@pytest.mark.parametrize("impl", IMPLS)
def test_wheel_batch_insert(benchmark: Any, impl: str, n: int) -> None:
    handles, due = arrays(n)
    benchmark.group = f"wheel insert_batch n={n}"
    benchmark.extra_info["n"] = n

    def run() -> Any:
        wheel = WHEELS[impl](T0)
        wheel.insert_batch(handles, due)
        return wheel

    wheel = benchmark(run)
    assert len(wheel) == n


@pytest.mark.parametrize("n", [10_000, 100_000, 1_000_000])
@pytest.mark.parametrize("impl", IMPLS)
def test_wheel_advance_through_a_minute(benchmark: Any, impl: str, n: int) -> None:
    handles, due = arrays(n)
    benchmark.group = f"wheel advance 60 s in 10 ms ticks n={n}"
    benchmark.extra_info["n"] = n

    def setup() -> tuple[tuple[Any], dict[str, Any]]:
        wheel = WHEELS[impl](T0)
        wheel.insert_batch(handles, due)
        return (wheel,), {}

    def run(wheel: Any) -> int:
        fired = 0
        for now in range(T0, T0 + 60_010, 10):
            fired += len(wheel.advance(now))
        return fired

    assert benchmark.pedantic(run, setup=setup, rounds=3) == n


JITTER = {"native": _native.jitter_offsets, "reference": ref_jitter.jitter_offsets}
IDS = [f"job-{i}" for i in range(50_000)]


@pytest.mark.parametrize("impl", IMPLS)
def test_jitter_50k(benchmark: Any, impl: str) -> None:
    benchmark.group = "jitter offsets n=50000"
    out = benchmark(JITTER[impl], IDS, 60_000)
    assert len(out) == len(IDS)


PLAN = {"native": _native.plan_buckets, "reference": ref_jitter.plan_buckets}


@pytest.mark.parametrize("impl", IMPLS)
def test_bucket_planning_50k(benchmark: Any, impl: str) -> None:
    benchmark.group = "plan_buckets n=50000"
    run_at = arrays(50_000)[1]
    buckets, _ = benchmark(PLAN[impl], IDS, run_at, 64)
    assert len(buckets) == len(IDS)


LOAD = {"native": _loader.load_page, "reference": ref_loader.load_page}
PAGE = [Run(i, f"job-{i}", T0, T0 + i, i % 64, 1, 0) for i in range(50_000)]


@pytest.mark.parametrize("impl", IMPLS)
def test_loader_50k(benchmark: Any, impl: str) -> None:
    benchmark.group = "load_page n=50000"
    handles, _ = benchmark(LOAD[impl], PAGE, T0 + 40_000)
    assert len(handles) == 40_000


ENCODE = {"native": _codec.encode_batch, "reference": ref_codec.encode_batch}
DECODE = {"native": _codec.decode, "reference": ref_codec.decode}
ROWS = [(i, f"job-{i}", T0, T0 + i, i % 64, 1, 0) for i in range(50_000)]


@pytest.mark.parametrize("impl", IMPLS)
def test_codec_encode_50k(benchmark: Any, impl: str) -> None:
    benchmark.group = "codec encode_batch n=50000"
    assert len(benchmark(ENCODE[impl], ROWS, 7, T0)) == len(ROWS)


@pytest.mark.parametrize("impl", IMPLS)
def test_codec_decode_50k(benchmark: Any, impl: str) -> None:
    benchmark.group = "codec decode n=50000"
    payloads = _codec.encode_batch(ROWS, 7, T0)
    decode = DECODE[impl]
    out = benchmark(lambda: [decode(p) for p in payloads])
    assert out[-1].run_id == 49_999


# Cron: pysched's evaluator against cronsim alone (its former engine), the
# next fire after one instant; the parsed expression is cached in pysched as
# the scheduler's repeated calls have it. cronsim is given its start as a
# datetime already, so its figure leaves out a conversion pysched pays.
CRON_CASES = {"*/5 * * * * UTC": ("*/5 * * * *", "UTC"), "30 2 * * * Europe/Berlin": ("30 2 * * *", "Europe/Berlin")}


@pytest.mark.parametrize("case", list(CRON_CASES))
@pytest.mark.parametrize("impl", ["pysched", "cronsim"])
def test_cron_next_fire(benchmark: Any, impl: str, case: str) -> None:
    expr, tz = CRON_CASES[case]
    benchmark.group = f"cron next fire {case}"
    after_ms = T0 + 123_456
    expected = cron.next_after(expr, tz, after_ms)
    if impl == "pysched":
        got = benchmark(cron.next_after, expr, tz, after_ms)
    else:
        start = datetime.fromtimestamp(after_ms // 1000, ZoneInfo(tz))
        got = benchmark(lambda: int(next(CronSim(expr, start)).timestamp()) * 1000)
    assert got == expected
