"""Firing: handing due runs to the dispatcher, each under its partition's
fence, and backing off while the dispatcher fails."""

from __future__ import annotations

import logging

from pysched import native
from pysched.leader.config import LeaderConfig
from pysched.protocols import Dispatcher, Run

log = logging.getLogger("pysched.leader")


class Publisher:
    def __init__(self, dispatcher: Dispatcher, config: LeaderConfig) -> None:
        self.dispatcher = dispatcher
        self.config = config
        self._failures = 0
        self._retry_at = 0

    def retry_due(self, now: int) -> bool:
        """Whether runs kept from a failed publish may be tried again."""
        return now >= self._retry_at

    def publish(self, rows: list[Run], fences: dict[int, int], now: int) -> bool:
        """Hand ``rows`` on; False (and a backoff) when the dispatcher failed
        and nothing may move past them."""
        try:
            self.dispatcher.publish(*encode(rows, fences, now))
        except Exception as exc:
            self._failures += 1
            delay = self.config.backoff_ms(self._failures)
            self._retry_at = now + delay
            log.warning(
                "dispatch of %d runs failed (%s: %s); retrying in %d ms", len(rows), type(exc).__name__, exc, delay
            )
            return False
        self._failures = 0
        return True


def encode(rows: list[Run], fences: dict[int, int], now: int) -> tuple[list[int], list[bytes]]:
    """The dispatcher's (partitions, payloads) for ``rows``."""
    distinct = set(fences.values())
    if len(distinct) == 1:
        # One fence for every partition (the embedded leader): one batch.
        return [r.partition for r in rows], native.encode_batch(rows, distinct.pop(), now)
    by_fence: dict[int, list[Run]] = {}
    for row in rows:
        by_fence.setdefault(fences[row.partition], []).append(row)
    partitions: list[int] = []
    payloads: list[bytes] = []
    for fence, group in by_fence.items():
        partitions.extend(r.partition for r in group)
        payloads.extend(native.encode_batch(group, fence, now))
    return partitions, payloads
