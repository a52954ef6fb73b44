"""Serving the API: its address bound first (a taken port is an error before
anything starts), then uvicorn, in the foreground (`pysched api`) or in a
thread beside a node (`pysched up --api`)."""

from __future__ import annotations

import os
import socket
import threading

import uvicorn
from fastapi import FastAPI

from pysched.api.guard import is_loopback_name
from pysched.config import MIN_API_TOKEN_CHARS

TOKEN_ENV = "PYSCHED_API_TOKEN"


class UnsafeHost(ValueError):
    """An address the API must not listen on without a token."""


class UnsafeToken(ValueError):
    """A token too weak to guard the API."""


def check_exposure(host: str, token: str | None) -> None:
    """Without a token, only this machine may reach the API."""
    if token is None and not is_loopback_name(host):
        raise UnsafeHost(
            f"{host} is not a loopback address (127.0.0.1, ::1, localhost), and no api_token is configured:"
            f" set {TOKEN_ENV} (or api_token in the --config file), or listen on 127.0.0.1"
        )
    if token is not None and (len(token) < MIN_API_TOKEN_CHARS or not token.isprintable() or " " in token):
        raise UnsafeToken(f"at least {MIN_API_TOKEN_CHARS} printable characters, no spaces")


def token_from(configured: str | None) -> tuple[str | None, str]:
    """The token and where it came from: PYSCHED_API_TOKEN, else the config
    file's api_token; None: none set."""
    env = os.environ.get(TOKEN_ENV)
    return (env, TOKEN_ENV) if env else (configured, "api_token")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (0: a free port). Raises OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class ApiServer:
    """uvicorn on a bound socket."""

    def __init__(self, app: FastAPI, sock: socket.socket, *, log_level: str = "info") -> None:
        self.sock = sock
        host, port = sock.getsockname()[:2]
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, access_log=False))
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        """In the foreground, until SIGINT or SIGTERM."""
        self.server.run(sockets=[self.sock])

    def start(self) -> None:
        """In a thread of its own (uvicorn leaves the signals to the main thread)."""
        self._thread = threading.Thread(target=self.run, name="pysched-api", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.sock.close()
