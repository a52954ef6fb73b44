"""Contract tests of the overlap policy's running slot (pysched/overlap.py):
every engine decides alike, by one conditional write per decision."""

from __future__ import annotations

import tests.test_contract as contract
from pysched.leader.recording import record_sent
from pysched.overlap import OWED, SlotHold, Verdict
from pysched.protocols import PlannedRun
from pysched.records import DispatchRecord
from tests.test_contract import Backend, _fresh_t0, backend, every, once_job, record

__all__ = ["_fresh_t0", "backend"]  # the shared fixtures, used by name

LEASE = 30_000


def fire(job_id: str, n: int) -> DispatchRecord:
    """The ``n``-th run of a job firing every second from T0."""
    at = contract.T0 + n * 1_000
    return record((1_000 + n, job_id, at, at, 0, 1, 0), 1)


def hold(rec: DispatchRecord, holder: str) -> SlotHold:
    return SlotHold(rec.job_id, rec.idempotency_key, holder)


def test_forbid_misses_a_run_while_the_slot_is_held_and_runs_the_next_once_it_is_let_go(backend: Backend) -> None:
    store, t0 = backend.store, contract.T0
    first, second, third = fire("f", 1), fire("f", 2), fire("f", 3)
    assert store.take_slot(first, "w1", "forbid", t0, LEASE).verdict is Verdict.RUN
    assert store.take_slot(second, "w2", "forbid", t0 + 1_000, LEASE).verdict is Verdict.MISS
    slot = store.running_slot("f")
    assert slot is not None and (slot.key, slot.holder) == (first.idempotency_key, "w1")
    store.release_slot(hold(first, "w1"), t0 + 2_500)
    assert store.take_slot(third, "w2", "forbid", t0 + 3_000, LEASE).verdict is Verdict.RUN


def test_a_run_takes_its_own_slot_again_and_a_slot_whose_lease_ran_out(backend: Backend) -> None:
    store, t0 = backend.store, contract.T0
    first, second = fire("e", 1), fire("e", 2)
    assert store.take_slot(first, "w1", "forbid", t0, LEASE).verdict is Verdict.RUN
    # The same run, taken over by another worker after its claim's lease died.
    assert store.take_slot(first, "w3", "forbid", t0 + 1, LEASE).verdict is Verdict.RUN
    # The heartbeat keeps it, for the holder that has it, and no other.
    assert store.extend_slots([hold(first, "w3")], t0 + LEASE - 1, LEASE) == []
    assert store.extend_slots([hold(first, "w1")], t0 + LEASE - 1, LEASE) == [hold(first, "w1")]
    assert store.take_slot(second, "w2", "forbid", t0 + 2 * LEASE - 2, LEASE).verdict is Verdict.MISS
    # Past the lease (its worker died): the next run takes it.
    assert store.take_slot(second, "w2", "forbid", t0 + 2 * LEASE, LEASE).verdict is Verdict.RUN


def test_replace_stops_the_run_holding_the_slot_then_runs(backend: Backend) -> None:
    store, t0 = backend.store, contract.T0
    first, second, third = fire("r", 1), fire("r", 2), fire("r", 3)
    assert store.take_slot(first, "w1", "replace", t0, LEASE).verdict is Verdict.RUN
    take = store.take_slot(second, "w2", "replace", t0 + 1_000, LEASE)
    assert (take.verdict, take.until_ms) == (Verdict.WAIT, t0 + LEASE)
    assert take.replaced is not None and (take.replaced.key, take.replaced.holder) == (first.idempotency_key, "w1")
    # Until the run replaced ends, the replacing run delivered again waits
    # on, a run owed waits too, and a newer fresh fire is missed.
    assert store.take_slot(second, "w2", "replace", t0 + 1_500, LEASE).verdict is Verdict.WAIT
    assert store.take_slot(third, "w3", OWED, t0 + 1_500, LEASE).verdict is Verdict.WAIT
    assert store.take_slot(third, "w3", "replace", t0 + 1_600, LEASE).verdict is Verdict.MISS
    # The run replaced finds it lost at its heartbeat; its end lets go of
    # the slot, and the replacing run takes it.
    assert store.extend_slots([hold(first, "w1")], t0 + 2_000, LEASE) == [hold(first, "w1")]
    store.release_slot(hold(first, "w1"), t0 + 3_000)
    assert store.running_slot("r") is None
    assert store.take_slot(second, "w2", "replace", t0 + 3_100, LEASE).verdict is Verdict.RUN


