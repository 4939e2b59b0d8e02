"""The board's and a workflow page's routes: what they show, live, and a person's decisions on them.

Routes (mounted by ``create_app``, behind its guard):

    GET  /                         the board, filtered by its address (``web.board``)
    GET  /board                    the board's fragment (what ``/`` re-reads live)
    GET  /board/events             SSE: ``changed`` whenever a card would change
    POST /tickets                  a new workflow filed (a worker takes it), then its page
    GET  /workflows/{id}           a workflow's page (``?lang=`` the report's language)
    GET  /workflows/{id}/fragment  its fragment
    GET  /workflows/{id}/events    SSE: its event rows (``live``), Last-Event-ID resumes
    POST /workflows/{id}/...       feedback, approve-merge, resume, cancel, revert,
                                   verify-override, proposals/{pid}/approve|reject
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sse_starlette import EventSourceResponse

from phasegate import operations
from phasegate.core.redaction import redact
from phasegate.runtime.engine import Engine
from phasegate.web import board, live, markdown, views
from phasegate.web.auth import Access, person_of, stream_ended
from phasegate.web.pages import LANGUAGE_COOKIE, Pages

__all__ = ["router"]


def router(engine: Engine, pages: Pages, access: Access, stop: threading.Event) -> APIRouter:
    """The board's and workflow pages' routes on ``engine``; ``stop`` ends every
    live stream, as does the person's losing their way in (``stream_ended``)."""
    store, secrets = engine.store, pages.secrets
    routes = APIRouter()

    def board_of(request: Request) -> dict[str, Any]:
        """The board's context: its ``groups`` as the address filters them, the
        ``filter`` (``board.BoardFilter``) and the ``choices`` each filter offers."""
        groups = views.board(store, store.clock.now())
        chosen = board.BoardFilter.of(request.query_params)
        offered = board.choices(groups)
        shown = board.filtered(groups, chosen)
        return {
            "groups": shown,
            "machines": board.machines(shown),
            "filter": chosen,
            "choices": offered,
            "shared": len(offered["repository"]) > 1,
        }

    @routes.get("/", response_class=HTMLResponse)
    def board_page(request: Request) -> Response:
        return pages.page(request, "board.html", board_of(request))

    @routes.get("/board", response_class=HTMLResponse)
    def board_fragment(request: Request) -> Response:
        return pages.page(request, "_board.html", board_of(request))

    @routes.get("/board/events")
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
            live.stream(store, batch, 0, stop, stream_ended(access, request)), ping=15
        )

    @routes.post("/tickets")
    def start_ticket(
        request: Request,
        ticket: Annotated[str, Form()] = "",
        title: Annotated[str, Form()] = "",
    ) -> Response:
        # Filed only: `serve`'s worker, woken by the commit, takes it from here.
        # The token too: the engine redacts the cartridge's secrets from what it files.
        given, named = redact(ticket, secrets), redact(title, secrets).strip()
        row = pages.acted(
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

    @routes.get("/workflows/{workflow_id}", response_class=HTMLResponse)
    def workflow_page(request: Request, workflow_id: str) -> Response:
        response = pages.page(request, "workflow.html", pages.shown(workflow_id, request))
        chosen = request.query_params.get("lang")
        if chosen in markdown.LANGUAGES:  # kept for the person's next pages
            response.set_cookie(LANGUAGE_COOKIE, chosen, httponly=True, samesite="strict")
        return response

    @routes.get("/workflows/{workflow_id}/fragment", response_class=HTMLResponse)
    def workflow_fragment(request: Request, workflow_id: str) -> Response:
        return pages.page(request, "_workflow.html", pages.shown(workflow_id, request))

    @routes.get("/workflows/{workflow_id}/events")
    async def workflow_events(
        request: Request, workflow_id: str, after: int | None = None
    ) -> EventSourceResponse:
        pages.detail_of(workflow_id)  # 404 before a stream starts
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
            live.stream(store, batch, resume_from, stop, stream_ended(access, request)), ping=15
        )

    @routes.post("/workflows/{workflow_id}/feedback")
    def feedback(request: Request, workflow_id: str, text: Annotated[str, Form()] = "") -> Response:
        given = redact(text, secrets)  # the token too: operations redacts the cartridge's
        return pages.decided(
            request,
            workflow_id,
            lambda: operations.feedback(engine, workflow_id, given, by=person_of(request).name),
        )

    @routes.post("/workflows/{workflow_id}/approve-merge")
    def approve_merge(request: Request, workflow_id: str) -> Response:
        return pages.decided(
            request,
            workflow_id,
            lambda: operations.approve_merge(engine, workflow_id, by=person_of(request).name),
        )

    @routes.post("/workflows/{workflow_id}/resume")
    def resume(request: Request, workflow_id: str) -> Response:
        return pages.decided(
            request,
            workflow_id,
            lambda: operations.resume(engine, workflow_id, by=person_of(request).name),
        )

    @routes.post("/workflows/{workflow_id}/cancel")
    def cancel(request: Request, workflow_id: str) -> Response:
        return pages.decided(
            request,
            workflow_id,
            lambda: operations.cancel(engine, workflow_id, by=person_of(request).name),
        )

    @routes.post("/workflows/{workflow_id}/revert")
    def revert(request: Request, workflow_id: str, reason: Annotated[str, Form()] = "") -> Response:
        why = redact(reason, secrets)  # the token too: operations redacts the cartridge's
        return pages.decided(
            request,
            workflow_id,
            lambda: operations.revert(engine, workflow_id, why, by=person_of(request).name),
        )

    @routes.post("/workflows/{workflow_id}/priority")
    def priority(
        request: Request, workflow_id: str, priority: Annotated[str, Form()] = ""
    ) -> Response:
        return pages.decided(
            request,
            workflow_id,
            lambda: operations.set_priority(
                store, workflow_id, priority, by=person_of(request).name
            ),
        )

    @routes.post("/workflows/{workflow_id}/verify-override")
    def verify_override(
        request: Request, workflow_id: str, verdict: Annotated[str, Form()] = ""
    ) -> Response:
        return pages.decided(
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
        return pages.decided(request, workflow_id, act)

    @routes.post("/workflows/{workflow_id}/proposals/{proposal_id}/approve")
    def approve(request: Request, workflow_id: str, proposal_id: str) -> Response:
        return gated(
            request,
            workflow_id,
            proposal_id,
            lambda: operations.approve(engine, proposal_id, by=person_of(request).name),
        )

    @routes.post("/workflows/{workflow_id}/proposals/{proposal_id}/reject")
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

    return routes


def _last_event_id(request: Request, after: int | None) -> int:
    """Where a stream starts: after ``Last-Event-ID`` (a reconnecting EventSource),
    else after ``?after=``, else from the first row."""
    header = request.headers.get("last-event-id", "").strip()
    if header.isdigit():
        return int(header)
    return after if after is not None and after >= 0 else 0
