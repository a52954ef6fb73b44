"""The native core and its pure-Python twins agree, operation by operation."""

from __future__ import annotations

import hashlib
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pysched import _codec, _loader, _native
from pysched._reference import codec as ref_codec
from pysched._reference import jitter as ref_jitter
from pysched._reference import loader as ref_loader
from pysched._reference import wheel as ref_wheel
from pysched.protocols import Run
from pysched.records import RecordError

HANDLES = st.integers(min_value=0, max_value=40)
# Deltas reach past level 2 (43.7 min) and past the 15.5-day overflow boundary.
DELTAS = st.one_of(
    st.integers(min_value=-50, max_value=700),
    st.integers(min_value=0, max_value=6_000_000),
    st.integers(min_value=0, max_value=3_000_000_000),
)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), HANDLES, DELTAS),
        st.tuples(st.just("batch"), st.lists(st.tuples(HANDLES, DELTAS), max_size=20), st.just(0)),
        st.tuples(st.just("cancel"), HANDLES, st.just(0)),
        st.tuples(st.just("advance"), st.just(0), DELTAS),
    ),
    max_size=80,
)


@given(start=st.integers(min_value=0, max_value=2**41), ops=OPS)
def test_wheel_matches_reference(start: int, ops: list[tuple[str, object, object]]) -> None:
    native = _native.TimingWheel(start)
    ref = ref_wheel.TimingWheel(start)
    now = start
    for op, a, b in ops:
        if op == "insert":
            assert isinstance(a, int) and isinstance(b, int)
            assert native.insert(a, now + b) == ref.insert(a, now + b)
        elif op == "batch":
            assert isinstance(a, list)
            handles = np.array([h for h, _ in a], dtype=np.int64)
            due = np.array([now + d for _, d in a], dtype=np.int64)
            assert native.insert_batch(handles, due).tolist() == ref.insert_batch(handles, due).tolist()
        elif op == "cancel":
            assert isinstance(a, int)
            assert native.cancel(a) == ref.cancel(a)
        else:
            assert isinstance(b, int)
            now += max(b, 0)
            assert native.advance(now).tolist() == ref.advance(now).tolist()
        assert len(native) == len(ref)
    # Everything left fires eventually, in the same order.
    far = now + 2**40
    assert native.advance(far).tolist() == ref.advance(far).tolist()
    assert len(native) == len(ref) == 0


def test_wheel_never_fires_early_and_fires_late_by_under_a_tick() -> None:
    wheel = _native.TimingWheel(0)
    rng = np.random.default_rng(7)
    due = rng.integers(1, 100_000, size=5_000)
    wheel.insert_batch(np.arange(5_000, dtype=np.int64), due.astype(np.int64))
    for now in range(0, 100_010, 10):
        for h in wheel.advance(now):
            assert due[h] <= now < due[h] + 10


def test_wheel_rejects_mismatched_arrays() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        _native.TimingWheel(0).insert_batch(np.array([1, 2]), np.array([5]))


@given(st.text(max_size=40), st.integers(min_value=1, max_value=2**63 - 1))
def test_jitter_matches_the_python_expression(job_id: str, window: int) -> None:
    expected = int(hashlib.sha256(job_id.encode()).hexdigest(), 16) % window
    assert _native.jitter_offset(job_id, window) == expected == ref_jitter.jitter_offset(job_id, window)


@given(st.lists(st.text(max_size=20), max_size=30), st.integers(min_value=1, max_value=10**7))
def test_jitter_vectorised(ids: list[str], window: int) -> None:
    assert _native.jitter_offsets(ids, window).tolist() == ref_jitter.jitter_offsets(ids, window).tolist()


@pytest.mark.parametrize("window", [0, -1])
def test_jitter_refuses_empty_window(window: int) -> None:
    with pytest.raises(ValueError, match="window_ms must be positive"):
        _native.jitter_offset("a", window)
    with pytest.raises(ValueError, match="window_ms must be positive"):
        ref_jitter.jitter_offset("a", window)


@given(
    st.lists(st.tuples(st.text(max_size=20), st.integers(min_value=-(2**50), max_value=2**50)), max_size=30),
    st.integers(min_value=1, max_value=2**32 - 1),
)
def test_bucket_planning_matches(rows: list[tuple[str, int]], partitions: int) -> None:
    ids = [r[0] for r in rows]
    run_at = np.array([r[1] for r in rows], dtype=np.int64)
    nb, ns = _native.plan_buckets(ids, run_at, partitions)
    rb, rs = ref_jitter.plan_buckets(ids, run_at, partitions)
    assert nb.tolist() == rb.tolist() == [t // 60_000 for t in run_at.tolist()]
    assert ns.tolist() == rs.tolist() == [zlib.crc32(i.encode()) % partitions for i in ids]
    for i in ids:
        assert _native.shard_for(i, partitions) == ref_jitter.shard_for(i, partitions)


ROWS = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=2**62),
        st.text(max_size=30),
        st.integers(min_value=0, max_value=2**50),
        st.integers(min_value=0, max_value=2**50),
        st.integers(min_value=0, max_value=0xFFFF),
        st.integers(min_value=0, max_value=0xFFFFFFFF),
        st.integers(min_value=0, max_value=0xFFFFFFFF),
    ),
    max_size=20,
)


@given(ROWS, st.integers(min_value=0, max_value=2**62), st.integers(min_value=0, max_value=2**50))
def test_codec_matches_and_round_trips(
    rows: list[tuple[int, str, int, int, int, int, int]], fence: int, at: int
) -> None:
    native = _codec.encode_batch(rows, fence, at)
    assert native == ref_codec.encode_batch(rows, fence, at)
    for row, payload in zip(rows, native, strict=True):
        record = _codec.decode(payload)
        assert record == ref_codec.decode(payload)
        assert (record.run_id, record.job_id, record.run_at_ms, record.due_ms, record.partition) == row[:5]
        assert (record.attempt, record.attempt_group, record.fence, record.dispatched_at_ms) == (*row[5:], fence, at)


@given(st.binary(max_size=80))
def test_codec_decoders_agree_on_garbage(payload: bytes) -> None:
    outcomes = []
    for decode in (_codec.decode, ref_codec.decode):
        try:
            outcomes.append(decode(payload))
        except (RecordError, UnicodeDecodeError) as exc:
            outcomes.append(type(exc))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("encode", [_codec.encode_batch, ref_codec.encode_batch])
def test_codec_refuses_out_of_range_fields(encode: object) -> None:
    assert callable(encode)
    with pytest.raises(RecordError, match="partition"):
        encode([(1, "j", 0, 0, 70_000, 0, 0)], 1, 0)
    with pytest.raises(RecordError, match="job id"):
        encode([(1, "x" * 70_000, 0, 0, 0, 0, 0)], 1, 0)


@given(
    st.lists(st.tuples(st.integers(min_value=0, max_value=2**62), st.integers(min_value=0, max_value=2**50))),
    st.integers(min_value=0, max_value=2**50),
)
def test_loader_matches(ids_and_due: list[tuple[int, int]], horizon: int) -> None:
    rows = [Run(r, f"j{r}", d, d, 0, 1, 0) for r, d in ids_and_due]
    nh, nd = _loader.load_page(rows, horizon)
    rh, rd = ref_loader.load_page(rows, horizon)
    assert nh.tolist() == rh.tolist() == [r for r, d in ids_and_due if d < horizon]
    assert nd.tolist() == rd.tolist() == [d for _, d in ids_and_due if d < horizon]
    assert nh.dtype == nd.dtype == np.int64
