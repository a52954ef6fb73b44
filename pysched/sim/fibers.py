"""Threads that run one at a time, each only when resumed, until it
suspends or ends: a worker waiting for its targets, or a target that takes
virtual time, holds its place in the middle of the real code (an executor's
batch, a target's call) while the world goes on, and the world stays one
thread of control. Which fiber runs when is decided by the world's rounds
alone, so a seed replays the same world."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

_current = threading.local()


class FiberKilled(BaseException):
    """Raised inside a fiber killed at the end of its world: it unwinds
    without going on (a BaseException, so that no ``except Exception`` of
    the code it runs takes it for a failure to handle)."""


class Fiber:
    """``body`` on a thread of its own that runs only between ``resume`` and
    the next ``suspend`` (or its end): the resumer waits meanwhile. What
    ``body`` raises is raised by the ``resume`` that ran it."""

    def __init__(self, name: str, body: Callable[[], None], owner: object = None) -> None:
        self._body = body
        self.owner = owner  # whose it is (a node process's), for what happens to it
        self._go = threading.Semaphore(0)
        self._back = threading.Semaphore(0)
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._started = False
        self._killed = False
        self._error: BaseException | None = None
        self.done = False
        # World time before which it is not to be resumed; None: any time.
        self.wake_at_ms: int | None = None
        # Whether resuming it now would do anything, as it said when it
        # suspended (None: it may): a world skips the fibers with nothing
        # to do, which costs two thread switches each.
        self.ready: Callable[[], bool] | None = None

    def _main(self) -> None:
        self._go.acquire()
        _current.fiber = self
        try:
            if not self._killed:
                self._body()
        except FiberKilled:
            pass
        except BaseException as exc:  # handed to the resumer, on its thread
            self._error = exc
        finally:
            self.done = True
            self._back.release()

    def resume(self) -> None:
        """Run it until it suspends or ends."""
        if self.done:
            return
        if not self._started:
            self._started = True
            self._thread.start()
        self._go.release()
        self._back.acquire()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def suspend(self, wake_at_ms: int | None = None, ready: Callable[[], bool] | None = None) -> None:
        """From inside: hand control back to the resumer until resumed."""
        self.wake_at_ms = wake_at_ms
        self.ready = ready
        self._back.release()
        self._go.acquire()
        self.wake_at_ms = None
        self.ready = None
        if self._killed:
            raise FiberKilled

    def kill(self) -> None:
        """Unwind it (its world is over) so its thread ends."""
        if self.done or not self._started:
            self.done = True
            return
        self._killed = True
        with contextlib.suppress(Exception):  # what its unwinding raised: the world is over
            self.resume()


def current_fiber() -> Fiber | None:
    """The fiber this code runs on, if any."""
    fiber: Fiber | None = getattr(_current, "fiber", None)
    return fiber
