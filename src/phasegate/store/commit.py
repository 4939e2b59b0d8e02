"""The single commit path (spec 000, ``_commit_phase_result``): a PhaseResult
validated and written in one transaction, fenced on the workflow's version and,
under a lease, on its fence; a conflict child's end wakes its parent.

``commit_phase_result`` is the only code that changes a workflow's
``current_phase`` or ``status`` for a phase's outcome.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import sqlalchemy as sa

from phasegate.contract import (
    COMPLETED,
    PHASE_STATUS_MAP,
    ContractViolation,
    EventWrite,
    PhaseResult,
    StaleContext,
    WorkflowContext,
    WorkflowNotFound,
    is_legal_next_phase,
    next_phase,
)
from phasegate.store import tables as t
from phasegate.store._base import FenceLost
from phasegate.store.leases import Fence

if TYPE_CHECKING:
    from phasegate.store.workflows import WorkflowRows

__all__ = ["UPDATABLE_COLUMNS", "commit_phase_result"]

#: Workflow columns a PhaseResult may set through ``updates``. current_phase and
#: status are deliberately absent: only the outcome decides those.
UPDATABLE_COLUMNS = frozenset(
    {
        "current_round",
        "dev_round",
        "branch_name",
        "worktree_path",
        "issue_number",
        "pr_number",
        "merge_sha",
        "auto_merge",
        "user_feedback",
    }
)


def _validate(ctx: WorkflowContext, result: PhaseResult) -> None:
    if result.next_phase is not None:
        if result.outcome != "completed":
            raise ContractViolation(
                f"next_phase {result.next_phase!r} given with outcome {result.outcome!r}; "
                "only a completed outcome moves the phase"
            )
        if not is_legal_next_phase(result.next_phase):
            raise ContractViolation(
                f"illegal next_phase {result.next_phase!r} from {ctx.current_phase!r}; "
                "expected a phase in PHASE_ORDER or one of wait, completed"
            )
    unknown = set(result.updates) - UPDATABLE_COLUMNS
    if unknown:
        raise ContractViolation(f"a PhaseResult may not set {sorted(unknown)}")


def commit_phase_result(
    store: WorkflowRows, ctx: WorkflowContext, result: PhaseResult, *, fence: Fence | None = None
) -> dict[str, Any]:
    """The single commit path (spec 000, ``_commit_phase_result``).

    In one transaction: validates ``result``, updates the workflow row (phase,
    status, error, ``updates``, merged ``state``), upserts the milestones and
    appends the events it carries. Only ``outcome == "completed"`` changes
    ``current_phase``; ``failed``/``pause`` set status ``failed``/``paused``
    (or ``result.status``) with ``result.reason`` as the error; ``retry`` and
    ``wait`` keep the phase and its status.

    With ``fence`` (the lease the engine advances under) the row is updated
    only while that lease is still this worker's: a worker whose lease was
    taken over commits nothing.

    A child's end (completed or failed) wakes its parent in the same
    transaction (``_wake_parent``): a parent paused for that child
    (``state["conflict_child"]``, phases/conflict.py) gets its phase's status
    back, so the next advance resumes its merge.

    Returns the workflow's new row. Raises ContractViolation (an illegal
    ``next_phase`` or update; nothing written), StaleContext (the row moved
    past ``ctx.version``; nothing written), FenceLost (another claim moved the
    fence on; nothing written, ``fence.lost`` set), StoreUnavailable (locked
    past the busy timeout, full; rolled back, nothing written).
    """
    _validate(ctx, result)
    phase = ctx.current_phase
    if result.outcome == "completed":
        phase = result.next_phase or next_phase(ctx.current_phase)
        status = result.status or PHASE_STATUS_MAP[phase]
        error = None
    elif result.outcome == "failed":
        status, error = result.status or "failed", result.reason
    elif result.outcome == "pause":
        status, error = result.status or "paused", result.reason
    else:
        status = result.status or PHASE_STATUS_MAP.get(phase, ctx.status)
        error = None

    now = store.clock.now()
    values: dict[str, Any] = {
        **result.updates,
        "current_phase": phase,
        "status": status,
        "error": error,
        "state": {**ctx.state, **result.state},
        "version": ctx.version + 1,
        "updated_at": now,
    }
    if phase == COMPLETED and ctx.current_phase != COMPLETED:
        values["completed_at"] = now

    c = t.workflows.c
    where = [c.id == ctx.id, c.version == ctx.version]
    if fence is not None:
        where += [c.lease_owner == fence.owner, c.fence == fence.value]
    with store.transaction() as conn:
        updated = conn.execute(t.workflows.update().where(*where).values(**values)).rowcount
        if updated != 1:
            _refuse(conn, ctx, fence)
        for write in result.milestones:
            store._upsert_milestone(conn, ctx.id, ctx.current_phase, write)
        for event in result.events:
            store._add_event(conn, ctx.id, event)
        if ctx.parent_workflow_id and status in ("completed", "failed"):
            _wake_parent(store, conn, ctx.parent_workflow_id, ctx.id, status, now)
        store.dialect.notify(conn)  # a person's decision, a settled phase: workers look
        # Read in the same transaction: once it commits, nothing is left to fail.
        return store._workflow_row(conn, ctx.id)


def _wake_parent(
    store: WorkflowRows, conn: sa.Connection, parent_id: str, child_id: str, how: str, now: Any
) -> None:
    """Give the parent paused for ``child_id`` its phase's status back: it is
    runnable again and decides on the child's outcome (``how``) itself."""
    c = t.workflows.c
    parent = conn.execute(
        sa.select(c.status, c.current_phase, c.version, c.state).where(c.id == parent_id)
    ).first()
    if (
        parent is None
        or parent.status != "paused"
        or (parent.state or {}).get("conflict_child") != child_id
    ):
        return  # a person moved it on meanwhile, or it waits for something else
    conn.execute(
        t.workflows.update()
        .where(c.id == parent_id, c.version == parent.version)
        .values(
            status=PHASE_STATUS_MAP[parent.current_phase],
            error=None,
            version=parent.version + 1,
            updated_at=now,
        )
    )
    store._add_event(conn, parent_id, EventWrite("child_ended", {"child": child_id, "status": how}))


def _refuse(conn: sa.Connection, ctx: WorkflowContext, fence: Fence | None) -> NoReturn:
    """Why the commit's UPDATE matched no row: the version moved, or the fence."""
    c = t.workflows.c
    row = conn.execute(sa.select(c.version, c.lease_owner, c.fence).where(c.id == ctx.id)).first()
    if row is None:
        raise WorkflowNotFound(ctx.id)
    if row.version != ctx.version:
        raise StaleContext(
            f"workflow {ctx.id} changed since version {ctx.version}; result not committed"
        )
    if fence is not None:
        fence.lost.set()
    raise FenceLost(
        f"workflow {ctx.id}: the lease is held by {row.lease_owner} (fence {row.fence}), "
        f"not {fence.owner if fence else '?'} (fence {fence.value if fence else '?'}); "
        "result not committed"
    )
