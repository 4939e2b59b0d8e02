"""The costs page: what agents spent, grouped, and every budget with what is spent
against it, for anyone signed in (viewers too).

Routes::

    GET  /costs[?by=GROUP&since=WHEN]   the page: ``by`` repository (default), model,
                                         role, day or workflow; ``since`` 2026-12-01,
                                         7d (whole UTC days), today or month
                                         (default: all time)

``GET /api/costs`` (web/api.py) answers with what the page shows, as JSON
(``costs_view``): ``{"costs": …, "repository", "budgets"}``, where ``costs`` is
``phasegate costs --json``'s answer and ``repository`` and ``budgets`` are
``phasegate budget --json``'s; a grouping or a ``since`` it does not know is
the page again with the message, 400.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from phasegate.agents.budgets import budget_report, costs_report, repository_here, since_of
from phasegate.runtime.engine import Engine
from phasegate.store.budgets import COST_GROUPS, STORE_SCOPE, BudgetRefused
from phasegate.web.pages import Pages

__all__ = ["costs_view", "router"]


def costs_view(engine: Engine, by: str, since: str | None) -> dict[str, Any]:
    """``costs`` (``agents.budgets.costs_report``: ``by``, ``since``, ``rows``,
    ``total``), ``repository`` (the one the dashboard serves, as budgets name it)
    and ``budgets`` (``Budget.as_dict`` each: the whole store's, this repository's,
    every other one budgeted in the store). Raises BudgetRefused for a grouping
    or a ``since`` it does not know."""
    store = engine.store
    here = repository_here(store, engine.cartridge, engine.repo)
    return {
        "costs": costs_report(store, by, since_of(since, store.clock.now())),
        "repository": here,
        "budgets": [b.as_dict() for b in budget_report(store, engine.cartridge, here)],
    }


def router(engine: Engine, pages: Pages) -> APIRouter:
    """The costs page on ``engine``'s store."""
    routes = APIRouter()

    @routes.get("/costs")
    def costs(request: Request, by: str = "repository", since: str = "") -> Response:
        context: Mapping[str, Any] = {"by": by, "since": since, "groups": COST_GROUPS}
        try:
            view = costs_view(engine, by, since or None)
        except BudgetRefused as exc:
            return pages.page(request, "costs.html", {**context, "refused": str(exc)}, 400)
        return pages.page(request, "costs.html", {**context, **view, "everyone": STORE_SCOPE})

    return routes
