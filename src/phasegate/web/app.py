"""The dashboard's HTTP app: who gets in, and the routers that serve what they asked.

The app itself answers the way in (login, sign-on, logout) and the static
files; ``workflow_routes`` the board and a workflow's page and decisions,
``review_routes`` the diff and its review, ``people`` the people page and
``api`` the JSON API, all behind the one guard here.

Routes (every one behind the token's session; ``/login`` is the way in):

    GET  /login[?token=T]          the login form; with the token: a session cookie, then /
    POST /login                    form field ``token``: the same
    GET  /login/oidc[/callback]    single sign-on, with ``[dashboard.oidc]`` (oidc.py)
    POST /logout                   ends the session
    GET  /                         the board (needs you, running, queued, waiting, done, failed)
    GET  /board                    the board's fragment (what ``/`` re-reads live)
    GET  /board/events             SSE: ``changed`` whenever a card would change
    POST /tickets                  form ``ticket``, ``title`` (optional): a new workflow
                                   filed (a worker takes it), then its page (CSRF)
    GET  /workflows/{id}           a workflow's page
    GET  /workflows/{id}/fragment  its fragment
    GET  /workflows/{id}/events    SSE: its event rows (``live``), Last-Event-ID resumes
    POST /workflows/{id}/feedback  form field ``text``: feedback (CSRF)
    POST /workflows/{id}/approve-merge    the merge approved by the token's user (CSRF)
    GET  /workflows/{id}/diff      its change per file, numbered lines (phasegate.changes)
    POST /workflows/{id}/comments  form ``path``, ``line``, ``text``: a draft comment on a
                                   line of the diff; moves nothing (CSRF)
    POST /workflows/{id}/review    form ``text`` (optional): the drafts sent as one
                                   feedback for the next round (CSRF)
    POST /workflows/{id}/resume    a failed, paused or timed-out workflow goes on (CSRF)
    POST /workflows/{id}/cancel    the workflow ends for good (CSRF)
    POST /workflows/{id}/revert    form ``reason``: back to planning, a reversion (CSRF)
    POST /workflows/{id}/verify-override  form ``verdict``: confirmed or rejected (CSRF)
    POST /workflows/{id}/proposals/{pid}/approve   the proposal it awaits approved (CSRF)
    POST /workflows/{id}/proposals/{pid}/reject    form ``reason``: rejected (CSRF)
    GET  /static/{name}            htmx and its sse extension (vendored), dashboard.js
    /api/..., GET /openapi.json    the JSON API (api.py), behind the same token
    GET  /costs[?by=&since=]       what agents spent, grouped, and the budgets (costs.py)
    GET  /people                   the people and their roles (admins only: people.py),
                                   and POSTs to add, re-role, re-token and remove them
    GET  /metrics                  the store's figures for Prometheus (web/metrics.py)

No session: 401 and the login form; a script may instead send
``Authorization: Bearer T`` (a wrong token: 401). A POST without the session's
CSRF token: 403, nothing done; a bearer request needs none, having no cookie to
borrow. A viewer's POST (but ``/logout``): 403, nothing done. Every action is
``phasegate.operations``' with ``by`` the person's name: a refused one is 409
with operations' message (the CLI's, word for word); a workflow a worker is
advancing: 409 too. Input refused before anything is recorded (a ticket, a
comment) is 400 with operations' message.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from http import HTTPStatus
from pathlib import Path
from typing import Annotated

from fastapi import Depends, FastAPI, Form, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from phasegate.agents.env import cartridge_secrets
from phasegate.runtime.engine import Engine
from phasegate.web import (
    api,
    costs,
    metrics,
    oidc,
    people,
    review_routes,
    webhooks,
    workflow_routes,
)
from phasegate.web.auth import (
    CSRF_FIELD,
    CSRF_HEADER,
    SESSION_COOKIE,
    SESSION_COOKIE_FLAGS,
    Access,
    Person,
    Role,
    Session,
    person_of,
)
from phasegate.web.pages import Pages

__all__ = ["create_app", "person_of"]

_HERE = Path(__file__).parent
_STATIC = {
    **{name: "text/javascript" for name in ("htmx.min.js", "sse.min.js", "dashboard.js")},
    "dashboard.css": "text/css",
}
#: On every answer. Scripts from this server only (what an agent wrote into a page
#: cannot run even if escaping missed it); no framing (a click cannot be borrowed);
#: no Referer (the login URL holds the token); nothing cached (pages hold the CSRF token).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'; "
    "form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_OPEN_PATHS = frozenset({"/login", *oidc.PATHS})
_OPEN_STYLE = "/static/dashboard.css"
#: A person's chosen report language (``en``/``zh``), else their browser's.
LANGUAGE_COOKIE = "phasegate_lang"


class _LoginNeeded(Exception):
    """No session: answered with 401 and the login form."""


def create_app(
    engine: Engine, access: Access, stop: threading.Event | None = None, metrics_mode: str = "token"
) -> FastAPI:
    """The dashboard on ``engine``'s store and cartridge: reads from the store,
    a person's actions through ``phasegate.operations`` (under the workflow's
    lease), ``by`` = the acting person's name (``person_of``). ``stop`` (``serve``
    passes the engine's shutdown) ends every live stream. Every secret of the
    cartridge and the environment, and the token, is redacted from every page and
    event (``phasegate.core.redaction``). ``metrics_mode``: who reads ``/metrics``
    (``web.metrics.METRICS_MODES``)."""
    stop = stop or engine.shutdown
    secrets = [*cartridge_secrets(engine.cartridge), *filter(None, [access.token])]
    pages = Pages(engine, secrets)
    templates = pages.templates

    def session_of(request: Request) -> Session | None:
        return access.session(request.cookies.get(SESSION_COOKIE))

    async def guard(request: Request) -> None:
        """Every route: a bearer token, or a session and on a POST its CSRF token
        (field or header); a POST also needs a person who may decide."""
        if request.url.path in _OPEN_PATHS or request.url.path.startswith(webhooks.PREFIX):
            return  # a delivery proves itself by its forge's signature
        if request.method == "GET" and request.url.path == _OPEN_STYLE:
            return  # the login and sign-on pages are styled before any session
        if metrics.open_to(request, metrics_mode):
            return  # serve --metrics local: this machine's scraper needs no token
        scheme, _, given_token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            person = await run_in_threadpool(access.bearer, given_token.strip())
            if person is None:
                raise HTTPException(401, "the bearer token is no person's")
            request.state.session, request.state.person = None, person
            _may_post(request, person)
            return
        session = await run_in_threadpool(session_of, request)  # a store read, maybe
        if session is None:
            raise _LoginNeeded
        if request.method == "POST":
            given = request.headers.get(CSRF_HEADER)
            if not given:
                form = await request.form()
                field = form.get(CSRF_FIELD)
                given = field if isinstance(field, str) else None
            if not access.csrf_ok(session, given):
                raise HTTPException(403, "missing or wrong CSRF token: reload the page")
        request.state.session, request.state.person = session, session.person
        _may_post(request, session.person)

    app = FastAPI(
        title="phasegate", docs_url=None, redoc_url=None, openapi_url=None,
        dependencies=[Depends(guard)],
    )  # fmt: skip

    app.include_router(webhooks.router(engine))
    sign_on = oidc.configured(engine.cartridge)  # None without [dashboard.oidc]
    if sign_on is not None:
        templates.env.globals["sign_on"] = sign_on.label  # the login page's link
        app.include_router(oidc.router(sign_on, templates, access))
    if metrics_mode != "off":
        app.include_router(metrics.router(engine.store))

    @app.exception_handler(_LoginNeeded)
    async def login_needed(request: Request, _exc: _LoginNeeded) -> Response:
        if api.is_api(request.url.path):
            return api.refusal(401, "Unauthorized", "no person: send Authorization: Bearer T")
        return templates.TemplateResponse(request, "login.html", {"failed": False}, 401)

    # Starlette's class: an unknown address's 404 too, and the API's handler (api.install)
    # hands this one what is not the API's.
    @app.exception_handler(StarletteHTTPException)
    async def refused(request: Request, exc: StarletteHTTPException) -> Response:
        if not _browser(request):  # htmx shows it in #action-error; a script reads JSON
            return await http_exception_handler(request, exc)
        return _error_page(request, exc.status_code, str(exc.detail), exc.headers)

    def _error_page(
        request: Request, code: int, message: str, headers: Mapping[str, str] | None = None
    ) -> Response:
        """A refusal as a page a person reads: its status, what it says, the way back."""
        session = getattr(request.state, "session", None)
        person = getattr(request.state, "person", None)
        context = {
            "code": code,
            "phrase": HTTPStatus(code).phrase,
            "message": message,
            "csrf": session.csrf if session else "",
            "csrf_field": CSRF_FIELD,
            "user": person.name if person else "",
            "role": person.role.value if person else "",
        }
        return templates.TemplateResponse(
            request, "error.html", context, code, headers=dict(headers or {})
        )

    @app.exception_handler(RequestValidationError)
    async def bad_value(request: Request, exc: RequestValidationError) -> Response:
        # One line, as every other refusal: the field and what it must be (FastAPI's
        # default is pydantic's whole error list, the value given included).
        said = "; ".join(
            f"{error['loc'][-1] if error.get('loc') else 'request'}: {error['msg']}"
            for error in exc.errors()
        )
        if _browser(request):
            return _error_page(request, 400, f"bad request: {said}")
        return JSONResponse({"detail": f"bad request: {said}"}, 400)

    app.include_router(people.router(engine.store, pages.page))
    app.include_router(workflow_routes.router(engine, pages, access, stop))
    app.include_router(review_routes.router(engine, pages))
    app.include_router(costs.router(engine, pages))

    @app.get("/login")
    async def login_form(request: Request, token: str | None = None) -> Response:
        if token is None:
            return templates.TemplateResponse(request, "login.html", {"failed": False})
        return _logged_in(request, token)

    @app.post("/login")
    async def login(request: Request, token: Annotated[str, Form()] = "") -> Response:
        return _logged_in(request, token)

    def _logged_in(request: Request, token: str) -> Response:
        session = access.login(token)
        if session is None:
            return templates.TemplateResponse(request, "login.html", {"failed": True}, 401)
        # 303: the browser follows with a GET, and the token leaves the address bar.
        response = RedirectResponse("/", 303)
        secure = request.url.scheme == "https"
        response.set_cookie(SESSION_COOKIE, session.id, secure=secure, **SESSION_COOKIE_FLAGS)
        return response

    @app.post("/logout")
    async def logout(request: Request) -> Response:
        access.logout(request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse("/login", 303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    @app.get("/static/{name}")
    async def static(name: str) -> Response:
        if name not in _STATIC:
            raise HTTPException(404)
        return FileResponse(_HERE / "static" / name, media_type=_STATIC[name])

    app.add_middleware(_SecurityHeaders)

    api.install(app, engine, secrets)
    return app


def _browser(request: Request) -> bool:
    """Whether a refusal goes to a person's browser as a page: not the API, not
    htmx (dashboard.js shows its refusals in place), and text/html accepted."""
    return (
        not api.is_api(request.url.path)
        and not request.headers.get("HX-Request")
        and "text/html" in request.headers.get("accept", "")
    )


def _may_post(request: Request, person: Person) -> None:
    """A POST by a viewer (but logging out): 403, nothing done."""
    if request.method != "POST" or request.url.path == "/logout":
        return
    if not person.role.allows(Role.APPROVER):
        raise HTTPException(403, f"{person.name} is a {person.role.value}: viewers cannot act")


class _SecurityHeaders:
    """SECURITY_HEADERS on every answer, streams included (plain ASGI: a
    BaseHTTPMiddleware would sit between a live stream and its disconnect)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, with_headers)


def _last_event_id(request: Request, after: int | None) -> int:
    """Where a stream starts: after ``Last-Event-ID`` (a reconnecting EventSource),
    else after ``?after=``, else from the first row."""
    header = request.headers.get("last-event-id", "").strip()
    if header.isdigit():
        return int(header)
    return after if after is not None and after >= 0 else 0
