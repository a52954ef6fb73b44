"""bench cost's CPU readings: a process's time from /proc, with its
children's, and a window read off samples by interpolation."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.cpu import CpuSample, CpuSampler, _children, cpu_seconds


def test_a_child_that_ended_is_counted_in_its_parent() -> None:
    before = cpu_seconds(os.getpid(), _children())
    # A child that burns CPU, then is waited for: its time is the parent's.
    subprocess.run([sys.executable, "-c", "sum(range(30_000_000))"], check=True)
    after = cpu_seconds(os.getpid(), _children())
    assert after - before >= 0.3


def test_a_window_between_samples_is_interpolated() -> None:
    sampler = CpuSampler({"a": 0})
    sampler.samples = [CpuSample(1_000, {"a": 1.0}), CpuSample(2_000, {"a": 3.0}), CpuSample(3_000, {"a": 3.0})]
    assert sampler.used(1_500, 2_500) == {"a": 1.0}
    assert sampler.used(1_000, 3_000) == {"a": 2.0}
    # Outside the samples: held at the first and the last.
    assert sampler.used(0, 10_000) == {"a": 2.0}
