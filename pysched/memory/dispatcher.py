"""An in-memory dispatcher, modelled on Kafka (dispatch/kafka.py).

Records go to ``schedule partition % N`` of the broker's N partitions, each
an append-only log with offsets, stamped with the injected clock (Kafka's
LogAppendTime). Consumers form a group that commits offsets as Kafka does:
acknowledging a record commits "everything before the next offset" of its
partition, so acknowledging a later record commits past an earlier one left
unacknowledged. Partitions are shared round-robin over the members in join
order; a member joining or leaving rebalances the group, and every member
then reads its partitions from their committed offsets again (Kafka's eager
rebalance), so what was taken but not committed is delivered again. A
crashed consumer keeps its partitions, unread, until the session timeout
has passed on the clock.

Where it differs, on purpose: a commit is synchronous and lands or is
dropped (the cluster's asynchronous commit may land late, or out of order);
there is no fetch batching, so a rebalance redelivers exactly what was
taken and not committed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from pysched.clock import Clock
from pysched.memory.faults import FaultHook, Guard
from pysched.protocols import Delivery

ROLE = "dispatcher"
# The cluster's consumer session timeout (dispatch/kafka.py).
SESSION_TIMEOUT_MS = 10_000
DEFAULT_GROUP = "pysched-workers"


@dataclass(frozen=True, slots=True)
class LogRecord:
    partition: int  # the broker's partition
    offset: int
    payload: bytes
    appended_at_ms: int
    schedule_partition: int


@dataclass(frozen=True, slots=True)
class RecordToken:
    """What a consumer acknowledges a delivery by."""

    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class GroupView:
    generation: int  # bumped by each rebalance
    committed: dict[int, int]  # partition -> the next offset to read
    assignment: dict[int, str]  # partition -> consumer name
    members: tuple[str, ...]  # in join order, crashed ones until evicted


@dataclass
class _Member:
    name: str
    positions: dict[int, int] = field(default_factory=dict)
    crashed_at_ms: int | None = None
    rotation: int = 0  # where the next read starts among its partitions


@dataclass
class _Group:
    committed: dict[int, int] = field(default_factory=dict)
    members: dict[str, _Member] = field(default_factory=dict)
    assignment: dict[int, str] = field(default_factory=dict)
    generation: int = 0


class Broker:
    """The logs and consumer groups, shared by every node's dispatcher."""

    def __init__(self, partitions: int, clock: Clock, session_timeout_ms: int = SESSION_TIMEOUT_MS) -> None:
        if partitions < 1:
            raise ValueError("a broker needs at least one partition")
        self.partitions = partitions
        self.clock = clock
        self.session_timeout_ms = session_timeout_ms
        self.lock = threading.RLock()
        # Wakes consumers waiting in next(); never read into the model.
        self.ready = threading.Condition(self.lock)
        self.logs: list[list[LogRecord]] = [[] for _ in range(partitions)]
        self.groups: dict[str, _Group] = {}
        self._joined = 0
        self.appended = 0  # records appended so far, to every partition

    # -- read back by a simulator's checker ------------------------------------

    def log(self, partition: int) -> list[LogRecord]:
        with self.lock:
            return list(self.logs[partition])

    def records_since(self, partition: int, offset: int) -> list[LogRecord]:
        with self.lock:
            return self.logs[partition][offset:]

    def records(self) -> list[LogRecord]:
        with self.lock:
            return [r for log in self.logs for r in log]

    def group_view(self, group: str = DEFAULT_GROUP) -> GroupView:
        with self.lock:
            g = self.groups.get(group, _Group())
            return GroupView(g.generation, dict(g.committed), dict(g.assignment), tuple(g.members))

    # -- the group's bookkeeping, under the lock ------------------------------

    def append(self, schedule_partition: int, payload: bytes) -> None:
        p = schedule_partition % self.partitions
        log = self.logs[p]
        log.append(LogRecord(p, len(log), payload, self.clock.now_ms(), schedule_partition))
        self.appended += 1

    def join(self, group: str) -> str:
        self._joined += 1
        name = f"{group}/consumer-{self._joined}"
        g = self.groups.setdefault(group, _Group())
        g.members[name] = _Member(name)
        self._rebalance(g)
        return name

    def leave(self, group: str, name: str) -> None:
        g = self.groups[group]
        if g.members.pop(name, None) is not None:
            self._rebalance(g)

    def evict_expired(self, group: str) -> None:
        """Members that crashed a session timeout ago leave the group."""
        g = self.groups[group]
        now = self.clock.now_ms()
        gone = [
            name
            for name, m in g.members.items()
            if m.crashed_at_ms is not None and now >= m.crashed_at_ms + self.session_timeout_ms
        ]
        for name in gone:
            del g.members[name]
        if gone:
            self._rebalance(g)

    def _rebalance(self, g: _Group) -> None:
        g.generation += 1
        members = list(g.members.values())
        g.assignment = {p: members[p % len(members)].name for p in range(self.partitions)} if members else {}
        # Eager: every partition is revoked and assigned again, and read from
        # its committed offset; whatever was taken and not committed comes back.
        for m in members:
            m.positions = {p: g.committed.get(p, 0) for p, owner in g.assignment.items() if owner == m.name}
            m.rotation = 0


