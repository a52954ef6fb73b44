"""The web dashboard, served by the API: `/` (the overview), `/ui/jobs/{id}`,
`/ui/dead-letters` and `/ui/partitions`, and `/login` when a token is set.

Server-rendered HTML from small Python templates (`html.tag`) rather than
Jinja2: no new runtime dependency for four pages, and escaping is the type's
default (a ``str`` is always escaped; only markup built by `tag` passes),
so a template cannot forget it. Each page's tables are `Part`s that the
page's script (static/dashboard.js) refreshes every few seconds from the
page's JSON view (the same URL with ``?parts=1``, built by the same
function), writing cells with textContent. The CSS and script are package
data served here: the pages fetch nothing from outside the server, and
their Content-Security-Policy says so.

Writes (redrive, login) are form POSTs checked to come from this origin
(`guard.same_origin`), token or not: without a token the API serves only
loopback, but any site a local browser visits could post a form to it.
"""

from __future__ import annotations

import secrets
import time
from importlib import resources
from typing import Annotated
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from pysched.api.guard import COOKIE_TTL_S, TOKEN_COOKIE, cookie_value, same_origin
from pysched.api.ui.html import Html, raw, tag
from pysched.api.ui.pages import (
    DEFAULT_WINDOW_MIN,
    MAX_WINDOW_MIN,
    REDRIVE_PATH,
    Page,
    clock,
    dead_letters_page,
    job_page,
    overview,
    partitions_page,
)
from pysched.client import Client, RunKey
from pysched.protocols import JobNotFound

LOGIN_PATH = "/login"
STATIC_PREFIX = "/ui/static/"
# Paths a browser without the token may load: the login form and its CSS.
OPEN_PATHS = (LOGIN_PATH, STATIC_PREFIX)
# Paths that are pages: a browser without the token is sent to log in.
PAGE_PATHS = ("/", "/ui/")
# How often the page's script refreshes its tables.
REFRESH_MS = 3000
_STATIC = {"dashboard.css": "text/css; charset=utf-8", "dashboard.js": "text/javascript; charset=utf-8"}
# Only this server's own CSS, script and forms; no framing (a redrive button
# under another site's overlay).
_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; style-src 'self'; script-src 'self'; connect-src 'self'; img-src 'self';"
        " form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}
_NAV = (("/", "Overview"), ("/ui/dead-letters", "Dead letters"), ("/ui/partitions", "Partitions"))


def _document(
    title: str, body: Html, *, path: str, logout: bool, updated: str, refresh_ms: int | None = REFRESH_MS
) -> Html:
    nav = tag(
        "nav",
        tag("a", "pysched", href="/", class_="brand"),
        *(tag("a", label, href=href, aria_current="page" if href == path else None) for href, label in _NAV),
        tag("form", tag("button", "Log out", type="submit"), method="post", action="/logout", class_="logout")
        if logout
        else None,
    )
    footer = tag("footer", "Updated ", tag("span", updated, id="updated"), class_="muted")
    return Html(
        raw("<!doctype html>")
        + tag(
            "html",
            tag(
                "head",
                tag("meta", charset="utf-8"),
                tag("meta", name="viewport", content="width=device-width, initial-scale=1"),
                tag("title", f"{title} · pysched"),
                tag("link", rel="stylesheet", href=f"{STATIC_PREFIX}dashboard.css"),
                tag("script", src=f"{STATIC_PREFIX}dashboard.js", defer=True),
            ),
            tag("body", tag("header", nav), tag("main", body), footer, data_refresh_ms=refresh_ms),
            lang="en",
        )
    )


def _html(markup: Html, status: int = 200) -> HTMLResponse:
    return HTMLResponse(markup, status_code=status, headers=_HEADERS)


def _whole(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _form(body: bytes) -> dict[str, str]:
    """An urlencoded form's fields, the last value of each."""
    return {k: v[-1] for k, v in parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True).items()}


