"""The commit point of a partition whose records finish in any order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pysched.dispatch.offsets import OffsetTracker


def test_a_long_record_holds_the_commit_and_the_records_behind_it_go_on() -> None:
    tracker = OffsetTracker()
    for offset in range(10, 15):
        tracker.taken(0, offset)
    # 11..14 finish while 10 (a six-hour run) goes on: nothing past 10 commits.
    assert [tracker.done(0, o) for o in (11, 12, 13, 14)] == [None, None, None, None]
    assert tracker.done(0, 10) == 15  # all done: read on from 15
    assert tracker.in_flight() == 0


def test_partitions_are_apart_and_a_forgotten_one_commits_nothing() -> None:
    tracker = OffsetTracker()
    tracker.taken(0, 5)
    tracker.taken(1, 7)
    assert tracker.done(1, 7) == 8
    tracker.forget([0])
    assert tracker.done(0, 5) is None


@given(st.permutations(list(range(12))))
def test_the_commit_never_passes_an_unfinished_record(order: list[int]) -> None:
    tracker = OffsetTracker()
    for offset in range(12):
        tracker.taken(3, offset)
    finished: set[int] = set()
    last = 0
    for offset in order:
        finished.add(offset)
        commit = tracker.done(3, offset)
        if commit is not None:
            assert commit > last
            assert set(range(commit)) <= finished  # everything below it is done
            assert commit == 12 or commit not in finished
            last = commit
    assert last == 12
