"""`pysched api`: the HTTP API over the embedded database or a cluster."""

from __future__ import annotations

import logging
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pysched.cli.common import DEFAULT_DB, ConfigOption, DbOption, cluster_config, fail, listening, open_client

if TYPE_CHECKING:
    from fastapi import FastAPI

    from pysched.stores.sqlite_db import Access

ApiPortOption = Annotated[
    int | None,
    typer.Option(
        "--api",
        metavar="PORT",
        min=0,
        max=65_535,
        help="Serve the HTTP API and its dashboard on this port (0: a free one, logged).",
    ),
]
ApiHostOption = Annotated[
    str, typer.Option("--api-host", help="The address --api listens on (another than loopback needs an api_token).")
]


def serve_api_on(
    host: str,
    port: int,
    db: str,
    config: str | None,
    *,
    host_flag: str = "--host",
    port_flag: str = "--port",
    access: Access = "write",
) -> tuple[FastAPI, socket.socket]:
    """The API's address bound and its app made, or exit 2 naming what is
    wrong: an exposed address without a token, a port that is taken, a
    database that is not there (``access``: "create" where the command
    creates it, as `up` does)."""
    from pysched.api.app import create_app
    from pysched.api.serve import UnsafeHost, UnsafeToken, bind, check_exposure, token_from

    token, token_source = token_from(cluster_config(config).api_token if config is not None else None)
    try:
        check_exposure(host, token)
    except UnsafeHost as exc:
        fail(f"{host_flag}: {exc}")
    except UnsafeToken as exc:
        fail(f"{token_source}: {exc}")
    with listening(host_flag, port_flag, host, port):
        sock = bind(host, port)
    client = open_client(db, config, access=access)
    # A Python target is checked by importing it from here, as the workers
    # of `pysched up` find it.
    sys.path.insert(0, str(Path.cwd()))
    return create_app(client, token=token), sock


def api(
    db: DbOption = DEFAULT_DB,
    config: ConfigOption = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (another than loopback needs an api_token).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65_535, help="Port to listen on (0: a free one).")] = 8080,
) -> None:
    """Serve the HTTP API: jobs, runs, dead letters, partitions; OpenAPI at
    /openapi.json, its docs page at /docs. With PYSCHED_API_TOKEN (or
    api_token in the --config file) set, every request needs
    `Authorization: Bearer TOKEN`."""
    from pysched.api.serve import ApiServer

    app, sock = serve_api_on(host, port, db, config)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    server = ApiServer(app, sock)
    # Printed whatever the log level: with --port 0 it is the one place
    # that says where the API is.
    typer.echo(f"pysched API on {server.url} (docs: {server.url}/docs)", err=True)
    server.run()


def register_commands(app: typer.Typer) -> None:
    app.command()(api)
