"""The dashboard's JSON API: every read and every action of ``phasegate.operations``
for scripts, described in OpenAPI at ``GET /openapi.json`` (docs/api.md).

Routes (each an OpenAPI operation named by its ``operationId``; an action's is
the ``phasegate.operations`` function it calls):

    GET  /api/board                              board
    GET  /api/workflows                          workflows (``status --json``)
    POST /api/workflows                          start
    GET  /api/workflows/{id}                     workflow (``show --json`` and ``actions``)
    GET  /api/workflows/{id}/events?after=N      events (``events --json``)
    GET  /api/workflows/{id}/diff                diff
    GET  /api/workflows/{id}/drafts              review_drafts
    POST /api/workflows/{id}/feedback            feedback
    POST /api/workflows/{id}/approve-merge       approve_merge
    POST /api/workflows/{id}/comments            comment
    POST /api/workflows/{id}/review              send_review
    POST /api/workflows/{id}/resume              resume
    POST /api/workflows/{id}/cancel              cancel
    POST /api/workflows/{id}/revert              revert
    POST /api/workflows/{id}/verify-override     verify_override
    POST /api/workflows/{id}/cleanup             cleanup
    POST /api/cleanup                            cleanup_all
    POST /api/retention                          expire_worktrees
    POST /api/retire                             retire_worktrees
    GET  /api/costs?by=&since=                   costs (``costs --json``, ``budget --json``)
    GET  /api/proposals?status=&workflow_id=     proposals
    GET  /api/proposals/{pid}                    proposal
    POST /api/proposals/{pid}/approve            approve
    POST /api/proposals/{pid}/reject             reject

Who acts is the person of the request (the app's guard: ``Authorization:
Bearer T``, or a session with its CSRF token on a POST); a viewer's POST is
refused. Every refusal under ``/api`` and at ``/openapi.json`` is JSON,
``{"error": {"code", "kind", "message"}}``: 400 bad input, 401 no person,
403 a viewer's action, 404 an unknown workflow or proposal, 409 an action
``phasegate.operations`` refused (its message, the CLI's word for word), 503
the store unavailable. Every secret of the cartridge and the environment, and
the token, is redacted from every answer.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from http import HTTPStatus
from typing import Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.exception_handlers import (
    http_exception_handler,
    request_validation_exception_handler,
)
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from phasegate import __version__, operations
from phasegate.changes import workflow_change
from phasegate.core.contract import PhasegateError, ProposalNotFound, WorkflowNotFound
from phasegate.core.priority import check_priority, parse_priority
from phasegate.core.redaction import redact
from phasegate.runtime.engine import Engine
from phasegate.store import PROPOSAL_STATUSES, StoreUnavailable
from phasegate.store.budgets import BudgetRefused
from phasegate.summary import iso, workflow_detail, workflow_summary
from phasegate.web import api_shapes as shapes
from phasegate.web import live, views
from phasegate.web.auth import person_of
from phasegate.web.costs import costs_view

__all__ = ["OPENAPI_PATH", "PREFIX", "ApiRefused", "install", "is_api", "refusal"]

PREFIX = "/api"
#: The API's OpenAPI description, behind the same token as the rest.
OPENAPI_PATH = "/openapi.json"
#: The most event rows one ``events`` answer holds; ``after`` pages on.
MAX_EVENTS = 1000

#: How the app reads a workflow's diff: its files, or none and why.

_REFUSALS: dict[int | str, dict[str, Any]] = {
    code: {"model": shapes.ErrorAnswer, "description": said}
    for code, said in (
        (400, "bad input"),
        (401, "no person: no token, or not a person's"),
        (403, "a viewer's action"),
        (404, "no such workflow or proposal"),
        (409, "the action is refused: operations' message"),
        (503, "the store is unavailable; nothing was half-written"),
    )
}


class ApiRefused(Exception):
    """A refusal answered as ``{"error": {"code", "kind", "message"}}``."""

    def __init__(self, code: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.code, self.kind, self.message = code, kind, message


def is_api(path: str) -> bool:
    """Whether a request's path is the API's, whose refusals are JSON."""
    return path in (OPENAPI_PATH, PREFIX) or path.startswith(PREFIX + "/")


def refusal(code: int, kind: str, message: str) -> JSONResponse:
    """The API's one error shape."""
    return JSONResponse({"error": {"code": code, "kind": kind, "message": message}}, code)


