"""`python -m bench peers`: the same instant burst through APScheduler 3, a
bare heapq scheduler thread, and pysched embedded, in one run.

Each in a process of its own (its peak RSS is its own), measured where a
user would: the moment the job function is called (``start``). The heapq
thread calls no function: its pop is its start. APScheduler runs its jobs
on as many threads as pysched's node has workers.
"""

from __future__ import annotations

import heapq
import threading
import time
from datetime import UTC
from typing import Any

from bench.burst import THREADS, in_own_process, peak_rss_mb, spike
from pysched_loadgen.measure import percentiles
from pysched_loadgen.registration import ATTEMPTS, SLACK_MS, registration_lead_s, retry_lead_s


def _now_ms() -> float:
    return time.time_ns() / 1_000_000


def heapq_thread(n: int, lead_s: float) -> dict[str, Any]:
    """The floor for a Python scheduler: a thread that only pops and fires."""
    instant = _now_ms() + lead_s * 1000
    heap = [(instant, k) for k in range(n)]
    heapq.heapify(heap)
    fired: list[float] = []

    def loop() -> None:
        while heap:
            due, _ = heap[0]
            delay = (due - _now_ms()) / 1000
            if delay > 0:
                time.sleep(min(delay, 0.01))
                continue
            heapq.heappop(heap)
            fired.append(_now_ms())

    t = threading.Thread(target=loop)
    t.start()
    t.join()
    lags = percentiles([round(f - instant) for f in fired])
    return {"fired": len(fired), **lags, "start": lags, "peak_rss_mb": peak_rss_mb()}


def apscheduler(n: int) -> dict[str, Any]:
    from datetime import datetime, timedelta

    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.jobstores.memory import MemoryJobStore
    from apscheduler.schedulers.background import BackgroundScheduler

    fired: list[float] = []
    done = threading.Event()

    def fire() -> None:
        fired.append(_now_ms())
        if len(fired) >= n:
            done.set()

    scheduler = BackgroundScheduler(
        jobstores={"default": MemoryJobStore()},
        executors={"default": ThreadPoolExecutor(THREADS)},
        job_defaults={"misfire_grace_time": 3600, "coalesce": False, "max_instances": 1},
        timezone=UTC,
    )
    # pysched's rule for its own burst: jobs added too slowly for their
    # instant are removed and added again for a later one.
    lead_s = registration_lead_s(n, embedded=True)
    for attempt in range(1, ATTEMPTS + 1):
        start = _now_ms()
        instant_dt = datetime.now(UTC) + timedelta(seconds=lead_s)
        instant = instant_dt.timestamp() * 1000
        for k in range(n):
            scheduler.add_job(fire, "date", run_date=instant_dt, id=f"j{k}")
        register_s = (_now_ms() - start) / 1000
        if _now_ms() <= instant - SLACK_MS or attempt == ATTEMPTS:
            break
        scheduler.remove_all_jobs()
        lead_s = retry_lead_s(register_s)
    scheduler.start()
    done.wait(timeout=300)
    scheduler.shutdown(wait=False)
    return {
        "fired": len(fired),
        "register_s": round(register_s, 2),
        "attempts": attempt,
        # APScheduler hands a job to its pool unseen: only its call is.
        "start": percentiles([round(f - instant) for f in fired]),
        "peak_rss_mb": peak_rss_mb(),
    }


def peers(n: int) -> dict[str, Any]:
    results = {
        "heapq": in_own_process(heapq_thread, n, 2.0),
        "apscheduler": in_own_process(apscheduler, n),
        "pysched": in_own_process(spike, n, None),
    }
    ours = results["pysched"]
    for name in ("heapq", "apscheduler"):
        peer = results[name]
        # Start lag against start lag; and pysched's hand-over against the
        # heapq thread's pop, the floor for firing in Python.
        if peer["start"].get("p99_ms") and ours["start"].get("p99_ms") is not None:
            results[f"pysched_start_p99_over_{name}"] = round(
                ours["start"]["p99_ms"] / max(peer["start"]["p99_ms"], 1.0), 2
            )
    if results["heapq"].get("p99_ms") and ours.get("p99_ms") is not None:
        results["pysched_fire_p99_over_heapq"] = round(ours["p99_ms"] / max(results["heapq"]["p99_ms"], 1.0), 2)
    return {"n": n, "threads": THREADS, **results}
