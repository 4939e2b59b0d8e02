"""The dashboard, ``phasegate serve``: the board, a workflow's page,
live events over SSE, behind a token and CSRF.

A thin skin: reads come from the store, a person's decisions go through the
engine's single commit path.

``create_app`` (app.py) makes the FastAPI app; ``Access`` (auth.py) holds
the tokens, the people they stand for and the sessions; people.py is the
admins' people page; ``serve`` (serve.py) runs it with uvicorn beside the worker.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phasegate.web.app import create_app
    from phasegate.web.auth import Access

__all__ = ["Access", "create_app"]

#: Where each name lives; it loads on first use, so ``phasegate events`` reads
#: ``live`` without importing FastAPI.
_HOMES = {"Access": "phasegate.web.auth", "create_app": "phasegate.web.app"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value
