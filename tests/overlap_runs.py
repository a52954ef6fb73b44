"""A shell job for the overlap tests: each execution records its start
(and the pid of the process that ran it) and, 3 s later, its end, in files
of the directory it runs in; the test reads them back."""

from __future__ import annotations

from pathlib import Path

# One pair of files per execution: its start time and node, then its end.
THREE_SECONDS = (
    'n="$PYSCHED_RUN_ID.$PYSCHED_ATTEMPT"; echo "$(date +%s%N) $PPID" > "start.$n.tmp" && mv "start.$n.tmp" "start.$n";'
    ' sleep 3; date +%s%N > "end.$n.tmp" && mv "end.$n.tmp" "end.$n"'
)


def executions(cwd: Path) -> list[tuple[int, int | None, int]]:
    """(start ns, end ns or None while running or cut short, node pid)."""
    out = []
    for start in cwd.glob("start.*"):
        if start.name.endswith(".tmp"):
            continue
        started_ns, pid = start.read_text().split()
        end = cwd / ("end." + start.name.removeprefix("start."))
        out.append((int(started_ns), int(end.read_text()) if end.exists() else None, int(pid)))
    return sorted(out)


def ended_on(cwd: Path, pid: int) -> int:
    return sum(1 for _, end, node in executions(cwd) if node == pid and end is not None)


def running_on(cwd: Path, pid: int) -> bool:
    return any(end is None and node == pid for _, end, node in executions(cwd))
