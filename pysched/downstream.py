"""The downstream a job's target calls: what its failures have in common
with other jobs' (an HTTP host, a Python module, a shell command's program,
a Temporal task queue)."""

from __future__ import annotations

import shlex
from urllib.parse import urlsplit

from pysched.model import HttpTarget, PythonTarget, ShellTarget, TemporalTarget


def downstream_of(target: ShellTarget | PythonTarget | HttpTarget | TemporalTarget) -> str:
    """``http:HOST[:PORT]``, ``python:MODULE``, ``shell:PROGRAM`` or
    ``temporal:NAMESPACE/TASK_QUEUE``."""
    if isinstance(target, HttpTarget):
        return f"http:{urlsplit(target.url).netloc.rpartition('@')[2].lower()}"
    if isinstance(target, PythonTarget):
        return f"python:{target.ref.partition(':')[0]}"
    if isinstance(target, TemporalTarget):
        # A workflow's failures are those of the workers polling its task
        # queue, not of its type alone; and a queue belongs to a namespace:
        # the same name in two namespaces is polled by two sets of workers.
        return f"temporal:{target.namespace}/{target.task_queue}"
    try:
        words = shlex.split(target.command)
    except ValueError:
        words = target.command.split()
    return f"shell:{words[0] if words else target.command}"
