"""Pure-Python twin of ``pysched._codec`` (see core_ext/codec.pyx for the layout)."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any

from pysched.records import DispatchRecord, RecordError

VERSION = 1
_HEADER = struct.Struct("<BBHIIHHqqqqq")
HEADER = _HEADER.size  # 56


def _encode_one(row: Sequence[Any], fence: int, dispatched_at_ms: int) -> bytes:
    run_id, job_id, run_at_ms, due_ms, partition, attempt, group = row
    if not isinstance(job_id, str):
        raise TypeError(f"job id must be str, not {type(job_id).__name__}")
    job = job_id.encode("utf-8")
    if len(job) > 0xFFFF:
        raise RecordError(f"job id of {len(job)} bytes exceeds 65535")
    if not 0 <= partition <= 0xFFFF:
        raise RecordError(f"partition {partition} outside 0..65535")
    if not 0 <= attempt <= 0xFFFFFFFF or not 0 <= group <= 0xFFFFFFFF:
        raise RecordError(f"attempt {attempt} or attempt_group {group} outside u32")
    header = _HEADER.pack(
        VERSION, 0, partition, attempt, group, len(job), 0, fence, run_id, run_at_ms, due_ms, dispatched_at_ms
    )
    return header + job


def encode_batch(rows: Iterable[Sequence[Any]], fence: int, dispatched_at_ms: int) -> list[bytes]:
    """Encode rows of (run_id, job_id, run_at_ms, due_ms, partition, attempt,
    attempt_group) into one payload each, all under ``fence``."""
    return [_encode_one(row, fence, dispatched_at_ms) for row in rows]


def decode(payload: bytes) -> DispatchRecord:
    """Decode one payload into a DispatchRecord; RecordError when malformed."""
    if len(payload) < HEADER:
        raise RecordError(f"payload of {len(payload)} bytes is shorter than the {HEADER}-byte header")
    if payload[0] != VERSION:
        raise RecordError(f"unknown record version {payload[0]}")
    (_, _, partition, attempt, group, n, _, fence, run_id, run_at_ms, due_ms, dispatched_at_ms) = _HEADER.unpack_from(
        payload
    )
    if len(payload) != HEADER + n:
        raise RecordError(f"payload of {len(payload)} bytes does not hold a {n}-byte job id")
    return DispatchRecord(
        run_id=run_id,
        job_id=bytes(payload[HEADER:]).decode("utf-8"),
        run_at_ms=run_at_ms,
        due_ms=due_ms,
        partition=partition,
        attempt=attempt,
        attempt_group=group,
        fence=fence,
        dispatched_at_ms=dispatched_at_ms,
    )
