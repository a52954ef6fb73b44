"""What every request passes before a route: the bearer token (or the
dashboard's cookie), when one is configured, and the size limit of its body.

Plain ASGI middleware, so that they also guard what FastAPI serves itself
(/openapi.json, /docs) and a refused request reaches no route: a write
without auth or too large changes nothing."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import secrets
import time
from http.cookies import CookieError, SimpleCookie
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# A job's payload may have 1 MiB as JSON; the rest of a job is small. A batch
# of jobs may have this much in all.
MAX_BODY_BYTES = 4 * 1024 * 1024
# The dashboard's login cookie (HttpOnly, SameSite=Strict): a browser cannot
# send a bearer header with a page load.
TOKEN_COOKIE = "pysched_token"
# Methods that change nothing: the only ones a cookie is enough for without
# an Origin check.
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


# How long a dashboard login lasts: the cookie names when it was issued, and
# is refused past this (a leaked one does not open the dashboard for good).
COOKIE_TTL_S = 12 * 3600


def cookie_value(token: str, issued_s: int) -> str:
    """What the login cookie holds: when it was issued and an HMAC of that
    under the token, so that a leaked cookie does not show the token a
    script would use, is good for COOKIE_TTL_S only, and is safe as a cookie
    value whatever the token's characters."""
    mac = hmac.new(token.encode(), f"pysched dashboard cookie {issued_s}".encode(), hashlib.sha256).hexdigest()
    return f"{issued_s}.{mac}"


def cookie_valid(token: str, value: bytes, now_s: float) -> bool:
    issued, _, _ = value.partition(b".")
    if not (issued.isascii() and issued.isdigit() and len(issued) < 16):
        return False
    # A minute's slack for a clock stepped back.
    if not -60 <= now_s - int(issued) <= COOKIE_TTL_S:
        return False
    return secrets.compare_digest(value, cookie_value(token, int(issued)).encode())


def _cookie(headers: dict[bytes, bytes], name: str) -> bytes:
    try:
        jar = SimpleCookie(headers.get(b"cookie", b"").decode("latin-1"))
    except CookieError:
        return b""
    morsel = jar.get(name)
    return morsel.value.encode("latin-1") if morsel is not None else b""


def same_origin(scope: Scope) -> bool:
    """Whether a request comes from a page of this server: its Origin (or,
    failing that, its Referer) names the scheme and host it was sent to. A
    form another site posts here names that site, and a request naming
    neither is refused."""
    headers = dict(scope["headers"])
    host = headers.get(b"host", b"").decode("latin-1")
    origin = headers.get(b"origin", b"").decode("latin-1")
    if not origin or origin == "null":
        referer = urlsplit(headers.get(b"referer", b"").decode("latin-1"))
        origin = f"{referer.scheme}://{referer.netloc}" if referer.netloc else ""
    return bool(host) and origin == f"{scope.get('scheme', 'http')}://{host}"


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


def _matches(path: str, patterns: tuple[str, ...]) -> bool:
    """A pattern ending in a slash (but "/" itself) is a prefix; others match exactly."""
    return any(path == p or (p != "/" and p.endswith("/") and path.startswith(p)) for p in patterns)


class BearerToken:
    """Every request needs ``Authorization: Bearer TOKEN`` or the login
    cookie (each compared in constant time); without one, 401 and nothing
    runs, or for a page (a path under ``pages``, GET), a redirect to
    ``login``. Paths under ``open_paths`` (the login form, its CSS) need
    neither. A write with the cookie alone must come from this origin
    (`same_origin`): SameSite=Strict keeps other sites' requests from
    carrying it, and this check holds for browsers that would."""

    def __init__(
        self,
        app: ASGIApp,
        token: str,
        *,
        login: str | None = None,
        open_paths: tuple[str, ...] = (),
        pages: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.expected = token.encode()
        self.token = token
        self.login = login
        self.open_paths = open_paths
        self.pages = pages

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if _matches(path, self.open_paths):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
        # The scheme's name is case-insensitive (RFC 9110 11.1).
        bearer = scheme.lower() == b"bearer" and secrets.compare_digest(given.strip(), self.expected)
        cookie = cookie_valid(self.token, _cookie(headers, TOKEN_COOKIE), time.time())
        if bearer or cookie:
            if not bearer and scope["method"] not in _SAFE_METHODS and not same_origin(scope):
                await _refuse(send, 403, "a write with the dashboard's cookie must come from the dashboard's own pages")
                return
            await self.app(scope, receive, send)
            return
        if self.login is not None and scope["method"] == "GET" and _matches(path, self.pages):
            await send({"type": "http.response.start", "status": 303, "headers": [(b"location", self.login.encode())]})
            await send({"type": "http.response.body", "body": b""})
            return
        if scheme:
            bearer_given = scheme.lower() == b"bearer"
            why = "the bearer token is wrong" if bearer_given else "the Authorization scheme is not Bearer"
            await _refuse(send, 401, f"{why}: Authorization: Bearer TOKEN", [(b"www-authenticate", b"Bearer")])
            return
        await _refuse(
            send, 401, "a bearer token is required: Authorization: Bearer TOKEN", [(b"www-authenticate", b"Bearer")]
        )


class BodyLimit:
    """413 for a body over ``limit`` bytes, before any route runs: by its
    Content-Length, or, sent in chunks, read here up to the limit (a route
    that reads no body would otherwise run whatever was sent)."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"the request body may have at most {self.limit:,} bytes"
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if not length.isdigit() or int(length) > self.limit:
                await _refuse(send, 413, too_large)
                return
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                # The client went away: the route sees it as it would.
                first: Message = message
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                await _refuse(send, 413, too_large)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return first
            return await receive()

        await self.app(scope, replay, send)


class CrossSiteWrites:
    """403 for a write (any method but GET, HEAD, OPTIONS) a browser sends
    from another site's page: its Origin names another host than the one
    it was sent to. A form post or a fetch needs no CORS preflight for
    that, and the API trusts no site's pages but its own."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in _SAFE_METHODS:
            headers = dict(scope["headers"])
            cross_site = headers.get(b"sec-fetch-site", b"") == b"cross-site"
            if (b"origin" in headers or cross_site) and not same_origin(scope):
                await _refuse(send, 403, "a write from another site's page is refused")
                return
        await self.app(scope, receive, send)


class LoopbackHosts:
    """Without a token, the API answers only requests addressed to this
    machine's loopback names (its Host header): a page on another site whose
    name an attacker points at 127.0.0.1 (DNS rebinding) is refused, since
    its requests carry that site's name."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            name = urlsplit(f"//{host}").hostname or ""
            if not is_loopback_name(name):
                await _refuse(
                    send,
                    421,
                    f"Host {host!r} is not a loopback name of this machine: without an api_token the API answers"
                    " only to 127.0.0.1, ::1 and localhost",
                )
                return
        await self.app(scope, receive, send)


def is_loopback_name(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
