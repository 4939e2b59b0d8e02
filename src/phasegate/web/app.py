"""The dashboard's HTTP app: FastAPI, Jinja2, htmx, SSE.

Routes (every one behind the token's session; ``/login`` is the way in):

    GET  /login[?token=T]          the login form; with the token: a session cookie, then /
    POST /login                    form field ``token``: the same
    POST /logout                   ends the session
    GET  /                         the board (needs you, running, waiting, done, failed)
    GET  /board                    the board's fragment (what ``/`` re-reads live)
    GET  /board/events             SSE: ``changed`` whenever a card would change
    POST /tickets                  form ``ticket``, ``title`` (optional): a new workflow
                                   filed (a worker takes it), then its page (CSRF)
    GET  /workflows/{id}           a workflow's page
    GET  /workflows/{id}/fragment  its fragment
    GET  /workflows/{id}/events    SSE: its event rows (``live``), Last-Event-ID resumes
    POST /workflows/{id}/feedback  form field ``text``: feedback (CSRF)
    POST /workflows/{id}/approve-merge    the merge approved by the token's user (CSRF)
    GET  /workflows/{id}/diff      its branch against its base, per file, numbered lines
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
    GET  /metrics                  the store's figures for Prometheus (web/metrics.py)

No session: 401 and the login form; a script may instead send
``Authorization: Bearer T`` (a wrong token: 401). A POST without the session's
CSRF token: 403, nothing done; a bearer request needs none, having no cookie to
borrow. A viewer's POST: 403, nothing done. Every action is
``phasegate.operations``' with ``by`` the person's name: a refused one is 409
with operations' message (the CLI's, word for word); a workflow a worker is
advancing: 409 too. Input refused before anything is recorded (a ticket, a
comment) is 400 with operations' message.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Form, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from sse_starlette import EventSourceResponse
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from phasegate import operations
from phasegate.agents.env import cartridge_secrets
from phasegate.core.contract import PhasegateError, ProposalNotFound, WorkflowNotFound
from phasegate.core.redaction import redact
from phasegate.git.workspace import GitError
from phasegate.runtime.engine import Engine
from phasegate.web import diff, live, metrics, views, webhooks
from phasegate.web.auth import (
    CSRF_FIELD,
    CSRF_HEADER,
    SESSION_COOKIE,
    Access,
    Person,
    Role,
    Session,
)

__all__ = ["create_app", "person_of"]

_HERE = Path(__file__).parent
_STATIC = {name: "text/javascript" for name in ("htmx.min.js", "sse.min.js", "dashboard.js")}
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
_OPEN_PATHS = frozenset({"/login"})


class _LoginNeeded(Exception):
    """No session: answered with 401 and the login form."""


def create_app(
    engine: Engine, access: Access, stop: threading.Event | None = None, metrics_mode: str = "token"
) -> FastAPI:
    """The dashboard on ``engine``'s store and cartridge: reads from the store,
    a person's actions through ``phasegate.operations`` (under the workflow's
    lease), ``by`` = ``access.user``. ``stop`` (``serve`` passes the engine's
    shutdown) ends every live stream. Every secret of the cartridge and the environment, and the
    token, is redacted from every page and event (``phasegate.core.redaction``).
    ``metrics_mode``: who reads ``/metrics`` (``web.metrics.METRICS_MODES``)."""
    store = engine.store
    stop = stop or engine.shutdown
    secrets = [*cartridge_secrets(engine.cartridge), access.token]
    templates = _templates(secrets)

    def session_of(request: Request) -> Session | None:
        return access.session(request.cookies.get(SESSION_COOKIE))

    async def guard(request: Request) -> None:
        """Every route: a bearer token, or a session and on a POST its CSRF token
        (field or header); a POST also needs a person who may decide."""
        if request.url.path in _OPEN_PATHS or request.url.path.startswith(webhooks.PREFIX):
            return  # a delivery proves itself by its forge's signature
        if metrics.open_to(request, metrics_mode):
            return  # serve --metrics local: this machine's scraper needs no token
        scheme, _, given_token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            person = access.bearer(given_token.strip())
            if person is None:
                raise HTTPException(401, "the bearer token is no person's")
            request.state.session, request.state.person = None, person
            _may_post(request, person)
            return
        session = session_of(request)
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
    if metrics_mode != "off":
        app.include_router(metrics.router(store))

    @app.exception_handler(_LoginNeeded)
    async def login_needed(request: Request, _exc: _LoginNeeded) -> Response:
        return templates.TemplateResponse(request, "login.html", {"failed": False}, 401)

    @app.exception_handler(RequestValidationError)
    async def bad_value(_request: Request, exc: RequestValidationError) -> Response:
        # One line, as every other refusal: the field and what it must be (FastAPI's
        # default is pydantic's whole error list, the value given included).
        said = "; ".join(
            f"{error['loc'][-1] if error.get('loc') else 'request'}: {error['msg']}"
            for error in exc.errors()
        )
        return JSONResponse({"detail": f"bad request: {said}"}, 400)

    def page(request: Request, name: str, context: Mapping[str, Any], code: int = 200) -> Response:
        session: Session | None = request.state.session
        person = person_of(request)
        shared = {
            "csrf": session.csrf if session else "",
            "user": person.name,
            "role": person.role.value,
            "may_decide": person.role.allows(Role.APPROVER),
            "csrf_field": CSRF_FIELD,
        }
        return templates.TemplateResponse(request, name, {**shared, **context}, code)

    def detail_of(workflow_id: str) -> dict[str, Any]:
        try:
            return views.workflow_page(store, workflow_id)
        except WorkflowNotFound:
            raise HTTPException(404, f"no workflow {workflow_id}") from None

    def shown(workflow_id: str) -> dict[str, Any]:
        """A workflow page's context: ``d`` (``views.workflow_page``), ``actions``
        (``operations.actions``: the buttons shown, none while a worker holds its
        lease) and ``awaited`` (the id of the proposal it waits on a person for, else
        None). Raises HTTPException 404 for an unknown workflow."""
        detail = detail_of(workflow_id)
        held = bool(detail["workflow"].get("worker"))
        offered = operations.actions(store.load_context(workflow_id), held=held)
        awaited = next(
            (p["id"] for p in detail["proposals"] if operations.awaiting(store, p) == workflow_id),
            None,
        )
        return {"d": detail, "actions": offered, "awaited": awaited}

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
        response.set_cookie(
            SESSION_COOKIE,
            session.id,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
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

    @app.get("/", response_class=HTMLResponse)
    def board_page(request: Request) -> Response:
        return page(request, "board.html", {"groups": views.board(store, store.clock.now())})

    @app.get("/board", response_class=HTMLResponse)
    def board_fragment(request: Request) -> Response:
        return page(request, "_board.html", {"groups": views.board(store, store.clock.now())})

    @app.get("/board/events")
    async def board_events(request: Request) -> EventSourceResponse:
        # None: the first look always tells, so a board that reconnects (a restarted
        # server, a dropped network) re-reads what changed while it was away.
        marker: list[Any] = [None]

        def batch(_last: int) -> list[tuple[int | None, str, str]]:
            now = views.board_marker(store)
            if now == marker[0]:
                return []
            marker[0] = now
            return [(None, "board", "")]

        return EventSourceResponse(
            live.stream(store, batch, 0, stop, request.is_disconnected), ping=15
        )

    @app.post("/tickets")
    def start_ticket(
        request: Request,
        ticket: Annotated[str, Form()] = "",
        title: Annotated[str, Form()] = "",
    ) -> Response:
        # Filed only: `serve`'s worker, woken by the commit, takes it from here.
        # The token too: the engine redacts the cartridge's secrets from what it files.
        given, named = redact(ticket, secrets), redact(title, secrets).strip()
        row = acted(
            lambda: operations.start(
                engine, given, by=person_of(request).name, title=named or None
            ),
            bad_input=400,
        )
        target = f"/workflows/{row['id']}"
        if request.headers.get("HX-Request"):
            # htmx would follow a 303 inside its request and swap the page in; this
            # header makes it load the page instead.
            return Response(status_code=204, headers={"HX-Redirect": target})
        return RedirectResponse(target, 303)

    @app.get("/workflows/{workflow_id}", response_class=HTMLResponse)
    def workflow_page(request: Request, workflow_id: str) -> Response:
        return page(request, "workflow.html", shown(workflow_id))

    @app.get("/workflows/{workflow_id}/fragment", response_class=HTMLResponse)
    def workflow_fragment(request: Request, workflow_id: str) -> Response:
        return page(request, "_workflow.html", shown(workflow_id))

    @app.get("/workflows/{workflow_id}/events")
    async def workflow_events(
        request: Request, workflow_id: str, after: int | None = None
    ) -> EventSourceResponse:
        detail_of(workflow_id)  # 404 before a stream starts
        resume_from = _last_event_id(request, after)

        held: list[bool] = []  # whether a worker held it at the last batch

        def batch(last: int) -> list[tuple[int | None, str, str]]:
            sent: list[tuple[int | None, str, str]] = [
                (row["id"], row["type"], live.event_json(row, secrets))
                for row in live.event_rows(store, workflow_id, last)
            ]
            # A worker letting go writes no event, yet it is what shows the page's
            # buttons again: the page re-reads its fragment on it too.
            now = bool(store.workflow_row(workflow_id).get("lease_owner"))
            if held and held[-1] != now:
                sent.append((None, live.LEASE, ""))
            held[:] = [now]
            return sent

        return EventSourceResponse(
            live.stream(store, batch, resume_from, stop, request.is_disconnected), ping=15
        )

    def commit(workflow_id: str, act: Callable[[], Any], *, bad_input: int = 409) -> Any:
        """Run a person's action (``phasegate.operations``) and return what it
        returns; the worker (woken by its commit) goes on. A refusal is 409 with
        operations' message: the CLI's (ActionRefused: ``bad_input``)."""
        detail_of(workflow_id)
        return acted(act, bad_input=bad_input)

    def acted(act: Callable[[], Any], *, bad_input: int = 409) -> Any:
        try:
            return act()
        except (WorkflowNotFound, ProposalNotFound) as exc:
            raise HTTPException(404, redact(str(exc), secrets)) from None
        except operations.ActionRefused as exc:
            raise HTTPException(bad_input, redact(str(exc), secrets)) from None
        except PhasegateError as exc:  # LeaseHeld among them: a worker advances it now
            # The CLI's message, word for word: a refusal reads the same in both.
            raise HTTPException(409, redact(str(exc), secrets)) from None

    def decided(request: Request, workflow_id: str, act: Callable[[], Any]) -> Response:
        """``commit``, then the workflow's fragment (htmx) or its page."""
        commit(workflow_id, act)
        if request.headers.get("HX-Request"):
            return page(request, "_workflow.html", shown(workflow_id))
        return RedirectResponse(f"/workflows/{workflow_id}", 303)

    @app.post("/workflows/{workflow_id}/feedback")
    def feedback(request: Request, workflow_id: str, text: Annotated[str, Form()] = "") -> Response:
        given = redact(text, secrets)  # the token too: operations redacts the cartridge's
        return decided(
            request,
            workflow_id,
            lambda: operations.feedback(engine, workflow_id, given, by=person_of(request).name),
        )

    @app.post("/workflows/{workflow_id}/approve-merge")
    def approve_merge(request: Request, workflow_id: str) -> Response:
        return decided(
            request,
            workflow_id,
            lambda: operations.approve_merge(engine, workflow_id, by=person_of(request).name),
        )

    app.add_middleware(_SecurityHeaders)

    def review_of(workflow_id: str, summary: Mapping[str, Any]) -> dict[str, Any]:
        """``_comments.html``'s context: the workflow's summary ``w``, its ``drafts``
        and the feedback its next round reads (``pending``)."""
        return {
            "w": summary,
            "drafts": operations.review_drafts(store, workflow_id),
            "pending": store.workflow_row(workflow_id)["user_feedback"],
        }

    @app.get("/workflows/{workflow_id}/diff", response_class=HTMLResponse)
    def diff_page(request: Request, workflow_id: str) -> Response:
        detail = detail_of(workflow_id)
        files, missing = _diff_of(engine, detail["workflow"])
        shown = diff.files_as_dicts(files, lambda text: redact(text, secrets))
        context = {"d": detail, "files": shown, "missing": missing, "css": diff.HIGHLIGHT_CSS}
        return page(request, "diff.html", {**context, **review_of(workflow_id, detail["workflow"])})

    def reviewed(request: Request, workflow_id: str) -> Response:
        """The drafts and pending feedback (htmx), else the diff page."""
        if request.headers.get("HX-Request"):
            summary = detail_of(workflow_id)["workflow"]
            return page(request, "_comments.html", review_of(workflow_id, summary))
        return RedirectResponse(f"/workflows/{workflow_id}/diff", 303)

    @app.post("/workflows/{workflow_id}/comments")
    def comment(
        request: Request,
        workflow_id: str,
        path: Annotated[str, Form()] = "",
        line: Annotated[int, Form()] = 0,
        text: Annotated[str, Form()] = "",
    ) -> Response:
        files, _missing = _diff_of(engine, detail_of(workflow_id)["workflow"])
        lines = {ln.new for f in files if f.path == path for ln in f.lines if ln.new}
        given = redact(text, secrets)  # the token too: operations redacts the cartridge's
        # A draft, its own event row: no state changes, so a running worker starts
        # no round on it; the person sends the review when it is whole.
        commit(
            workflow_id,
            lambda: operations.comment(
                engine, workflow_id, path, line, given, by=person_of(request).name, shown=lines
            ),
            bad_input=400,
        )
        return reviewed(request, workflow_id)

    @app.post("/workflows/{workflow_id}/review")
    def send_review(
        request: Request, workflow_id: str, text: Annotated[str, Form()] = ""
    ) -> Response:
        given = redact(text, secrets)
        commit(
            workflow_id,
            lambda: operations.send_review(engine, workflow_id, given, by=person_of(request).name),
        )
        return reviewed(request, workflow_id)

    @app.post("/workflows/{workflow_id}/resume")
    def resume(request: Request, workflow_id: str) -> Response:
        return decided(
            request,
            workflow_id,
            lambda: operations.resume(engine, workflow_id, by=person_of(request).name),
        )

    @app.post("/workflows/{workflow_id}/cancel")
    def cancel(request: Request, workflow_id: str) -> Response:
        return decided(
            request,
            workflow_id,
            lambda: operations.cancel(engine, workflow_id, by=person_of(request).name),
        )

    @app.post("/workflows/{workflow_id}/revert")
    def revert(request: Request, workflow_id: str, reason: Annotated[str, Form()] = "") -> Response:
        why = redact(reason, secrets)  # the token too: operations redacts the cartridge's
        return decided(
            request,
            workflow_id,
            lambda: operations.revert(engine, workflow_id, why, by=person_of(request).name),
        )

    @app.post("/workflows/{workflow_id}/verify-override")
    def verify_override(
        request: Request, workflow_id: str, verdict: Annotated[str, Form()] = ""
    ) -> Response:
        return decided(
            request,
            workflow_id,
            lambda: operations.verify_override(
                engine, workflow_id, verdict, by=person_of(request).name
            ),
        )

    def gated(
        request: Request, workflow_id: str, proposal_id: str, act: Callable[[], Any]
    ) -> Response:
        """A proposal of this workflow's decided (``operations.approve``/``reject``);
        another workflow's, or none: 404, nothing done."""
        found = store.proposals(workflow_id=workflow_id)
        if not any(p["id"] == proposal_id for p in found):
            raise HTTPException(404, f"workflow {workflow_id} has no proposal {proposal_id}")
        return decided(request, workflow_id, act)

    @app.post("/workflows/{workflow_id}/proposals/{proposal_id}/approve")
    def approve(request: Request, workflow_id: str, proposal_id: str) -> Response:
        return gated(
            request,
            workflow_id,
            proposal_id,
            lambda: operations.approve(engine, proposal_id, by=person_of(request).name),
        )

    @app.post("/workflows/{workflow_id}/proposals/{proposal_id}/reject")
    def reject(
        request: Request, workflow_id: str, proposal_id: str, reason: Annotated[str, Form()] = ""
    ) -> Response:
        why = redact(reason, secrets)
        return gated(
            request,
            workflow_id,
            proposal_id,
            lambda: operations.reject(engine, proposal_id, why, by=person_of(request).name),
        )

    return app


