"""Workers: take dispatch records, pass the fence check and the idempotency
claim, run the target, record the outcome.

One heartbeat per worker pool extends the leases of all its running claims
every ``heartbeat_ms``; if the pool dies, its claims expire after
``lease_ms`` and the leader hands those runs on again.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass

from pysched import native
from pysched.clock import Clock
from pysched.protocols import ClaimOutcome, Dispatcher, IdempotencyClaims, JobNotFound, ScheduleStore
from pysched.targets import context_for, run_target

log = logging.getLogger("pysched.worker")


@dataclass(frozen=True)
class WorkerConfig:
    concurrency: int = 4
    lease_ms: int = 30_000
    heartbeat_ms: int = 10_000
    poll_s: float = 0.2


class WorkerPool:
    def __init__(
        self,
        dispatcher: Dispatcher,
        claims: IdempotencyClaims,
        store: ScheduleStore,
        clock: Clock,
        holder: str,
        config: WorkerConfig | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.claims = claims
        self.store = store
        self.clock = clock
        self.holder = holder
        self.config = config or WorkerConfig()
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self, stop: threading.Event) -> None:
        for i in range(self.config.concurrency):
            t = threading.Thread(target=self._consume, args=(stop,), name=f"pysched-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        hb = threading.Thread(target=self._heartbeat, args=(stop,), name="pysched-heartbeat", daemon=True)
        hb.start()
        self._threads.append(hb)

    def join(self, timeout_s: float) -> None:
        for t in self._threads:
            t.join(timeout_s)

    def _count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def _consume(self, stop: threading.Event) -> None:
        while not stop.is_set():
            payload = self.dispatcher.consume(self.config.poll_s)
            if payload is None:
                continue
            try:
                self.handle(payload)
            except Exception:
                log.exception("worker failed on a dispatch record")
                self._count("errors")

    def _heartbeat(self, stop: threading.Event) -> None:
        while not stop.wait(self.config.heartbeat_ms / 1000):
            self.claims.heartbeat(self.holder, self.clock.now_ms(), self.config.lease_ms)

    def handle(self, payload: bytes) -> ClaimOutcome:
        record = native.decode(payload)
        now = self.clock.now_ms()
        claim = self.claims.claim(record, self.holder, now, self.config.lease_ms)
        self._count(claim.outcome.value)
        if claim.outcome is ClaimOutcome.FENCED:
            log.warning(
                "rejected %s run_at=%d: fence %d is below the partition's %d (a stale leader)",
                record.job_id,
                record.run_at_ms,
                record.fence,
                claim.fence_floor,
            )
            return claim.outcome
        if claim.outcome is ClaimOutcome.SUCCEEDED:
            log.info("skipped %s: %s already succeeded", record.job_id, record.idempotency_key)
            return claim.outcome
        if claim.outcome is ClaimOutcome.BUSY:
            log.info("skipped %s: %s runs elsewhere under a live lease", record.job_id, record.idempotency_key)
            return claim.outcome
        try:
            job = self.store.get_job(record.job_id).job
        except JobNotFound:
            self.claims.complete(record.idempotency_key, self.holder, False, None, self.clock.now_ms())
            log.error("job %s vanished before its run", record.job_id)
            return claim.outcome
        self.store.run_started(record.run_id, record.attempt, self.holder, self.clock.now_ms())
        outcome = run_target(job, context_for(job, record))
        end = self.clock.now_ms()
        self.store.run_finished(record.run_id, record.attempt, outcome.succeeded, outcome.error, outcome.result, end)
        self.claims.complete(record.idempotency_key, self.holder, outcome.succeeded, outcome.result, end)
        self._count("succeeded" if outcome.succeeded else "failed")
        if outcome.succeeded:
            log.info("ran %s: succeeded%s", record.job_id, f": {outcome.result}" if outcome.result else "")
        else:
            log.warning("ran %s: failed: %s", record.job_id, outcome.error)
        return claim.outcome
