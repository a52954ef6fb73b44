"""One etcd client on an event loop of its own, called from threads.

aetcd is asyncio-only and the node's parts are threads: the client lives on
a loop in a daemon thread, and each call is a coroutine handed to it and
waited for, bounded by twice the client's timeout.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import aetcd

from pysched.config import host_port

T = TypeVar("T")


class EtcdConnection:
    def __init__(self, endpoint: str, *, call_timeout_s: float = 5.0, name: str = "pysched-etcd") -> None:
        self.endpoint = endpoint
        self.call_timeout_s = call_timeout_s
        host, port = host_port(endpoint, 2379)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        try:
            self.client = self.call(self._connect(host, port))
        except BaseException:
            self._stop_loop()
            raise

    async def _connect(self, host: str, port: int) -> aetcd.Client:
        client = aetcd.Client(host=host, port=port, timeout=int(self.call_timeout_s))
        try:
            await client.status()
        except Exception as exc:
            raise ConnectionError(f"etcd at {host}:{port} is unreachable: {type(exc).__name__}: {exc}") from None
        return client

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self.call_timeout_s * 2)

    def close(self) -> None:
        try:
            self.call(self.client.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
