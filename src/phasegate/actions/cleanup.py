"""A person's cleanup actions: a merged workflow's failed cleanup retried, the worktree
retention applied, and ``cleanup --all`` (docs/worktrees.md).

``phasegate.operations`` re-exports them for the CLI and the dashboard.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from phasegate.core.decisions import decision_event
from phasegate.core.inputs import check_by
from phasegate.phases import cleanup as cleanup_phase
from phasegate.runtime import retention
from phasegate.runtime.engine import Engine, LeaseHeld
from phasegate.runtime.retention import candidates as retirable

__all__ = ["cleanup", "expire_worktrees", "retire_worktrees"]


def cleanup(engine: Engine, workflow_id: str | None = None, *, by: str) -> list[dict[str, Any]]:
    """Retry removing merged workflows' worktrees and branches, and closing
    cancelled workflows' pull requests (phases/cleanup.py): ``workflow_id``'s,
    else every workflow whose cleanup failed.

    One outcome per workflow: ``{"id", "cleanup", "retried", "reason"}``, cleanup
    ``completed``, ``failed`` (reason: git's or the forge's), ``none`` (not merged yet) or
    ``busy`` (another process holds it; reason: LeaseHeld's). A retry is a
    ``decision`` event of action ``cleanup``. Raises WorkflowNotFound.
    """
    check_by(by)
    store = engine.store
    ids = [workflow_id] if workflow_id else cleanup_phase.waiting(store)
    outcomes = []
    for wf in ids:
        try:
            settled = engine.retry_cleanup(wf)
        except LeaseHeld as exc:
            outcomes.append({"id": wf, "cleanup": "busy", "retried": False, "reason": str(exc)})
            continue
        if settled is not None:
            store.add_event(wf, decision_event("cleanup", by, status=settled.status))
        found = settled or cleanup_phase.latest(store.load_context(wf))
        status = found.status if found else "none"
        reason = found.summary if found and status == "failed" else None
        outcomes.append(
            {"id": wf, "cleanup": status, "retried": settled is not None, "reason": reason}
        )
    return outcomes


def expire_worktrees(engine: Engine) -> list[dict[str, Any]]:
    """Retention now (runtime/retention.py: ``expire``): failed and cancelled workflows'
    worktrees and local branches past ``landing_areas.keep_*_days`` removed."""
    return retention.expire(engine, engine.store.clock.now(), busy=LeaseHeld)


def retire_worktrees(engine: Engine, ids: Collection[str], *, by: str) -> list[dict[str, Any]]:
    """``cleanup --all`` (runtime/retention.py: ``retire``): the worktree and local branch
    of each failed or cancelled workflow of ``ids`` (``retirable``) removed now; the
    forge keeps what was pushed. Raises ActionRefused (``by``), StoreUnavailable."""
    check_by(by)
    found = [r for r in retirable(engine) if r.id in ids]
    return retention.retire(engine, found, why=f"cleanup --all by {by}", busy=LeaseHeld)
