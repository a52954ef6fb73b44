"""`python -m bench peers`: the same instant burst through APScheduler 3, a
bare heapq scheduler thread, and pysched embedded, in one run."""

from __future__ import annotations

import heapq
import threading
import time
from datetime import UTC
from typing import Any

from loadgen.measure import percentiles
from loadgen.registration import ATTEMPTS, SLACK_MS, registration_lead_s, retry_lead_s


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
    return {"fired": len(fired), **percentiles([round(f - instant) for f in fired])}


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
        executors={"default": ThreadPoolExecutor(10)},
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
        **percentiles([round(f - instant) for f in fired]),
    }


def peers(n: int) -> dict[str, Any]:
    from bench.burst import spike

    results = {
        "heapq": heapq_thread(n, 2.0),
        "apscheduler": apscheduler(n),
        "pysched": spike(n, None),
    }
    p = results["pysched"]
    for name in ("heapq", "apscheduler"):
        peer = results[name]
        if peer.get("p99_ms") and p.get("p99_ms") is not None:
            results[f"pysched_p99_over_{name}"] = round(p["p99_ms"] / max(peer["p99_ms"], 1.0), 2)
    return {"n": n, **results}
