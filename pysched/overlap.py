"""The overlap policy: what a run does when it comes due while its job's
previous run still runs (Kubernetes CronJob's concurrencyPolicy, plus
Temporal schedules' BUFFER_ONE).

Each job with a policy other than ``allow`` has one *running slot* in the
store, taken by a run when it starts and let go of when it ends. The slot
is judged by the run's claim lease: taken with the claim's lease, extended
by the same heartbeat that extends the claim, so a worker that dies frees
it when its claim's lease runs out, and no second liveness mechanism is
needed. Every engine decides with the pure functions here, in one
conditional write (an SQLite transaction, a Cassandra LWT on the job's slot
row, the memory store under its lock): across nodes and workers, one run
holds the slot at a time.

- ``allow``: no slot is taken; runs may overlap.
- ``forbid``: a run finding the slot held is missed, reason ``overlap``.
- ``replace``: a run finding the slot held stops the run holding it, then
  starts. It leaves the slot *replacing*: its own key, held by no
  execution, with itself waiting in it and parked in the store; the run
  that held the slot learns it lost it (at once on the same node, else at
  its worker's next heartbeat) and is cancelled (``ctx.cancelled`` set, a
  shell command's process group stopped); when it ends it lets go of the
  slot, which makes the waiting run due at once. A worker that died lets
  go of nothing: the waiting run is due when that lease runs out. A run
  due while the slot is replacing is missed, reason ``overlap``: the
  newest run is already on its way.
- ``buffer_one``: a run finding the slot held waits, at most one: it is
  recorded in the slot and parked in the store; the run that holds the slot
  makes it due at once when it ends (and if that run's worker dies, the
  waiting run comes due again when the lease runs out). A run finding
  another one waiting is missed, reason ``overlap``.

A run that is not a fresh fire (a retry, a run parked and delivered again,
a run taken over from a dead worker) is owed whatever the policy: finding
the slot held, it waits, and is never missed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import NamedTuple

from pysched.model import Overlap
from pysched.records import DispatchRecord

# The policy a run that is not a fresh fire is judged by (see above).
OWED = "owed"
# The holder of a slot that is replacing (see above): no execution's.
REPLACING = "(replacing)"


class SlotHold(NamedTuple):
    """A run's hold on its job's slot, as the executor keeps it."""

    job_id: str
    key: str  # the run's idempotency key
    holder: str  # the execution holding it


@dataclass(frozen=True, slots=True)
class RunningSlot:
    """A job's running slot as the store keeps it: one row per job."""

    job_id: str
    key: str  # the idempotency key of the run holding it
    holder: str
    lease_expires_ms: int
    # buffer_one: the run waiting for the slot, as delivered, its due time
    # the one it is parked until (where the store scheduled it again).
    waiting: DispatchRecord | None = None
    # Bumped by every write: a conditional write expects the version read.
    version: int = 0


class Verdict(enum.Enum):
    RUN = "run"  # the slot is the run's: start it
    MISS = "miss"  # missed, reason overlap
    WAIT = "wait"  # park it until ``SlotTake.until_ms`` (or woken earlier)


@dataclass(frozen=True, slots=True)
class SlotTake:
    verdict: Verdict
    # WAIT: when to look again at the latest (the holder's lease end).
    until_ms: int | None = None
    # WAIT under replace: the run that held the slot, to cancel.
    replaced: RunningSlot | None = None
    # WAIT: the run is the one the slot lists as waiting, which its holder
    # wakes when it lets go. A run owed is not listed: it waits its time.
    listed: bool = False


def live(slot: RunningSlot | None, now_ms: int) -> bool:
    return slot is not None and slot.lease_expires_ms > now_ms


def decide(
    slot: RunningSlot | None,
    record: DispatchRecord,
    holder: str,
    policy: Overlap | str,
    now_ms: int,
    lease_ms: int,
) -> tuple[SlotTake, RunningSlot | None]:
    """What ``record`` does, given its job's slot as read, and the slot to
    write (None: write nothing)."""
    key = record.idempotency_key
    version = 0 if slot is None else slot.version
    if slot is not None and slot.holder == REPLACING and live(slot, now_ms):
        # The run it replaces still holds the slot, in effect: the run
        # waiting in it waits on (delivered again), as does a run owed; a
        # fresh fire is missed.
        if slot.key == key or policy == OWED:
            return SlotTake(Verdict.WAIT, until_ms=slot.lease_expires_ms, listed=slot.key == key), None
        return SlotTake(Verdict.MISS), None
    if slot is None or slot.key == key or not live(slot, now_ms):
        # Free, or this run's own (its execution trying again, or taken
        # over after its worker died): the run takes it. A run still
        # waiting stays recorded, unless it is this one.
        waiting = (
            None if slot is None or (slot.waiting is not None and slot.waiting.idempotency_key == key) else slot.waiting
        )
        taken = RunningSlot(record.job_id, key, holder, now_ms + lease_ms, waiting, version + 1)
        return SlotTake(Verdict.RUN), taken
    if slot.waiting is not None and slot.waiting.idempotency_key == key:
        # The run waiting, delivered again before the slot was let go of.
        return SlotTake(Verdict.WAIT, until_ms=slot.lease_expires_ms, listed=True), None
    if policy == "replace":
        waiting = record._replace(due_ms=slot.lease_expires_ms)
        replacing = RunningSlot(record.job_id, key, REPLACING, slot.lease_expires_ms, waiting, version + 1)
        return SlotTake(Verdict.WAIT, until_ms=slot.lease_expires_ms, replaced=slot, listed=True), replacing
    if policy == OWED:
        return SlotTake(Verdict.WAIT, until_ms=slot.lease_expires_ms), None
    if policy == "buffer_one" and slot.waiting is None:
        waiting = record._replace(due_ms=slot.lease_expires_ms)
        return SlotTake(Verdict.WAIT, until_ms=slot.lease_expires_ms, listed=True), replace(
            slot, waiting=waiting, version=version + 1
        )
    return SlotTake(Verdict.MISS), None


def extended(slot: RunningSlot | None, hold: SlotHold, now_ms: int, lease_ms: int) -> RunningSlot | None:
    """The slot with its lease extended, or None when ``hold`` no longer
    holds it (replaced, or taken after its lease ran out)."""
    if slot is None or slot.key != hold.key or slot.holder != hold.holder:
        return None
    return replace(slot, lease_expires_ms=now_ms + lease_ms, version=slot.version + 1)


def released(slot: RunningSlot | None, hold: SlotHold) -> bool:
    """Whether ``hold`` lets go of ``slot``: the run holding it does (a
    later execution of the same run may have taken it: any execution of
    the run lets go, since the run is one), and so does the run a replacing
    slot waits on."""
    return slot is not None and (slot.key == hold.key or slot.holder == REPLACING)


def wake_reason(job_id: str) -> str:
    return f"waiting: the previous run of {job_id} has ended (overlap buffer_one)"


def waiting_reason(job_id: str, policy: str = "buffer_one") -> str:
    if policy == "replace":
        return f"waiting: the previous run of {job_id} is being stopped (overlap replace)"
    return f"waiting: the previous run of {job_id} is still running (overlap buffer_one)"
