"""pysched.cron against the brute-force oracle, on generated expressions,
zones and start instants around offset changes.

CI runs ORACLE_CI_CASES examples; the ``oracle`` profile runs 10,000:

    HYPOTHESIS_PROFILE=oracle python -m pytest tests/test_cron_oracle.py
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from functools import lru_cache
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError
from hypothesis import given, settings
from hypothesis import strategies as st

from pysched import cron
from tests.cron_oracle import Oracle, package_zone

ORACLE_CI_CASES = 300
CASES = settings().max_examples if os.environ.get("HYPOTHESIS_PROFILE") == "oracle" else ORACLE_CI_CASES
ZONES = [
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "America/Santiago",
    "Pacific/Apia",
    "Pacific/Chatham",
    "Asia/Kathmandu",
    "Africa/Casablanca",
    "Europe/London",
    "UTC",
]
WINDOW_S = 200 * 86_400  # the oracle looks this far; rarer expressions are compared up to it


def _offset(zone: ZoneInfo, t: int) -> float:
    off = datetime.fromtimestamp(t, UTC).astimezone(zone).utcoffset()
    assert off is not None
    return off.total_seconds()


@lru_cache
def transitions(tz: str) -> list[int]:
    """Offset changes in 2026-2028 (and Apia's skipped day), hour probes then bisection."""
    zone = package_zone(tz)
    out = []
    spans = [(2026, 2029)] + ([(2011, 2012)] if tz == "Pacific/Apia" else [])
    for first, last in spans:
        t = int(datetime(first, 1, 1, tzinfo=UTC).timestamp())
        end = int(datetime(last, 1, 1, tzinfo=UTC).timestamp())
        while t < end:
            if _offset(zone, t) != _offset(zone, t + 3600):
                lo, hi = t, t + 3600
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (mid, hi) if _offset(zone, mid) == _offset(zone, t) else (lo, mid)
                out.append(hi)
            t += 3600
    return out or [int(datetime(2027, 3, 28, tzinfo=UTC).timestamp())]


def _num(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


def field(lo: int, hi: int, span: int, near: tuple[int, int] | None = None) -> st.SearchStrategy[str]:
    a = st.one_of(_num(*near), _num(lo, hi)) if near else _num(lo, hi)

    def ranged(pair: tuple[int, int]) -> str:
        x, y = sorted(pair)
        return f"{x}-{y}"

    return st.one_of(
        st.just("*"),
        a.map(str),
        st.tuples(a, a).map(ranged),
        _num(1, span).map(lambda k: f"*/{k}"),
        st.tuples(a, a, _num(1, span)).map(lambda t: f"{ranged((t[0], t[1]))}/{t[2]}"),
        st.tuples(a, _num(1, span)).map(lambda t: f"{t[0]}/{t[1]}"),
        st.lists(a, min_size=2, max_size=4).map(lambda xs: ",".join(map(str, xs))),
    )


DOM = st.one_of(st.just("*"), st.just("*"), st.just("*"), field(1, 28, 31), st.sampled_from(["L", "LW", "1-15", "*/2"]))
DOW = st.one_of(
    st.just("*"),
    st.just("*"),
    field(0, 7, 7),
    st.sampled_from(["MON-FRI", "SUN", "5L", "1#2", "0#1", "*/2", "1/2", "SAT,SUN"]),
)
MONTH = st.one_of(st.just("*"), st.just("*"), st.just("*"), field(1, 12, 12))


@st.composite
def expressions(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 15)) == 0:
        return draw(st.sampled_from(list(cron.MACROS)))
    parts = [
        draw(field(0, 59, 60, near=(0, 1))),
        draw(st.one_of(field(0, 23, 24, near=(0, 3)), st.just("*"))),
        draw(DOM),
        draw(MONTH),
        draw(DOW),
    ]
    if draw(st.integers(0, 3)) == 0:
        parts.insert(0, draw(field(0, 59, 60, near=(0, 1))))
    return " ".join(parts)


@st.composite
def starts(draw: st.DrawFn, tz: str) -> int:
    """An epoch ms near one of the zone's offset changes."""
    near = draw(st.sampled_from(transitions(tz)))
    return (near + draw(st.integers(-2 * 86_400, 86_400))) * 1000 + draw(st.integers(0, 999))


def evaluator_fires(expr: str, tz: str, after_ms: int, n: int) -> list[int]:
    out, at = [], after_ms
    for _ in range(n):
        nxt = cron.next_after(expr, tz, at)
        if nxt is None:
            break
        out.append(nxt // 1000)
        at = nxt
    return out


def check(expr: str, tz: str, after_ms: int, n: int = 5) -> None:
    expected = Oracle(expr, tz).fires(after_ms // 1000, n, WINDOW_S)
    got = evaluator_fires(expr, tz, after_ms, len(expected) + 1)
    assert got[: len(expected)] == expected, (expr, tz, after_ms)
    if len(expected) < n and len(got) > len(expected):
        # The oracle gave up at its window: pysched's next fire is beyond it.
        assert got[len(expected)] > after_ms // 1000 + WINDOW_S - 60, (expr, tz, after_ms)


@settings(max_examples=CASES)
@given(st.data(), expressions(), st.sampled_from(ZONES))
def test_evaluator_agrees_with_the_oracle(data: st.DataObject, expr: str, tz: str) -> None:
    try:
        cron.validate(expr, tz)
    except cron.CronError as exc:
        # The generator writes only valid grammar: the one refusal allowed
        # is of an expression that never fires (nothing to compare). Any
        # other would be the evaluator refusing what it must accept.
        assert "never fires" in str(exc), (expr, str(exc))
        return
    check(expr, tz, data.draw(starts(tz)))


@settings(max_examples=CASES // 3)
@given(expressions(), st.integers(1_767_225_600_000, 1_861_920_000_000))
def test_fields_mean_what_cronsim_says_where_there_is_no_dst(expr: str, after_ms: int) -> None:
    # In UTC cronsim has no DST handling to get wrong: the grammar must agree.
    try:
        cron.validate(expr)
        sim = CronSim(cron.expand(expr), datetime.fromtimestamp(after_ms // 1000, UTC))
    except (cron.CronError, CronSimError):
        return
    expected = [int(next(sim).timestamp()) for _ in range(3)]
    assert evaluator_fires(expr, "UTC", after_ms, 3) == expected, expr
