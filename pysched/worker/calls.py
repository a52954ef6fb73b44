"""How the targets of a worker's batch are called, and how many may run at
once on a node.

A worker takes several deliveries together so that their claims, starts and
ends cost one write each; that batching is for the bookkeeping alone. Their
targets must not wait behind each other: a short run due with a long one
starts when the long one does, not when it ends. So a node's pool calls each
target on a thread of its own (``ThreadedCalls``), and a worker takes no more
deliveries than there are places free to run them (``Capacity``): every run
it takes starts at once, and a run beyond the node's concurrency waits in the
queue, not in a batch, for a place to come free. A simulator, stepping one
thing at a time, calls them one after another (``InlineCalls``).
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Ends(Generic[T, R]):
    """Calls that have returned, with what each returned; ``more_running``:
    whether others of the batch are still running or still to start (their
    ends are not to be waited for before these are recorded)."""

    returned: list[tuple[T, R]]
    more_running: bool


def split_returns(
    got: Iterable[tuple[T, R | None, BaseException | None]], failure: BaseException | None
) -> tuple[list[tuple[T, R]], BaseException | None]:
    """Calls' returns as ``TargetCalls.run`` gathers them: the items that
    returned, with their results, and the first failure (``failure`` if one
    came before), raised once every call has returned."""
    returned: list[tuple[T, R]] = []
    for item, result, exc in got:
        if exc is not None:
            failure = failure or exc
        else:
            returned.append((item, cast(R, result)))
    return returned, failure


class TargetCalls(Protocol):
    def run(self, items: Iterable[T], call: Callable[[T], R]) -> Iterator[Ends[T, R]]:
        """Call ``call`` on each of ``items`` (taken from it as they are
        started) and yield their returns as they come; what a call raises is
        raised once every call of the batch has returned."""
        ...


class InlineCalls:
    """One after another on the caller's thread. Each return is yielded
    before the next call starts, as one whose end is not to wait for the
    calls after it: a run that ended is recorded before the next target of
    its batch runs, or a crash during that one would have it run again."""

    def run(self, items: Iterable[T], call: Callable[[T], R]) -> Iterator[Ends[T, R]]:
        for item in items:
            yield Ends([(item, call(item))], more_running=True)


class Capacity:
    """How many targets a node may run at once (its concurrency): a worker
    reserves a place for each delivery it takes, and gives it back when the
    run's target returns, or when the delivery is dealt with without a
    call."""

    def __init__(self, places: int) -> None:
        self.places = places
        self._free = places
        self._changed = threading.Condition()

    def reserve(self, most: int, timeout_s: float) -> int:
        """Up to ``most`` places, at least one, waiting at most
        ``timeout_s`` for one to come free; 0 if none did."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._free > 0, timeout_s):
                return 0
            taken = min(most, self._free)
            self._free -= taken
            return taken

    def give_back(self, places: int) -> None:
        if places <= 0:
            return
        with self._changed:
            self._free = min(self.places, self._free + places)
            self._changed.notify_all()


class ThreadedCalls:
    """Each call on a thread of its own, all of a batch at once: nothing
    waits behind another run. The threads are kept for the next calls (a
    burst would otherwise start one per run), as many as have ever run at
    once, which a node's capacity bounds; a call never waits for one. They
    are daemon threads, because a Python target cannot be stopped: a
    process that exits ends it (non-daemon threads would keep the process
    alive for it instead).

    A call's return is yielded together with those that follow within
    ``gather_s``, so that a burst of short runs records its ends in a few
    writes rather than one each."""

    def __init__(self, gather_s: float = 0.02) -> None:
        self._gather_s = gather_s
        self._tasks: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a task, not yet promised one

    def _submit(self, task: Callable[[], None]) -> None:
        with self._lock:
            promised = self._idle > 0
            if promised:
                self._idle -= 1
        if not promised:
            threading.Thread(target=self._serve, name="pysched-run", daemon=True).start()
        self._tasks.put(task)

    def _serve(self) -> None:
        while True:
            self._tasks.get()()
            with self._lock:
                self._idle += 1

    def run(self, items: Iterable[T], call: Callable[[T], R]) -> Iterator[Ends[T, R]]:
        returns: queue.SimpleQueue[tuple[T, R | None, BaseException | None]] = queue.SimpleQueue()

        def calling(item: T) -> None:
            try:
                returns.put((item, call(item), None))
            except BaseException as exc:  # raised by the caller, not lost on this thread
                returns.put((item, None, exc))

        running = 0
        try:
            for item in items:
                self._submit(functools.partial(calling, item))
                running += 1
        except BaseException:
            # Taking the next item failed: the calls under way are not left
            # behind unseen; they finish before the failure is raised.
            for _ in range(running):
                returns.get()
            raise
        failure: BaseException | None = None
        while running:
            first = returns.get()
            got = [first]
            deadline = time.monotonic() + self._gather_s
            while len(got) < running:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    got.append(returns.get(timeout=remaining))
                except queue.Empty:
                    break
            running -= len(got)
            returned, failure = split_returns(got, failure)
            if returned:
                yield Ends(returned, more_running=running > 0)
        if failure is not None:
            raise failure