def install(app: FastAPI, engine: Engine, secrets: list[str]) -> None:
    """Add the API's routes, ``OPENAPI_PATH`` and its error shape to the dashboard's
    ``app`` (after the app's own exception handlers: it answers for ``/api`` and
    leaves the pages' to them)."""
    routes = _router(engine, secrets)
    app.include_router(routes)
    described: list[dict[str, Any]] = []  # made at its first reading, then kept

    @app.get(OPENAPI_PATH, include_in_schema=False)
    def openapi() -> dict[str, Any]:
        if not described:
            described.append(_description(routes))
        return described[0]

    @app.exception_handler(ApiRefused)
    async def refused(_request: Request, exc: ApiRefused) -> Response:
        return refusal(exc.code, exc.kind, redact(exc.message, secrets))

    pages_http = app.exception_handlers.get(HTTPException, http_exception_handler)
    pages_bad = app.exception_handlers.get(
        RequestValidationError, request_validation_exception_handler
    )

    @app.exception_handler(HTTPException)
    async def http_refused(request: Request, exc: HTTPException) -> Response:
        if not is_api(request.url.path):
            return await _answer(pages_http(request, exc))
        kind = HTTPStatus(exc.status_code).phrase.replace(" ", "").replace("-", "")
        return refusal(exc.status_code, kind, redact(str(exc.detail), secrets))

    @app.exception_handler(RequestValidationError)
    async def bad_input(request: Request, exc: RequestValidationError) -> Response:
        if not is_api(request.url.path):
            return await _answer(pages_bad(request, exc))
        said = "; ".join(
            f"{'.'.join(str(p) for p in error['loc'][1:]) or 'body'}: {error['msg']}"
            for error in exc.errors()
        )
        return refusal(400, "BadRequest", redact(f"bad request: {said}", secrets))


async def _answer(given: Response | Awaitable[Response]) -> Response:
    """A page's exception handler's answer, whether it was written sync or async."""
    return await given if inspect.isawaitable(given) else given


def _description(routes: APIRouter) -> dict[str, Any]:
    """The OpenAPI description of the API's routes (the pages are not an API),
    with the bearer token as its one security scheme."""
    described = get_openapi(
        title="phasegate API",
        version=__version__,
        description="Every read and every person's action of phasegate, as the dashboard "
        "and the CLI have them (docs/api.md). Authorization: Bearer TOKEN.",
        routes=routes.routes,
    )
    # FastAPI lists a 422 HTTPValidationError on every route that reads input; this
    # API answers bad input 400 with its one error shape (_REFUSALS), as it says.
    for operations_of in described.get("paths", {}).values():
        for operation in operations_of.values():
            operation.get("responses", {}).pop("422", None)
    schemas = described.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    described.setdefault("components", {})["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer"}
    }
    described["security"] = [{"bearer": []}]
    return described


