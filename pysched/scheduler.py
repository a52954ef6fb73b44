"""`pysched.Scheduler`: the embedded engine in a thread of the application's
own process, as APScheduler's BackgroundScheduler is embedded.

It is `pysched up` without the command: a leader for every partition of the
database and a pool of workers, in threads of this process, so Python
targets are the application's own functions, imported as it imports them.
Another process may run `pysched up` on the same database; one of them leads
at a time, and both work.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from pysched.client import Client
from pysched.clock import Clock, SystemClock
from pysched.declare import job_of
from pysched.node import EmbeddedBackends, Node, open_embedded
from pysched.protocols import JobRecord
from pysched.worker import WorkerConfig

log = logging.getLogger("pysched.scheduler")


class SchedulerStopped(RuntimeError):
    """The scheduler's node ended with an error; it no longer fires."""


class Scheduler:
    """Start with `start()` (or ``with Scheduler(...) as scheduler:``);
    `stop()` hands the partitions on and gives running jobs ``grace_s`` to
    finish before they are interrupted (and run again later). Jobs are added
    and read through `client`, on the same database."""

    def __init__(
        self,
        db: str | os.PathLike[str] | None = None,
        *,
        workers: int = 4,
        grace_s: float = 30.0,
        lease_s: float = 30.0,
        clock: Clock | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        """``on_failure`` is called, on the scheduler's thread, if its node
        fails (a store it can no longer write, say): the jobs then stop
        firing, as ``running`` says; the failure is also logged.
        ``lease_s``: how long a running run's claim lasts without a
        heartbeat (they come every third of it), as `pysched up --lease`:
        a run whose process died is taken over that long after."""
        if not 1 <= workers <= 256:
            raise ValueError(f"workers: from 1 to 256; got {workers}")
        if not 0 <= grace_s <= 86_400:
            raise ValueError(f"grace_s: seconds from 0 to 86400; got {grace_s}")
        if not 0.3 <= lease_s <= 86_400:
            raise ValueError(f"lease_s: seconds from 0.3 to 86400; got {lease_s}")
        self.clock: Clock = clock or SystemClock()
        self.client = Client(db, clock=self.clock)
        # The application's process outlives the scheduler: a Python job
        # still running after the grace keeps its claim until it returns.
        self._config = WorkerConfig(
            concurrency=workers,
            grace_s=grace_s,
            lease_ms=round(lease_s * 1000),
            heartbeat_ms=round(lease_s * 1000 / 3),
            process_exits_at_stop=False,
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._backends: EmbeddedBackends | None = None
        self._node: Node | None = None
        self._failure: BaseException | None = None
        self._on_failure = on_failure

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Open the database and start leading and working; returns once
        the threads run. Raises DatabaseUnusable for a file that is not a
        pysched database."""
        if self._thread is not None:
            raise RuntimeError("this scheduler was started already; make a new one to start again")
        self._backends = open_embedded(self.client.db, clock=self.clock)
        self._node = Node(self._backends, clock=self.clock, worker_config=self._config)
        self._thread = threading.Thread(target=self._run, name="pysched-scheduler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self._node is not None
        try:
            self._node.run(self._stop)
        except BaseException as exc:
            # Nothing fires any more: said at once, not only at stop().
            log.exception("the scheduler's node failed and stopped; its jobs no longer fire")
            self._failure = exc
            if self._on_failure is not None:
                self._on_failure(exc)

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop firing, let running jobs finish within the grace period, and
        close the database. Raises SchedulerStopped if the node had failed.

        A shell job still running after the grace is stopped and run again
        later. A Python function cannot be stopped: its ``ctx.cancelled`` is
        set, and it keeps its run's claim until it returns, so that no other
        node runs it beside it; it is then recorded interrupted (to run
        again as its next attempt, from its last checkpoint), and the
        database closed, in the background. If the application exits first,
        ending it, it is recorded interrupted at the exit."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive() and self._node is not None:
            self._node.stop_now()
            self._thread.join(5.0)
        if self._node is not None and self._node.workers.executor.running():
            # Their outcome is recorded when they return; if the process
            # exits first, ending them, they are recorded interrupted then.
            atexit.register(self._exiting)
            threading.Thread(target=self._close_after_runs, name="pysched-closing", daemon=True).start()
        elif self._backends is not None:
            self._backends.close()
        self.client.close()
        if self._failure is not None:
            raise SchedulerStopped(f"the scheduler's node failed: {self._failure!r}") from self._failure

    def add_job(self, target: Callable[..., Any] | str, /, **options: Any) -> JobRecord:
        """Register a job that calls ``target`` (a module-level function, or
        ``"module:function"``) with `@pysched.job`'s options, as
        APScheduler's ``add_job`` does: ``scheduler.add_job(report,
        cron="0 9 * * 1-5")``, ``at=``, ``id=``, ``retries=``, ... Raises
        InvalidJob (a lambda or a closure, which a worker cannot import,
        included) or JobExists."""
        return self.client.add(
            target if callable(target) else job_of(target, **options), **(options if callable(target) else {})
        )

    def _close_after_runs(self) -> None:
        """Close the database once the runs that went on past the stop have
        returned and been recorded."""
        assert self._node is not None and self._backends is not None
        self._node.workers.wait_ended()
        atexit.unregister(self._exiting)
        self._backends.close()

    def _exiting(self) -> None:
        """At the interpreter's exit, with runs still going on past the
        stop: the exit ends their threads, so they are recorded interrupted
        and their claims let go of, to run again at once as their next
        attempts (rather than be found lost when their leases run out)."""
        assert self._node is not None
        self._node.workers.interrupt_going_on("the application exited while it ran, after the scheduler stopped")

    def __enter__(self) -> Scheduler:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
