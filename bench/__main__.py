"""`python -m bench micro [--json FILE] [--quick]`: native vs reference ratios;
`burst`, `peers`, `limit` and `cost`: see bench/README.md.

Runs bench/test_micro.py under pytest-benchmark, then prints, per group, the
median time of each implementation and baseline / implementation (reference
/ native; cronsim / pysched for cron); also the native wheel's memory for
100k near-term entries.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def wheel_memory(n: int = 100_000) -> int:
    from pysched import _native

    wheel = _native.TimingWheel(0)
    wheel.insert_batch(np.arange(n, dtype=np.int64), np.arange(1, n + 1, dtype=np.int64) * 600)
    return int(wheel.memory_bytes())


# Each group's implementation and the baseline it is measured against.
PAIRS = (("native", "reference"), ("pysched", "cronsim"))


def _dur(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.3f} ms"


def micro(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.json"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            str(HERE / "test_micro.py"),
            "-q",
            "-p",
            "no:cacheprovider",
            "--benchmark-only",
            "--benchmark-enable",
            f"--benchmark-json={raw}",
            "-o",
            "addopts=",
        ]
        if args.quick:
            cmd += ["--benchmark-min-rounds=1", "--benchmark-max-time=0.05", "--benchmark-warmup=off"]
        code = subprocess.call(cmd)
        if code != 0:
            return code
        data = json.loads(raw.read_text())
    groups: dict[str, dict[str, float]] = {}
    for b in data["benchmarks"]:
        impl = b["params"]["impl"]
        groups.setdefault(b["group"], {})[impl] = b["stats"]["median"]
    rows: list[dict[str, Any]] = []
    print(f"\n{'group':<44} {'impl':>9} {'median':>12} {'baseline':>9} {'median':>12} {'ratio':>8}")
    for group, t in sorted(groups.items()):
        fast, base = next((f, b) for f, b in PAIRS if f in t and b in t)
        ratio = t[base] / t[fast]
        rows.append({"group": group, f"{fast}_s": t[fast], f"{base}_s": t[base], "ratio": ratio})
        print(f"{group:<44} {fast:>9} {_dur(t[fast]):>12} {base:>9} {_dur(t[base]):>12} {ratio:>7.1f}x")
    mem = wheel_memory()
    print(f"\nnative wheel memory for 100,000 entries: {mem / 2**20:.2f} MiB")
    if args.json:
        Path(args.json).write_text(json.dumps({"groups": rows, "wheel_memory_100k_bytes": mem}, indent=2))
    return 0


def _emit(figures: dict[str, Any], path: str | None) -> None:
    text = json.dumps(figures, indent=2)
    print(text)
    if path:
        Path(path).write_text(text)


def _correct(figures: dict[str, Any]) -> int:
    """Benchmarks judge correctness only: a run missed, doubled, or handed
    on and never executed fails."""
    bad = [k for k in ("missed", "duplicates", "not_executed") if figures.get(k)]
    if bad:
        print(f"bench: {', '.join(f'{k}={figures[k]}' for k in bad)}", file=sys.stderr)
        return 1
    return 0


def burst_cmd(args: argparse.Namespace) -> int:
    from bench.burst import burst

    if args.metrics and args.config is not None:
        print("bench: --metrics is for the embedded node (a cluster's are its processes' own)", file=sys.stderr)
        return 2
    figures = burst(args.n, args.repeat, args.config, args.start_nodes, args.start_workers, args.metrics)
    _emit(figures, args.json)
    return _correct(figures)


def peers_cmd(args: argparse.Namespace) -> int:
    from bench.peers import peers

    figures = peers(args.n)
    _emit(figures, args.json)
    return _correct(figures["pysched"])


def limit_cmd(args: argparse.Namespace) -> int:
    from bench.limit import limit

    figures = limit(args.config, args.n, args.start_nodes, args.start_workers)
    _emit(figures, args.json)
    bare = figures["bare_producer"]
    if bare["acknowledged"] != bare["n"]:
        # A baseline that lost records is no baseline: the ratio means nothing.
        print(f"bench: the bare producer's records read back: {bare['acknowledged']} of {bare['n']}", file=sys.stderr)
        return 1
    return _correct(figures["pysched_cluster"])


def cost_cmd(args: argparse.Namespace) -> int:
    from bench.cost import ServersUnknown, cost

    if args.start_nodes < 1 or args.start_workers < 1:
        print("bench: cost: --start-nodes and --start-workers must each be 1 or more", file=sys.stderr)
        return 2
    if args.rate <= 0 or args.duration <= 0 or not 1 <= args.threads <= 256:
        print("bench: cost: --rate and --duration must be more than 0, --threads 1 to 256", file=sys.stderr)
        return 2
    try:
        figures = cost(
            args.config, args.rate, args.duration, args.start_nodes, args.start_workers, args.threads, Path(args.state)
        )
    except ServersUnknown as exc:
        print(f"bench: cost: --state: {exc}", file=sys.stderr)
        return 2
    _emit(figures, args.json)
    return _correct(figures)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("micro", help="native vs pure-Python reference, as ratios")
    p.add_argument("--json", help="write the figures to this file")
    p.add_argument("--quick", action="store_true", help="one short round each: CI's smoke form")
    p.set_defaults(func=micro)

    def cluster_args(q: argparse.ArgumentParser, required: bool) -> None:
        q.add_argument("--config", required=required, help="cluster TOML (default: embedded)")
        q.add_argument("--start-nodes", type=int, default=0, help="start this many `pysched up` nodes for the run")
        q.add_argument("--start-workers", type=int, default=0, help="and this many `pysched worker` processes")

    b = sub.add_parser("burst", help="an instant spike, repeated; medians")
    b.add_argument("--n", type=int, default=50_000)
    b.add_argument("--repeat", type=int, default=3)
    b.add_argument("--embedded", action="store_true", help="the default without --config")
    cluster_args(b, required=False)
    b.add_argument("--metrics", action="store_true", help="embedded: the node counts into its Prometheus metrics")
    b.add_argument("--json")
    b.set_defaults(func=burst_cmd)
    q = sub.add_parser("peers", help="APScheduler, a heapq thread and pysched, one burst each")
    q.add_argument("--n", type=int, default=50_000)
    q.add_argument("--json")
    q.set_defaults(func=peers_cmd)
    lim = sub.add_parser("limit", help="pysched's cluster fire path against a bare producer")
    lim.add_argument("--n", type=int, default=50_000)
    cluster_args(lim, required=True)
    lim.add_argument("--json")
    lim.set_defaults(func=limit_cmd)
    c = sub.add_parser("cost", help="CPU per executed run, per process, under a sustained recurring load")
    c.add_argument("--rate", type=float, default=100.0, help="runs a second (rate x 60 every-minute jobs)")
    c.add_argument("--duration", type=float, default=120.0, help="seconds, rounded up to whole minutes")
    c.add_argument("--threads", type=int, default=8, help="worker threads of each `pysched worker`")
    c.add_argument("--state", default=str(ROOT / ".services" / "state.json"), help="scripts/services' state file")
    cluster_args(c, required=True)
    c.set_defaults(start_nodes=2, start_workers=2)
    c.add_argument("--json")
    c.set_defaults(func=cost_cmd)
    args = parser.parse_args()
    from pysched.config import ConfigError
    from pysched.protocols import PartitionsMismatch
    from pysched_loadgen.registration import RegisteredLate

    try:
        return int(args.func(args))
    except RegisteredLate as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"bench: --config: {exc}", file=sys.stderr)
        return 2
    except PartitionsMismatch as exc:
        print(f"bench: --config: {getattr(args, 'config', None)}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