class MemoryConsumer:
    def __init__(self, broker: Broker, group: str, faults: FaultHook | None) -> None:
        self._broker = broker
        self._group = group
        self._op = Guard(ROLE, faults, broker.lock)
        with broker.lock:
            self.name = broker.join(group)
        self._closed = False

    def next(self, timeout_s: float) -> Delivery | None:
        with self._op("next"):
            if self._closed:
                raise RuntimeError(f"{self.name} is closed")
            delivery = self._take()
            if delivery is None and timeout_s > 0:
                # Real time, only so that a consumer thread does not spin.
                self._broker.ready.wait(timeout_s)
                delivery = self._take()
            return delivery

    def _take(self) -> Delivery | None:
        b = self._broker
        b.evict_expired(self._group)
        member = b.groups[self._group].members.get(self.name)
        if member is None or member.crashed_at_ms is not None:
            return None
        owned = sorted(member.positions)
        for i in range(len(owned)):
            p = owned[(member.rotation + i) % len(owned)]
            offset = member.positions[p]
            if offset < len(b.logs[p]):
                member.positions[p] = offset + 1
                member.rotation = (member.rotation + i + 1) % len(owned)
                rec = b.logs[p][offset]
                return Delivery(rec.payload, rec.appended_at_ms, RecordToken(p, offset))
        return None

    def may_deliver(self) -> bool:
        """Whether ``next`` may give a delivery now: one of its partitions
        has records past its position, or a crashed member's session has run
        out (the rebalance may give it partitions). A simulator steps a
        worker only when it may."""
        with self._broker.lock:
            b = self._broker
            g = b.groups[self._group]
            now = b.clock.now_ms()
            for m in g.members.values():
                if m.crashed_at_ms is not None and now >= m.crashed_at_ms + b.session_timeout_ms:
                    return True
            member = g.members.get(self.name)
            if member is None or member.crashed_at_ms is not None or self._closed:
                return False
            return any(offset < len(b.logs[p]) for p, offset in member.positions.items())

    def ack(self, delivery: Delivery) -> None:
        token = delivery.token
        if not isinstance(token, RecordToken):
            raise TypeError(f"not a delivery of this dispatcher: {token!r}")
        with self._op("ack"):
            b = self._broker
            b.evict_expired(self._group)
            g = b.groups[self._group]
            member = g.members.get(self.name)
            if member is None or member.crashed_at_ms is not None or g.assignment.get(token.partition) != self.name:
                return  # the partition moved on: Kafka refuses the commit, unseen by the caller
            # Kafka commits the offset given, even below the one committed.
            g.committed[token.partition] = token.offset + 1

    def close(self) -> None:
        with self._op("close"):
            if not self._closed:
                self._closed = True
                self._broker.leave(self._group, self.name)

    def crash(self) -> None:
        """Die without a word: the group notices after the session timeout."""
        with self._broker.lock:
            member = self._broker.groups[self._group].members.get(self.name)
            if member is not None and member.crashed_at_ms is None:
                member.crashed_at_ms = self._broker.clock.now_ms()
            self._closed = True


class MemoryDispatcher:
    """One node's producer and consumer factory on the Broker."""

    def __init__(self, broker: Broker, faults: FaultHook | None = None, group: str = DEFAULT_GROUP) -> None:
        self.broker = broker
        self.group = group
        self._faults = faults
        self._op = Guard(ROLE, faults, broker.lock)
        self._closed = False

    def publish(self, partitions: Sequence[int], payloads: Sequence[bytes]) -> None:
        if len(partitions) != len(payloads):
            raise ValueError("partitions and payloads differ in length")
        with self._op("publish"):
            if self._closed:
                raise RuntimeError("dispatcher is closed")
            for partition, payload in zip(partitions, payloads, strict=True):
                self.broker.append(partition, payload)
            self.broker.ready.notify_all()

    def consumer(self) -> MemoryConsumer:
        return MemoryConsumer(self.broker, self.group, self._faults)

    def close(self) -> None:
        # The producer only: the broker and its logs outlive a node.
        self._closed = True
