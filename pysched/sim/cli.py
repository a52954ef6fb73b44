"""``pysched-sim``: run simulated worlds and say whether any lost or doubled
a run. Exit 0 when every world held, 1 on a violation, 2 on bad input."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Annotated

import typer

from pysched.config import DEFAULT_CATCH_UP_RATE, MAX_CATCH_UP_RATE
from pysched.sim.faults import KINDS, Outage
from pysched.sim.mutants import MUTANTS, NOT_YET_CAUGHT, SEARCH_SEEDS, search, table
from pysched.sim.runner import SimConfig, SimReport, simulate
from pysched.sim.servers import STORE_KINDS, StoreKind

app = typer.Typer(add_completion=False, help=__doc__)


def _faults(text: str) -> frozenset[str]:
    if text == "all":
        return frozenset(KINDS)
    if text == "none":
        return frozenset()
    kinds = frozenset(k.strip() for k in text.split(",") if k.strip())
    unknown = sorted(kinds - set(KINDS))
    if unknown:
        raise typer.BadParameter(f"unknown fault {', '.join(unknown)}; known: {', '.join(KINDS)}, all, none")
    return kinds


def _outage(text: str | None) -> Outage | None:
    """AT+FOR, in seconds from the world's start."""
    if text is None:
        return None
    at, plus, duration = text.partition("+")
    try:
        outage = Outage(float(at), float(duration)) if plus else None
    except ValueError:
        outage = None
    if outage is None or outage.at_s < 0 or outage.for_s <= 0:
        raise typer.BadParameter(f"{text!r} is not AT+FOR in seconds, e.g. 600+7200")
    return outage


def _store(text: str) -> StoreKind:
    for kind in STORE_KINDS:
        if text == kind:
            return kind
    raise typer.BadParameter(f"unknown store {text!r}; known: {', '.join(STORE_KINDS)}")


@app.command()
def run(
    seed: Annotated[int, typer.Option(help="The world's seed: the same seed replays the same world.")] = 1,
    seeds: Annotated[int, typer.Option(min=1, help="How many worlds, seeds SEED, SEED+1, ...")] = 1,
    jobs: Annotated[int, typer.Option(min=1, max=1_000_000, help="Jobs registered at the start.")] = 1_000,
    hours: Annotated[float, typer.Option(min=0.05, max=168, help="Simulated hours per world.")] = 1.0,
    faults: Annotated[str, typer.Option(help=f"Comma list of {', '.join(KINDS)}; or all, none.")] = "all",
    fault_count: Annotated[int, typer.Option(min=0, max=10_000, help="Faults drawn per world.")] = 12,
    nodes: Annotated[int, typer.Option(min=1, max=16, help="Nodes, each a leader and a worker.")] = 3,
    partitions: Annotated[int, typer.Option(min=1, max=4096, help="Schedule partitions.")] = 16,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per world.")] = False,
    flaky: Annotated[
        float,
        typer.Option(
            min=0, max=1, help="Fraction of jobs whose every run fails its first one or two attempts (retried)."
        ),
    ] = 0.0,
    catch_up: Annotated[
        bool, typer.Option("--catch-up", help="Each job follows a catch-up policy drawn from all four.")
    ] = False,
    catch_up_rate: Annotated[
        int, typer.Option(min=1, max=MAX_CATCH_UP_RATE, help="The leaders' catch-up lane, runs a second.")
    ] = DEFAULT_CATCH_UP_RATE,
    cluster_outage: Annotated[
        str | None, typer.Option(help="Every node down at AT s for FOR s, as AT+FOR (e.g. 600+7200).")
    ] = None,
    downstream_outage: Annotated[
        str | None,
        typer.Option(help="The downstream fails every call at AT s for FOR s, as AT+FOR; production breaker."),
    ] = None,
    recording_outage: Annotated[
        str | None,
        typer.Option(help="The leaders cannot record what they send at AT s for FOR s, as AT+FOR."),
    ] = None,
    history_outage: Annotated[
        str | None,
        typer.Option(help="The workers cannot record how their runs ended at AT s for FOR s, as AT+FOR."),
    ] = None,
    target_time: Annotated[
        bool,
        typer.Option(
            "--target-time",
            help="Targets take time (most seconds, some past the lease, a few minutes); workers take batches.",
        ),
    ] = False,
    changes: Annotated[
        bool,
        typer.Option(
            "--changes",
            help="The workload changes jobs as they run (cancel, reschedule, pause, trigger, redrive, prune);"
            " each job follows an overlap policy drawn from all four.",
        ),
    ] = False,
    store: Annotated[
        str,
        typer.Option(
            help="The store the nodes run: model (the hand-written model of the cluster store) or tables"
            " (the cluster's own store and claims over in-memory Cassandra tables, Redis and etcd)."
        ),
    ] = "model",
    verbose: Annotated[bool, typer.Option(help="The nodes' log lines on stderr.")] = False,
    mutants: Annotated[
        bool,
        typer.Option(
            "--mutants",
            help="Instead: put each known bug into the code in turn (mutants.py) and search its world kinds,"
            " --seeds seeds each (12 if 1), for a world that catches it; print the table. Exit 1 if one is not.",
        ),
    ] = False,
) -> None:
    """Simulate; print each world's counts and its first violation, with the
    line that replays it."""
    if mutants:
        _hunt_mutants(SEARCH_SEEDS if seeds == 1 else seeds)
        return
    kinds = _faults(faults)
    blackout, down, recording = _outage(cluster_outage), _outage(downstream_outage), _outage(recording_outage)
    history = _outage(history_outage)
    store_kind = _store(store)
    if store_kind == "tables" and changes:
        raise typer.BadParameter("--changes runs on --store model only, for now")
    if not verbose:
        logging.getLogger("pysched").setLevel(logging.CRITICAL)
    failed = 0
    for n in range(seed, seed + seeds):
        config = SimConfig(
            n,
            jobs=jobs,
            hours=hours,
            faults=kinds,
            nodes=nodes,
            partitions=partitions,
            fault_count=fault_count,
            flaky=flaky,
            catch_up=catch_up,
            catch_up_rate=catch_up_rate,
            cluster_outage=blackout,
            downstream_outage=down,
            recording_outage=recording,
            history_outage=history,
            target_time=target_time,
            changes=changes,
            store=store_kind,
        )
        started = time.monotonic()
        report = simulate(config)
        _print(report, time.monotonic() - started, as_json)
        failed += not report.ok
    if failed:
        raise typer.Exit(1)


