"""What a worker does with a run, against the claims and the store: claim it,
run its target, record how it ended. Shared by a node's delivery workers,
whatever drives them (threads, or a simulator's steps).

Each execution of a delivery claims its run under a holder of its own, the
node's holder and a number: two workers of one node are two executions, and
one never takes over a run the other has in flight. The executor keeps the
claims of its executions still running, which ``heartbeat_step`` extends;
an execution that ends without recording an outcome leaves its claim to run
out, and the run is handed on again.

A run is stopped when its execution's lease is lost (the heartbeat finds
its claim taken over, or could not renew it within the lease) or its job is
cancelled (``heartbeat_step``): its ``ctx.cancelled`` is set, and its shell
command's process group is signalled. A run whose job was cancelled is
recorded cancelled. A run whose lease was lost may have been taken over, or
not (etcd, Cassandra or the network failed the heartbeat for a while): once
its target returns, its claim is ended under its holder, and only if that
claim was still its holder's is anything recorded (``_write_ends``), as the
run ended, whether before the stop or after it: a success as a success, a
failure with its retry. Still its holder's means the claim's conditional
completion under that holder applied (on the cluster Cassandra's
lightweight transaction, which a taker's conditional take-over contends
with; Redis is only a hint): nobody took the run over, so no other
execution ran it or will, and a delivery of it that comes later finds the
claim ended. Handing such a run back to run again would repeat an effect a
target that ignored ``ctx.cancelled`` has done. A claim taken over is the
taker's to record: nothing of this execution is. Either way its delivery
is acknowledged: the run is in the store's hands again, or in the hands of
the execution that took it over, whose own delivery it is.

When its node stops past the grace period, the executor interrupts the
executions whose runs have not ended (``interrupt``, then, once their shell
commands are stopped, ``record_interrupted``): each claim is let go of and
each run recorded interrupted, so the run's next delivery is a new attempt
at once, never a second copy beside a first still running; an outcome that
arrives later is dropped.

The calls take a batch of executions, each carrying how far it got: an
attempt that failed halfway is repeated whole, and an execution whose run
has ended only records it, never runs again. A batch's claims, starts and
ends are one write each; its targets are called as ``calls`` says (a node's
pool: each on a thread of its own, all at once, so none waits behind
another; a simulator: one after another), and each holds a place of the
node's ``capacity`` from its delivery's taking until its target returns.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import random
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import cast

from pydantic import ValidationError

from pysched.catchup import late_reason
from pysched.clock import Clock
from pysched.downstream import downstream_of
from pysched.kept_failures import record_kept_failure
from pysched.model import Job
from pysched.overlap import OWED, SlotHold, Verdict, waiting_reason, wake_reason
from pysched.protocols import (
    ABANDONED,
    Claim,
    ClaimedFailure,
    ClaimOutcome,
    DeadLetterSink,
    FailedAttempt,
    IdempotencyClaims,
    JobNotFound,
    MissedRuns,
    RunNotFound,
    RunRecord,
    ScheduleStore,
    next_attempt,
    not_at_delivery,
    of_replaced_job,
)
from pysched.records import DispatchRecord
from pysched.retries import LOST, lost_not_retried, retry_delay_ms
from pysched.shell import stop_commands
from pysched.targets import RunContext, context_for, run_target, runs_in_thread
from pysched.worker.calls import Capacity, InlineCalls, TargetCalls
from pysched.worker.config import WorkerConfig
from pysched.worker.downstreams import DownstreamGuard
from pysched.worker.observer import NoObserver, RunObserver, RunOutcome

log = logging.getLogger("pysched.worker")


_RUN = (ClaimOutcome.CLAIMED, ClaimOutcome.TAKEN_OVER)

# The ends of a batch's runs are recorded together: at the batch's end, or
# before its next target starts once the first end has waited this long. A
# node that dies meanwhile leaves them to run again (delivery is at least
# once; the idempotency key is what makes the effect once), so the wait is
# short, and bounded by one target's time besides.
_RECORD_WITHIN_MS = 20


@dataclass(frozen=True)
class Ended:
    """How a run ended, to record: ``state`` succeeded, failed or cancelled,
    or None for a run replaced by a reschedule (its history row says so).
    A failure says what kind it was (targets.Outcome), for its retry."""

    state: str | None
    error: str | None
    result: str | None
    at_ms: int
    kind: str | None = None
    exception_names: tuple[str, ...] = ()
    # A run parked (state "parked"), not started: when it is owed again.
    parked_until_ms: int | None = None
    # Parked as the run its job's slot lists as waiting (overlap.SlotTake).
    listed: bool = False


def _outcome(end: Ended) -> RunOutcome:
    """How ``end`` is counted."""
    if end.state == "parked" and end.kind == "overlap":
        return "waiting"  # for its job's previous run, not a breaker
    if end.state in ("succeeded", "failed", "missed", "parked"):
        return cast(RunOutcome, end.state)
    return "cancelled"


@dataclass(eq=False)
class Execution:
    """One execution of one delivery, through every attempt a failure costs
    it: the holder of its claim, how the run ended once it has, and whether
    it was interrupted (then it records nothing more, and its delivery is
    let go of unacknowledged)."""

    record: DispatchRecord
    holder: str
    ended: Ended | None = None
    # Whether an attempt asked the store to mark the run started: an answer
    # lost may have left it marked, though the target never ran.
    start_asked: bool = False
    interrupted: bool = False
    attempt: int | None = None  # the attempt its start is, once started
    started_at_ms: int | None = None
    job: Job | None = None  # the job as it was read for the run
    # Whether its retry budget was asked, and what it said: the question is
    # asked once, however often recording its failure is repeated.
    retry_granted: bool | None = None
    # The error its last failure was recorded with (the budget's refusal
    # said), for the log.
    recorded_error: str | None = None
    # Its failure to record and when it is retried (None: a dead letter),
    # made once: a repeated recording writes what the first wrote (perhaps
    # in part) and its claim kept, not a retry at a time drawn again.
    failure: tuple[FailedAttempt, int | None] | None = None
    # A failure an earlier delivery's claim kept (ClaimedFailure JSON), not
    # yet known to be in the run's history: its claim hands it over once,
    # so it is kept here until recorded, through repeated attempts.
    claimed_failure: str | None = None
    # The checkpoint it resumes from (JSON text), when it took the run over.
    checkpoint: str | None = None
    # When its claim's lease was last known renewed (claimed or extended).
    renewed_at_ms: int = 0
    # Its last claim found the run another's: when that holder's lease ends
    # unless renewed, if the claim said.
    busy_until_ms: int | None = None
    # Set to stop its run (the target's ctx.cancelled), and why; lease_lost:
    # the heartbeat no longer extends its claim, which another execution
    # may have taken over (then taken_over, once its end finds so).
    cancelled: threading.Event = field(default_factory=threading.Event)
    stop_reason: str | None = None
    lease_lost: bool = False
    taken_over: bool = False
    # Its lease was lost before its target was called: not called, and
    # handed back to run, unless its claim was taken over (_waited_in_vain).
    uncalled: bool = False
    # Its hold on its job's running slot (overlap policy), while it has one.
    slot: SlotHold | None = None
    replaced: bool = False  # stopped because a newer run of its job replaced it
    recorded: bool = False  # its end is recorded: never again
    recording: bool = False  # a thread is recording its end now
    # A write of its end failed: it waits to be written again, and a death
    # of its node meanwhile leaves the run to run again.
    end_refused: bool = False
    # Its run as it found it when it took it over from an execution that
    # started it and never ended (retries.LOST): recorded as that attempt.
    lost: RunRecord | None = None
    # Marked by an interruption and not yet recorded by it: its claim is
    # still extended, or another node could take it over meanwhile.
    awaiting_interruption: bool = False
    # Its target went on past its node's stop (a thread nothing can stop),
    # ctx.cancelled set: whatever it returns, it is recorded interrupted.
    outlived_stop: bool = False
    # It holds a place of its node's capacity (calls.Capacity): from its
    # delivery's taking until its target returns, or it ends without a call.
    reserved: bool = False


class Executor:
    def __init__(
        self,
        claims: IdempotencyClaims,
        store: ScheduleStore,
        clock: Clock,
        holder: str,
        config: WorkerConfig | None = None,
        rng: random.Random | None = None,
        dead_letters: DeadLetterSink | None = None,
        observer: RunObserver | None = None,
        calls: TargetCalls | None = None,
        capacity: Capacity | None = None,
    ) -> None:
        self.claims = claims
        self.calls: TargetCalls = calls or InlineCalls()
        # None: a worker takes what its batch allows, and the calls are not
        # counted (one after another on a simulator's step).
        self.capacity = capacity
        self.dead_letters = dead_letters
        self.observer: RunObserver = observer or NoObserver()
        self._rng = rng or random.Random()
        self.store = store
        self.clock = clock
        self.holder = holder
        self.config = config or WorkerConfig()
        self.counts: Counter[str] = Counter()
        # Set once the node's runs are interrupted and recorded so: the
        # workers record and acknowledge nothing more.
        self.abandoned = threading.Event()
        # Set when the interruption begins: no target starts from then on,
        # and the shell commands started under it are stopped.
        self.interrupting = threading.Event()
        # Set when the node begins to stop (the pool's stop): a batch of
        # deliveries starts no more of its runs.
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._serial = itertools.count(1)
        # Execution holder -> the execution, while it holds a claim it runs.
        self._running: dict[str, Execution] = {}
        self.downstreams = DownstreamGuard(store, clock, holder, self.config.breaker)

    def count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def new_execution(self, record: DispatchRecord) -> Execution:
        """An execution of ``record`` whose claims holder is unique to it
        within the node, as the node's holder is to the node."""
        with self._lock:
            serial = next(self._serial)
        return Execution(record, f"{self.holder}/{serial}")

    def end(self, executions: Sequence[Execution]) -> None:
        """The executions are over: a claim one still holds (it ended without
        recording an outcome) is no longer extended and runs out."""
        with self._lock:
            for execution in executions:
                if not execution.awaiting_interruption:
                    self._running.pop(execution.holder, None)
        self._free_places(executions)

    def _free_places(self, executions: Sequence[Execution]) -> None:
        """Give back the places the executions hold of the node's capacity."""
        if self.capacity is None:
            return
        with self._lock:
            freed = [e for e in executions if e.reserved]
            for execution in freed:
                execution.reserved = False
        self.capacity.give_back(len(freed))

    def running(self) -> int:
        """How many executions hold a claim they extend."""
        with self._lock:
            return len(self._running)

    def heartbeat_step(self, now_ms: int) -> int:
        """Extend the leases of the claims of the executions running, in one
        call; how many were extended. A failure is logged and left to the
        next beat: a lease outlives several. A run whose lease is lost (its
        claim taken over, or not renewed for a whole lease) or whose job was
        cancelled is stopped (``stop``)."""
        with self._lock:
            running = [e for e in self._running.values() if not e.lease_lost]
        if not running:
            return 0
        lease_ms = self.config.lease_ms
        self._extend_slots(running, now_ms)
        try:
            keys, holders = [e.record.idempotency_key for e in running], [e.holder for e in running]
            not_extended = self.claims.heartbeat(keys, holders, now_ms, lease_ms)
            lost = [running[i] for i in not_extended if running[i].ended is None]
        except Exception as exc:
            log.warning("heartbeat failed, will retry: %s", exc)
            # A lease that would run out before the next beat could renew it,
            # the kill that follows a stop included, is given up at this one:
            # stopped once it ran out, a target may still be running when
            # another worker takes its run over, and runs beside it. Never
            # before two beats failed in a row (a lease shorter than a beat
            # and a kill cannot keep to this), nor later than the lease.
            beat_ms, kill_ms = self.config.heartbeat_ms, int(self.config.kill_after_s * 1000)
            give_up_ms = min(lease_ms, max(lease_ms - beat_ms - kill_ms, 2 * beat_ms))
            for execution in running:
                if now_ms - execution.renewed_at_ms >= give_up_ms:
                    unrenewed_s = (now_ms - execution.renewed_at_ms) / 1000
                    self.stop(
                        execution,
                        f"its lease could not be renewed in time: not renewed for {unrenewed_s:g} s"
                        f" of its {lease_ms / 1000:g} s",
                        lease_lost=True,
                    )
            return 0
        for execution in running:
            if execution in lost:
                self.stop(execution, "its lease was lost: its claim was taken over", lease_lost=True)
            else:
                execution.renewed_at_ms = now_ms
        self._stop_cancelled_jobs([e for e in running if e not in lost])
        return len(running) - len(not_extended)

    def _stop_cancelled_jobs(self, running: Sequence[Execution]) -> None:
        """Stop the runs whose job was cancelled (``pysched cancel``) while
        they ran: one read per job, at each beat."""
        jobs = {e.record.job_id for e in running if e.stop_reason is None and e.ended is None}
        for job_id in jobs:
            try:
                cancelled = self.store.get_job(job_id).state == "cancelled"
            except JobNotFound:
                cancelled = True
            except Exception as exc:
                log.warning("could not read job %s, will look again: %s", job_id, exc)
                continue
            if cancelled:
                for execution in running:
                    if execution.record.job_id == job_id:
                        self.stop(execution, "its job was cancelled while it ran")

    def stop(self, execution: Execution, why: str, lease_lost: bool = False) -> None:
        """Stop ``execution``'s run: ``ctx.cancelled`` for a Python target,
        SIGTERM to its shell command's process group (SIGKILL after
        ``kill_after_s``). A run whose lease was lost is no longer extended;
        how it ended is recorded only if its claim is still its holder's
        (``_write_ends``)."""
        with self._lock:
            if execution.stop_reason is not None:
                return
            execution.stop_reason = why
            if lease_lost:
                execution.lease_lost = True
        execution.cancelled.set()
        self.count("lease_lost" if lease_lost else "stopped")
        record = execution.record
        log.warning("stopping %s run_at=%d (%s): %s", record.job_id, record.run_at_ms, execution.holder, why)
        stop_commands(execution.cancelled, self.config.kill_after_s)

    def _extend_slots(self, running: Sequence[Execution], now_ms: int) -> None:
        """Extend the running slots of the runs holding one, with their
        claims' lease: a run that lost its slot (replaced by a newer run, or
        its lease ran out and another run took it) is stopped."""
        holding = {e.slot: e for e in running if e.slot is not None}
        if not holding:
            return
        try:
            lost = self.store.extend_slots(list(holding), now_ms, self.config.lease_ms)
        except Exception as exc:
            log.warning("extending running slots failed, will retry: %s", exc)
            return
        for hold in lost:
            self._stop_replaced(holding[hold])

    def _stop_replaced(self, execution: Execution) -> None:
        """Stop a run that a newer run of its job replaced: ``ctx.cancelled``
        for a Python target, and its shell command's process group, asked
        with SIGTERM and killed after ``kill_after_s``, in a thread of its
        own (the caller is a worker or the heartbeat)."""
        with self._lock:
            if execution.replaced or execution.ended is not None:
                return
            # It keeps its hold: letting go of the slot when it ends is
            # what starts the run replacing it (overlap.released).
            execution.replaced = True
        execution.cancelled.set()
        log.warning("replacing %s run_at=%d: a newer run is due", execution.record.job_id, execution.record.run_at_ms)
        threading.Thread(
            target=stop_commands,
            args=(execution.cancelled, self.config.kill_after_s),
            name="pysched-replace",
            daemon=True,
        ).start()

    def attempt(self, executions: Sequence[Execution]) -> list[ClaimOutcome]:
        """One attempt at each execution: claim, run and record, or, once its
        run has ended in an earlier attempt, only record, since a run whose
        outcome failed to record must not run again. Returns each claim's
        outcome (CLAIMED for one that only recorded); BUSY means not yet
        dealt with; an interrupted execution is not attempted again. Raises
        what a claims or store call raised: the attempt is to be repeated,
        whole."""
        outcomes = [ClaimOutcome.CLAIMED] * len(executions)
        self._claim_again(executions)
        fresh = [i for i, e in enumerate(executions) if e.ended is None and not e.interrupted]
        for i, outcome in zip(fresh, self._claim([executions[i] for i in fresh]), strict=True):
            outcomes[i] = outcome
        ready: list[Execution] = []
        for i in fresh:
            if outcomes[i] in _RUN:
                execution = executions[i]
                # A batch's later runs ask their breaker just before their
                # calls, not now: the calls before theirs may open it.
                first_claim = outcomes[i] is ClaimOutcome.CLAIMED
                ended = self._prepare(execution, first_claim, admit=not ready)
                if ended is None:
                    ready.append(execution)
                else:
                    self._set_ended(execution, ended)
        # What ended without a call (or in an earlier attempt), in one write,
        # its places given back; then the ends of the runs called, together,
        # but none left waiting past _RECORD_WITHIN_MS, nor for a run still
        # running.
        self._free_places([e for e in executions if e.ended is not None or e.interrupted])
        self._record(executions)
        called: list[Execution] = []
        calls = self.calls.run(self._start(ready), self._call_in_place)
        try:
            for ends in calls:
                called.extend(execution for execution, _ in ends.returned)
                first_end = next((e.ended.at_ms for e in called if e.ended is not None and not e.recorded), None)
                if ends.more_running or (
                    first_end is not None and self.clock.now_ms() - first_end >= _RECORD_WITHIN_MS
                ):
                    self._record(called)
        except BaseException:
            # A write failed while calls were under way: they finish first
            # (each sets its end as it returns), so that the attempt's
            # repetition records them rather than calls them a second time.
            with contextlib.suppress(BaseException):
                for _ in calls:
                    pass
            raise
        self._record(ready)
        return outcomes

    def _claim_again(self, executions: Sequence[Execution]) -> None:
        """An execution whose lease was lost before its target was called (an
        attempt that failed and waited out its backoff, unrenewed) claims its
        run again, as a fresh one: its claim says whether it is still its
        holder's. Its stop was for a target it never called."""
        with self._lock:
            for execution in executions:
                if execution.lease_lost and execution.ended is None and execution.started_at_ms is None:
                    execution.lease_lost = False
                    execution.stop_reason = None
                    execution.cancelled = threading.Event()

    def _stopped_here(self, execution: Execution) -> bool:
        """Whether the run was stopped by this node (its job cancelled, its
        lease lost, the node stopping, its ctx.cancelled set): how its call
        then ended is our doing, and its downstream learns nothing of it."""
        with self._lock:
            stopped = execution.stop_reason is not None or execution.interrupted or execution.outlived_stop
        return stopped or execution.cancelled.is_set()

    def _call_in_place(self, execution: Execution) -> Ended:
        """Its call, its end set as soon as it returns (an interruption or a
        repeated attempt then finds it ended: never called again), then its
        place of the node's capacity given back."""
        try:
            end = self._call(execution)
            self._set_ended(execution, end)
            return end
        finally:
            self._free_places([execution])

    def ends_unrecorded(self) -> list[Execution]:
        """The executions whose runs ended and whose ends are not recorded
        yet (waiting in their batch, or their write refused and to be tried
        again): what a death of the node now leaves to run again."""
        with self._lock:
            return [e for e in self._running.values() if e.ended is not None and not e.recorded]

    def record_ended(self) -> None:
        """Record the runs that have ended and wait in their batch to be
        recorded, now: the node is about to give up its runs (after its
        grace period), and a run that ended must not run again."""
        waiting = self.ends_unrecorded()
        try:
            self._record(waiting)
        except Exception as exc:
            log.warning("could not record %d runs that ended: %s", len(waiting), exc)

    def _waited_in_vain(self, execution: Execution) -> Ended | None:
        """How a run that waited in its batch ends without its call: its job
        cancelled (the heartbeat stopped it), a newer run replacing it, or
        its lease lost (handed back, to run)."""
        now_ms = self.clock.now_ms()
        if execution.replaced:
            error = "replaced: a newer run of the job came due before this one started (overlap replace)"
            return Ended("cancelled", error, None, now_ms)
        if execution.lease_lost:
            # Its claim may be another's now: nothing of it was done here,
            # and whoever holds the claim runs it (_hand_back_uncalled).
            execution.uncalled = True
            return Ended(None, f"interrupted: {execution.stop_reason}", None, now_ms)
        if execution.stop_reason is not None:
            return Ended("cancelled", f"cancelled: {execution.stop_reason}", None, now_ms)
        return None

    def _set_ended(self, execution: Execution, ended: Ended) -> None:
        with self._lock:
            if execution.interrupted:
                # Recorded interrupted, and perhaps already delivered again
                # (or dropped at a stop after its lease was lost): this
                # outcome came too late to count.
                return
            outlived_stop = execution.outlived_stop
            if outlived_stop:
                execution.interrupted = True
        if outlived_stop:
            # Told to stop by its node's stop, as a shell command is
            # interrupted: it ran again as its next attempt, from its last
            # checkpoint, rather than count a return cut short as done.
            self.record_interrupted([execution], "the node stopped; it returned after ctx.cancelled was set")
            return
        with self._lock:
            # Stopped because its lease was lost, it ends as its target said,
            # recorded if its claim is still its own (_write_ends).
            if ended.state in ("succeeded", "failed") and execution.stop_reason and not execution.lease_lost:
                # Stopped because its job was cancelled: whatever the target
                # made of it, the run was cancelled.
                ended = Ended("cancelled", f"cancelled: {execution.stop_reason}", ended.result, ended.at_ms)
            execution.ended = ended

    def _start(self, ready: list[Execution]) -> Iterator[Execution]:
        """Record the runs started, in one commit where the store can, then
        yield each whose target is to run now. A run rescheduled since it
        was handed on ends there (it never runs, and its row belongs to the
        cancellation); one interrupted, or, past a batch's first, reached
        once its node has begun to stop, is let go of, to be handed on
        again. Called one after another (a simulator's steps), a batch's
        later runs are recorded started before they are; a node's pool
        calls them all at once. Those not yielded give back their places."""
        try:
            yield from self._starting(ready)
        finally:
            self._free_places([e for e in ready if e.ended is not None or e.interrupted])

    def _starting(self, ready: list[Execution]) -> Iterator[Execution]:
        if len(ready) > 1 and self.stopping.is_set():
            # Not started: let go of as they are, for the next node.
            for execution in ready[1:]:
                self._let_go_unstarted(execution)
            ready = ready[:1]
        now_ms = self.clock.now_ms()
        with self.store.writes_together():
            for execution in ready:
                execution.start_asked = True
                execution.attempt = self.store.run_started(execution.record, self.holder, now_ms)
        for position, execution in enumerate(ready):
            if execution.attempt is None:
                self._set_ended(execution, Ended(None, None, None, self.clock.now_ms()))
                continue
            if position > 0 and self.stopping.is_set():
                self._let_go_unstarted(execution)
                continue
            with self._lock:
                by_interrupt = execution.interrupted
                execution.interrupted = by_interrupt or self.interrupting.is_set()
            if execution.interrupted:
                self._interrupted_before_start(execution, by_interrupt)
                continue
            # A batch's later run: what happened while it waited. A first one
            # whose lease was lost already is not called either.
            if position > 0:
                instead = self._waited_in_vain(execution) or self._admit(execution)
            else:
                instead = self._waited_in_vain(execution) if execution.lease_lost else None
            if instead is not None:
                self._set_ended(execution, instead)
                continue
            started_at_ms = self._mark_called(execution)
            if started_at_ms is None:
                # Interrupted meanwhile, and recorded so by the interruption.
                self._interrupted_before_start(execution, by_interrupt=True)
                continue
            self.observer.started(execution.record.due_ms, started_at_ms)
            yield execution

    def _mark_called(self, execution: Execution) -> int | None:
        """Its start time, now, unless it was interrupted: under the lock,
        so that an interruption sees every run whose target is called or
        about to be (``started_at_ms`` set), and no other."""
        with self._lock:
            if execution.interrupted:
                return None
            execution.started_at_ms = self.clock.now_ms()
            return execution.started_at_ms

    def _let_go_unstarted(self, execution: Execution) -> None:
        """A run of a batch the stopping node will not start: its claim is
        let go of (and, marked started, it is recorded interrupted), so the
        next leader hands it on again."""
        with self._lock:
            execution.interrupted = True
        self._interrupted_before_start(execution, by_interrupt=False)

    def interrupt(self, *, process_exits: bool | None = None) -> list[Execution]:
        """Begin the interruption: no target starts from now on, and the
        executions whose runs have not ended are marked interrupted (an
        outcome they reach later is dropped). Returns those, for
        ``record_interrupted`` once their shell commands are stopped (under
        ``interrupting``, see shell.stop_commands).

        A target running in a thread (targets.runs_in_thread) cannot be
        stopped: its ``ctx.cancelled`` is set. Unless the process is about
        to exit and end it (``process_exits``, by default the config's
        ``process_exits_at_stop``), its run is not interrupted now: it keeps
        its claim, extended by the heartbeat, until its target returns, and
        is recorded interrupted then. Letting go of the claim of a run still
        running would let another node run it beside it. Each run marked
        keeps its claim extended until ``record_interrupted`` lets go of it."""
        if process_exits is None:
            process_exits = self.config.process_exits_at_stop
        with self._lock:
            self.interrupting.set()
            unended = [e for e in self._running.values() if e.ended is None and not e.interrupted]
            for execution in unended:
                if execution.lease_lost:
                    # Its claim may be another's: dropped unrecorded, its
                    # delivery let go of (delivered again after the stop).
                    execution.interrupted = True
            unended = [e for e in unended if not e.lease_lost]
            in_thread = [e for e in unended if e.started_at_ms is not None and e.job and runs_in_thread(e.job)]
            going_on = [] if process_exits else in_thread
            marked = [e for e in unended if e not in going_on]
            for execution in marked:
                execution.interrupted = execution.awaiting_interruption = True
            for execution in going_on:
                execution.outlived_stop = True
        for execution in in_thread:
            execution.cancelled.set()
        if going_on:
            log.warning(
                "%d runs go on after the stop (%s): their targets run in threads, which cannot be stopped;"
                " ctx.cancelled is set, and each keeps its claim until it returns",
                len(going_on),
                ", ".join(sorted({e.record.job_id for e in going_on})[:5]),
            )
        return marked

    def record_interrupted(self, executions: Sequence[Execution], why: str) -> None:
        """Let go of each claim and record each run interrupted, the claim
        first (as in _record): the next delivery takes it over at once, as a
        new attempt. A failed write is logged: that run's claim then runs
        out, as a dead node's does."""
        now_ms = self.clock.now_ms()
        for execution in executions:
            record = execution.record
            try:
                self.claims.complete(record.idempotency_key, execution.holder, False, None, now_ms)
                self.store.run_interrupted(record, f"interrupted: {why}", now_ms)
            except Exception as exc:
                log.warning("could not record %s run_at=%d interrupted: %s", record.job_id, record.run_at_ms, exc)
                continue
            self.count("interrupted")
            self.observer.ended("interrupted")
            log.warning(
                "interrupted %s run_at=%d attempt=%s: %s", record.job_id, record.run_at_ms, execution.attempt, why
            )
        self._release_slots(executions, now_ms)
        with self._lock:
            for execution in executions:
                execution.awaiting_interruption = False
        self.end(executions)

    def _claim(self, executions: Sequence[Execution]) -> list[ClaimOutcome]:
        """Take the runs' claims; each outcome is dealt with unless it says
        to run it (or, BUSY, to look again later)."""
        if not executions:
            return []
        now_ms = self.clock.now_ms()
        lease_ms = self.config.lease_ms
        # One commit for a batch's claims, where the store shares the claims'
        # database; none of them is acted on before it.
        with self.store.writes_together():
            claims = [self.claims.claim(e.record, e.holder, now_ms, lease_ms) for e in executions]
        with self._lock:
            for execution, claim in zip(executions, claims, strict=True):
                self.counts[claim.outcome.value] += 1
                if claim.outcome in _RUN:
                    # Extended by the heartbeat until the execution ends.
                    self._running[execution.holder] = execution
                    execution.renewed_at_ms = now_ms
                    if claim.outcome is ClaimOutcome.TAKEN_OVER:
                        execution.checkpoint = claim.checkpoint
        self.observer.claimed([claim.outcome for claim in claims])
        for execution, claim in zip(executions, claims, strict=True):
            if claim.failure is not None:
                execution.claimed_failure = claim.failure
            if execution.claimed_failure is not None:
                # A failed delivery's end, kept on its claim: its worker may
                # have died before the history had it. Recorded before this
                # delivery is dealt with: a take-over then starts the next
                # attempt, never the failed one again.
                self._record_claimed_failure(execution.record, execution.claimed_failure)
                execution.claimed_failure = None
            if claim.outcome is ClaimOutcome.FAILED:
                log.info(
                    "skipped %s: delivery %d of %s already failed",
                    execution.record.job_id,
                    execution.record.attempt,
                    execution.record.idempotency_key,
                )
            elif claim.outcome is ClaimOutcome.PRUNED:
                # A stale record delivered again: its run ended and its
                # history is gone, so nothing is recorded either.
                log.info(
                    "skipped %s: %s ended, and its history was pruned",
                    execution.record.job_id,
                    execution.record.idempotency_key,
                )
            elif claim.outcome is ClaimOutcome.SUCCEEDED:
                # Its history may not say so: the node that ran it may have
                # died after completing the claim (_record). A history that
                # says succeeded already keeps its record.
                self.store.run_finished(execution.record, "succeeded", None, claim.result, now_ms)
                log.info("skipped %s: %s already succeeded", execution.record.job_id, execution.record.idempotency_key)
            elif claim.outcome is ClaimOutcome.BUSY:
                execution.busy_until_ms = claim.busy_until_ms
                log.info("waiting on %s: it runs elsewhere under a live lease", execution.record.idempotency_key)
        waiting = self._hand_back(
            [(e, c) for e, c in zip(executions, claims, strict=True) if c.outcome is ClaimOutcome.FENCED]
        )
        return [
            ClaimOutcome.BUSY if e.holder in waiting else c.outcome for e, c in zip(executions, claims, strict=True)
        ]

    def _hand_back(self, rejected: Sequence[tuple[Execution, Claim]]) -> set[str]:
        """Runs sent by a leader that has lost the partition, perhaps before
        it lost it: each is still owed, to the new leader, unless it started
        or ended meanwhile. A start does not count when this execution asked
        for it (a rejected attempt runs nothing). Nor when the run's claim
        was taken under a fence as stale as this one (this record may be the
        only one left: Kafka brought it here from a worker that died) and no
        live lease holds it: that worker died, perhaps before it ran the
        target. Under a live lease, this execution looks again when the
        lease ends: returns those executions' holders. A run claimed under
        the current fence is its holder's: if it dies, its own record is
        delivered again."""
        waiting: set[str] = set()
        for execution, claim in rejected:
            record = execution.record
            failed = self.claims.failed_claim(record.idempotency_key)
            if failed is not None and record.attempt <= failed.delivery:
                # This delivery failed (or a later one did): the run is owed
                # by its retry, if any, not by this record. Its failure goes
                # into the history if the worker died before writing it.
                self._record_claimed_failure(record, failed.failure)
                log.warning(
                    "rejected %s run_at=%d: fence %d is below the partition's %d (a stale leader);"
                    " delivery %d already failed",
                    record.job_id,
                    record.run_at_ms,
                    record.fence,
                    claim.fence_floor,
                    record.attempt,
                )
                continue
            now_ms = self.clock.now_ms()
            started_by = self.holder if execution.start_asked else None
            # Most are runs no worker started (a stale leader's sends): no
            # claim to ask about.
            handed_back = self.store.hand_back(record, now_ms, started_by)
            if not handed_back and started_by is None:
                held = self.claims.unfinished_claim(record.idempotency_key, now_ms)
                if held is not None and held.fence < claim.fence_floor:
                    if held.holder != execution.holder and held.alive_until_ms is not None:
                        execution.busy_until_ms = held.alive_until_ms
                        waiting.add(execution.holder)
                        log.info(
                            "waiting on %s: rejected for its fence, and held under a live lease from as stale a one",
                            record.idempotency_key,
                        )
                        continue
                    # Its own claim (an attempt whose answer was lost, which
                    # ran nothing), or one whose lease ran out.
                    handed_back = self.store.hand_back(record, now_ms, ABANDONED)
            log.warning(
                "rejected %s run_at=%d: fence %d is below the partition's %d (a stale leader)%s",
                record.job_id,
                record.run_at_ms,
                record.fence,
                claim.fence_floor,
                "; handed back to its leader" if handed_back else "",
            )
        return waiting

    def _prepare(self, execution: Execution, first_claim: bool, admit: bool = True) -> Ended | None:
        """None when the run is to start: not cancelled or replaced after it
        was handed on, not too late for its job's catch-up policy, holding
        its job's slot if it has one, admitted by its downstream's breaker
        (unless not ``admit``: asked just before its call); else how it
        ends. Lateness is judged on the run's first claim alone:
        a retry, or a run taken over from a dead worker, is owed whenever it
        comes."""
        record = execution.record
        # Taken over, and not from this execution's own earlier try.
        lost = None if first_claim or execution.start_asked else self._lost_attempt(record)
        try:
            job_record = self.store.get_job(record.job_id)
        except JobNotFound:
            job_record = None
        except ValidationError as exc:
            # Its stored definition no longer validates: that will not pass
            # by trying again, so the run fails, saying why, and the records
            # behind it go on.
            error = f"the job's stored definition no longer validates: {exc.errors()[0].get('msg', exc)}"
            return Ended("failed", error, None, self.clock.now_ms(), kind="invalid")
        if job_record is not None and of_replaced_job(job_record, record.run_at_ms):
            # Its id was taken since by a new job: nothing of it is the new
            # job's (the store records nothing of it either).
            return Ended(
                "cancelled", "job cancelled before the run, and its id taken by a new job", None, self.clock.now_ms()
            )
        if job_record is None or job_record.state == "cancelled":
            why = "job cancelled before the run"
            if lost is not None:
                why = f"job cancelled after attempt {lost.attempt} ended with its worker's process on {lost.worker}"
            return Ended("cancelled", why, None, self.clock.now_ms())
        now_ms = self.clock.now_ms()
        if lost is not None:
            # That attempt failed: its retry, if any, is a new delivery.
            execution.job, execution.lost = job_record.job, lost
            error = f"lost: attempt {lost.attempt} ended with its worker's process on {lost.worker} while it ran"
            return Ended("failed", error, None, now_ms, kind=LOST)
        paused = job_record.state == "paused" and record.attempt_group == 0
        if paused and (first_claim or self._never_started(record)):
            # Handed on before the pause reached its leader, or parked
            # before it (waiting for its job's previous run, or for a
            # breaker) and never started: a paused job starts nothing new
            # of its schedule, and counts it. A retry's run had started: it
            # goes on. A triggered run (a group of its own) is no part of
            # the schedule the pause holds.
            return Ended("missed", "missed: the job was paused", None, now_ms, kind="paused")
        late = late_reason(job_record.job, record.due_ms, now_ms) if first_claim else None
        if late is not None:
            job = job_record.job
            error = (
                f"missed: handed on {(now_ms - record.due_ms) / 1000:.1f} s after its due time, past its"
                f" max delay of {job.max_delay_ms / 1000:g} s (catch-up {job.catch_up})"
            )
            return Ended("missed", error, None, now_ms, kind=late)
        blocked = self._take_slot(execution, job_record.job, first_claim, now_ms)
        if blocked is not None:
            return blocked
        execution.job = job_record.job
        return self._admit(execution) if admit else None

    def _lost_attempt(self, record: DispatchRecord) -> RunRecord | None:
        """The run, if an execution started it and never recorded its end:
        taken over now, that attempt ended with its worker's process (or,
        on a node still alive, was stopped when its lease was lost)."""
        try:
            run = self.store.get_run(record.job_id, record.run_at_ms, record.attempt_group)
        except RunNotFound:
            return None
        if run.state != "running":
            return None
        self.count("lost")
        log.warning(
            "taking over %s run_at=%d: attempt %d was running on %s and never ended"
            " (that node died, or the job ended its process)",
            record.job_id,
            record.run_at_ms,
            run.attempt,
            run.worker,
        )
        return run

    def _admit(self, execution: Execution) -> Ended | None:
        """None if its downstream's breaker lets the run call it now; else
        the run is parked until the breaker may let it through."""
        assert execution.job is not None
        downstream = downstream_of(execution.job)
        admission = self.downstreams.admit(downstream)
        if admission.park_until_ms is None:
            return None
        # No call: no failure, and its retries untouched. A batch's run
        # recorded started keeps its attempt, not ended, for its next start.
        why = f"parked: the circuit breaker of {downstream} is open"
        return Ended("parked", why, None, self.clock.now_ms(), parked_until_ms=admission.park_until_ms)

    def _call(self, execution: Execution) -> Ended:
        """Run the target of a run recorded started."""
        job = execution.job
        assert job is not None
        downstream = downstream_of(job)
        self.downstreams.called(downstream)
        outcome = run_target(
            job,
            self._context(execution, job),
            self.interrupting,
            self.config.temporal_address,
        )
        if execution.replaced:
            # Stopped by us, not failed: its downstream is not to blame.
            error = "replaced: a newer run of the job came due while this one ran (overlap replace)"
            return Ended("cancelled", error, outcome.result, self.clock.now_ms())
        if not self._stopped_here(execution):
            self.downstreams.ended(downstream, outcome.kind, outcome.succeeded)
        return Ended(
            "succeeded" if outcome.succeeded else "failed",
            outcome.error,
            outcome.result,
            self.clock.now_ms(),
            outcome.kind,
            outcome.exception_names,
        )

    def _context(self, execution: Execution, job: Job) -> RunContext:
        """The target's context: the execution's stop event, the checkpoint
        it resumes from, and its checkpoints saved under its claim."""
        key, holder = execution.record.idempotency_key, execution.holder

        def save(state: str) -> bool:
            return self.claims.save_checkpoint(key, holder, state, self.clock.now_ms())

        record = execution.record._replace(attempt=execution.attempt or execution.record.attempt)
        return context_for(job, record, execution.cancelled, execution.checkpoint, save)

    def _take_slot(self, execution: Execution, job: Job, first_claim: bool, now_ms: int) -> Ended | None:
        """The job's overlap policy (overlap.py): None when the run may
        start (holding the job's slot, unless the policy is allow), else
        how it ends now: missed, or parked waiting for the slot. A run that
        is not a fresh fire is owed, and waits rather than being missed."""
        if job.overlap == "allow":
            return None
        record = execution.record
        policy = job.overlap if first_claim else OWED
        take = self.store.take_slot(record, execution.holder, policy, now_ms, self.config.lease_ms)
        if take.verdict is Verdict.MISS:
            if job.overlap == "replace":
                # Under replace a run misses only when one already waits
                # to replace the running run (overlap.decide).
                error = f"missed: a newer run of {job.id} already waits to replace the running one (overlap replace)"
            else:
                error = f"missed: the previous run of {job.id} was still running (overlap {job.overlap})"
            return Ended("missed", error, None, now_ms, kind="overlap")
        if take.replaced is not None:
            # Held on this node: stopped at once; elsewhere, its worker
            # finds it lost at its next heartbeat (_extend_slots). This run
            # waits for it to end (overlap.py).
            with self._lock:
                local = self._running.get(take.replaced.holder)
            if local is not None and local is not execution:
                self._stop_replaced(local)
        if take.verdict is Verdict.WAIT:
            until_ms = take.until_ms if take.until_ms is not None else now_ms + self.config.lease_ms
            reason = waiting_reason(job.id, job.overlap)
            return Ended("parked", reason, None, now_ms, kind="overlap", parked_until_ms=until_ms, listed=take.listed)
        execution.slot = SlotHold(record.job_id, record.idempotency_key, execution.holder)
        return None

    def _never_started(self, record: DispatchRecord) -> bool:
        """Whether the run is parked and no attempt of it ever started."""
        try:
            run = self.store.get_run(record.job_id, record.run_at_ms, record.attempt_group)
        except RunNotFound:
            return False
        return run.state == "parked" and run.started_at_ms is None and not run.failures

    def _wake_if_let_go(self, record: DispatchRecord, until_ms: int) -> None:
        """A run parked waiting in its job's slot is woken by the run that
        lets go of the slot; that run may have let go between this run's
        decision and its park (a run replaced on the same node stops at
        once), and found nothing parked to wake. Then it is woken here, once
        parked, or it would wait out the old run's lease. Read after the
        park: a let-go after it wakes the run itself."""
        slot = self.store.running_slot(record.job_id)
        if slot is not None and slot.waiting is not None and slot.waiting.idempotency_key == record.idempotency_key:
            return  # still listed: the holder wakes it
        try:
            run = self.store.get_run(record.job_id, record.run_at_ms, record.attempt_group)
        except RunNotFound:
            return
        if run.state != "parked" or run.due_ms != until_ms:
            return  # woken already, or delivered again since
        now_ms = self.clock.now_ms()
        self.store.run_parked(record._replace(due_ms=until_ms), now_ms, wake_reason(record.job_id), now_ms)

    def _release_slots(self, executions: Sequence[Execution], now_ms: int) -> None:
        """Let go of the running slots the ended runs hold (waking the run
        waiting for one). A failure is logged: the slot's lease runs out."""
        for execution in executions:
            hold = execution.slot
            if hold is None:
                continue
            try:
                self.store.release_slot(hold, now_ms)
            except Exception as exc:
                log.warning("could not let go of the running slot of %s: %s", hold.job_id, exc)
                continue
            execution.slot = None

    def _record_history(
        self, execution: Execution, end: Ended, failure: tuple[FailedAttempt, int | None] | None
    ) -> None:
        """Write how the run ended into its history (a failure as
        ``_failure_of`` made it)."""
        record = execution.record
        if end.state == "failed":
            assert failure is not None
            self.store.run_failed(record, *failure)
        elif end.state == "missed":
            missed = MissedRuns(record.job_id, record.run_at_ms, record.run_at_ms + 1, end.kind or "skipped")
            self.store.run_missed(record, missed, end.error or "missed", end.at_ms)
        elif end.state == "parked" and end.parked_until_ms is not None:
            self.store.run_parked(record, end.parked_until_ms, end.error or "parked", end.at_ms)
            if end.listed:
                self._wake_if_let_go(record, end.parked_until_ms)
        elif end.state is not None:
            self.store.run_finished(record, end.state, end.error, end.result, end.at_ms)

    def _failure_of(self, execution: Execution, end: Ended) -> tuple[FailedAttempt, int | None]:
        """A failed attempt to record, and when the run is tried again (None:
        not, it is a dead letter now), by the job's retry policy and its
        downstream's retry budget. Asked before the writes that record it:
        the budget takes a lock of its own, which its own writes hold while
        they wait for the database."""
        record = execution.record
        try:
            run = self.store.get_run(record.job_id, record.run_at_ms, record.attempt_group)
            failures, started = run.failures, run.attempt
        except RunNotFound:
            failures, started = (), 0
        # Not started (its spec or target refused first): the attempt its
        # start would have been. Lost: the attempt that was.
        attempt = execution.attempt or next_attempt(started, max((f.attempt for f in failures), default=0))
        worker: str | None = self.holder
        started_at_ms = execution.started_at_ms
        if execution.lost is not None:
            attempt, worker, started_at_ms = execution.lost.attempt, execution.lost.worker, execution.lost.started_at_ms
        delay = None
        if execution.job is not None:
            delay = retry_delay_ms(execution.job.retry, end.kind, end.exception_names, failures, attempt, self._rng)
        error = end.error
        if delay is None and end.kind == LOST and execution.job is not None:
            error = f"{error}; {lost_not_retried(execution.job.retry, failures, attempt)}"
        if delay is not None and execution.job is not None and end.kind != LOST:
            # The budget is asked once: a repeated recording asks nothing.
            downstream = downstream_of(execution.job)
            if execution.retry_granted is None:
                execution.retry_granted = self.downstreams.grant_retry(downstream)
            if not execution.retry_granted:
                # Held back a window, not dropped: the run's own retries
                # are what it was promised.
                delay = max(delay, self.downstreams.policy.budget_window_ms)
                error = (
                    f"{error or 'failed'} (the retry budget of {downstream} is spent: retried in {delay / 1000:.0f} s)"
                )
        retry_due_ms = None if delay is None else end.at_ms + delay
        retry_due_ms = not_at_delivery(retry_due_ms, record.due_ms)
        execution.recorded_error = error
        failure = FailedAttempt(
            attempt,
            worker,
            started_at_ms,
            end.at_ms,
            error,
            end.kind,
            retry_due_ms is None,
            end.result,
        )
        return failure, retry_due_ms

    def _record_claimed_failure(self, record: DispatchRecord, text: str) -> None:
        """Write a failure its claim kept (ClaimedFailure) into the run's
        history, as its delivery's worker would have, unless the history
        has it already: that worker died between the two writes."""
        claimed = record_kept_failure(self.store, record, text, self.clock.now_ms())
        if claimed is not None and claimed.retry_due_ms is None and self.dead_letters is not None:
            self._announce_dead_letter(record)

    def _announce_dead_letter(self, record: DispatchRecord) -> None:
        """After the store has it: a failure to announce loses nothing the
        store holds, and is logged."""
        assert self.dead_letters is not None
        try:
            run = self.store.get_run(record.job_id, record.run_at_ms, record.attempt_group)
            if run.state == "failed":
                self.dead_letters.publish(run, self.clock.now_ms())
        except Exception as exc:
            log.warning("could not announce the dead letter %s: %s", record.idempotency_key, exc)

    def _interrupted_before_start(self, execution: Execution, by_interrupt: bool) -> None:
        """Its target will not start. Marked by ``interrupt``, which records
        it, the run's history is written again: that may have been written
        before this start made the run running. Else this records it."""
        if execution.lease_lost:
            return  # the run is the execution's that took it over
        why = "the node stopped before it started"
        if not by_interrupt:
            self.record_interrupted([execution], why)
            return
        record = execution.record
        try:
            self.store.run_interrupted(record, f"interrupted: {why}", self.clock.now_ms())
        except Exception as exc:
            log.warning("could not record %s interrupted: %s", execution.record.job_id, exc)

    def _record(self, executions: Sequence[Execution]) -> None:
        """Record each run's end on its claim, then in its history; both
        writes are idempotent, so an attempt that failed halfway is simply
        repeated. The claim first: it is what decides whether a redelivery
        runs the run again. A node dying between the two leaves a claim that
        says succeeded, and the redelivery copies its result to the history
        (_claim), or one that says failed, keeping the failure, and the next
        delivery (a redelivery, one rejected for its fence, or the retry)
        records it (_record_claimed_failure); the other order left a history
        saying how it ended and a running claim whose lease ran out, and
        the run was run again. Where the store can, both are one commit
        (``writes_together``)."""
        with self._lock:
            # Taken for recording: the worker's thread and, at a stop, the
            # interrupting one may both ask.
            ended = [(e, e.ended) for e in executions if e.ended is not None and not (e.recorded or e.recording)]
            for execution, _ in ended:
                execution.recording = True
        if not ended:
            return
        try:
            retry_at = self._write_ends(ended)
        except BaseException:
            with self._lock:
                for execution, _ in ended:
                    execution.end_refused = True
            raise
        finally:
            with self._lock:
                for execution, _ in ended:
                    execution.recording = False
        self._release_slots([e for e, _ in ended], self.clock.now_ms())
        self._log_ends(ended, retry_at)

    def _write_ends(self, ended: list[tuple[Execution, Ended]]) -> dict[str, int | None]:
        """The writes of ``_record``; each failure's retry time (None: a dead
        letter), by holder."""
        uncalled = [(e, end) for e, end in ended if e.uncalled]
        ended = [(e, end) for e, end in ended if not e.uncalled]
        for execution, end in ended:
            if end.state == "failed" and execution.failure is None:
                execution.failure = self._failure_of(execution, end)
        failures = {e.holder: e.failure for e, _ in ended if e.failure is not None}
        retry_at = {holder: retry_due_ms for holder, (_, retry_due_ms) in failures.items()}
        with self.store.writes_together():
            self._hand_back_uncalled(uncalled)
            for execution, end in ended:
                # A missed run's claim is not a success: its redelivery would
                # record it succeeded. Taken over, it finds the run missed. A
                # parked run let go of its claim, for its next delivery. A
                # failure is kept on the claim as the history is to have it:
                # no redelivery runs that delivery again, and the one that
                # comes after a death before the history write records it.
                record = execution.record
                result = end.result
                if end.state == "failed":
                    failure, retry_due_ms = failures[execution.holder]
                    result = ClaimedFailure(failure, retry_due_ms, record.attempt, record.due_ms).to_json()
                elif end.state in ("missed", "parked"):
                    result = None
                succeeded = end.state not in ("failed", "missed", "parked")
                ours = self.claims.complete(record.idempotency_key, execution.holder, succeeded, result, end.at_ms)
                # Its lease lost, it learns here whether the run is still its
                # own to record (see the module's docstring).
                execution.taken_over = execution.lease_lost and not ours
            for execution, end in ended:
                if not execution.taken_over:
                    self._record_history(execution, end, failures.get(execution.holder))
        if self.dead_letters is not None:
            # Once the store has them.
            for execution, end in ended:
                if end.state == "failed" and retry_at.get(execution.holder) is None and not execution.taken_over:
                    self._announce_dead_letter(execution.record)
        with self._lock:
            for execution, _ in [*uncalled, *ended]:
                execution.recorded = True
        return retry_at

    def _hand_back_uncalled(self, ended: list[tuple[Execution, Ended]]) -> None:
        """The runs whose lease was lost before their targets were called,
        each under its claim: nothing of one whose claim another execution
        took over (that one runs the run); else the run is recorded
        interrupted and handed back to its leader, owed again at once as its
        next attempt (on the embedded engine an interrupted run is owed by
        its state). The claim first, as in ``_record``: once it is let go of
        a taker no longer waits out its lease."""
        for execution, end in ended:
            record = execution.record
            ours = self.claims.complete(record.idempotency_key, execution.holder, False, None, end.at_ms)
            execution.taken_over = not ours
            if not ours:
                continue
            self.store.run_interrupted(record, end.error or "interrupted: its lease was lost", end.at_ms)
            # As its next delivery: its leader, which may still lead under
            # the fence it sent this one with, skips a row of a delivery it
            # has sent already.
            self.store.hand_back(record._replace(attempt=record.attempt + 1), end.at_ms, self.holder)

    def _log_ends(self, ended: list[tuple[Execution, Ended]], retry_at: dict[str, int | None]) -> None:
        for execution, end in ended:
            job_id = execution.record.job_id
            if execution.lease_lost and execution.taken_over:
                run_at_ms = execution.record.run_at_ms
                log.info("dropped the end of %s run_at=%d: its claim was taken over", job_id, run_at_ms)
                continue
            if execution.uncalled:
                self.count("interrupted")
                self.observer.ended("interrupted")
                log.warning(
                    "interrupted %s run_at=%d before its call: %s; handed back, to run",
                    job_id,
                    execution.record.run_at_ms,
                    execution.stop_reason,
                )
                continue
            outcome = _outcome(end)
            self.count(outcome)
            self.observer.ended(outcome, retry_at.get(execution.holder) is not None)
            if end.state == "missed":
                log.info("missed %s run_at=%d: %s", job_id, execution.record.run_at_ms, end.error)
            elif end.state == "parked":
                log.info("%s run_at=%d %s", job_id, execution.record.run_at_ms, end.error)
            elif end.state == "succeeded":
                log.info("ran %s: succeeded%s", job_id, f": {end.result}" if end.result else "")
            elif end.state == "failed" and (retry_ms := retry_at.get(execution.holder)) is not None:
                self.count("retried")
                log.warning(
                    "ran %s: attempt %s failed, retrying at %s: %s",
                    job_id,
                    execution.lost.attempt if execution.lost else execution.attempt,
                    datetime.fromtimestamp(retry_ms / 1000, UTC).isoformat(timespec="milliseconds"),
                    end.error,
                )
            elif end.state == "failed":
                self.count("dead_lettered")
                log.warning(
                    "ran %s: failed for good (a dead letter): %s", job_id, execution.recorded_error or end.error
                )
            else:
                if execution.started_at_ms is None:
                    log.info("skipped %s run_at=%d: cancelled", job_id, execution.record.run_at_ms)
                else:
                    # Started, then stopped: replaced, or its job cancelled.
                    log.info("stopped %s run_at=%d: %s", job_id, execution.record.run_at_ms, end.error or "cancelled")
