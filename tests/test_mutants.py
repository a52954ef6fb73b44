"""The simulator's mutation proof (pysched/sim/mutants.py): each known bug,
put into the real code in a process of its own, is caught by the world the
table names; the code it changes still holds its original text once; and
a world run with nothing changed holds, so that a catch means the change."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from pysched.sim.mutants import MUTANTS, NOT_YET_CAUGHT, Mutant, run_in_child, unchanged

# A world and its mutant's process: a few seconds, far less than this.
_CHILD_TIMEOUT_S = 600


def _source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    return Path(spec.origin).read_text(encoding="utf-8")


@pytest.mark.parametrize("mutant", [*MUTANTS, *NOT_YET_CAUGHT], ids=lambda m: m.name)
def test_each_mutant_still_changes_its_module(mutant: Mutant) -> None:
    mutated = mutant.apply(_source(mutant.module))
    assert mutated != _source(mutant.module)


def test_the_mutants_have_distinct_names_and_each_a_world_that_caught_it() -> None:
    assert len({m.name for m in MUTANTS}) == len(MUTANTS) >= 10
    assert all(m.caught_by for m in MUTANTS), [m.name for m in MUTANTS if not m.caught_by]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_each_mutant_is_caught_by_the_world_that_caught_it(mutant: Mutant) -> None:
    result = run_in_child(mutant, mutant.caught_by, _CHILD_TIMEOUT_S)
    assert result.caught, f"{mutant.name} ({mutant.why}) no longer caught by {mutant.caught_by}"


def test_a_change_that_changes_nothing_is_not_caught() -> None:
    # The first mutant's worlds, its text put back as it was: the same
    # worlds hold, so each catch above is the mutant's doing.
    first = MUTANTS[0]
    result = run_in_child(unchanged(first), first.caught_by, _CHILD_TIMEOUT_S)
    assert not result.caught and result.worlds_run == len(first.caught_by)
