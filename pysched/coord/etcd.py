"""The distributed coordinator: a leader per partition, elected in etcd.

Each node holds one etcd lease (TTL ``lease_ttl_s``) and keeps it alive from
its coordinator thread; nothing per run touches this lease (running runs'
leases are the workers', coord/run_leases.py). Under that lease it
writes ``{prefix}/nodes/{holder}`` to say it is alive. The partitions are
shared round-robin over the sorted live nodes, so they spread evenly and move
when a node joins or leaves. A node takes a partition it should lead with a
put-if-absent transaction on ``{prefix}/leaders/{p}`` bound to its lease; the
fence is that key's mod revision, which etcd makes strictly increasing. When
a node dies its lease expires, its keys vanish, and the others take over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import aetcd

from pysched.config import ClusterConfig
from pysched.coord.etcd_connection import EtcdConnection
from pysched.protocols import HandOvers, Lease

log = logging.getLogger("pysched.etcd")


class EtcdCoordinator:
    def __init__(
        self,
        config: ClusterConfig,
        *,
        partitions: int,
        publish_fence: Callable[[int, int], None] | None = None,
        prefix: str | None = None,
        call_timeout_s: float = 5.0,
    ) -> None:
        # The keyspace's count (ScheduleStore.partitions), not the
        # configuration's: the partitions its jobs are placed in.
        self.partitions = partitions
        self.ttl_s = config.lease_ttl_s
        # A poll refreshes the lease once it is a quarter of its TTL old, so
        # at least three quarters remain when a poll begins; less a second
        # for a batch still being handed on.
        self.answer_valid_ms = max(self.ttl_s * 750 - 1_000, self.ttl_s * 250)
        self.prefix = (prefix or f"/pysched/{config.keyspace}").rstrip("/")
        self.publish_fence = publish_fence
        self.endpoint = config.etcd
        self.call_timeout_s = call_timeout_s
        self._etcd = EtcdConnection(config.etcd, call_timeout_s=call_timeout_s)
        self._client = self._etcd.client
        self._call = self._etcd.call
        # Per holder: one node is one holder, but nothing forbids sharing.
        self._leases: dict[str, tuple[aetcd.Lease, float]] = {}
        self._owned: dict[str, dict[int, int]] = {}
        self._hand_overs = HandOvers()

    def _key(self, kind: str, name: object) -> bytes:
        return f"{self.prefix}/{kind}/{name}".encode()

    # -- the Coordinator protocol --------------------------------------------

    def poll(self, holder: str, now_ms: int) -> dict[int, int]:
        # A failed poll keeps the lease and what it won: the lease may well
        # live (the next poll refreshes it, or finds it expired and starts
        # over), and a new one would orphan the partitions won under it until
        # its TTL ran out, then win them again under new fences. Whether to
        # go on leading meanwhile is the leader's call (answer_valid_ms).
        return self._call(self._poll(holder))

    def release(self, holder: str) -> None:
        self._call(self._release(holder))

    def leaders(self) -> dict[int, Lease]:
        return self._call(self._leaders())

    def members(self) -> list[str]:
        """The nodes up, sorted: those whose etcd lease lives, leading
        partitions or not (for status reports)."""
        return self._call(self._members())

    def giving_up(self, holder: str) -> dict[int, int]:
        return self._hand_overs.of(holder)

    def close(self) -> None:
        self._etcd.close()

    # -- the work, on the event loop -----------------------------------------

    async def _ensure_lease(self, holder: str) -> aetcd.Lease:
        now = time.monotonic()
        if holder in self._leases:
            lease, refreshed = self._leases[holder]
            if now - refreshed < self.ttl_s / 4:
                return lease
            if await lease.remaining_ttl() > 0:
                await lease.refresh()
                self._leases[holder] = (lease, now)
                return lease
            log.warning("etcd lease of %s expired: its partitions are gone", holder)
            self._owned.pop(holder, None)
        lease = await self._client.lease(self.ttl_s)
        self._leases[holder] = (lease, now)
        await self._client.put(self._key("nodes", holder), b"1", lease=lease)
        return lease

    async def _poll(self, holder: str) -> dict[int, int]:
        lease = await self._ensure_lease(holder)
        nodes = await self._members()
        if holder not in nodes:
            await self._client.put(self._key("nodes", holder), b"1", lease=lease)
            nodes = sorted([*nodes, holder])
        desired = {p for p in range(self.partitions) if nodes[p % len(nodes)] == holder}
        leaders = await self._leaders()
        before = self._owned.get(holder, {})
        # Every key this holder holds, including one won by a poll that
        # failed before it could say so (its publishing failed): led, or
        # handed over, never left held by a lease that lives on.
        mine = {p: current.fence for p, current in leaders.items() if current.holder == holder}
        owned = {p: fence for p, fence in mine.items() if before.get(p) == fence}
        for p in sorted(set(mine) - desired):
            # Hand it over: another node should lead it now. Its leader stops
            # before the key goes, even if this poll then fails or outlives
            # its call's timeout (giving_up).
            self._hand_overs.begin(holder, p, mine[p])
            key = self._key("leaders", p)
            await self._client.transaction(
                compare=[self._client.transactions.value(key) == holder.encode()],
                success=[self._client.transactions.delete(key)],
                failure=[],
            )
            owned.pop(p, None)
        for p in sorted(desired - set(owned)):
            if p in mine:
                # Won in an earlier poll whose publishing failed (a store or
                # Redis timeout): publish again, then lead it.
                if self.publish_fence is not None:
                    self.publish_fence(p, mine[p])
                owned[p] = mine[p]
                continue
            if p in leaders:
                continue  # still held by its previous leader: wait for its hand-over or its lease
            key = self._key("leaders", p)
            won, responses = await self._client.transaction(
                compare=[self._client.transactions.create(key) == 0],
                success=[
                    self._client.transactions.put(key, holder.encode(), lease=lease),
                    self._client.transactions.get(key),
                ],
                failure=[],
            )
            if won:
                fence = int(responses[1][0][1].mod_revision)
                if self.publish_fence is not None:
                    self.publish_fence(p, fence)
                owned[p] = fence
        self._owned[holder] = owned
        self._hand_overs.granted(holder, owned)
        return dict(owned)

    async def _release(self, holder: str) -> None:
        for p in list(self._owned.pop(holder, {})):
            key = self._key("leaders", p)
            await self._client.transaction(
                compare=[self._client.transactions.value(key) == holder.encode()],
                success=[self._client.transactions.delete(key)],
                failure=[],
            )
        await self._client.delete(self._key("nodes", holder))
        lease = self._leases.pop(holder, None)
        if lease is not None:
            await lease[0].revoke()

    async def _members(self) -> list[str]:
        return sorted(kv.key.decode().rsplit("/", 1)[1] for kv in await self._client.get_prefix(self._key("nodes", "")))

    async def _leaders(self) -> dict[int, Lease]:
        out: dict[int, Lease] = {}
        for kv in await self._client.get_prefix(self._key("leaders", "")):
            p = int(kv.key.decode().rsplit("/", 1)[1])
            out[p] = Lease(kv.value.decode(), int(kv.mod_revision), 0)
        return out
