"""Workers: take dispatch records, pass the fence check and the idempotency
claim, run the target, record the outcome.

- executor.py: claim, run and record a batch of executions against the
  claims and the store; the node's executions in flight and their heartbeat.
- step.py: ``DeliveryWorker``, one consumer's deliveries handled step by
  step, never sleeping, for threads and a simulator alike.
- pool.py: ``WorkerPool``, the threads that drive the steps, supervised.
- observer.py: ``RunObserver``, what the executor tells observers (metrics).
"""

from pysched.worker.config import WorkerConfig
from pysched.worker.executor import Executor
from pysched.worker.observer import NoObserver, RunObserver
from pysched.worker.pool import WorkerPool
from pysched.worker.step import DeliveryWorker

__all__ = ["DeliveryWorker", "Executor", "NoObserver", "RunObserver", "WorkerConfig", "WorkerPool"]
