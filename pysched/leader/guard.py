"""Backend calls a leader part retries on its next step rather than fail on."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TypeVar

log = logging.getLogger("pysched.leader")
T = TypeVar("T")


def guarded(call: Callable[[], T]) -> T | None:
    """Run a backend call; a failure is logged and None returned, for the
    caller to try again on a later step."""
    try:
        return call()
    except Exception as exc:
        log.warning("backend call failed, will retry: %s: %s", type(exc).__name__, exc)
        return None


def ranges(partitions: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5': readable logs for 64 partitions."""
    out: list[str] = []
    for p in sorted(partitions):
        if out and out[-1].split("-")[-1] == str(p - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{p}"
        else:
            out.append(str(p))
    return ",".join(out)
