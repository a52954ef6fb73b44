"""The downstream a job's target calls: what its failures have in common
with other jobs' (an HTTP host, a Python module, a shell command's program)."""

from __future__ import annotations

import shlex
from urllib.parse import urlsplit

from pysched.model import HttpTarget, PythonTarget, ShellTarget


def downstream_of(target: ShellTarget | PythonTarget | HttpTarget) -> str:
    """``http:HOST[:PORT]``, ``python:MODULE`` or ``shell:PROGRAM``."""
    if isinstance(target, HttpTarget):
        return f"http:{urlsplit(target.url).netloc.rpartition('@')[2].lower()}"
    if isinstance(target, PythonTarget):
        return f"python:{target.ref.partition(':')[0]}"
    try:
        words = shlex.split(target.command)
    except ValueError:
        words = target.command.split()
    return f"shell:{words[0] if words else target.command}"
