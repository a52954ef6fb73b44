"""How a node's workers behave: their number, leases and waits."""

from __future__ import annotations

from dataclasses import dataclass, field

from pysched.breakers import BreakerPolicy

# The soonest a run held elsewhere is looked at again: a lease end known to
# the second (etcd's) may be read as "now" for most of that second.
_BUSY_RECHECK_MIN_MS = 250


@dataclass(frozen=True)
class WorkerConfig:
    concurrency: int = 4
    # The most deliveries a worker takes at once from a queue that can give
    # several (the embedded one; Kafka's give one at a time), never more
    # than its share of what is queued nor than the places free to run them
    # (``concurrency`` in all): in a burst their claims are one write and
    # their ends another, where a run alone costs three. Their targets all
    # start at once, each on a thread of its own: none waits behind another.
    batch: int = 16
    lease_ms: int = 30_000
    heartbeat_ms: int = 10_000
    # How long a consumer thread with nothing to do waits in the consumer
    # for the next delivery: a stop is noticed within it.
    poll_s: float = 0.2
    supervise_s: float = 1.0
    # A failed handling is tried again after a full-jitter backoff that
    # doubles from retry_base_s up to retry_max_s.
    retry_base_s: float = 0.2
    retry_max_s: float = 10.0
    # A run held elsewhere under a live lease is looked at again after this
    # long (or the lease, if shorter): it may have ended, or its lease died.
    busy_wait_ms: int = 5_000
    # After a stop, how long running runs may take to finish before they are
    # interrupted (Kubernetes' terminationGracePeriodSeconds, and its default).
    grace_s: float = 30.0
    # How long an interrupted shell command has to end after SIGTERM before
    # SIGKILL: short, since the grace period came before it.
    kill_after_s: float = 2.0
    # Whether the process ends once its node has stopped (`pysched up`,
    # `pysched worker`): a run whose target runs in a thread (a Python
    # function, an HTTP call), which nothing stops, then ends with the
    # process, and is recorded interrupted at once. An application's
    # Scheduler lives on: such a run keeps its claim, ctx.cancelled set,
    # until its target returns, so that no other node runs it beside it,
    # and is recorded interrupted then.
    process_exits_at_stop: bool = True
    # The Temporal server of --temporal targets, host:port; None: the
    # PYSCHED_TEMPORAL_ADDRESS environment variable, else 127.0.0.1:7233.
    temporal_address: str | None = None
    # The downstreams' circuit breakers and retry budget (breakers.py).
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)

    def retry_cap_ms(self, failures: int) -> int:
        """The longest backoff before the retry that follows ``failures``
        failed attempts (from 1)."""
        # The exponent is capped: a float overflows past 2**1023, which a
        # store down for an hour or two would otherwise reach.
        doubling = 2.0 ** min(max(failures - 1, 0), 64)
        return round(min(self.retry_max_s, self.retry_base_s * doubling) * 1000)

    def busy_recheck_ms(self, busy_until_ms: int | None = None, now_ms: int = 0) -> int:
        """How long a run held elsewhere is left before it is looked at
        again: every ``busy_wait_ms`` (a holder may finish it early), and at
        once when its holder's lease ends (``busy_until_ms``, if known), so a
        worker that died is replaced within its lease, not a beat later."""
        beat = min(self.lease_ms, self.busy_wait_ms)
        if busy_until_ms is None:
            return beat
        return max(_BUSY_RECHECK_MIN_MS, min(beat, busy_until_ms - now_ms))
