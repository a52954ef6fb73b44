"""`pysched-loadgen spike|sustain`: load a scheduler and report what it did.

    pysched-loadgen spike --n 50000 --shape instant --embedded --json out.json --plot out.png
    pysched-loadgen spike --n 50000 --config .services/cluster.toml --at 2026-12-02T16:00:00Z
    pysched-loadgen sustain --rate 1200 --duration 600 --config .services/cluster.toml

Fire lag = when the run was handed to the dispatch channel (cluster: the
broker's LogAppendTime of its record; embedded: when the in-process queue
took it) minus its target (the jittered target where jitter applies).
Executions are counted from a ledger the job itself appends to.
"""

from __future__ import annotations

import json
import math
import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from pysched.config import ConfigError
from pysched.config import load as load_config
from pysched.protocols import PartitionsMismatch
from pysched_loadgen.measure import plot
from pysched_loadgen.registration import LoadPlan, RegisteredLate, now_ms, registration_lead_s
from pysched_loadgen.runner import run_cluster, run_embedded
from pysched_loadgen.shapes import MINUTE_MS, SHAPES, SUSTAIN_SHAPES, Load, spike_jobs, sustain_jobs, sustain_recurring

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__.split("\n\n")[0])

ConfigOpt = Annotated[str | None, typer.Option("--config", help="Cluster TOML: load a running cluster.")]
EmbeddedOpt = Annotated[bool, typer.Option("--embedded", help="Start an embedded scheduler in this process.")]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="Write the figures to this file.")]
PlotOpt = Annotated[Path | None, typer.Option("--plot", help="Draw the fire-lag CDF and histogram (PNG).")]
WorkersOpt = Annotated[int, typer.Option("--workers", min=1, help="Embedded worker threads.")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds to wait for the dispatches after the spike.")]
ExecOpt = Annotated[float, typer.Option("--exec-timeout", help="Seconds to wait for the executions after that.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", help="No progress bars.")]


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _in_ms(in_s: float | None) -> int | None:
    """--in as an instant: a finite number of seconds, from 0 to a day."""
    if in_s is None:
        return None
    if not math.isfinite(in_s) or not 0 <= in_s <= 86_400:
        _fail(f"--in: seconds from now, from 0 to 86400; got {in_s}")
    return now_ms() + round(in_s * 1000)


def _fixed_instant(at: str | None, in_s: float | None, minimum_s: float) -> int | None:
    """The instant the user chose, if any."""
    if at is not None and in_s is not None:
        _fail("give --at or --in, not both")
    if in_s is not None:
        return _in_ms(in_s)
    if at is not None:
        try:
            when = datetime.fromisoformat(at)
        except ValueError:
            _fail(f"--at: not an ISO 8601 time: {at!r}")
        instant = int(when.astimezone().timestamp() * 1000)
        if instant < now_ms() + minimum_s * 1000:
            _fail(f"--at: {at} leaves less than {minimum_s:.0f} s to register the runs")
        return instant
    return None


def _run(
    plan: LoadPlan,
    embedded: bool,
    config: str | None,
    workers: int,
    timeout: float,
    exec_timeout: float,
    quiet: bool,
    extra: dict[str, Any],
    json_path: Path | None,
    plot_path: Path | None,
    title: str,
) -> dict[str, Any]:
    if embedded == (config is not None):
        _fail("give exactly one of --embedded, --config")
    if config is not None:
        try:
            cfg = load_config(config)
        except ConfigError as exc:
            _fail(f"--config: {exc}")
    try:
        if config is not None:
            attempt = run_cluster(cfg, plan, timeout, exec_timeout, quiet)
        else:
            attempt = run_embedded(plan, workers, timeout, exec_timeout, quiet)
    except RegisteredLate as exc:
        _fail(str(exc))
    except PartitionsMismatch as exc:
        _fail(f"--config: {config}: {exc}")
    figures = attempt.figures({**extra, "mode": "embedded" if config is None else "cluster"})
    lags = figures.pop("_fire_lags")
    if plot_path is not None:
        plot(lags, plot_path, title)
    typer.echo(json.dumps(figures, indent=2))
    if json_path is not None:
        json_path.write_text(json.dumps(figures, indent=2))
    # Load runs judge correctness only: a missed or doubled run fails.
    if figures["missed"] or figures["duplicates"]:
        sys.exit(1)
    return figures


@app.command()
def spike(
    n: Annotated[int, typer.Option("--n", min=1, help="Runs due at the instant.")] = 50_000,
    at: Annotated[str | None, typer.Option("--at", help="The instant (ISO 8601); default the next minute.")] = None,
    in_s: Annotated[float | None, typer.Option("--in", help="The instant, seconds from now.")] = None,
    shape: Annotated[str, typer.Option("--shape", help=f"One of {', '.join(SHAPES)}.")] = "instant",
    window: Annotated[float, typer.Option("--window", help="Jitter window in seconds.")] = 60.0,
    embedded: EmbeddedOpt = False,
    config: ConfigOpt = None,
    workers: WorkersOpt = 4,
    timeout: TimeoutOpt = 120.0,
    exec_timeout: ExecOpt = 300.0,
    json_path: JsonOpt = None,
    plot_path: PlotOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """N runs due at one instant."""
    if shape not in SHAPES:
        _fail(f"--shape: {shape!r} is not one of {', '.join(SHAPES)}")
    fixed = _fixed_instant(at, in_s, registration_lead_s(n, embedded))

    def build(ledger: Path, prefix: str, instant: int) -> Load:
        return Load.one_shots(spike_jobs(n, instant, shape, window, ledger, prefix))

    # Unless the user chose it, the instant is a minute boundary, as a real
    # spike's is, far enough ahead to register first.
    _run(
        LoadPlan(n, build, fixed, 1 if fixed is not None else MINUTE_MS),
        embedded,
        config,
        workers,
        timeout,
        exec_timeout,
        quiet,
        {"shape": shape, "window_s": window if shape != "instant" else 0},
        json_path,
        plot_path,
        f"spike of {n:,} ({shape})",
    )


@app.command()
def sustain(
    rate: Annotated[float, typer.Option("--rate", min=0.1, help="Runs a second.")] = 1_200.0,
    duration: Annotated[float, typer.Option("--duration", min=1, help="Seconds.")] = 60.0,
    in_s: Annotated[float | None, typer.Option("--in", help="Start this many seconds from now.")] = None,
    shape: Annotated[
        str, typer.Option("--shape", help="once: a one-shot job per run; recurring: rate x 60 every-minute jobs.")
    ] = "once",
    embedded: EmbeddedOpt = False,
    config: ConfigOpt = None,
    workers: WorkersOpt = 4,
    timeout: TimeoutOpt = 60.0,
    exec_timeout: ExecOpt = 300.0,
    json_path: JsonOpt = None,
    plot_path: PlotOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """R runs a second for T seconds, end to end through execution."""
    if shape not in SUSTAIN_SHAPES:
        _fail(f"--shape: {shape!r} is not one of {', '.join(SUSTAIN_SHAPES)}")
    recurring = shape == "recurring"
    # Recurring: rate x 60 jobs to register; the window is whole minutes
    # from a minute boundary.
    n = round(rate * 60) if recurring else int(rate * duration)
    fixed = _in_ms(in_s)
    minutes = math.ceil(duration / 60)
    if recurring:
        duration = minutes * 60

    def build(ledger: Path, prefix: str, start: int) -> Load:
        if recurring:
            return sustain_recurring(rate, minutes, start, ledger, prefix)
        return Load.one_shots(sustain_jobs(rate, duration, start, ledger, prefix))

    _run(
        LoadPlan(n, build, fixed, MINUTE_MS if recurring else 1),
        embedded,
        config,
        workers,
        timeout,
        exec_timeout,
        quiet,
        {"rate": rate, "duration_s": duration, "shape": shape},
        json_path,
        plot_path,
        f"sustained {rate:g}/s for {duration:g} s",
    )


def main() -> None:
    app()
