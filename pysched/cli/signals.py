"""SIGINT and SIGTERM for a long-running command, read by the main thread.

Python runs a signal handler in the main thread between two bytecodes, which
may be inside a lock that thread holds: a handler that takes a lock (as
``Event.set()`` does) can wait on itself for ever when a second signal comes
while the first is handled. So the handler here does nothing: the
interpreter's own handler writes the signal's number to a socket
(``signal.set_wakeup_fd``), and the main thread reads it there, outside any
lock.
"""

from __future__ import annotations

import select
import signal
import socket

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _noted(_signum: int, _frame: object) -> None:
    """Nothing to do: the number is already on the wakeup socket."""


class StopSignals:
    def __init__(self) -> None:
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)
        # A storm of signals may fill the socket: those past it add nothing.
        signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        for signum in STOP_SIGNALS:
            signal.signal(signum, _noted)

    def wait(self, timeout_s: float) -> list[int]:
        """The stop signals received since the last call, oldest first;
        empty if none came within ``timeout_s``."""
        ready, _, _ = select.select([self._read], [], [], timeout_s)
        if not ready:
            return []
        try:
            data = self._read.recv(4096)
        except BlockingIOError:
            return []
        return [n for n in data if n in STOP_SIGNALS]