def _router(engine: Engine, secrets: list[str]) -> APIRouter:
    store = engine.store
    routes = APIRouter(prefix=PREFIX, responses=_REFUSALS)

    def clean(value: Any) -> Any:
        """``value`` with every secret redacted from every string in it."""
        if isinstance(value, str):
            return redact(value, secrets)
        if isinstance(value, Mapping):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        if isinstance(value, datetime):
            return iso(value)
        return value

    def acted(act: Callable[[], Any], *, bad_input: int = 409) -> Any:
        """What ``act`` returns; its refusal as the pages answer it (ActionRefused:
        ``bad_input``), an unknown workflow or proposal 404."""
        try:
            return act()
        except (WorkflowNotFound, ProposalNotFound) as exc:
            raise ApiRefused(404, type(exc).__name__, str(exc)) from None
        except StoreUnavailable as exc:
            raise ApiRefused(503, type(exc).__name__, str(exc)) from None
        except operations.ActionRefused as exc:
            raise ApiRefused(bad_input, type(exc).__name__, str(exc)) from None
        except PhasegateError as exc:  # LeaseHeld among them: a worker advances it now
            raise ApiRefused(409, type(exc).__name__, str(exc)) from None

    def found(workflow_id: str) -> dict[str, Any]:
        """The workflow's row. Raises ApiRefused 404."""
        row: dict[str, Any] = acted(lambda: store.workflow_row(workflow_id))
        return row

    def moved(workflow_id: str) -> dict[str, Any]:
        """``WorkflowMoved``: the workflow's summary now and the actions that apply."""
        summary = workflow_summary(store, found(workflow_id))
        held = bool(summary.get("worker"))
        offered = operations.offered(store, workflow_id, held=held)
        return clean({"workflow": summary, "actions": list(offered)})

    def decide(workflow_id: str, act: Callable[[], Any], *, bad_input: int = 409) -> Any:
        found(workflow_id)
        acted(act, bad_input=bad_input)
        return moved(workflow_id)

    def by(request: Request) -> str:
        return person_of(request).name

    # -- reads -----------------------------------------------------------------

    @routes.get("/board", operation_id="board", response_model=shapes.Board)
    def board() -> Any:
        """The board: needs you, running, waiting, done, failed."""
        return clean({"groups": acted(lambda: views.board(store, store.clock.now()))})

    @routes.get("/workflows", operation_id="workflows", response_model=list[shapes.WorkflowSummary])
    def workflows() -> Any:
        """Every workflow, as ``phasegate status --json`` lists them."""
        return clean(acted(lambda: [workflow_summary(store, r) for r in store.list_workflows()]))

    @routes.get(
        "/workflows/{workflow_id}", operation_id="workflow", response_model=shapes.WorkflowDetail
    )
    def workflow(workflow_id: str) -> Any:
        """One workflow as ``phasegate show --json`` prints it, and the actions that apply."""
        detail = acted(lambda: workflow_detail(store, workflow_id))
        held = bool(detail["workflow"].get("worker"))
        detail["actions"] = list(operations.offered(store, workflow_id, held=held))
        return clean(detail)

    @routes.get(
        "/workflows/{workflow_id}/events",
        operation_id="events",
        response_model=list[shapes.Event],
    )
    def events(
        workflow_id: str,
        after: int = Query(0, ge=0, description="Only the rows with a greater id."),
        limit: int = Query(MAX_EVENTS, ge=1, le=MAX_EVENTS, description="At most this many."),
    ) -> Any:
        """The workflow's event rows after ``after``, oldest first (``phasegate
        events --json``); the last one's id is the next ``after``."""
        found(workflow_id)
        rows = acted(lambda: live.event_rows(store, workflow_id, after))[:limit]
        return [json.loads(live.event_json(row, secrets)) for row in rows]

    @routes.get("/workflows/{workflow_id}/diff", operation_id="diff", response_model=shapes.Diff)
    def diff(workflow_id: str) -> Any:
        """The workflow's change (``phasegate diff --json``'s): its branch against its
        base, its merge commit once merged, or fetched from the forge when another
        clone built it; per file, numbered lines."""
        found(workflow_id)
        return clean(workflow_change(engine, workflow_id).as_dict())

    @routes.get(
        "/workflows/{workflow_id}/drafts",
        operation_id="review_drafts",
        response_model=list[shapes.Draft],
    )
    def drafts(workflow_id: str) -> Any:
        """The draft review comments no review has sent yet, oldest first."""
        found(workflow_id)
        return clean([vars(d) for d in operations.review_drafts(store, workflow_id)])

    @routes.get("/costs", operation_id="costs", response_model=shapes.Costs)
    def costs(
        by: str = Query("repository", description="repository, model, role, day or workflow."),
        since: str | None = Query(None, description="2026-12-01 (UTC), 7d, today or month."),
    ) -> Any:
        """What agents spent, grouped (``phasegate costs --json``), and every budget
        with what is spent against it this UTC day and month (``phasegate budget``)."""

        def view() -> dict[str, Any]:
            try:
                return costs_view(engine, by, since)
            except BudgetRefused as exc:
                raise ApiRefused(400, type(exc).__name__, str(exc)) from None

        return clean(acted(view))

    @routes.get("/proposals", operation_id="proposals", response_model=list[shapes.Proposal])
    def proposals(status: str | None = None, workflow_id: str | None = None) -> Any:
        """Proposals, oldest first (``phasegate proposals --json``)."""
        if status is not None and status not in PROPOSAL_STATUSES:
            known = ", ".join(PROPOSAL_STATUSES)
            raise ApiRefused(400, "BadRequest", f"bad request: status: one of {known}")
        return clean(acted(lambda: store.proposals(status=status, workflow_id=workflow_id)))

    @routes.get("/proposals/{proposal_id}", operation_id="proposal", response_model=shapes.Proposal)
    def proposal(proposal_id: str) -> Any:
        return clean(acted(lambda: store.proposal(proposal_id)))

    # -- actions ---------------------------------------------------------------

    @routes.post(
        "/workflows", operation_id="start", status_code=201, response_model=shapes.WorkflowMoved
    )
    def start(request: Request, body: shapes.StartBody) -> Any:
        """File a ticket: a new workflow in preparation, which a worker takes."""
        title = redact(body.title, secrets).strip() if body.title else None
        row = acted(
            lambda: operations.start(
                engine,
                redact(body.ticket, secrets),
                by=by(request),
                title=title or None,
                auto_merge=body.auto_merge,
                profile=body.profile,
                priority=_priority(body.priority) if body.priority is not None else 0,
            ),
            bad_input=400,
        )
        return moved(row["id"])

    @routes.post(
        "/workflows/{workflow_id}/feedback",
        operation_id="feedback",
        response_model=shapes.WorkflowMoved,
    )
    def feedback(request: Request, workflow_id: str, body: shapes.FeedbackBody) -> Any:
        """Feedback for the agents: a waiting workflow goes back to development with it."""
        text = redact(body.text, secrets)
        return decide(
            workflow_id, lambda: operations.feedback(engine, workflow_id, text, by=by(request))
        )

    @routes.post(
        "/workflows/{workflow_id}/approve-merge",
        operation_id="approve_merge",
        response_model=shapes.WorkflowMoved,
    )
    def approve_merge(request: Request, workflow_id: str) -> Any:
        """Let a waiting workflow merge; the person is its ``merge_approved_by``."""
        return decide(
            workflow_id, lambda: operations.approve_merge(engine, workflow_id, by=by(request))
        )

    @routes.post(
        "/workflows/{workflow_id}/comments",
        operation_id="comment",
        status_code=201,
        response_model=list[shapes.Draft],
    )
    def comment(request: Request, workflow_id: str, body: shapes.CommentBody) -> Any:
        """A draft comment on a line of the diff; moves nothing until ``review``.
        Answers the drafts now."""
        found(workflow_id)
        files = workflow_change(engine, workflow_id).files
        lines = {ln.new for f in files if f.path == body.path for ln in f.lines if ln.new}
        text = redact(body.text, secrets)
        drafts = acted(
            lambda: operations.comment(
                engine, workflow_id, body.path, body.line, text, by=by(request), shown=lines
            ),
            bad_input=400,
        )
        return clean([vars(d) for d in drafts])

    @routes.post(
        "/workflows/{workflow_id}/review",
        operation_id="send_review",
        response_model=shapes.WorkflowMoved,
    )
    def send_review(request: Request, workflow_id: str, body: shapes.ReviewBody) -> Any:
        """The drafts, and ``text``, sent as one feedback for the next round."""
        text = redact(body.text, secrets)
        return decide(
            workflow_id,
            lambda: operations.send_review(engine, workflow_id, text, by=by(request)),
        )

    @routes.post(
        "/workflows/{workflow_id}/resume",
        operation_id="resume",
        response_model=shapes.WorkflowMoved,
    )
    def resume(request: Request, workflow_id: str) -> Any:
        """Run the current phase again: a failed, paused or interrupted workflow goes on."""
        return decide(workflow_id, lambda: operations.resume(engine, workflow_id, by=by(request)))

    @routes.post(
        "/workflows/{workflow_id}/cancel",
        operation_id="cancel",
        response_model=shapes.WorkflowMoved,
    )
    def cancel(request: Request, workflow_id: str) -> Any:
        """End a workflow that is not completed, for good."""
        return decide(workflow_id, lambda: operations.cancel(engine, workflow_id, by=by(request)))

    @routes.post(
        "/workflows/{workflow_id}/revert",
        operation_id="revert",
        response_model=shapes.WorkflowMoved,
    )
    def revert(request: Request, workflow_id: str, body: shapes.RevertBody) -> Any:
        """Back to planning with a reason (a reversion, at most 3 a workflow)."""
        why = redact(body.reason, secrets)
        return decide(
            workflow_id,
            lambda: operations.revert(
                engine, workflow_id, why, by=by(request), to_phase=body.to_phase
            ),
        )

    @routes.post(
        "/workflows/{workflow_id}/verify-override",
        operation_id="verify_override",
        response_model=shapes.WorkflowMoved,
    )
    def verify_override(request: Request, workflow_id: str, body: shapes.VerifyBody) -> Any:
        """A person's acceptance verdict; a rejection's reason is commented on the issue."""
        why = redact(body.reason, secrets)
        return decide(
            workflow_id,
            lambda: operations.verify_override(
                engine, workflow_id, body.verdict, by=by(request), reason=why
            ),
        )

    @routes.post(
        "/workflows/{workflow_id}/priority",
        operation_id="set_priority",
        response_model=shapes.WorkflowMoved,
    )
    def priority(request: Request, workflow_id: str, body: shapes.PriorityBody) -> Any:
        """Change where the workflow is claimed in the queue (high, normal, low or an
        integer); no lease is needed, so a running workflow's changes too."""
        # Read here: bad input is 400, a finished workflow 409.
        value = acted(lambda: _priority(body.priority), bad_input=400)
        return decide(
            workflow_id,
            lambda: operations.set_priority(store, workflow_id, value, by=by(request)),
        )

    @routes.post(
        "/workflows/{workflow_id}/cleanup",
        operation_id="cleanup",
        response_model=list[shapes.CleanupOutcome],
    )
    def cleanup(request: Request, workflow_id: str) -> Any:
        """Retry a merged workflow's failed cleanup (or a cancelled one's pull request)."""
        found(workflow_id)
        return clean(acted(lambda: operations.cleanup(engine, workflow_id, by=by(request))))

    @routes.post("/cleanup", operation_id="cleanup_all", response_model=list[shapes.CleanupOutcome])
    def cleanup_all(request: Request) -> Any:
        """Retry every workflow's failed cleanup."""
        return clean(acted(lambda: operations.cleanup(engine, by=by(request))))

    @routes.post(
        "/retention", operation_id="expire_worktrees", response_model=list[shapes.Retirement]
    )
    def expire_worktrees(request: Request) -> Any:
        """Apply the worktree retention now (landing_areas.keep_failed_days and
        keep_cancelled_days)."""
        return clean(acted(lambda: operations.expire_worktrees(engine)))

    @routes.post("/retire", operation_id="retire_worktrees", response_model=list[shapes.Retirement])
    def retire_worktrees(request: Request, body: shapes.RetireBody) -> Any:
        """Remove now the worktree and local branch of the failed or cancelled workflows
        named (``cleanup --all``); the forge keeps what was pushed."""
        return clean(
            acted(lambda: operations.retire_worktrees(engine, set(body.ids), by=by(request)))
        )

    def gated(outcome: operations.GateOutcome) -> dict[str, Any]:
        return clean(
            {
                "proposal": outcome.proposal,
                "recorded_before": outcome.recorded_before,
                "workflow_id": outcome.workflow_id,
                "streak": outcome.streak,
                "graduation_streak": outcome.policy.graduation_streak,
            }
        )

    @routes.post(
        "/proposals/{proposal_id}/approve",
        operation_id="approve",
        response_model=shapes.GateOutcome,
    )
    def approve(request: Request, proposal_id: str) -> Any:
        """Approve a proposal; the workflow paused for it goes on."""
        return gated(acted(lambda: operations.approve(engine, proposal_id, by=by(request))))

    @routes.post(
        "/proposals/{proposal_id}/reject",
        operation_id="reject",
        response_model=shapes.GateOutcome,
    )
    def reject(request: Request, proposal_id: str, body: shapes.RejectBody) -> Any:
        """Reject a proposal saying why; the workflow paused for its draft PR starts a new
        run, one paused for its pieces pauses with the reason."""
        why = redact(body.reason, secrets)
        return gated(acted(lambda: operations.reject(engine, proposal_id, why, by=by(request))))

    return routes


def _priority(given: int | str) -> int:
    """The priority a request body gives, read as ``phasegate priority`` reads it.
    Raises ActionRefused with the CLI's words."""
    return parse_priority(given) if isinstance(given, str) else check_priority(given)
