"""The simulator's proof of itself: plausible bugs put into the real code,
one at a time, each of which some world must catch.

A mutant is a textual change to one module's source (two statements
swapped, a condition dropped, a rule weakened), applied as the module is
imported, in a process of its own, so that no other mutant and no cached
bytecode sees it. The original text must occur exactly once: a change to
the code that moves it away fails loudly (``StaleMutant``) instead of
leaving a mutant that mutates nothing.

Each mutant names the worlds it was caught in (``caught_by``: CI replays
them, tests/test_mutants.py) and the worlds to search when that is to be
found again (``pysched-sim --mutants``)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import CodeType, ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pysched.sim.runner import SimReport

# How many seeds of each world kind a search tries before calling a mutant
# uncaught.
SEARCH_SEEDS = 12


class StaleMutant(RuntimeError):
    """A mutant's original text is not in its module exactly once."""


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str  # dotted name of the module changed
    original: str  # the text replaced; exactly once in the module
    mutated: str
    why: str  # the bug it stands for
    # The world kinds (worlds.WORLD_KINDS) searched, and the worlds it was
    # caught in, as (kind, seed).
    kinds: tuple[str, ...]
    caught_by: tuple[tuple[str, int], ...] = ()

    def apply(self, source: str) -> str:
        found = source.count(self.original)
        if found != 1:
            raise StaleMutant(f"mutant {self.name}: its original text occurs {found} times in {self.module}")
        return source.replace(self.original, self.mutated)


@dataclass(frozen=True)
class MutantResult:
    name: str
    caught: bool
    # The first world that broke an invariant, as kind and seed, with the
    # kinds of violation it found.
    kind: str | None
    seed: int | None
    violations: tuple[str, ...]
    worlds_run: int

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "watermark-ahead-of-read",
        "pysched.leader.cache",
        "min(now, self._read_at[p]) - SETTLE_MS for p in fences if p in self._read_at",
        "now - SETTLE_MS for p in fences",
        "a new leader moves a partition's watermark before it has read the partition",
        ("wide",),
        (("wide", 32),),
    ),
    Mutant(
        "leading-on-an-expired-answer",
        "pysched.leader.leases",
        "if not owned or now < granted_at + self.coordinator.answer_valid_ms:",
        "if True:",
        "a leader keeps leading on the coordinator's last answer past its validity",
        ("paused", "short"),
        (("paused", 2),),
    ),
    Mutant(
        "marks-not-held-below-planned-runs",
        "pysched.leader.recording",
        "            marks = held_below(marks, first)",
        "            marks = dict(marks)",
        "a batch's watermark is written past runs planned after it was sent",
        ("recording-outage",),
        (("recording-outage", 9),),
    ),
    Mutant(
        "retried-recording-forgets-what-it-stored",
        "pysched.leader.recording",
        "planned.stored_before.extend(planned_before(sliced_rows, jobs))",
        "planned.stored_before.extend([])",
        "a recording retried after a lost answer plans again what it stored",
        ("recording-outage",),
        (("recording-outage", 46),),
    ),
    Mutant(
        "owed-again-row-not-placed-ahead",
        "pysched.protocols",
        "    if mark is None or due_ms > mark:\n        return due_ms\n    return mark + AHEAD_OF_WATERMARK_MS",
        "    return due_ms",
        "a retry, parking or hand-back row written late lands behind the watermark",
        ("history-outage",),
        (("history-outage", 2),),
    ),
    Mutant(
        "redelivery-not-a-new-delivery",
        "pysched.protocols",
        "        return handed_attempt\n    return handed_attempt + 1",
        "        return handed_attempt\n    return handed_attempt",
        "a new leader hands a predecessor's run on as the same delivery",
        ("short", "flaky", "wide"),
        (("flaky", 1),),
    ),
    Mutant(
        "claim-taken-without-its-transaction",
        "pysched.claims.redis_cassandra",
        " delivery) VALUES (?, ?, 'running', ?, ?, ?, ?, ?) IF NOT EXISTS\"",
        " delivery) VALUES (?, ?, 'running', ?, ?, ?, ?, ?)\"",
        "a run's authoritative claim is a plain write: two workers may both take it",
        ("tables", "tables-flaky"),
        (("tables", 1),),
    ),
    Mutant(
        "deadline-catch-up-runs-past-its-deadline",
        "pysched.catchup",
        '        return "past_deadline"\n    return None',
        "        return None\n    return None",
        "a deadline job's run handed on past its max delay runs instead of being missed",
        ("catch-up", "cluster-outage"),
        (("cluster-outage", 1),),
    ),
    Mutant(
        "mark-held-at-a-planned-run-not-below-it",
        "pysched.leader.recording",
        "            held[partition] = due - 1",
        "            held[partition] = due",
        "a watermark held for a run planned late is held at its due time, which hides it",
        ("recording-outage", "cluster-outage"),
        (("cluster-outage", 1),),
    ),
    Mutant(
        "own-fence-taken-for-a-newer-one",
        "pysched.protocols",
        "stale = {p for p, fence in fences.items() if floors.get(p, 0) > fence}",
        "stale = {p for p, fence in fences.items() if floors.get(p, 0) >= fence}",
        "a leader takes its own fence for a successor's and records nothing it sends",
        ("short",),
        (("short", 1),),
    ),
    Mutant(
        "attempt-reused-after-a-failure",
        "pysched.protocols",
        "    if ended_attempt >= attempt:\n        return ended_attempt + 1",
        "    if ended_attempt >= attempt:\n        return ended_attempt",
        "a retry starts as the attempt that failed, overwriting its failure",
        ("flaky",),
        (("flaky", 1),),
    ),
    Mutant(
        "fence-check-dropped",
        "pysched.protocols",
        "stale = {p for p, fence in fences.items() if floors.get(p, 0) > fence}",
        "stale: set[int] = set()",
        "a superseded leader's recording is written over its successor's",
        # Seen at the tables (fence_tables.py): on the model, the stale
        # writes land and nothing the judge reads shows them.
        ("tables-recording-outage", "recording-outage"),
        (("tables-recording-outage", 4),),
    ),
)

