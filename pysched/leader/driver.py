"""Running a leader's parts on the calling thread, in an order chosen by the
caller: tests and the simulator, on a clock they move themselves."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from pysched.leader.partition_leader import PartitionLeader

Part = Literal["coordinate", "load", "tick", "record", "sweep"]
# The order of one round unless told otherwise: a grant is acted on by the
# tick, which asks for a read, which the next round's tick applies. The
# sweep, which acts only every few seconds, ends every round whatever the
# order (a simulator's seeds shuffle these four and replay as before).
ROUND: tuple[Part, ...] = ("coordinate", "tick", "load", "record")


class SyncDriver:
    def __init__(self, leader: PartitionLeader) -> None:
        self.leader = leader
        self._next_coordinate = 0
        self._steps: dict[Part, Callable[[int], bool]] = {
            "coordinate": leader.leases.step,
            "load": leader.loader.step,
            "tick": leader.tick,
            "record": leader.recorder.step,
            "sweep": leader.sweeper.step,
        }

    def step(self, part: Part, now: int) -> bool:
        """One step of one part at ``now``; whether it did anything."""
        return self._steps[part](now)

    def round(self, now: int, order: Sequence[Part] = ROUND) -> None:
        """Each part once, in ``order`` (the sweep last unless named); the
        coordinator only as often as the leader's configuration says, and
        the recorder until it has nothing more it can record now."""
        for part in (*order, "sweep") if "sweep" not in order else order:
            if part == "coordinate":
                if now < self._next_coordinate:
                    continue
                self._next_coordinate = now + self.leader.config.coordinate_every_ms
            if part == "record":
                while self.step("record", now):
                    pass
                continue
            self.step(part, now)

    def run_until(self, end_ms: int, order: Sequence[Part] = ROUND) -> None:
        """Rounds at every tick boundary of the leader's clock, which must be
        one that ``sleep`` moves (a ManualClock), until ``end_ms``; then hand
        over as a stopping node does."""
        clock = self.leader.clock
        tick_ms = self.leader.config.tick_ms
        while (now := clock.now_ms()) < end_ms:
            self.round(now, order)
            clock.sleep((tick_ms - clock.now_ms() % tick_ms) / 1000)
        self.leader.hand_over()
