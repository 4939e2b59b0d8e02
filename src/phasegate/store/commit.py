"""The single commit path (docs/contracts/lifecycle.md): a PhaseResult
validated and written in one transaction, fenced on the workflow's version and,
under a lease, on its fence; a conflict child's end wakes its parent.

``commit_phase_result`` is the only code that changes a workflow's
``current_phase`` or ``status`` for a phase's outcome.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, NoReturn

import sqlalchemy as sa

from phasegate.core.contract import (
    CANCELLED,
    COMPLETED,
    ENDED_STATUSES,
    NEEDS_YOU_STATUSES,
    PHASE_STATUS_MAP,
    ContractViolation,
    EventWrite,
    MilestoneWrite,
    PhaseResult,
    StaleContext,
    WorkflowContext,
    WorkflowNotFound,
    is_legal_next_phase,
    next_phase,
)
from phasegate.store import dependencies, ports
from phasegate.store import tables as t
from phasegate.store._base import INSERT_EVENT, Dialect, FenceLost, StoreBase, event_params, utc
from phasegate.store.leases import Fence
from phasegate.store.values import WOKEN_AT

__all__ = [
    "NEEDS_YOU_EVENT",
    "NEEDS_YOU_EVENT_STATUSES",
    "UPDATABLE_COLUMNS",
    "commit_phase_result",
    "dedupe_key",
    "milestone_upsert",
    "milestone_writes",
    "workflow_dict",
]

_c = t.workflows.c

#: The statuses a workflow never leaves: no proposal of its is decided any more.
_FINAL = frozenset({COMPLETED, CANCELLED})

#: The commit's UPDATE, built once: its SET columns are the keys of the
#: parameters it is executed with (SQLAlchemy compiles, and caches, one SQL
#: string per set of keys), its WHERE names its own parameters (``w_*``: a
#: parameter named as a column is that column's new value). ``RETURNING`` hands
#: back the new row in the same statement, so nothing is read again.
_UPDATE = (
    t.workflows.update()
    .where(_c.id == sa.bindparam("w_id"), _c.version == sa.bindparam("w_version"))
    # A wait a webhook overtook (it woke the workflow while this phase looked) stays
    # due now: the look may have missed what the delivery announced.
    .values(
        due_at=sa.case(
            (sa.and_(sa.bindparam("w_wait", type_=sa.Boolean), _c.due_at == WOKEN_AT), None),
            else_=sa.bindparam("w_due", type_=t.Timestamp),
        )
    )
    .returning(t.workflows)
)
#: The same, only while the lease is still this worker's (owner and fence).
_UPDATE_FENCED = _UPDATE.where(
    _c.lease_owner == sa.bindparam("w_owner"), _c.fence == sa.bindparam("w_fence")
)

#: Workflow columns a PhaseResult may set through ``updates``. current_phase and
#: status are deliberately absent: only the outcome decides those.
UPDATABLE_COLUMNS = frozenset(
    {
        "current_round",
        "dev_round",
        # A workflow taken over by another clone of its forge repository (takeover.py)
        "repo_path",
        "branch_name",
        "worktree_path",
        "issue_number",
        "pr_number",
        "merge_sha",
        "auto_merge",
        "user_feedback",
    }
)


#: The event a commit moving a workflow into a status of ``NEEDS_YOU_EVENT_STATUSES``
#: appends, in its own transaction: ``{"status", "from", "phase", "version"}`` (the
#: version that commit wrote). One per transition, whichever process commits it, and
#: never lost to a crash after the commit: the notifications deliver from it
#: (``phasegate.integrations.notify``).
NEEDS_YOU_EVENT = "needs_you"

#: A person's turn (``NEEDS_YOU_STATUSES``), or a failure a person must look at.
NEEDS_YOU_EVENT_STATUSES: frozenset[str] = NEEDS_YOU_STATUSES | {"failed"}


def workflow_dict(row: Mapping[Any, Any]) -> dict[str, Any]:
    """A workflow row as a dict, its timestamps UTC-aware."""
    out = dict(row)
    for key in ("created_at", "updated_at", "completed_at", "lease_expires_at"):
        out[key] = utc(out[key])
    if "due_at" in out:  # absent from a store at a revision before 0006
        out["due_at"] = utc(out["due_at"])
    return out


def dedupe_key(workflow_id: str, phase: str, write: MilestoneWrite) -> str:
    """A milestone's unique key: ``{workflow}:{phase}:{kind}:r{round}:a{attempt}[:{key}]``."""
    key = f"{workflow_id}:{phase}:{write.kind}:r{write.round}:a{write.attempt}"
    return f"{key}:{write.key}" if write.key else key


