"""Contract tests of the rows a run is owed again by (a retry, a parking, a
hand-back, a trigger, a redrive) written late for their due time: every
engine alike. Their due time is set before the write lands (a failure's
end, a breaker's reopening, a worker's or a client's clock); a leader may
have handed the partition on past it by then, and a store that reads runs
from a watermark must still read them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import tests.test_contract as contract
from pysched.leader.recording import record_sent
from pysched.protocols import FailedAttempt, PlannedRun, Run, RunRecord
from tests.test_contract import Backend, _fresh_t0, backend, every, once_job, read_through, record

__all__ = ["_fresh_t0", "backend"]  # the shared fixtures, used by name

# Where the leader is when the late rows land: it has handed every
# partition on through LEADER_AT - SETTLE_MS.
LEADER_AT = 70_000
HORIZON = 900_000


def _failure(at: int, dead: bool = False) -> FailedAttempt:
    return FailedAttempt(1, "w1", at - 50, at, "exit status 1", "exception", dead)


def _delivered(backend: Backend, started: bool = True) -> Run:
    """A one-shot due at T0+100, handed on at T0+150 (and started by w1)."""
    t0 = contract.T0
    store = backend.store
    store.add_job(once_job("o", t0 + 100), 0, 0, PlannedRun(t0 + 100, t0 + 100), t0)
    (sent,) = store.due_runs(every(1), t0 + 60_000, t0 + 150)
    record_sent(store, [sent], every(1), {}, t0 + 150)
    if started:
        assert store.run_started(record(sent, 1), "w1", t0 + 160) == 1
    return sent


def _leader_moves_on(backend: Backend, fence: int) -> None:
    now = contract.T0 + LEADER_AT
    record_sent(backend.store, [], every(fence), read_through(now), now)


def _owed(backend: Backend, run_id: int, fence: int) -> Run:
    """The run as the leader reads it now: once."""
    now = contract.T0 + LEADER_AT + 1_000
    (run,) = [r for r in backend.store.due_runs(every(fence), contract.T0 + HORIZON, now) if r.run_id == run_id]
    if backend.name != "sqlite":  # which reads runs by their state, not from a watermark
        assert run.due_ms > backend.store.watermarks()[0]
    return run


def _write_retry(backend: Backend, sent: Run) -> RunRecord:
    # Retried at once (the full jitter drew 0), from the failure's end.
    backend.store.run_failed(record(sent, 1), _failure(contract.T0 + 200), contract.T0 + 200)
    return backend.store.get_run("o", sent.run_at_ms)


def _write_park(backend: Backend, sent: Run) -> RunRecord:
    # The breaker, open when the run was admitted, reopens at T0+300.
    backend.store.run_parked(record(sent, 1), contract.T0 + 300, "breaker open", contract.T0 + 160)
    return backend.store.get_run("o", sent.run_at_ms)


def _write_redrive(backend: Backend, sent: Run) -> RunRecord:
    # Redriven by a client whose clock is 11 s behind the leader's.
    assert backend.store.redrive("o", sent.run_at_ms, 0, contract.T0 + LEADER_AT - 11_000)
    return backend.store.get_run("o", sent.run_at_ms)


def _write_hand_back(backend: Backend, sent: Run) -> RunRecord:
    # Handed back by a worker whose clock is 11 s behind the leader's, its
    # delivery rejected for its fence (the embedded store needs no row for
    # it: a run handed on under an older fence is owed to the newer).
    handed = backend.store.hand_back(record(sent, 1), contract.T0 + LEADER_AT - 11_000)
    assert handed or backend.name == "sqlite"
    return backend.store.get_run("o", sent.run_at_ms)


WRITES: dict[str, tuple[Callable[[Backend, Run], RunRecord], str]] = {
    "retry": (_write_retry, "retrying"),
    "park": (_write_park, "parked"),
    "redrive": (_write_redrive, "retrying"),
    "hand_back": (_write_hand_back, "dispatched"),
}


def _prepared(backend: Backend, how: str) -> tuple[Run, int]:
    """The run, as each write needs it: started (a retry), admitted and not
    started (a park), a dead letter (a redrive), or handed on under a fence
    a new leader has since raised (a hand-back); and the fence of the
    leader that reads it."""
    sent = _delivered(backend, started=how in ("retry", "redrive"))
    if how == "redrive":
        backend.store.run_failed(record(sent, 1), _failure(contract.T0 + 200, dead=True), None)
    if how != "hand_back":
        return sent, 1
    for p in range(4):
        backend.store.raise_fence(p, 2)
    return sent, 2


@pytest.mark.parametrize("how", list(WRITES))
def test_a_row_owed_again_landing_behind_the_watermark_is_still_read(backend: Backend, how: str) -> None:
    # Reproduced on the cluster: run_failed refused for a minute (a
    # Cassandra brownout), then written due at the failure's end, behind the
    # watermark: the run stayed retrying for ever.
    write, state = WRITES[how]
    sent, fence = _prepared(backend, how)
    _leader_moves_on(backend, fence)
    shown = write(backend, sent)
    run = _owed(backend, sent.run_id, fence)
    assert (run.run_at_ms, run.attempt_group) == (sent.run_at_ms, 0)
    assert shown.state == state
    if how != "hand_back":  # which leaves the run's due time as it was
        # The history says when the run is owed: when a leader hands it on.
        assert shown.due_ms == run.due_ms


def _watermark_moves_on_first_read(backend: Backend, fence: int, monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """The store's first read of its watermarks returns them as they were,
    and a leader whose read missed the row being written moves them on
    before the write lands. Returns what makes sure the leader moved on
    (for a store that reads no watermarks, after the write)."""
    store = backend.store
    read_watermarks = store.watermarks
    moved: list[bool] = []

    def watermarks_then_a_leader_moves_on() -> dict[int, int]:
        marks = read_watermarks()
        monkeypatch.setattr(store, "watermarks", read_watermarks)
        _leader_moves_on(backend, fence)
        moved.append(True)
        return marks

    monkeypatch.setattr(store, "watermarks", watermarks_then_a_leader_moves_on)

    def after_the_write() -> None:
        if not moved:
            monkeypatch.setattr(store, "watermarks", read_watermarks)
            _leader_moves_on(backend, fence)

    return after_the_write


@pytest.mark.parametrize("how", list(WRITES))
def test_a_row_owed_again_the_watermark_passes_while_it_is_written_is_still_read(
    backend: Backend, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Due ahead of the watermark read before the write, and placed there; a
    # leader whose read missed the row moves the watermark past it before
    # the write lands.
    write, _ = WRITES[how]
    sent, fence = _prepared(backend, how)
    after_the_write = _watermark_moves_on_first_read(backend, fence, monkeypatch)
    shown = write(backend, sent)
    after_the_write()
    run = _owed(backend, sent.run_id, fence)
    if how != "hand_back":
        assert backend.store.get_run("o", sent.run_at_ms).due_ms == run.due_ms
    assert shown.run_id == run.run_id


def test_a_trigger_from_a_clock_behind_the_leaders_is_still_read(backend: Backend) -> None:
    # A client clock 11 s behind the leader's: its trigger's row, due a
    # moment after the client's now, lands behind the watermark.
    t0 = contract.T0
    store = backend.store
    store.add_job(once_job("o", t0 + 100), 0, 0, PlannedRun(t0 + 100, t0 + 100), t0)
    _leader_moves_on(backend, 1)
    triggered = store.trigger("o", t0 + LEADER_AT - 11_000)
    run = _owed(backend, triggered.run_id, 1)
    assert (run.run_at_ms, run.attempt_group) == (t0 + LEADER_AT - 11_000, triggered.attempt_group)
    assert store.get_run("o", run.run_at_ms, run.attempt_group).due_ms == run.due_ms


def test_a_trigger_the_watermark_passes_while_it_is_written_is_still_read(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    t0 = contract.T0
    store = backend.store
    store.add_job(once_job("o", t0 + 100), 0, 0, PlannedRun(t0 + 100, t0 + 100), t0)
    after_the_write = _watermark_moves_on_first_read(backend, 1, monkeypatch)
    triggered = store.trigger("o", t0 + LEADER_AT - 11_000)
    after_the_write()
    run = _owed(backend, triggered.run_id, 1)
    assert store.get_run("o", run.run_at_ms, run.attempt_group).due_ms == run.due_ms
