"""The `pysched` command: a module per command group."""

from __future__ import annotations

import typer

from pysched.cli import jobs, node

app = typer.Typer(no_args_is_help=True, add_completion=False, help="pysched: a job scheduler for Python.")
jobs.register_commands(app)
node.register_commands(app)


def main() -> None:
    app()
