"""What every request passes before a route: the bearer token, when one is
configured, and the size limit of its body.

Plain ASGI middleware, so that they also guard what FastAPI serves itself
(/openapi.json, /docs) and a refused request reaches no route: a write
without auth or too large changes nothing."""

from __future__ import annotations

import json
import secrets

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# A job's payload may have 1 MiB as JSON; the rest of a job is small. A batch
# of jobs may have this much in all.
MAX_BODY_BYTES = 4 * 1024 * 1024


async def _refuse(send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            + (headers or []),
        }
    )
    await send({"type": "http.response.body", "body": body})


class BearerToken:
    """Every request needs ``Authorization: Bearer TOKEN`` (compared in
    constant time); without one, 401 and nothing runs."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        if not secrets.compare_digest(given, self.expected):
            await _refuse(
                send, 401, "a bearer token is required: Authorization: Bearer TOKEN", [(b"www-authenticate", b"Bearer")]
            )
            return
        await self.app(scope, receive, send)


class BodyLimit:
    """413 for a body over ``limit`` bytes: by its Content-Length before it is
    read, or, sent in chunks, as soon as it passes the limit."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await _refuse(send, 413, f"the request body may have at most {self.limit:,} bytes")
            return
        seen = 0
        refused = False

        async def counted() -> Message:
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request" and not refused:
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    # Answered here; the route sees the client gone and
                    # whatever it would answer is dropped.
                    refused = True
                    await _refuse(send, 413, f"the request body may have at most {self.limit:,} bytes")
                    return {"type": "http.disconnect"}
            return message

        async def unless_refused(message: Message) -> None:
            if not refused:
                await send(message)

        try:
            await self.app(scope, counted, unless_refused)
        except Exception:
            if not refused:
                raise
