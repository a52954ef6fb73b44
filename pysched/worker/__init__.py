"""Workers: take dispatch records, pass the fence check and the idempotency
claim, run the target, record the outcome."""

from pysched.worker.pool import WorkerConfig, WorkerPool

__all__ = ["WorkerConfig", "WorkerPool"]