def person_of(request: Request) -> Person:
    """The person a request acts as, set by the app's guard (bearer or session)."""
    person: Person = request.state.person
    return person


def _may_post(request: Request, person: Person) -> None:
    """A POST by a viewer: 403, nothing done."""
    if request.method == "POST" and not person.role.allows(Role.APPROVER):
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


def _diff_of(engine: Engine, summary: Mapping[str, Any]) -> tuple[list[diff.DiffFile], str | None]:
    """The workflow's branch against its base, parsed; or no file and why."""
    branch = summary.get("branch_name")
    if not branch:
        return [], "no branch yet"
    base = engine.store.workflow_row(summary["id"])["base_branch"]
    try:
        return diff.parse_diff(engine.workspace.diff(engine.repo, base, branch)), None
    except GitError:
        return [], f"the branch {branch} is gone (merged and cleaned up, or deleted)"


def _last_event_id(request: Request, after: int | None) -> int:
    """Where a stream starts: after ``Last-Event-ID`` (a reconnecting EventSource),
    else after ``?after=``, else from the first row."""
    header = request.headers.get("last-event-id", "").strip()
    if header.isdigit():
        return int(header)
    return after if after is not None and after >= 0 else 0


def _templates(secrets: list[str]) -> Jinja2Templates:
    def finalize(value: Any) -> Any:
        # Every value a template prints passes here: no secret reaches a page, whatever
        # the store holds (an agent's output, a check's log, an error).
        if value is None:
            return ""
        if isinstance(value, Markup):
            return Markup(redact(str(value), secrets))
        return redact(str(value), secrets)

    env = Environment(
        loader=FileSystemLoader(_HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        finalize=finalize,
    )
    env.filters["elapsed"] = _elapsed
    env.filters["usd"] = lambda v: f"${float(v or 0):.4f}"
    return Jinja2Templates(env=env)


def _elapsed(seconds: float | None) -> str:
    """``3h 02m``, ``4m 05s``, ``12s``."""
    s = int(seconds or 0)
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"
