"""How a node of a world with --target-time calls its targets: each call on
a fiber of its own (fibers.py), all of a batch at once, as a node's pool
calls each on a thread of its own (worker/calls.ThreadedCalls); a target
that takes time suspends its fiber until the world's clock reaches its end
(ledger.record), and its worker waits meanwhile, suspended in the middle of
its batch, while the world, its heartbeats and the other nodes go on."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar, cast

from pysched.sim.fibers import Fiber, FiberKilled, current_fiber
from pysched.worker.calls import Ends, split_returns

T = TypeVar("T")
R = TypeVar("R")


class NodeFibers:
    """The fibers of one node process: its workers' and its targets' calls."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.workers: list[Fiber] = []
        self.calls: list[Fiber] = []  # in the order started

    def add_worker(self, body: Callable[[], None]) -> Fiber:
        fiber = Fiber(f"{self.name}-worker-{len(self.workers)}", body, owner=self)
        self.workers.append(fiber)
        return fiber

    def start_call(self, body: Callable[[], None]) -> None:
        """Run ``body`` on a fiber of its own until its target suspends or it
        ends."""
        fiber = Fiber(f"{self.name}-call", body, owner=self)
        self.calls.append(fiber)
        fiber.resume()
        self.calls = [f for f in self.calls if not f.done]

    def resume_calls(self, now_ms: int) -> None:
        """Resume the calls whose time has come, by the time each ends, then
        as started."""
        due = [f for f in self.calls if f.wake_at_ms is not None and f.wake_at_ms <= now_ms]
        for fiber in sorted(due, key=lambda f: cast(int, f.wake_at_ms)):
            fiber.resume()
        self.calls = [f for f in self.calls if not f.done]

    def resume_workers(self) -> None:
        """Resume each worker that may do something now."""
        for fiber in self.workers:
            if fiber.ready is None or fiber.ready():
                fiber.resume()

    def kill(self) -> None:
        """The world is over: every thread of theirs ends."""
        for fiber in [*self.calls, *self.workers]:
            fiber.kill()


class FiberCalls:
    """TargetCalls for a node's fibers: called on a worker's fiber, it
    starts each call on a fiber of its own and suspends the worker until
    one returns; the returns of one round are yielded together."""

    def __init__(self, fibers: NodeFibers) -> None:
        self._fibers = fibers

    def run(self, items: Iterable[T], call: Callable[[T], R]) -> Iterator[Ends[T, R]]:
        worker = current_fiber()
        if worker is None:
            raise RuntimeError("FiberCalls runs on a worker's fiber")
        returns: list[tuple[T, R | None, BaseException | None]] = []

        def calling(item: T) -> None:
            try:
                result = call(item)
            except FiberKilled:
                raise
            except BaseException as exc:  # raised by the caller, as ThreadedCalls does
                returns.append((item, None, exc))
            else:
                returns.append((item, result, None))

        running = 0
        try:
            for item in items:
                self._fibers.start_call(functools.partial(calling, item))
                running += 1
        except FiberKilled:
            raise
        except BaseException:
            # Taking the next item failed: the calls under way finish first.
            while len(returns) < running:
                worker.suspend(ready=lambda: len(returns) == running)
            raise
        failure: BaseException | None = None
        while running:
            while not returns:
                worker.suspend(ready=lambda: bool(returns))
            got = list(returns)
            returns.clear()
            running -= len(got)
            returned, failure = split_returns(got, failure)
            if returned:
                yield Ends(returned, more_running=running > 0)
        if failure is not None:
            raise failure
