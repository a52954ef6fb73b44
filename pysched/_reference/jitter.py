"""Pure-Python twins of the native jitter and bucket planning."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

BUCKET_MS = 60_000


def jitter_offset(job_id: str, window_ms: int) -> int:
    """The offset in [0, window_ms) of a job's runs within its jitter window."""
    if window_ms <= 0:
        raise ValueError(f"window_ms must be positive, got {window_ms}")
    return int(hashlib.sha256(job_id.encode()).hexdigest(), 16) % window_ms


def jitter_offsets(job_ids: Sequence[str], window_ms: int) -> npt.NDArray[np.int64]:
    return np.array([jitter_offset(j, window_ms) for j in job_ids], dtype=np.int64)


def shard_for(job_id: str, partitions: int) -> int:
    """A stable shard: crc32 of the id, the same in every process."""
    if not 0 < partitions < 2**32:
        raise ValueError(f"partitions must be in 1..2**32, got {partitions}")
    return zlib.crc32(job_id.encode()) % partitions


def plan_buckets(
    job_ids: Sequence[str], run_at_ms: npt.NDArray[np.int64], partitions: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    if len(job_ids) != len(run_at_ms):
        raise ValueError(f"job_ids ({len(job_ids)}) and run_at_ms ({len(run_at_ms)}) differ in length")
    buckets = np.array([int(t) // BUCKET_MS for t in run_at_ms], dtype=np.int64)
    shards = np.array([shard_for(j, partitions) for j in job_ids], dtype=np.int64)
    return buckets, shards