# Plausible bugs no world catches yet: each still wants the fault or the
# invariant that would (the README's simulator section says which). Searched
# as the others are (``pysched-sim --mutants``), not replayed by CI.
NOT_YET_CAUGHT: tuple[Mutant, ...] = (
    Mutant(
        "claim-taken-over-from-a-changed-holder",
        "pysched.claims.redis_cassandra",
        'WHERE idem_key = ? IF state = ? AND holder = ? AND lease_expires_ms = ?"',
        'WHERE idem_key = ? IF state = ? AND holder = ? AND lease_expires_ms >= ?"',
        "a take-over of a claim whose lease was renewed since it was read still applies",
        ("tables", "tables-flaky"),
    ),
    Mutant(
        "fence-raised-backwards",
        "pysched.stores.cassandra",
        'SET fence = ? WHERE partition = ? IF fence < ?")',
        'SET fence = ? WHERE partition = ? IF fence != ?")',
        "a partition's stored fence may go back to a superseded leader's",
        ("tables", "tables-flaky"),
    ),
    Mutant(
        "cluster-owed-again-row-not-placed-ahead",
        "pysched.stores.cassandra",
        "            placed = placed_ahead(due_ms, self.watermarks().get(record.partition))\n"
        "            if placed == due_ms:",
        "            placed = due_ms\n            if placed == due_ms:",
        "the cluster store does not look again at a row owed again after writing it",
        ("tables-history-outage",),
    ),
    Mutant(
        "overlap-slot-taken-while-held",
        "pysched.overlap",
        "if slot is None or slot.key == key or not live(slot, now_ms):",
        "if slot is None or slot.key == key or True:",
        "a run takes its job's running slot while another run holds it (forbid, buffer_one, replace)",
        ("changes",),
    ),
    Mutant(
        "own-send-read-as-a-new-delivery",
        "pysched.protocols",
        "    if handed_fence is not None and handed_fence >= fence:",
        "    if handed_fence is not None and handed_fence > fence:",
        "a leader reading back a run it sent itself hands it on again as the next delivery",
        ("short", "wide", "flaky"),
    ),
    Mutant(
        "rejected-run-owed-though-started-elsewhere",
        "pysched.protocols",
        'return state == "running" and started_by is not None and started_by in (worker, ABANDONED)',
        'return state == "running"',
        "a run rejected for its fence is handed back though another worker started it",
        ("short", "wide"),
    ),
    Mutant(
        "read-run-due-at-its-earliest-row",
        "pysched.protocols",
        "if known is None or (-run.attempt, run.due_ms) < (-known.attempt, known.due_ms):",
        "if known is None or run.due_ms < known.due_ms:",
        "a run with a hand-back row left behind is due at that row, before its retry's backoff",
        ("flaky", "timed"),
    ),
    Mutant(
        "failure-not-kept-on-the-claim",
        "pysched.worker.executor",
        "result = ClaimedFailure(failure, retry_due_ms, record.attempt, record.due_ms).to_json()",
        "result = None",
        "a failed claim keeps no failure: a death before the history write loses it",
        ("wide", "flaky"),
    ),
)


def named(name: str) -> Mutant:
    for mutant in (*MUTANTS, *NOT_YET_CAUGHT):
        if mutant.name == name:
            return mutant
    raise KeyError(f"no mutant named {name!r}; known: {', '.join(m.name for m in (*MUTANTS, *NOT_YET_CAUGHT))}")


class _MutatedLoader(importlib.machinery.SourceFileLoader):
    """Loads its module from source with the mutant applied, never from
    cached bytecode."""

    def __init__(self, fullname: str, path: str, mutant: Mutant) -> None:
        super().__init__(fullname, path)
        self.mutant = mutant

    def get_code(self, fullname: str) -> CodeType:
        source = Path(self.path).read_text(encoding="utf-8")
        return compile(self.mutant.apply(source), self.path, "exec", dont_inherit=True)