def milestone_writes(
    workflow_id: str, phase: str, writes: Iterable[MilestoneWrite], now: datetime
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The parameters of ``milestone_upsert`` for ``writes`` (in the phase ``phase``
    unless a write names its own), and those of their ``milestone_updated`` events
    (``INSERT_EVENT``), in the same order: ``(milestones, events)``."""
    milestones: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    for write in writes:
        where = write.phase or phase
        key = dedupe_key(workflow_id, where, write)
        milestones.append(
            {
                "workflow_id": workflow_id,
                "kind": write.kind,
                "phase": where,
                "round": write.round,
                "attempt": write.attempt,
                "dedupe_key": key,
                "status": write.status,
                "summary": write.summary,
                "data": dict(write.data),
                "created_at": now,
                "updated_at": now,
            }
        )
        events.append(
            {
                "workflow_id": workflow_id,
                "type": "milestone_updated",
                "data": {"kind": write.kind, "phase": where, "status": write.status, "key": key},
                "created_at": now,
            }
        )
    return milestones, events


def milestone_upsert(dialect: Dialect, returning: bool = False) -> Any:
    """``INSERT … ON CONFLICT (dedupe_key) DO UPDATE`` of one milestone, built once
    per dialect: a write of an existing key settles that row in place (status,
    summary, data, updated_at), keeping its id, kind, phase, round and attempt.
    Executed with ``milestone_writes``' parameters (a list of them: one
    executemany). With ``returning`` it hands back the row written."""
    built = _UPSERTS.get((dialect.name, returning))
    if built is not None:
        return built
    insert = dialect.insert(t.milestones)
    upsert = insert.on_conflict_do_update(
        index_elements=[t.milestones.c.dedupe_key],
        set_={name: insert.excluded[name] for name in ("status", "summary", "data", "updated_at")},
    )
    built = upsert.returning(t.milestones) if returning else upsert
    _UPSERTS[(dialect.name, returning)] = built
    return built


#: ``milestone_upsert``'s statements by (dialect name, returning).
_UPSERTS: dict[tuple[str, bool], Any] = {}


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
    store: StoreBase,
    ctx: WorkflowContext,
    result: PhaseResult,
    *,
    fence: Fence | None = None,
    due_in_s: float | None = None,
) -> dict[str, Any]:
    """The single commit path (docs/contracts/lifecycle.md: the single commit path).

    In one transaction: validates ``result``, updates the workflow row (phase,
    status, error, ``updates``, merged ``state``), upserts the milestones and
    appends the events it carries (and a ``NEEDS_YOU_EVENT`` when the status
    changes into one of ``NEEDS_YOU_EVENT_STATUSES``). Only ``outcome == "completed"`` changes
    ``current_phase``; ``failed``/``pause`` set status ``failed``/``paused``
    (or ``result.status``) with ``result.reason`` as the error; ``retry`` and
    ``wait`` keep the phase and its status.

    With ``fence`` (the lease the engine advances under) the row is updated
    only while that lease is still this worker's: a worker whose lease was
    taken over commits nothing.

    ``due_in_s``: the workflow is due again (``workflows.due_at``) that many
    seconds after the commit, by the store's clock (a wait for the forge's CI
    or its people: its next look); None, it is due at once, as after any change
    (a person's decision). Workers claim a runnable workflow only once due.

    A change of status releases, in the same transaction, the workflows waiting for
    this one once all they wait for completed (``dependencies.on_status``).
    A workflow's end (completed, failed or cancelled) releases its port range
    (``store.ports``) in the same transaction.

    A workflow completed or cancelled supersedes its proposals still ``proposed``
    in the same transaction: nobody decides them any more.

    A child's end (completed, failed or cancelled) wakes its parent in the same
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
        "due_at": None if due_in_s is None else now + timedelta(seconds=due_in_s),
    }
    if phase == COMPLETED and ctx.current_phase != COMPLETED:
        values["completed_at"] = now

    statement = _UPDATE_FENCED if fence is not None else _UPDATE
    params = {k: v for k, v in values.items() if k != "due_at"}
    params.update(w_id=ctx.id, w_version=ctx.version, w_due=values["due_at"])
    params["w_wait"] = result.outcome == "wait"
    if fence is not None:
        params.update(w_owner=fence.owner, w_fence=fence.value)
    milestones, events = milestone_writes(ctx.id, ctx.current_phase, result.milestones, now)
    events += [event_params(ctx.id, event, now) for event in result.events]
    if status != ctx.status and status in NEEDS_YOU_EVENT_STATUSES and _needs_a_person(ctx, values):
        entered = {"status": status, "from": ctx.status, "phase": phase, "version": ctx.version + 1}
        events.append(event_params(ctx.id, EventWrite(NEEDS_YOU_EVENT, entered), now))
    with store.transaction() as conn:
        row = conn.execute(statement, params).first()
        if row is None:
            _refuse(conn, ctx, fence)
        if milestones:
            conn.execute(milestone_upsert(store.dialect), milestones)
        if events:
            conn.execute(INSERT_EVENT, events)
        if ctx.parent_workflow_id and status in ENDED_STATUSES:
            _wake_parent(store, conn, ctx.parent_workflow_id, ctx.id, status, now)
        if status != ctx.status:  # who waits for it, or what it waits for (docs/epics.md)
            dependencies.on_status(store, conn, ctx.id, ctx.status, status, now)
        if status in ENDED_STATUSES and status != ctx.status:
            ports.release(conn, ctx.id)  # its worktree runs nothing more
        if status in _FINAL and status != ctx.status:
            # A workflow that ended waits for no decision: its open proposals are closed.
            # A failed one keeps them: `resume` may pause it for them again.
            open_ = (t.proposals.c.workflow_id == ctx.id) & (t.proposals.c.status == "proposed")
            ended = {"status": "superseded", "reason": f"superseded: its workflow {status}"}
            conn.execute(t.proposals.update().where(open_).values(**ended))
        store.dialect.notify(conn)  # a person's decision, a settled phase: workers look
    return workflow_dict(row._mapping)


def _needs_a_person(ctx: WorkflowContext, values: Mapping[str, Any]) -> bool:
    """Whether the status the commit enters waits for a person. A pause with a due
    time does not: the worker resumes it then (a forge outage, runtime/outage.py).
    Nor does a workflow that waits for its merge with ``auto_merge`` and nothing
    holding it, or with an approval already given: it merges on its own (no
    needs-you event, so no notification)."""
    if values["status"] == "paused" and values["due_at"] is not None:
        return False
    if values["status"] != "waiting" or values["current_phase"] != "wait":
        return True
    state = values["state"]
    unattended = ctx.auto_merge and not state.get("merge_hold")
    return not (unattended or state.get("merge_approved"))


def _wake_parent(
    store: StoreBase, conn: sa.Connection, parent_id: str, child_id: str, how: str, now: Any
) -> None:
    """Give the parent paused for ``child_id`` its phase's status back: it is
    runnable again, due at once, and decides on the child's outcome (``how``) itself."""
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
            due_at=None,
        )
    )
    store.write_event(
        conn, parent_id, EventWrite("child_ended", {"child": child_id, "status": how})
    )


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
