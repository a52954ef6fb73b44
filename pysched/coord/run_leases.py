"""Running runs' leases on the cluster, in etcd.

One etcd lease per worker process (TTL: the worker's run lease, 30 s by
default), kept alive by the process's heartbeat: a single keep-alive every
10 s, however many runs it carries. Under it, one key per running run,
``{prefix}/runs/{idempotency key}`` = the execution's holder. When the process
dies its lease expires and every key goes with it; when a run ends its key is
deleted. A key is created only if absent: whoever holds a run's key holds the
run, so a take-over is decided here before it is written to the claim row.

Kept apart from the claims (claims/redis_cassandra.py): which key is held by
whom, under which lease, and what a lost lease takes with it.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

import aetcd
import aetcd.exceptions

from pysched.coord.etcd_connection import EtcdConnection

log = logging.getLogger("pysched.etcd")

# How long a key still held under an expired lease is left before it is
# looked at again (see _held_for_ms).
_EXPIRED_NOT_YET_REVOKED_MS = 1_000


class Holding(enum.Enum):
    HELD = "held"  # the key is this holder's, under the lease alive now
    LOST = "lost"  # it was, under a lease that has since expired
    NOT_YET = "not_yet"  # this process never took it for this holder


class RunLeases(Protocol):
    """What the claims need of the run leases (EtcdRunLeases; an in-memory
    model in pysched.memory_cluster)."""

    def renew(self, ttl_s: int) -> None: ...
    def holding(self, key: str, holder: str) -> Holding: ...
    def take(self, key: str, holder: str, ttl_s: int) -> bool: ...
    def held_for_ms(self, key: str) -> int | None: ...
    def let_go(self, keys: Collection[str]) -> None: ...
    def let_go_all_but(self, keep: Collection[str]) -> None: ...
    def revoke(self) -> None: ...


@dataclass(frozen=True, slots=True)
class _Taken:
    holder: str
    lease_id: int
    at: float  # time.monotonic() when taken


class EtcdRunLeases:
    def __init__(self, etcd: EtcdConnection, prefix: str) -> None:
        self._etcd = etcd
        self._client = etcd.client
        self.prefix = prefix.rstrip("/")
        self._lock = threading.Lock()
        self._lease: aetcd.Lease | None = None
        self._refreshed = 0.0
        self._taken: dict[str, _Taken] = {}
        self._beat_began = 0.0

    def _key(self, key: str) -> bytes:
        return f"{self.prefix}/runs/{key}".encode()

    # -- called by the claims, from any thread -------------------------------

    def renew(self, ttl_s: int) -> None:
        """Keep the process's lease alive (the heartbeat), or grant a new one
        if it expired: the keys taken under the old one are lost
        (``holding`` says so). Raises if etcd cannot be reached."""
        with self._lock:
            self._beat_began = time.monotonic()
            self._etcd.call(self._renew(ttl_s))

    def holding(self, key: str, holder: str) -> Holding:
        with self._lock:
            taken = self._taken.get(key)
            if taken is None or taken.holder != holder:
                return Holding.NOT_YET
            alive = self._lease is not None and taken.lease_id == self._lease.id
            return Holding.HELD if alive else Holding.LOST

    def take(self, key: str, holder: str, ttl_s: int) -> bool:
        """Take ``key`` for ``holder`` under the process's lease: True if it
        was free or already ``holder``'s, False if another holder's lease
        keeps it."""
        with self._lock:
            return self._etcd.call(self._take(key, holder, ttl_s))

    def held_for_ms(self, key: str) -> int | None:
        """How long the lease holding ``key`` has left unless renewed (0:
        the key is free now); None if etcd could not say."""
        with self._lock:
            try:
                return self._etcd.call(self._held_for_ms(key))
            except Exception as exc:
                log.warning("could not read how long %s stays held: %s", key, exc)
                return None

    def let_go(self, keys: Collection[str]) -> None:
        """Delete each key this process took, if still its holder's."""
        with self._lock:
            self._etcd.call(self._let_go(keys))

    def let_go_all_but(self, keep: Collection[str]) -> None:
        """Let go of every key taken before the last ``renew`` began and not
        in ``keep``: runs that ended without their key being deleted (an
        execution that failed before its outcome, or a delete that failed)
        must not stay held. A key taken since is a run the heartbeat did not
        know of yet."""
        with self._lock:
            began = self._beat_began
            stale = [key for key, taken in self._taken.items() if key not in keep and taken.at < began]
            if stale:
                self._etcd.call(self._let_go(stale))

    def revoke(self) -> None:
        """Give up the lease and every key under it at once, as a process's
        death does after its TTL."""
        with self._lock:
            if self._lease is not None:
                self._etcd.call(self._lease.revoke())
            self._lease = None
            self._taken.clear()

    # -- the work, on the event loop -----------------------------------------

    async def _renew(self, ttl_s: int) -> None:
        if self._lease is not None:
            reply = await self._lease.refresh()
            if reply is not None and reply.TTL > 0:
                self._refreshed = time.monotonic()
                return
            lost = sum(1 for t in self._taken.values() if t.lease_id == self._lease.id)
            if lost:
                # An idle worker's lease runs out unrenewed, and nothing is lost.
                log.warning("etcd lease of this worker's runs expired: %d running run(s) lost", lost)
            self._lease = None
        await self._grant(ttl_s)

    async def _grant(self, ttl_s: int) -> aetcd.Lease:
        self._lease = await self._client.lease(ttl_s)
        self._refreshed = time.monotonic()
        return self._lease

    async def _live_lease(self, ttl_s: int) -> aetcd.Lease:
        """The lease, refreshed if a quarter of its TTL went by unrefreshed
        (a take-over may come long after the last heartbeat)."""
        if self._lease is None:
            return await self._grant(ttl_s)
        if time.monotonic() - self._refreshed >= self._lease.ttl / 4:
            await self._renew(ttl_s)
        assert self._lease is not None
        return self._lease

    async def _take(self, key: str, holder: str, ttl_s: int) -> bool:
        lease = await self._live_lease(ttl_s)
        name, value = self._key(key), holder.encode()
        tx = self._client.transactions
        try:
            created, _ = await self._client.transaction(
                compare=[tx.create(name) == 0], success=[tx.put(name, value, lease=lease)], failure=[]
            )
            if not created:
                # Already this holder's (taken before, perhaps under a lease
                # since expired): put it under the live one.
                created, _ = await self._client.transaction(
                    compare=[tx.value(name) == value], success=[tx.put(name, value, lease=lease)], failure=[]
                )
        except aetcd.exceptions.ClientError:
            # The lease may have expired between the refresh and the put.
            self._lease = None
            raise
        if created:
            self._taken[key] = _Taken(holder, lease.id, time.monotonic())
        return bool(created)

    async def _held_for_ms(self, key: str) -> int:
        kv = await self._client.get(self._key(key))
        if kv is None or not kv.lease:
            return 0
        info = await self._client.get_lease_info(kv.lease, keys=False)
        if info.TTL <= 0:
            # Expired, its keys not yet deleted: etcd's lessor revokes it
            # within about half a second, or later when busy. Looking again
            # sooner would only load etcd.
            return _EXPIRED_NOT_YET_REVOKED_MS
        # Whole seconds, rounded down by etcd: the next look may come up to
        # a second early, and looks again.
        return int(info.TTL) * 1000

    async def _let_go(self, keys: Collection[str]) -> None:
        tx = self._client.transactions
        for key in list(keys):
            taken = self._taken.get(key)
            if taken is None:
                continue
            name = self._key(key)
            await self._client.transaction(
                compare=[tx.value(name) == taken.holder.encode()], success=[tx.delete(name)], failure=[]
            )
            del self._taken[key]