def _hunt_mutants(seeds: int) -> None:
    """Search each mutant's worlds; the table on stdout, progress on stderr.
    Exit 1 when a mutant once caught is caught no more."""
    results = []
    for mutant in (*MUTANTS, *NOT_YET_CAUGHT):
        started = time.monotonic()
        found = search(mutant, seeds, timeout_s=3_600)
        result = found.result
        verdict = f"caught by {result.kind} seed {result.seed}" if result.caught else "not caught"
        seconds = time.monotonic() - started
        typer.echo(f"{mutant.name}: {verdict} ({result.worlds_run} worlds, {seconds:.0f} s)", err=True)
        for kind, seed in found.failing_unchanged:
            typer.echo(f"  passed over {kind} seed {seed}: it breaks an invariant unchanged", err=True)
        results.append(result)
    typer.echo(table(results))
    if not all(r.caught for r in results[: len(MUTANTS)]):
        raise typer.Exit(1)


def _print(report: SimReport, seconds: float, as_json: bool) -> None:
    first = report.violations[0] if report.violations else None
    if as_json:
        out = {
            "seed": report.config.seed,
            "ok": report.ok,
            "owed": report.owed,
            "executed": report.executed,
            "missed": report.missed,
            "dead_letters": report.dead_letters,
            "faults": report.faults,
            "failed_calls": report.failed_calls,
            "violations": len(report.violations),
            "first_violation": None if first is None else {"kind": first.kind, "detail": first.detail},
            "digest": report.digest,
            "replay": report.config.replay_line(),
            "seconds": round(seconds, 2),
        }
        typer.echo(json.dumps(out))
        return
    verdict = "ok" if first is None else f"{len(report.violations)} violations; first: {first.kind}: {first.detail}"
    typer.echo(
        f"seed {report.config.seed}: {report.owed} runs owed, {report.executed} executed, {report.missed} missed,"
        f" {report.dead_letters} dead letters, {report.faults} faults,"
        f" {report.failed_calls} failed calls, {seconds:.1f} s: {verdict}"
    )
    if first is not None:
        typer.echo(f"  replay: {report.config.replay_line()}")


def main() -> None:
    # String hashing decides the order of some sets: fixed, so that a seed
    # replays the same world in any process.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "pysched.sim", *sys.argv[1:]])
    app()
