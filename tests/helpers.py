"""Running the real `pysched` command in tests, embedded or as a cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pysched.config import ClusterConfig
from pysched.model import Job
from pysched.node import open_cluster
from pysched.registry import register

PYSCHED = [sys.executable, "-m", "pysched"]
ROOT = Path(__file__).resolve().parent.parent


def cli(
    *args: str, db: Path | str, cwd: Path | None = None, check: bool = True, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [*PYSCHED, *args, "--db", str(db)], capture_output=True, text=True, timeout=timeout_s, cwd=cwd
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"pysched {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def cli_json(*args: str, db: Path) -> Any:
    return json.loads(cli(*args, "--json", db=db).stdout)


def start_node(db: Path, cwd: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([*PYSCHED, "up", "--db", str(db), *args], cwd=cwd, stdout=out, stderr=out)


def stop_node(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM by PID, then SIGKILL if it lingers: only our own process."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str, log: Path | None = None) -> None:
    """Poll ``predicate`` until it holds; on timeout, say what was awaited
    and show the end of the node's ``log``, which says why."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    tail = ""
    if log is not None and log.exists():
        tail = "\n--- end of " + log.name + " ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-60:])
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{tail}")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Cluster:
    config: ClusterConfig
    config_path: Path
    tmp: Path
    ledger: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{name}.log").open("ab")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.Popen(
            [*PYSCHED, *args, "--config", str(self.config_path)], cwd=ROOT, stdout=log, stderr=log, env=env
        )
        self.procs[name] = proc
        return proc

    def node(self, name: str) -> subprocess.Popen[bytes]:
        return self.start(name, "up", "--workers", "0", "--quiet")

    def worker(self, name: str) -> subprocess.Popen[bytes]:
        return self.start(name, "worker", "--workers", "4", "--quiet")

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def register_spread(self, n: int, first_ms: int, spread_ms: int) -> set[str]:
        """n one-shot runs evenly over [first, first + spread); their keys.

        A run is never registered less than REGISTER_LEAD_MS ahead: on a slow
        machine the later ones move out with the registration (a moving
        base). These tests are about failover, not about registrations that
        land after their own time."""

        def register_one(k: int) -> str:
            run_at = max(first_ms + k * spread_ms // n, now_ms() + REGISTER_LEAD_MS)
            job = Job.model_validate(
                {
                    "id": f"j{k:05d}",
                    "schedule": {"kind": "once", "run_at_ms": run_at},
                    "target": {"kind": "python", "ref": "pysched_loadgen.target:append"},
                    "payload": {"ledger": str(self.ledger), "due_ms": run_at},
                }
            )
            register(backends.store, job, now_ms())
            return f"{job.id}:{run_at}:0"

        backends = open_cluster(self.config, coordinator=False)
        try:
            with ThreadPoolExecutor(16) as pool:
                return set(pool.map(register_one, range(n)))
        finally:
            backends.close()

    def register_minutely(self, n: int) -> list[str]:
        """n minutely jobs writing to the ledger; their ids."""
        backends = open_cluster(self.config, coordinator=False)
        try:
            ids = []
            for k in range(n):
                job = Job.model_validate(
                    {
                        "id": f"m{k:03d}",
                        "schedule": {"kind": "cron", "expr": "* * * * *"},
                        "target": {"kind": "python", "ref": "pysched_loadgen.target:append"},
                        "payload": {"ledger": str(self.ledger)},
                        "critical": True,
                    }
                )
                register(backends.store, job, now_ms())
                ids.append(job.id)
            return ids
        finally:
            backends.close()

    def ledger_keys(self) -> Counter[str]:
        # loadgen's ledger: "<idempotency key> <due_ms> <started_ms>" a line.
        if not self.ledger.exists():
            return Counter()
        return Counter(line.split()[0] for line in self.ledger.read_text().splitlines())

    def three_nodes_two_workers(self) -> dict[str, subprocess.Popen[bytes]]:
        nodes = {name: self.node(name) for name in ("node-a", "node-b", "node-c")}
        self.worker("worker-1")
        self.worker("worker-2")
        wait_for(lambda: len(self.holders()) == 3, 60, "three leaders")
        return nodes

    def holders(self) -> set[str]:
        return {lease.holder for lease in self.leaders().values()}

    def leaders(self) -> dict[int, Any]:
        from pysched.coord.etcd import EtcdCoordinator

        coordinator = EtcdCoordinator(self.config, partitions=self.config.partitions or 64)
        try:
            return coordinator.leaders()
        finally:
            coordinator.close()


REGISTER_LEAD_MS = 15_000


def write_config(path: Path, values: dict[str, Any]) -> Path:
    # TOML has no null: a field left unset (partitions) is left out.
    lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items() if v is not None)
    path.write_text("[cluster]\n" + lines)
    return path
