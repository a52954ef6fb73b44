"""A time zone as UTC offsets between transitions, in whole seconds.

zoneinfo answers "what is the offset at this instant" but not "when does it
next change", which the DST rule in pysched.cron needs. The transitions of
each UTC year are found once by probing the offset every few hours and
bisecting each change to the second, then kept: evaluation afterwards is a
bisect in a list, with no datetime arithmetic.

Assumption, true of every zone in the tz database since 1900: two offset
changes are never less than ``PROBE_S`` apart while returning to the same
offset (a probe could not see such a pair).
"""

from __future__ import annotations

from bisect import bisect_right
from datetime import UTC, date, datetime
from importlib import resources
from zoneinfo import ZoneInfo

PROBE_S = 6 * 3600
FIXED_ZONES = frozenset({"UTC", "UCT", "GMT", "GMT0", "GMT+0", "GMT-0", "Greenwich", "Universal", "Zulu"})
DAY_S = 86_400
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
# Years whose instants datetime can express with any offset.
MIN_YEAR, MAX_YEAR = 2, 9998


def year_of(t: int) -> int:
    return date.fromordinal(_EPOCH_ORDINAL + t // DAY_S).year


def _year_start(year: int) -> int:
    return (date(year, 1, 1).toordinal() - _EPOCH_ORDINAL) * DAY_S


def load(name: str) -> ZoneInfo:
    """The zone from the tzdata package pysched depends on, never from the
    machine's own zoneinfo (which ``ZoneInfo(name)`` reads first): nodes
    with different system tz data would fire the same job at different
    instants."""
    path = resources.files("tzdata").joinpath("zoneinfo", *name.split("/"))
    with path.open("rb") as data:
        return ZoneInfo.from_file(data, key=name)


class ZoneTable:
    """Offsets of one zone; ``name`` must be a zone zoneinfo knows."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.zone = load(name)
        # UTC and the Etc/ zones never change offset: no year needs probing.
        self._fixed = name in FIXED_ZONES or name.startswith("Etc/")
        # year -> (offset just before the year, transition instants, offset from each on)
        self._years: dict[int, tuple[int, list[int], list[int]]] = {}

    def _offset_probe(self, t: int) -> int:
        off = datetime.fromtimestamp(t, UTC).astimezone(self.zone).utcoffset()
        assert off is not None
        return int(off.total_seconds())

    def _year(self, year: int) -> tuple[int, list[int], list[int]]:
        got = self._years.get(year)
        if got is None:
            got = self._years[year] = self._scan(year)
        return got

    def _scan(self, year: int) -> tuple[int, list[int], list[int]]:
        """(offset just before the year, its changes, the offset from each).
        Probing starts a second before the year so that a change at its very
        first instant is one of its changes."""
        start, end = _year_start(year), _year_start(year + 1)
        first = prev = self._offset_probe(start - 1)
        times: list[int] = []
        offsets: list[int] = []
        if self._fixed:
            return first, times, offsets
        t = start - 1
        while t < end - 1:
            nxt = min(t + PROBE_S, end - 1)
            off = self._offset_probe(nxt)
            if off != prev:
                lo, hi = t, nxt  # offset(lo) == prev, offset(hi) == off
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if self._offset_probe(mid) == prev:
                        lo = mid
                    else:
                        hi = mid
                times.append(hi)
                offsets.append(off)
                prev = off
            t = nxt
        return first, times, offsets

    def offset_at(self, t: int) -> int:
        first, times, offsets = self._year(year_of(t))
        i = bisect_right(times, t)
        return offsets[i - 1] if i else first

    def last_change(self, t: int, within_s: int) -> tuple[int, int] | None:
        """The last transition at or before ``t``, no more than ``within_s``
        earlier, as (instant, offset before it)."""
        year = year_of(t)
        while True:
            first, times, offsets = self._year(year)
            i = bisect_right(times, t)
            if i:
                at = times[i - 1]
                if at < t - within_s:
                    return None
                return at, offsets[i - 2] if i > 1 else first
            if _year_start(year) < t - within_s:
                return None
            year -= 1

    def next_change(self, t: int, until: int) -> int | None:
        """The first transition after ``t`` and at or before ``until``."""
        year = year_of(t)
        last_year = min(year_of(until), MAX_YEAR)
        while year <= last_year:
            _, times, _ = self._year(year)
            i = bisect_right(times, t)
            if i < len(times):
                return times[i] if times[i] <= until else None
            year += 1
        return None
