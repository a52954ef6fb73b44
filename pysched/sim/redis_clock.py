"""Redis's clock in a simulated world: the world's.

fakeredis reads the time its keys expire by from ``time.time()`` at each
command (``fakeredis._socket._base``): a claim marker set for two leases
would outlive a simulated quarter of an hour that runs in seconds, and
expire in a long world when the machine's clock says, not the world's, so
that the same seed could take another path. While a world on the tables
runs, that module reads the world's clock instead; ``restore`` gives it back
its own. One world runs at a time in a process.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

from fakeredis._socket import _base as fakeredis_commands

from pysched.clock import Clock


class _WorldTime:
    """The ``time`` module as fakeredis's command loop sees it: ``time()``
    from the world's clock, everything else the real module's."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def time(self) -> float:
        return self._clock.now_ms() / 1000

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class RedisOnWorldTime:
    def __init__(self, clock: Clock) -> None:
        self._own: ModuleType | _WorldTime = getattr(fakeredis_commands, "time")  # noqa: B009 (not exported)
        setattr(fakeredis_commands, "time", _WorldTime(clock))  # noqa: B010

    def restore(self) -> None:
        setattr(fakeredis_commands, "time", self._own)  # noqa: B010