class _MutatingFinder(importlib.abc.MetaPathFinder):
    def __init__(self, mutant: Mutant) -> None:
        self.mutant = mutant

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.mutant.module:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None:
            raise StaleMutant(f"mutant {self.mutant.name}: no source for {fullname}")
        spec.loader = _MutatedLoader(fullname, spec.origin, self.mutant)
        return spec


def install(mutant: Mutant) -> None:
    """Make the next import of the mutant's module load it mutated: to be
    called in a fresh process, before the module is imported."""
    if mutant.module in sys.modules:
        raise RuntimeError(f"{mutant.module} is imported already: a mutant needs a process of its own")
    sys.meta_path.insert(0, _MutatingFinder(mutant))
    importlib.import_module(mutant.module)


def hunt(mutant: Mutant, worlds: Sequence[tuple[str, int]]) -> MutantResult:
    """Run ``worlds`` (kind, seed) in this process, with ``mutant`` applied
    (install first), until one breaks an invariant."""
    # Imported here, not with this module: the simulator imports the code
    # the mutant changes, which install must see imported first.
    from pysched.sim.worlds import simulate_world

    for i, (kind, seed) in enumerate(worlds, start=1):
        report: SimReport = simulate_world(kind, seed)
        if not report.ok:
            kinds = tuple(sorted({v.kind for v in report.violations}))
            return MutantResult(mutant.name, True, kind, seed, kinds, i)
    return MutantResult(mutant.name, False, None, None, (), len(worlds))


def search_worlds(mutant: Mutant, seeds: int = SEARCH_SEEDS) -> list[tuple[str, int]]:
    """The worlds a search tries: each of the mutant's kinds, seed by seed."""
    return [(kind, seed) for seed in range(1, seeds + 1) for kind in mutant.kinds]


def run_in_child(mutant: Mutant, worlds: Sequence[tuple[str, int]], timeout_s: float) -> MutantResult:
    """``hunt`` in a fresh interpreter, so the mutant touches nothing else."""
    spec = json.dumps({"mutant": asdict(mutant), "worlds": list(worlds)})
    # The hash seed the simulator's own command runs under (cli.main): a
    # world found here replays there.
    done = subprocess.run(
        [sys.executable, "-m", "pysched.sim.mutants", spec],
        env={**os.environ, "PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"mutant {mutant.name}: its process failed:\n{done.stderr[-2000:]}")
    fields = json.loads(done.stdout.strip().splitlines()[-1])
    fields["violations"] = tuple(fields["violations"])
    return MutantResult(**fields)


def unchanged(mutant: Mutant) -> Mutant:
    """The mutant's module as it is: its worlds' control."""
    return Mutant(
        f"{mutant.name} (unchanged)", mutant.module, mutant.original, mutant.original, "nothing", mutant.kinds
    )


@dataclass(frozen=True)
class Search:
    result: MutantResult
    # Worlds that broke an invariant with the code unchanged: bugs of their
    # own, passed over.
    failing_unchanged: tuple[tuple[str, int], ...]


def search(mutant: Mutant, seeds: int, timeout_s: float) -> Search:
    """The first of the mutant's search worlds that catches it and holds
    with the code unchanged."""
    worlds = search_worlds(mutant, seeds)
    passed_over: list[tuple[str, int]] = []
    run = 0
    while True:
        result = run_in_child(mutant, worlds, timeout_s)
        run += result.worlds_run
        if not result.caught or result.kind is None or result.seed is None:
            return Search(replace(result, worlds_run=run), tuple(passed_over))
        found = (result.kind, result.seed)
        if not run_in_child(unchanged(mutant), [found], timeout_s).caught:
            return Search(replace(result, worlds_run=run), tuple(passed_over))
        passed_over.append(found)
        worlds = worlds[result.worlds_run :]


def table(results: Sequence[MutantResult]) -> str:
    """The results as the README's markdown table."""
    lines = ["| mutant | the bug it stands for | caught by | violations | worlds run |", "|---|---|---|---|---:|"]
    for result in results:
        mutant = named(result.name)
        caught = f"`{result.kind}` seed {result.seed}" if result.caught else "**not caught**"
        lines.append(
            f"| `{mutant.name}` | {mutant.why} | {caught} | {', '.join(result.violations)} | {result.worlds_run} |"
        )
    return "\n".join(lines)


def _child(spec: str) -> None:
    # Thousands of injected failures, each logged by the nodes.
    logging.getLogger("pysched").setLevel(logging.CRITICAL)
    asked = json.loads(spec)
    fields = asked["mutant"]
    fields["kinds"] = tuple(fields["kinds"])
    fields["caught_by"] = tuple((str(kind), int(seed)) for kind, seed in fields["caught_by"])
    mutant = Mutant(**fields)
    install(mutant)
    worlds = [(str(kind), int(seed)) for kind, seed in asked["worlds"]]
    sys.stdout.write(hunt(mutant, worlds).to_json() + "\n")


__all__ = ["MUTANTS", "Mutant", "MutantResult", "StaleMutant", "hunt", "install", "run_in_child"]

if __name__ == "__main__":
    _child(sys.argv[1])