def dashboard(client: Client, *, token: str | None) -> APIRouter:
    """The dashboard's routes over ``client``; ``token``: the API's, which
    the login form takes (None: no login)."""
    router = APIRouter(include_in_schema=False)
    static = {name: resources.files(__name__).joinpath("static", name).read_bytes() for name in _STATIC}

    def now() -> str:
        return clock(client.clock.now_ms())

    def document(
        title: str, body: Html, path: str = "", refresh_ms: int | None = None, status: int = 200
    ) -> HTMLResponse:
        return _html(
            _document(title, body, path=path, logout=token is not None, updated=now(), refresh_ms=refresh_ms), status
        )

    def refused(why: str) -> HTMLResponse:
        body = Html(tag("h1", "Refused") + tag("p", why, ": reload the dashboard and try again from its own page."))
        return document("Refused", body, status=403)

    def show(page: Page, request: Request, parts: bool) -> Response:
        if parts:
            return JSONResponse(
                {"parts": {name: part.json() for name, part in page.parts.items()}, "updated": now()},
                headers={"cache-control": "no-store"},
            )
        return document(page.title, page.body, request.url.path, REFRESH_MS)

    @router.get("/")
    def overview_page(
        request: Request, minutes: Annotated[str | None, Query(max_length=20)] = None, parts: bool = False
    ) -> Response:
        # Read here, not by FastAPI: a bad value is a page that says so,
        # not JSON in place of the page.
        window = DEFAULT_WINDOW_MIN if minutes is None else _whole(minutes)
        if window is None or not 1 <= window <= MAX_WINDOW_MIN:
            why = f"window, minutes: a whole number from 1 to {MAX_WINDOW_MIN:,}; got {minutes!r}"
            if parts:
                return JSONResponse({"detail": [{"field": "minutes", "message": why}]}, status_code=422)
            body = Html(tag("h1", "Bad request") + tag("p", why, ". ", tag("a", "Back to the overview", href="/")))
            return document("Bad request", body, status=422)
        return show(overview(client, window), request, parts)

    @router.get("/ui/jobs/{job_id}")
    def one_job(request: Request, job_id: str, parts: bool = False) -> Response:
        try:
            page = job_page(client, job_id)
        except JobNotFound:
            if parts:
                return JSONResponse({"detail": f"no job {job_id}"}, status_code=404)
            body = Html(tag("h1", "No such job") + tag("p", "There is no job ", tag("code", job_id), "."))
            return document("No such job", body, status=404)
        return show(page, request, parts)

    @router.get("/ui/dead-letters")
    def dead_letters(
        request: Request, parts: bool = False, notice: Annotated[str | None, Query(max_length=500)] = None
    ) -> Response:
        return show(dead_letters_page(client, notice), request, parts)

    @router.post(REDRIVE_PATH)
    async def redrive(request: Request) -> Response:
        if not same_origin(request.scope):
            return refused("the redrive came from another site")
        form = _form(await request.body())
        try:
            # Checked as a typed key is: digits within the stores' integers.
            key = RunKey.parse(f"{form['job_id']}:{form['run_at_ms']}:{form.get('group', '0')}")
        except (KeyError, ValueError):
            return document(
                "Bad request", Html(tag("h1", "Bad request") + tag("p", "The form names no run.")), status=400
            )
        done = await run_in_threadpool(client.redrive, [key])
        notice = f"Redriven: {key}" if done.redriven else f"Not a dead letter (any more): {key}"
        return RedirectResponse(f"/ui/dead-letters?{urlencode({'notice': notice})}", status_code=303)

    @router.get("/ui/partitions")
    def partitions(request: Request, parts: bool = False) -> Response:
        return show(partitions_page(client), request, parts)

    @router.get(STATIC_PREFIX + "{name}")
    def static_file(name: str) -> Response:
        if name not in static:
            return Response(status_code=404)
        return Response(
            static[name],
            media_type=_STATIC[name],
            headers={"cache-control": "no-cache", "x-content-type-options": "nosniff"},
        )

    def login_form(message: str | None, status: int = 200) -> HTMLResponse:
        body = Html(
            tag("h1", "Log in")
            + (tag("p", message, class_="notice", role="alert") if message else Html(""))
            + tag(
                "form",
                tag(
                    "label",
                    "API token ",
                    tag(
                        "input",
                        type="password",
                        name="token",
                        autocomplete="current-password",
                        required=True,
                        autofocus=True,
                    ),
                ),
                tag("button", "Log in", type="submit"),
                method="post",
                action=LOGIN_PATH,
                class_="login",
            )
            + tag(
                "p", "The token is kept in a cookie of this browser only (HttpOnly, SameSite=Strict).", class_="muted"
            )
        )
        return _html(_document("Log in", body, path=LOGIN_PATH, logout=False, updated=now(), refresh_ms=None), status)

    @router.get(LOGIN_PATH)
    def login_page() -> Response:
        if token is None:
            return RedirectResponse("/", status_code=303)
        return login_form(None)

    @router.post(LOGIN_PATH)
    async def login(request: Request) -> Response:
        if token is None:
            return RedirectResponse("/", status_code=303)
        if not same_origin(request.scope):
            return refused("the login came from another site")
        given = _form(await request.body()).get("token", "")
        if not secrets.compare_digest(given.encode(), token.encode()):
            return login_form("That is not the API's token.", 401)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            TOKEN_COOKIE,
            cookie_value(token, int(time.time())),
            max_age=COOKIE_TTL_S,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    @router.post("/logout")
    def logout(request: Request) -> Response:
        if not same_origin(request.scope):
            return refused("the logout came from another site")
        response = RedirectResponse(LOGIN_PATH if token is not None else "/", status_code=303)
        response.delete_cookie(TOKEN_COOKIE, path="/", httponly=True, samesite="strict")
        return response

    return router
