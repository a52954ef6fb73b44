"""A node's Prometheus metrics (`--metrics-port`): what its leader handed on
and holds, what its workers claimed, started and recorded, and how long its
store calls take.

Each node owns its registry (not prometheus_client's global one), so several
nodes in one process (tests, an in-process scheduler) keep theirs apart. The
core imports none of this: the leader tells a batch handed on
(``BatchDispatched``), the workers tell a ``RunObserver``, and the leader's
gauges are read when scraped. No label names a job: the labels' values are
outcomes, store calls and partitions, each a short, fixed list.

The fire path pays one call per batch handed on: a burst's lags are counted
into the buckets by numpy in one pass, under one lock, on the recorder's
thread (``BatchHistogram``)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast
from wsgiref.simple_server import WSGIServer

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from pysched.leader import BatchDispatched
from pysched.protocols import ClaimOutcome, ScheduleStore
from pysched.worker.observer import RUN_OUTCOMES, RunOutcome

if TYPE_CHECKING:
    from pysched.leader import PartitionLeader

# Lag buckets from 1 ms (a tick is 10 ms) to 5 min: the SLO's 1 s sits in
# the middle, with room to see how far past it a bad hour went.
LAG_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
# Store calls: from an SQLite read (~100 us) to a Cassandra timeout (10 s).
STORE_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

# Store methods that are not calls to time: writes_together returns a
# context manager at once (the writes inside are timed each).
_UNTIMED = frozenset({"writes_together"})


class BatchHistogram:
    """A histogram observed a batch at a time, in ms: one numpy pass and one
    lock per batch, where prometheus_client's Histogram takes a lock per
    value (50,000 a burst)."""

    def __init__(self, name: str, documentation: str, buckets_s: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self._buckets_s = tuple(buckets_s)
        self._bounds_ms = np.array(buckets_s, dtype=np.float64) * 1000
        self._lock = threading.Lock()
        self._counts = np.zeros(len(buckets_s) + 1, dtype=np.int64)  # the last: past every bound
        self._sum_ms = 0

    def observe_ms(self, values_ms: np.ndarray) -> None:
        # A value on a bound counts in that bound's bucket (le: less or equal).
        counts = np.bincount(np.searchsorted(self._bounds_ms, values_ms, side="left"), minlength=len(self._counts))
        total = int(values_ms.sum())
        with self._lock:
            self._counts += counts
            self._sum_ms += total

    @property
    def count(self) -> int:
        with self._lock:
            return int(self._counts.sum())

    def family(self) -> HistogramMetricFamily:
        with self._lock:
            cumulative = np.cumsum(self._counts).tolist()
            sum_s = self._sum_ms / 1000
        # repr of a float, as prometheus_client's own histograms write their bounds.
        buckets = [(repr(float(b)), float(c)) for b, c in zip(self._buckets_s, cumulative, strict=False)]
        buckets.append(("+Inf", float(cumulative[-1])))
        return HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=sum_s)


class _LeaderCollector(Collector):
    """What the leader handed on, counted per batch, and what it holds and
    leads, read at scrape time: nothing is updated on the tick."""

    def __init__(self, fire_lag: BatchHistogram) -> None:
        self.fire_lag = fire_lag
        self.leader: PartitionLeader | None = None

    def collect(self) -> Iterable[Metric]:
        yield self.fire_lag.family()
        yield CounterMetricFamily(
            "pysched_runs_dispatched", "Runs the leader handed on to the dispatcher.", self.fire_lag.count
        )
        leader = self.leader
        # The tick replaces its fences dict whole: this reference is one state of it.
        fences = dict(leader.fences) if leader is not None else {}
        yield GaugeMetricFamily(
            "pysched_wheel_runs",
            "Runs the leader holds to hand on: in its timing wheel, or due and not yet handed on.",
            leader.cache.waiting if leader is not None else 0,
        )
        yield GaugeMetricFamily(
            "pysched_catch_up_runs",
            "Runs found long overdue, waiting in the leader's catch-up lane.",
            len(leader.lane) if leader is not None else 0,
        )
        yield GaugeMetricFamily("pysched_partitions_led", "Partitions this node leads.", len(fences))
        family = GaugeMetricFamily(
            "pysched_partition_fence", "The fence this node leads each partition under.", labels=["partition"]
        )
        for partition, fence in sorted(fences.items()):
            family.add_metric([str(partition)], fence)
        yield family

    def describe(self) -> Iterable[Metric]:
        # Names only, for the registry's duplicate check; no leader read.
        yield HistogramMetricFamily(self.fire_lag.name, self.fire_lag.documentation)
        yield CounterMetricFamily("pysched_runs_dispatched", "")
        for name in ("pysched_wheel_runs", "pysched_catch_up_runs", "pysched_partitions_led"):
            yield GaugeMetricFamily(name, "")
        yield GaugeMetricFamily("pysched_partition_fence", "", labels=["partition"])


class _ConsumerLagCollector(Collector):
    """Kafka records not yet taken, by partition, read at scrape time: as
    many labels as the topic has partitions."""

    _NAME = "pysched_kafka_consumer_lag_records"

    def __init__(self, lag: Callable[[], Mapping[int, int]]) -> None:
        self.lag = lag

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            self._NAME,
            "Records of the dispatch topic behind this worker's position, by partition it is assigned.",
            labels=["partition"],
        )
        for partition, behind in sorted(self.lag().items()):
            family.add_metric([str(partition)], behind)
        yield family

    def describe(self) -> Iterable[Metric]:
        yield GaugeMetricFamily(self._NAME, "", labels=["partition"])


@dataclass
class MetricsServer:
    """The HTTP server of /metrics, on a thread of its own."""

    host: str
    port: int
    _server: WSGIServer
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class NodeMetrics:
    """A node's metrics: give it to ``Node(metrics=...)``, which attaches it
    to the leader, the workers and the store; ``serve`` exposes them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._leader = _LeaderCollector(
            BatchHistogram(
                "pysched_fire_lag_seconds",
                "Fire lag: handed on to the dispatcher, less the run's due time.",
                LAG_BUCKETS_S,
            )
        )
        self.registry.register(self._leader)
        self._start_lag = Histogram(
            "pysched_start_lag_seconds",
            "Start lag: the target called, less the run's due time.",
            buckets=LAG_BUCKETS_S,
            registry=self.registry,
        )
        self._executed = Counter(
            "pysched_runs_executed",
            "Runs whose end a worker recorded, by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        self._executed_by = {outcome: self._executed.labels(outcome) for outcome in RUN_OUTCOMES}
        self._retried = Counter("pysched_runs_retried", "Failed runs given a next attempt.", registry=self.registry)
        self._dead_lettered = Counter(
            "pysched_runs_dead_lettered", "Failed runs with no attempt left: dead letters.", registry=self.registry
        )
        claims = Counter(
            "pysched_claims", "Idempotency claims answered, by outcome.", ["outcome"], registry=self.registry
        )
        self._claims_by = {outcome: claims.labels(outcome.value) for outcome in ClaimOutcome}
        self._fence_rejections = Counter(
            "pysched_fence_rejections",
            "Dispatch records a worker rejected: sent under a fence older than their partition's.",
            registry=self.registry,
        )
        self._store_calls = Histogram(
            "pysched_store_call_seconds",
            "Schedule store calls, by method.",
            ["call"],
            buckets=STORE_BUCKETS_S,
            registry=self.registry,
        )
        self.server: MetricsServer | None = None

    # -- the leader --------------------------------------------------------------

    def watch(self, leader: PartitionLeader) -> None:
        """Read ``leader``'s gauges at each scrape."""
        self._leader.leader = leader

    def watch_consumer_lag(self, lag: Callable[[], Mapping[int, int]]) -> None:
        """Read a dispatcher's consumer lag by partition at each scrape (the
        Kafka dispatcher's; the in-process queue has none to show)."""
        self.registry.register(_ConsumerLagCollector(lag))

    def dispatched(self, event: BatchDispatched) -> None:
        """The leader's batch hook (``on_batch``)."""
        due_ms = np.fromiter((row.due_ms for row in event.rows), dtype=np.int64, count=len(event.rows))
        self._leader.fire_lag.observe_ms(event.dispatched_at_ms - due_ms)

    # -- the workers: a RunObserver ---------------------------------------------

    def claimed(self, outcomes: Sequence[ClaimOutcome]) -> None:
        for outcome in outcomes:
            self._claims_by[outcome].inc()
            if outcome is ClaimOutcome.FENCED:
                self._fence_rejections.inc()

    def started(self, due_ms: int, started_at_ms: int) -> None:
        self._start_lag.observe((started_at_ms - due_ms) / 1000)

    def ended(self, outcome: RunOutcome, retried: bool = False) -> None:
        self._executed_by[outcome].inc()
        if outcome == "failed":
            (self._retried if retried else self._dead_lettered).inc()

    # -- the store ------------------------------------------------------------------

    def timed(self, store: ScheduleStore) -> ScheduleStore:
        """``store``, each of its calls timed into pysched_store_call_seconds."""
        return cast(ScheduleStore, _TimedStore(store, self._store_calls))

    # -- serving ----------------------------------------------------------------------

    def serve(self, host: str, port: int) -> MetricsServer:
        """Serve /metrics on ``host``:``port`` (0: a free port) on a thread of
        its own. Raises OSError when it cannot listen there (the port taken,
        the host not this machine's)."""
        server, thread = start_http_server(port, host, registry=self.registry)
        thread.name = "pysched-metrics"
        bound_host, bound_port = server.server_address[:2]
        self.server = MetricsServer(str(bound_host), int(bound_port), server, thread)
        return self.server

    def close(self) -> None:
        """Stop serving, if serving."""
        if self.server is not None:
            self.server.close()
            self.server = None


class _TimedStore:
    """A store whose method calls are timed, each under its name (a short,
    fixed list: the ScheduleStore protocol's). Elapsed time is measured
    with the monotonic counter: a duration, not a time of the schedule."""

    def __init__(self, store: ScheduleStore, calls: Histogram) -> None:
        self._store = store
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name.startswith("_") or name in _UNTIMED or not callable(attr):
            return attr
        timed = _timed(attr, self._calls.labels(name).observe)
        # Found by ordinary lookup from now on: __getattr__ runs once a name.
        setattr(self, name, timed)
        return timed


def _timed(call: Callable[..., Any], observe: Callable[[float], None]) -> Callable[..., Any]:
    @functools.wraps(call)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            observe(time.perf_counter() - start)

    return timed
