"""Leadership: the partitions the coordinator grants this node, and for how
long its answer holds."""

from __future__ import annotations

import logging
import threading

from pysched.leader.guard import guarded
from pysched.protocols import Coordinator

log = logging.getLogger("pysched.leader")


class LeaseKeeper:
    """Polls the coordinator (``step``) and says what may be led now
    (``granted``). Kept apart from the ticks: a slow coordinator call never
    delays a fire, and a paused process wakes up ticking (its stale sends are
    what the fences are for)."""

    def __init__(self, coordinator: Coordinator, holder: str) -> None:
        self.coordinator = coordinator
        self.holder = holder
        self._lock = threading.Lock()
        self._owned: dict[int, int] = {}  # what the coordinator last granted
        self._granted_at = 0  # when the poll that granted it began
        self._answered = False  # whether any poll was answered yet
        self._unanswered_logged = False

    def step(self, now: int) -> bool:
        """One poll, begun at ``now``; whether it was answered."""
        owned = guarded(lambda: self.coordinator.poll(self.holder, now))
        if owned is None:
            return False
        with self._lock:
            self._owned = owned
            self._granted_at = now
            self._answered = True
        return True

    @property
    def answered(self) -> bool:
        """Whether the coordinator answered a poll yet: before, an empty
        grant says nothing of who leads."""
        with self._lock:
            return self._answered

    def granted(self, now: int) -> dict[int, int]:
        """What the coordinator granted, while its answer holds (past that,
        another node may lead these partitions, and this one stops sending
        until the coordinator answers again), less what it has begun to
        hand over since."""
        with self._lock:
            owned, granted_at = self._owned, self._granted_at
        if owned and (giving_up := self.coordinator.giving_up(self.holder)):
            # A poll since handed these over, and may have failed after.
            owned = {p: fence for p, fence in owned.items() if giving_up.get(p) != fence}
        if not owned or now < granted_at + self.coordinator.answer_valid_ms:
            self._unanswered_logged = False
            return owned
        if not self._unanswered_logged:
            log.error(
                "no answer from the coordinator for %.1f s: stopped leading %d partitions until it answers",
                (now - granted_at) / 1000,
                len(owned),
            )
            self._unanswered_logged = True
        return {}

    def leader_names(self) -> list[str]:
        """Who leads the partitions, for the standby log line."""
        leaders = guarded(self.coordinator.leaders) or {}
        return sorted({lease.holder for lease in leaders.values()})

    def release(self) -> None:
        guarded(lambda: self.coordinator.release(self.holder))
        with self._lock:
            self._owned = {}
