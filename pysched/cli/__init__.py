"""The `pysched` command: a module per command group."""

from __future__ import annotations

import os
import signal
import sys

import typer

from pysched.cli import api, breakers, catchup, deadletters, jobs, node, preview, slo, sync

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    # Docstrings are paragraphs: their line breaks are not the terminal's.
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
    help="pysched: a job scheduler for Python.",
)
jobs.register_commands(app)
node.register_commands(app)
preview.register_commands(app)
deadletters.register_commands(app)
breakers.register_commands(app)
catchup.register_commands(app)
sync.register_commands(app)
api.register_commands(app)
slo.register_commands(app)


def main() -> None:
    """Exit 0 when done, 2 on bad input, 3 for no such job (the commands say
    so themselves), 1 on anything unexpected: one line, and the traceback only
    with PYSCHED_DEBUG=1."""
    # A reader that goes away (`pysched ls | head`) ends the command quietly,
    # as it ends `cat`; `up` and `worker` keep Python's default, ignoring it.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        app()
    except Exception as exc:
        if os.environ.get("PYSCHED_DEBUG") == "1":
            raise
        print(f"error: unexpected {type(exc).__name__}: {exc} (PYSCHED_DEBUG=1 shows where)", file=sys.stderr)
        sys.exit(1)
