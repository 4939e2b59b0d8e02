"""Persistence: the schema, its migrations, the Store and the single commit path.

The names below load with ``phasegate.store.store`` on first use, so importing
one part (``phasegate.store.tables``) does not import the rest.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from phasegate.store.values import HEAD_REVISION, UsageTotals

if TYPE_CHECKING:
    from phasegate.store.store import (
        APPLY_ARM,
        DEFAULT_BUSY_TIMEOUT_S,
        AgentRunRecord,
        Fence,
        FenceLost,
        PortsUnavailable,
        Store,
        StoreUnavailable,
        StoreUrlUnsupported,
        commit_phase_result,
        open_store,
        store_server_problem,
        store_url_problem,
    )

#: Where a proposal stands. ``superseded``: a workflow's proposal nobody decided
#: before a later run of that workflow was recorded (a revert, feedback, a new run);
#: never decided, never counted in a streak. Here, not in ``tables``, so that the
#: command line's help names them without importing SQLAlchemy.
PROPOSAL_STATUSES = ("proposed", "approved", "rejected", "applied", "superseded")

__all__ = [
    "APPLY_ARM",
    "DEFAULT_BUSY_TIMEOUT_S",
    "AgentRunRecord",
    "Fence",
    "FenceLost",
    "HEAD_REVISION",
    "PROPOSAL_STATUSES",
    "PortsUnavailable",
    "Store",
    "StoreUnavailable",
    "StoreUrlUnsupported",
    "UsageTotals",
    "commit_phase_result",
    "open_store",
    "store_server_problem",
    "store_url_problem",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module("phasegate.store.store"), name)
    globals()[name] = value
    return value