def test_replace_runs_once_the_lease_of_a_dead_holder_runs_out(backend: Backend) -> None:
    store, t0 = backend.store, contract.T0
    first, second = fire("r", 1), fire("r", 2)
    assert store.take_slot(first, "w1", "replace", t0, LEASE).verdict is Verdict.RUN
    assert store.take_slot(second, "w2", "replace", t0 + 1_000, LEASE).verdict is Verdict.WAIT
    assert store.take_slot(second, "w2", "replace", t0 + LEASE - 1, LEASE).verdict is Verdict.WAIT
    assert store.take_slot(second, "w2", "replace", t0 + LEASE, LEASE).verdict is Verdict.RUN


def test_buffer_one_keeps_one_run_waiting_and_misses_the_next(backend: Backend) -> None:
    store, t0 = backend.store, contract.T0
    first, second, third = fire("b", 1), fire("b", 2), fire("b", 3)
    assert store.take_slot(first, "w1", "buffer_one", t0, LEASE).verdict is Verdict.RUN
    waits = store.take_slot(second, "w2", "buffer_one", t0 + 1_000, LEASE)
    assert (waits.verdict, waits.until_ms) == (Verdict.WAIT, t0 + LEASE)
    assert store.take_slot(third, "w3", "buffer_one", t0 + 2_000, LEASE).verdict is Verdict.MISS
    # The run waiting, delivered again while the slot is held, waits again.
    assert store.take_slot(second, "w4", "owed", t0 + 3_000, LEASE).verdict is Verdict.WAIT
    store.release_slot(hold(first, "w1"), t0 + 4_000)
    assert store.take_slot(second, "w4", "buffer_one", t0 + 4_100, LEASE).verdict is Verdict.RUN
    slot = store.running_slot("b")
    assert slot is not None and slot.waiting is None


def test_a_run_not_freshly_fired_waits_for_the_slot_whatever_the_policy(backend: Backend) -> None:
    store, t0 = backend.store, contract.T0
    first, retry = fire("o", 1), fire("o", 2)._replace(attempt=2)
    assert store.take_slot(first, "w1", "forbid", t0, LEASE).verdict is Verdict.RUN
    take = store.take_slot(retry, "w2", "owed", t0 + 1_000, LEASE)
    assert (take.verdict, take.until_ms) == (Verdict.WAIT, t0 + LEASE)


def test_letting_go_of_the_slot_makes_the_parked_waiting_run_due_at_once(backend: Backend) -> None:
    store, t0 = backend.store, contract.T0
    job = once_job("wake", t0 + 1_000)
    store.add_job(job, 0, 0, PlannedRun(t0 + 1_000, t0 + 1_000), t0)
    (row,) = store.due_runs(every(1), t0 + 60_000, t0)
    record_sent(store, [row], every(1), {}, t0 + 1_000)
    waiting = record(row, 1)
    holding = fire("wake", -5)  # an earlier run of the job, still running
    assert store.take_slot(holding, "w1", "buffer_one", t0, LEASE).verdict is Verdict.RUN
    take = store.take_slot(waiting, "w2", "buffer_one", t0 + 1_000, LEASE)
    assert take.verdict is Verdict.WAIT and take.until_ms == t0 + LEASE
    store.run_parked(waiting, take.until_ms, "waiting", t0 + 1_000)
    assert store.get_run("wake", t0 + 1_000).due_ms == t0 + LEASE
    store.release_slot(hold(holding, "w1"), t0 + 5_000)
    woken = store.get_run("wake", t0 + 1_000)
    assert (woken.state, woken.due_ms) == ("parked", t0 + 5_000)
    assert [r.run_at_ms for r in store.due_runs(every(1), t0 + 6_000, t0 + 5_000)] == [t0 + 1_000]
