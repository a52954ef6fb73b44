"""An in-memory coordinator, modelled on coord/etcd.py.

Election is etcd's state: leases with a TTL on the injected clock, keys
bound to them (``nodes/{holder}``, ``leaders/{p}``) that vanish when their
lease expires or is revoked, and one revision counter that every write
bumps; a partition's fence is its leader key's mod revision, so fences only
grow. MemoryCoordinator is one node's etcd client, with the same poll as
EtcdCoordinator: keep its lease alive, share the partitions round-robin over
the sorted live holders, hand over those another holder should lead, and
take a partition only once its leader key is gone (released, or its lease
expired), publishing the new fence before returning it.

Where it differs, on purpose: a poll is atomic (on etcd it is a series of
calls other nodes' polls interleave with); expired leases are reaped at the
next call rather than by the server's own timer; ``leaders`` reports each
lease's expiry (etcd's status report leaves it 0).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from pysched.clock import Clock
from pysched.memory.faults import FaultHook, Guard
from pysched.protocols import HandOvers, Lease

ROLE = "coordinator"
log = logging.getLogger("pysched.memory.coordinator")


@dataclass(frozen=True, slots=True)
class LeaseRow:
    holder: str
    expires_at_ms: int


@dataclass(frozen=True, slots=True)
class LeaderKey:
    holder: str
    lease_id: int
    mod_revision: int  # the fence


@dataclass(frozen=True, slots=True)
class FenceGrant:
    """A partition won: what a checker needs to see that fences only grow."""

    partition: int
    holder: str
    fence: int
    at_ms: int


class Election:
    """etcd's keys and leases, shared by every node's coordinator."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.lock = threading.RLock()
        self.revision = 0
        self.leases: dict[int, LeaseRow] = {}
        self.nodes: dict[str, int] = {}  # holder -> lease id
        self.leader_keys: dict[int, LeaderKey] = {}
        self.granted: list[FenceGrant] = []
        # (partition, fence) -> the first instant its leader key no longer
        # led: the lease's end, however late it was reaped, or the instant
        # after the key was deleted (a leader hands a partition over after
        # its sends of that instant).
        self.fence_ended: dict[tuple[int, int], int] = {}
        self._lease_ids = 0

    # -- read back by a simulator's checker ------------------------------------

    def grants(self) -> list[FenceGrant]:
        with self.lock:
            return list(self.granted)

    def leading_at(self, partition: int, fence: int, at_ms: int) -> bool:
        """Whether the leader key of ``partition`` with ``fence`` was alive
        at ``at_ms`` (a time not later than now)."""
        with self.lock:
            ended = self.fence_ended.get((partition, fence))
            if ended is not None:
                return at_ms < ended
            key = self.leader_keys.get(partition)
            if key is None or key.mod_revision != fence:
                return False
            lease = self.leases.get(key.lease_id)
            return lease is not None and at_ms < lease.expires_at_ms

    def leader_table(self) -> dict[int, LeaderKey]:
        with self.lock:
            self.reap()
            return dict(self.leader_keys)

    # -- etcd's operations, under the lock ------------------------------------

    def reap(self) -> None:
        """Revoke the leases that have run out, with their keys."""
        now = self.clock.now_ms()
        for lease_id in [i for i, row in self.leases.items() if row.expires_at_ms <= now]:
            self.revoke(lease_id)

    def grant_lease(self, holder: str, ttl_ms: int) -> int:
        self._lease_ids += 1
        self.leases[self._lease_ids] = LeaseRow(holder, self.clock.now_ms() + ttl_ms)
        return self._lease_ids

    def revoke(self, lease_id: int) -> None:
        row = self.leases.pop(lease_id, None)
        if row is None:
            return
        ended = min(self.clock.now_ms(), row.expires_at_ms)
        for holder in [h for h, i in self.nodes.items() if i == lease_id]:
            del self.nodes[holder]
        for p in [p for p, k in self.leader_keys.items() if k.lease_id == lease_id]:
            self.fence_ended[(p, self.leader_keys[p].mod_revision)] = ended
            del self.leader_keys[p]
        self.revision += 1

    def put_node(self, holder: str, lease_id: int) -> None:
        self.nodes[holder] = lease_id
        self.revision += 1

    def create_leader_key(self, partition: int, holder: str, lease_id: int) -> int | None:
        """Put-if-absent: the new key's mod revision, or None if one exists."""
        if partition in self.leader_keys or lease_id not in self.leases:
            return None
        self.revision += 1
        self.leader_keys[partition] = LeaderKey(holder, lease_id, self.revision)
        self.granted.append(FenceGrant(partition, holder, self.revision, self.clock.now_ms()))
        return self.revision

    def delete_leader_key(self, partition: int, holder: str) -> None:
        """Delete if its value is ``holder``."""
        key = self.leader_keys.get(partition)
        if key is not None and key.holder == holder:
            self.fence_ended[(partition, key.mod_revision)] = self.clock.now_ms() + 1
            del self.leader_keys[partition]
            self.revision += 1


