"""The actions a workflow's state admits now, by name: what a front end offers as
buttons; pure, it reads the workflow's context only.

``phasegate.operations`` re-exports ``ACTIONS`` and ``actions``.
"""

from __future__ import annotations

from phasegate.core import decisions
from phasegate.core.contract import (
    ACCEPTANCE_VERIFICATION,
    AWAITING_APPROVAL,
    BLOCKED,
    CANCELLED,
    MERGE,
    RUNNABLE_STATUSES,
    WAIT,
    WorkflowContext,
)
from phasegate.phases import cleanup as cleanup_phase
from phasegate.phases.cleanup import KIND as CLEANUP

__all__ = ["ACTIONS", "actions"]


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


def actions(ctx: WorkflowContext, *, held: bool = False) -> tuple[str, ...]:
    """The actions that apply to the workflow now, by name, in ACTIONS' order: what a
    front end offers: buttons for exactly the actions that apply.

    ``held``: another process advances the workflow (its lease is live), so every
    action would be refused with LeaseHeld: none applies. An action offered is one
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
    if decisions.revert_refusal(ctx) is None:
        offered.add("revert")
    return tuple(a for a in ACTIONS if a in offered)
