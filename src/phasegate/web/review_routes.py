"""A workflow's diff page and the line comments a person drafts on it, sent as one review.

Routes (mounted by ``create_app``, behind its guard):

    GET  /workflows/{id}/diff      its change per file, numbered lines (phasegate.changes)
    POST /workflows/{id}/comments  form ``path``, ``line``, ``text``: a draft comment on a
                                   line of the diff; moves nothing (CSRF)
    POST /workflows/{id}/review    form ``text`` (optional): the drafts sent as one
                                   feedback for the next round (CSRF)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from phasegate import operations
from phasegate.changes import workflow_change
from phasegate.core.redaction import redact
from phasegate.runtime.engine import Engine
from phasegate.web import diff
from phasegate.web.auth import person_of
from phasegate.web.pages import Pages

__all__ = ["router"]


def router(engine: Engine, pages: Pages) -> APIRouter:
    """The review routes on ``engine``: drafts are events, a review a feedback."""
    store, secrets = engine.store, pages.secrets
    routes = APIRouter()

    def review_of(workflow_id: str, summary: Mapping[str, Any]) -> dict[str, Any]:
        """``_comments.html``'s context: the workflow's summary ``w``, its ``drafts``
        and the feedback its next round reads (``pending``)."""
        return {
            "w": summary,
            "drafts": operations.review_drafts(store, workflow_id),
            "pending": store.workflow_row(workflow_id)["user_feedback"],
        }

    @routes.get("/workflows/{workflow_id}/diff", response_class=HTMLResponse)
    def diff_page(request: Request, workflow_id: str) -> Response:
        detail = pages.detail_of(workflow_id)
        change = workflow_change(engine, workflow_id)
        shown = diff.files_as_dicts(change.files, lambda text: redact(text, secrets))
        context = {"d": detail, "files": shown, "change": change, "css": diff.HIGHLIGHT_CSS}
        return pages.page(
            request, "diff.html", {**context, **review_of(workflow_id, detail["workflow"])}
        )

    def reviewed(request: Request, workflow_id: str) -> Response:
        """The drafts and pending feedback (htmx), else the diff page."""
        if request.headers.get("HX-Request"):
            summary = pages.detail_of(workflow_id)["workflow"]
            return pages.page(request, "_comments.html", review_of(workflow_id, summary))
        return RedirectResponse(f"/workflows/{workflow_id}/diff", 303)

    @routes.post("/workflows/{workflow_id}/comments")
    def comment(
        request: Request,
        workflow_id: str,
        path: Annotated[str, Form()] = "",
        line: Annotated[int, Form()] = 0,
        text: Annotated[str, Form()] = "",
    ) -> Response:
        pages.detail_of(workflow_id)  # 404 for an unknown workflow
        files = workflow_change(engine, workflow_id).files
        lines = {ln.new for f in files if f.path == path for ln in f.lines if ln.new}
        given = redact(text, secrets)  # the token too: operations redacts the cartridge's
        # A draft, its own event row: no state changes, so a running worker starts
        # no round on it; the person sends the review when it is whole.
        pages.commit(
            workflow_id,
            lambda: operations.comment(
                engine, workflow_id, path, line, given, by=person_of(request).name, shown=lines
            ),
            bad_input=400,
        )
        return reviewed(request, workflow_id)

    @routes.post("/workflows/{workflow_id}/review")
    def send_review(
        request: Request, workflow_id: str, text: Annotated[str, Form()] = ""
    ) -> Response:
        given = redact(text, secrets)
        pages.commit(
            workflow_id,
            lambda: operations.send_review(engine, workflow_id, given, by=person_of(request).name),
        )
        return reviewed(request, workflow_id)

    return routes
