"""A local HTTP downstream for the breaker tests: 503 to every call while
failing, else 200, counting the answers per idempotency key."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pysched.model import Job


class Downstream:
    """A local HTTP server: 503 to every call while failing, else 200; it
    counts the answers per idempotency key."""

    def __init__(self) -> None:
        self.failing = True
        self.lock = threading.Lock()
        self.answers: dict[str, list[int]] = {}
        downstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                # Decided and counted under one lock: a call answered 503 is
                # counted before the recovery's count is taken, never after.
                with downstream.lock:
                    status = 503 if downstream.failing else 200
                    downstream.answers.setdefault(self.headers.get("Idempotency-Key", "?"), []).append(status)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def recover(self) -> int:
        """Answer 200 from now on; how many calls were answered 503."""
        with self.lock:
            self.failing = False
            return sum(answers.count(503) for answers in self.answers.values())

    def count(self, status: int) -> int:
        with self.lock:
            return sum(answers.count(status) for answers in self.answers.values())


def jobs_calling(url: str, n: int, due_ms: int) -> list[Job]:
    """n one-shot HTTP jobs due together at ``due_ms``, each calling ``url``
    with up to 3 quick retries."""
    return [
        Job.model_validate(
            {
                "id": f"hook-{i:04d}",
                "schedule": {"kind": "once", "run_at_ms": due_ms},
                "target": {"kind": "http", "url": url, "timeout_s": 5},
                "retry": {"retries": 3, "backoff_base_s": 0.2, "backoff_cap_s": 1.0},
            }
        )
        for i in range(n)
    ]
