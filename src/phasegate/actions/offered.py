"""The actions a workflow's state admits now, by name: what a front end offers as buttons.

``actions`` is pure: it reads the workflow's context only, and what its caller
says of the rest. ``offered`` reads what that is from the store: whether a
piece of an epic's parent ended without completing (a resume then goes on
without it). ``phasegate.operations`` re-exports all three.
"""

from __future__ import annotations

from phasegate.core import decisions
from phasegate.core.contract import (
    ACCEPTANCE_VERIFICATION,
    AWAITING_APPROVAL,
    BLOCKED,
    CANCELLED,
    MERGE,
    PIECES,
    RUNNABLE_STATUSES,
    WAIT,
    WorkflowContext,
)
from phasegate.core.dependencies import ENDED_UNCOMPLETED
from phasegate.phases import cleanup as cleanup_phase
from phasegate.phases.cleanup import KIND as CLEANUP
from phasegate.store import Store

__all__ = ["ACTIONS", "actions", "offered"]


#: Every action on a workflow ``actions`` may offer, in the order a page lists them.
ACTIONS = (
    "approve_merge",
    "feedback",
    "approve",
    "reject",
    "verify_override",
    "resume",
    "revert",
    "cancel",
    "cleanup",
)

#: Where a person is asked for words: a report waiting, a stop to explain.
_FEEDBACK_STATUSES = frozenset({"waiting", "paused", "failed", "planning_timeout"})


def actions(
    ctx: WorkflowContext, *, held: bool = False, pieces_ended: bool = False
) -> tuple[str, ...]:
    """The actions that apply to the workflow now, by name, in ACTIONS' order: what a
    front end offers: buttons for exactly the actions that apply.

    ``held``: another process advances the workflow (its lease is live), so every
    action would be refused with LeaseHeld: none applies. ``pieces_ended``: it is
    an epic's parent waiting for its pieces, one of which failed or was cancelled,
    so a resume goes on without it (``offered`` reads it). An action offered is one
    the workflow's state admits (its function may still refuse its input: an
    empty feedback, an empty reason); ``approve``/``reject`` are for the proposal
    the workflow awaits. Pure: reads ``ctx`` only.
    """
    if held:
        return ()
    if ctx.status == CANCELLED:
        closing = ctx.milestone(cleanup_phase.CLOSE_KIND)
        return ("cleanup",) if closing and closing.status == "failed" else ()
    if ctx.status == "completed":
        cleaned = ctx.milestone(CLEANUP, phase=MERGE)
        return ("cleanup",) if cleaned and cleaned.status == "failed" else ()
    offered = {"cancel"}
    approved = decisions.approved_by(ctx) is not None
    if ctx.current_phase == WAIT and not approved:
        offered.add("approve_merge")
    if ctx.status in _FEEDBACK_STATUSES and not approved:
        offered.add("feedback")
    if ctx.status == AWAITING_APPROVAL:
        offered |= {"approve", "reject"}
    if ctx.current_phase == ACCEPTANCE_VERIFICATION:
        offered.add("verify_override")
    stopped = ctx.status in ("failed", "paused", "planning_timeout", BLOCKED)
    if stopped or (ctx.status in RUNNABLE_STATUSES and ctx.status != "waiting"):
        offered.add("resume")  # a stop, or a runnable workflow nobody advances: interrupted
    if ctx.status == PIECES and pieces_ended:
        offered.add("resume")
    if decisions.revert_refusal(ctx) is None:
        offered.add("revert")
    return tuple(a for a in ACTIONS if a in offered)


def offered(store: Store, workflow_id: str, *, held: bool = False) -> tuple[str, ...]:
    """``actions`` of the workflow as the store holds it now, ``pieces_ended`` read
    from its pieces. Raises WorkflowNotFound, StoreUnavailable."""
    ctx = store.load_context(workflow_id)
    ended = ctx.status == PIECES and any(
        e["kind"] == "piece" and e["status"] in ENDED_UNCOMPLETED
        for e in store.dependencies(workflow_id)
    )
    return actions(ctx, held=held, pieces_ended=ended)
