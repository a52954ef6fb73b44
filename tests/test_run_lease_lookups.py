"""How long a run held in etcd is said to stay held, for the branches a
live etcd shows only by chance: a key still there under a lease that has
just expired (etcd deletes such keys a moment later)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from pysched.coord.run_leases import EtcdRunLeases


class _Client:
    """The two reads ``_held_for_ms`` makes, answering as etcd does."""

    def __init__(self, lease: int | None, ttl_s: int) -> None:
        self.lease, self.ttl_s = lease, ttl_s

    async def get(self, key: bytes) -> SimpleNamespace | None:
        return None if self.lease is None else SimpleNamespace(lease=self.lease)

    async def get_lease_info(self, lease: int, keys: bool) -> SimpleNamespace:
        return SimpleNamespace(TTL=self.ttl_s)


@pytest.mark.parametrize(
    ("lease", "ttl_s", "held_ms"),
    [
        (None, 0, 0),  # free now: look again at once
        (7, 12, 12_000),  # live: look again when it ends
        (7, -1, 1_000),  # expired, its key not yet deleted: in a second, not every 250 ms
        (7, 0, 1_000),
    ],
)
def test_held_for(lease: int | None, ttl_s: int, held_ms: int) -> None:
    leases = EtcdRunLeases.__new__(EtcdRunLeases)
    leases.prefix = "p"
    leases._client = _Client(lease, ttl_s)
    assert asyncio.run(leases._held_for_ms("k")) == held_ms