class MemoryCoordinator:
    def __init__(
        self,
        election: Election,
        partitions: int,
        ttl_ms: int = 10_000,
        publish_fence: Callable[[int, int], None] | None = None,
        faults: FaultHook | None = None,
    ) -> None:
        self.election = election
        self.partitions = partitions
        self.ttl_ms = ttl_ms
        # As etcd's: a poll refreshes the lease once a quarter of its TTL
        # old, so three quarters remain when a poll begins; less a second.
        self.answer_valid_ms = max(ttl_ms * 3 // 4 - 1_000, ttl_ms // 4)
        self.publish_fence = publish_fence
        self._op = Guard(ROLE, faults, election.lock)
        # Per holder, as the etcd client keeps them: its lease (id, when last
        # refreshed) and the partitions it won, with their fences.
        self._leases: dict[str, tuple[int, int]] = {}
        self._owned: dict[str, dict[int, int]] = {}
        self._hand_overs = HandOvers()

    def poll(self, holder: str, now_ms: int) -> dict[int, int]:
        # Time is etcd's (the injected clock), not the caller's ``now_ms``.
        # As the etcd client: a failed poll keeps the lease and what it won
        # (the next poll refreshes the lease, or finds it expired and starts
        # over); whether to go on leading meanwhile is the leader's call
        # (answer_valid_ms). Dropping the lease here left the partitions won
        # under it held by a lease nobody refreshed, and the next poll took
        # them up again as its own: led on past that lease's end.
        with self.election.lock, self._op("poll"):
            return self._poll(holder)

    def release(self, holder: str) -> None:
        e = self.election
        with self._op("release"):
            for p in list(self._owned.pop(holder, {})):
                e.delete_leader_key(p, holder)
            if e.nodes.pop(holder, None) is not None:
                e.revision += 1
            lease = self._leases.pop(holder, None)
            if lease is not None:
                e.revoke(lease[0])

    def giving_up(self, holder: str) -> dict[int, int]:
        return self._hand_overs.of(holder)

    def leaders(self) -> dict[int, Lease]:
        e = self.election
        with self._op("leaders"):
            e.reap()
            return {
                p: Lease(k.holder, k.mod_revision, e.leases[k.lease_id].expires_at_ms)
                for p, k in sorted(e.leader_keys.items())
            }

    def _ensure_lease(self, holder: str) -> int:
        e = self.election
        now = e.clock.now_ms()
        if holder in self._leases:
            lease_id, refreshed = self._leases[holder]
            if now - refreshed < self.ttl_ms // 4:
                return lease_id  # fresh enough: etcd is not asked
            if lease_id in e.leases:
                e.leases[lease_id] = LeaseRow(holder, now + self.ttl_ms)
                self._leases[holder] = (lease_id, now)
                return lease_id
            log.warning("lease of %s expired: its partitions are gone", holder)
            self._owned.pop(holder, None)
        lease_id = e.grant_lease(holder, self.ttl_ms)
        self._leases[holder] = (lease_id, now)
        e.put_node(holder, lease_id)
        return lease_id

    def _poll(self, holder: str) -> dict[int, int]:
        e = self.election
        e.reap()
        lease_id = self._ensure_lease(holder)
        if holder not in e.nodes:
            e.put_node(holder, lease_id)
        nodes = sorted(e.nodes)
        desired = {p for p in range(self.partitions) if nodes[p % len(nodes)] == holder}
        before = self._owned.get(holder, {})
        # Every key this holder's lease holds, including one won by a poll
        # that failed before it could say so (its publishing failed): led,
        # or handed over, never left held by a lease that lives on.
        mine = {p: k.mod_revision for p, k in e.leader_keys.items() if k.holder == holder and k.lease_id == lease_id}
        owned = {p: fence for p, fence in mine.items() if before.get(p) == fence}
        for p in sorted(set(mine) - desired):
            # Hand it over: another holder should lead it. Its leader stops
            # at once, even if this poll then fails (giving_up).
            self._hand_overs.begin(holder, p, mine[p])
            e.delete_leader_key(p, holder)
            owned.pop(p, None)
        for p in sorted(desired - set(owned)):
            if p in mine:
                # Won in an earlier poll whose publishing failed: publish
                # again, then lead it.
                self._publish(p, mine[p])
                owned[p] = mine[p]
                continue
            if p in e.leader_keys:
                continue  # still held by its previous leader: wait for its hand-over or its lease
            fence = e.create_leader_key(p, holder, lease_id)
            if fence is not None:
                self._publish(p, fence)
                owned[p] = fence
        self._owned[holder] = owned
        self._hand_overs.granted(holder, owned)
        return dict(owned)

    def _publish(self, partition: int, fence: int) -> None:
        if self.publish_fence is not None:
            self.publish_fence(partition, fence)
