"""What every page route shares: templates, a page's context, a workflow, an action answered.

One ``Pages`` is made per app (``create_app``); the routers of the board, a
workflow's page and its review take it, so a page reads and a refusal
answers the same way whichever router serves it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from fastapi import HTTPException, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from phasegate import operations
from phasegate.core.contract import PhasegateError, ProposalNotFound, WorkflowNotFound
from phasegate.core.redaction import redact
from phasegate.runtime.engine import Engine
from phasegate.web import board, markdown, timeline, views
from phasegate.web.auth import CSRF_FIELD, Role, Session, person_of

__all__ = ["LANGUAGE_COOKIE", "Pages", "templates_for"]

_HERE = Path(__file__).parent
#: A person's chosen report language (``en``/``zh``), else their browser's.
LANGUAGE_COOKIE = "phasegate_lang"


class Pages:
    """The dashboard's pages on ``engine``'s store: ``templates`` (``templates_for``
    with ``secrets``), and how a route renders, reads a workflow and answers a
    person's action. Every secret in ``secrets`` is redacted from what it says."""

    def __init__(self, engine: Engine, secrets: list[str]) -> None:
        self.engine = engine
        self.store = engine.store
        self.secrets = secrets
        self.templates = templates_for(secrets, engine.store.clock.now)

    def page(
        self, request: Request, name: str, context: Mapping[str, Any], code: int = 200
    ) -> Response:
        session: Session | None = request.state.session
        person = person_of(request)
        shared = {
            "csrf": session.csrf if session else "",
            "user": person.name,
            "role": person.role.value,
            "may_decide": person.role.allows(Role.APPROVER),
            "csrf_field": CSRF_FIELD,
        }
        return self.templates.TemplateResponse(request, name, {**shared, **context}, code)

    def detail_of(self, workflow_id: str, language: str | None = None) -> dict[str, Any]:
        try:
            return views.workflow_page(self.store, workflow_id, language)
        except WorkflowNotFound:
            raise HTTPException(404, f"no workflow {workflow_id}") from None

    def shown(self, workflow_id: str, request: Request) -> dict[str, Any]:
        """A workflow page's context: ``d`` (``views.workflow_page``), ``actions``
        (``operations.offered``: the buttons shown, none while a worker holds its
        lease) and ``awaited`` (the id of the proposal it waits on a person for, else
        None). Raises HTTPException 404 for an unknown workflow."""
        chosen = request.query_params.get("lang") or request.cookies.get(LANGUAGE_COOKIE)
        detail = self.detail_of(workflow_id, markdown.viewer_language(chosen, request.headers))
        held = bool(detail["workflow"].get("worker"))
        offered = operations.offered(self.store, workflow_id, held=held)
        awaited = next(
            (
                p["id"]
                for p in detail["proposals"]
                if operations.awaiting(self.store, p) == workflow_id
            ),
            None,
        )
        return {"d": detail, "actions": offered, "awaited": awaited}

    def commit(self, workflow_id: str, act: Callable[[], Any], *, bad_input: int = 409) -> Any:
        """Run a person's action (``phasegate.operations``) and return what it
        returns; the worker (woken by its commit) goes on. A refusal is 409 with
        operations' message: the CLI's (ActionRefused: ``bad_input``)."""
        self.detail_of(workflow_id)
        return self.acted(act, bad_input=bad_input)

    def acted(self, act: Callable[[], Any], *, bad_input: int = 409) -> Any:
        try:
            return act()
        except (WorkflowNotFound, ProposalNotFound) as exc:
            raise HTTPException(404, redact(str(exc), self.secrets)) from None
        except operations.ActionRefused as exc:
            raise HTTPException(bad_input, redact(str(exc), self.secrets)) from None
        except PhasegateError as exc:  # LeaseHeld among them: a worker advances it now
            # The CLI's message, word for word: a refusal reads the same in both.
            raise HTTPException(409, redact(str(exc), self.secrets)) from None

    def decided(self, request: Request, workflow_id: str, act: Callable[[], Any]) -> Response:
        """``commit``, then the workflow's fragment (htmx) or its page."""
        self.commit(workflow_id, act)
        if request.headers.get("HX-Request"):
            return self.page(request, "_workflow.html", self.shown(workflow_id, request))
        return RedirectResponse(f"/workflows/{workflow_id}", 303)


def templates_for(secrets: list[str], now: Callable[[], datetime]) -> Jinja2Templates:
    """The dashboard's templates: every value printed redacted of ``secrets``, and
    the filters ``elapsed``, ``when`` (relative to ``now()``), ``usd``, ``machine``."""

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
    env.filters["when"] = lambda at: timeline.when(at, now())
    env.filters["usd"] = lambda v: f"${float(v or 0):.4f}"
    env.filters["machine"] = board.machine_of
    return Jinja2Templates(env=env)


def _elapsed(seconds: float | None) -> str:
    """``3h 02m``, ``4m 05s``, ``12s``."""
    s = int(seconds or 0)
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"
