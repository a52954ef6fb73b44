"""The kinds of world the simulator is run in, by name: the shapes CI's
sweeps, the worlds kept as found and the mutation proof (mutants.py) share,
each defined once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pysched.sim.faults import Outage
from pysched.sim.runner import SimConfig, SimReport, simulate

# The fault kinds of the worlds kept as found: pinned, so that a kind added
# later does not change them.
PINNED_FAULTS = frozenset({"claims", "coordinator", "crash", "pause", "publish", "rebalance", "redis", "skew", "store"})
# Those of the changing worlds, as they were found.
CHANGES_FAULTS = PINNED_FAULTS | {"cassandra"}

# The workers' writes of how their runs ended refused for a minute, five
# minutes in (a brownout of the runs table): a flaky run's retry, due a
# moment after its failure, is written a minute later.
HISTORY_OUTAGE = Outage(at_s=300, for_s=60)
# The leaders' recordings refused for two and a half minutes, five minutes
# in, while every read and send goes on: what was sent is recorded long
# after, and the next runs it plans are due already.
RECORDING_OUTAGE = Outage(at_s=300, for_s=150)
# The whole cluster down for two virtual hours, ten minutes in; a catch-up
# lane slow enough to be busy for a while on the return.
CLUSTER_OUTAGE = Outage(at_s=600, for_s=7_200)
CATCH_UP_RATE = 20


def short_world(seed: int, **options: Any) -> SimConfig:
    """CI's short form: 100 jobs, 3 nodes and 6 faults for a quarter of an hour."""
    return SimConfig(seed, jobs=100, hours=0.25, fault_count=6, **options)


def flaky_world(seed: int) -> SimConfig:
    """The short form, a third of the jobs failing a run's first attempts."""
    return short_world(seed, flaky=0.3)


def timed_world(seed: int) -> SimConfig:
    """The short form, its targets taking time."""
    return short_world(seed, target_time=True)


def wide_world(seed: int) -> SimConfig:
    """300 jobs for half an hour, 12 faults of the pinned kinds but Redis's."""
    return SimConfig(seed, jobs=300, hours=0.5, faults=PINNED_FAULTS - {"redis"})


def paused_world(seed: int) -> SimConfig:
    """200 jobs for half an hour, its only faults nodes paused past their leases."""
    return SimConfig(seed, jobs=200, hours=0.5, faults=frozenset({"pause"}), fault_count=8)


def catch_up_world(seed: int, **options: Any) -> SimConfig:
    """300 jobs of the four catch-up policies for half an hour, 12 faults."""
    return SimConfig(seed, jobs=300, hours=0.5, fault_count=12, catch_up=True, faults=PINNED_FAULTS, **options)


def history_outage_world(seed: int) -> SimConfig:
    return catch_up_world(seed, flaky=0.2, history_outage=HISTORY_OUTAGE)


def recording_outage_world(seed: int) -> SimConfig:
    return catch_up_world(seed, recording_outage=RECORDING_OUTAGE)


def changing_world(seed: int, **options: Any) -> SimConfig:
    """100 jobs for a quarter of an hour, 6 faults, the workload changing them."""
    return SimConfig(seed, jobs=100, hours=0.25, fault_count=6, faults=CHANGES_FAULTS, changes=True, **options)


def cluster_outage_world(seed: int) -> SimConfig:
    """100 jobs of each catch-up policy for two and a half hours, the whole
    cluster down for two of them."""
    return SimConfig(
        seed,
        jobs=100,
        hours=2.5,
        fault_count=4,
        faults=PINNED_FAULTS,
        catch_up=True,
        catch_up_rate=CATCH_UP_RATE,
        cluster_outage=CLUSTER_OUTAGE,
    )


def catch_up_flaky_world(seed: int) -> SimConfig:
    return catch_up_world(seed, flaky=0.2)


def timed_changing_world(seed: int) -> SimConfig:
    """The changing workload, its targets taking time: runs overlap."""
    return changing_world(seed, target_time=True)


def tables_world(seed: int, **options: Any) -> SimConfig:
    """The short form on the real cluster store over in-memory tables."""
    return short_world(seed, store="tables", **options)


def tables_flaky_world(seed: int) -> SimConfig:
    return tables_world(seed, flaky=0.3)


def tables_history_outage_world(seed: int) -> SimConfig:
    """The workers cannot record how their runs ended for a minute, two
    minutes in: retries written then land behind the moved watermarks."""
    return tables_world(seed, flaky=0.3, history_outage=Outage(120, 60))


def tables_recording_outage_world(seed: int) -> SimConfig:
    """The leaders cannot record what they send for two and a half minutes,
    five minutes in, on the cluster store: batches wait to be recorded
    under fences that leadership moves past meanwhile (a pause, a crash, a
    hand-over), and the store's fence check alone keeps them off the
    successor's rows, as the tables see (fence_tables.py)."""
    return tables_world(seed, recording_outage=RECORDING_OUTAGE)


WORLD_KINDS: dict[str, Callable[[int], SimConfig]] = {
    "short": short_world,
    "flaky": flaky_world,
    "timed": timed_world,
    "wide": wide_world,
    "paused": paused_world,
    "catch-up": catch_up_world,
    "history-outage": history_outage_world,
    "recording-outage": recording_outage_world,
    "catch-up-flaky": catch_up_flaky_world,
    "changes": changing_world,
    "timed-changes": timed_changing_world,
    "cluster-outage": cluster_outage_world,
    "tables": tables_world,
    "tables-flaky": tables_flaky_world,
    "tables-history-outage": tables_history_outage_world,
    "tables-recording-outage": tables_recording_outage_world,
}


def world(kind: str, seed: int) -> SimConfig:
    try:
        return WORLD_KINDS[kind](seed)
    except KeyError:
        raise ValueError(f"no world kind {kind!r}; known: {', '.join(WORLD_KINDS)}") from None


def simulate_world(kind: str, seed: int) -> SimReport:
    return simulate(world(kind, seed))
