"""A person's decisions, as PhaseResults for the single commit path.

Pure: each function reads the context and returns the result to commit
(``Engine.decide`` commits it under the workflow's lease). Raises
ContractViolation, changing nothing, when the decision does not fit the
workflow's state. The acceptance override lives with its phase
(``phases.acceptance_verification.override``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from phasegate.core.contract import (
    PHASE_STATUS_MAP,
    PIECES,
    PLANNING,
    WAIT,
    ContractViolation,
    EventWrite,
    PhaseResult,
    WorkflowContext,
)
from phasegate.core.profiles import REVERTIBLE_PHASES, reversion_refusal, reversion_result
from phasegate.core.state import WorkflowState

if TYPE_CHECKING:
    from datetime import datetime

__all__ = [
    "DECISION_EVENT",
    "approve_merge",
    "approved_by",
    "decision_event",
    "feedback",
    "pieces_refusal",
    "resume",
    "revert",
    "revert_refusal",
]

#: The event every person's action adds to the workflow's stream: ``{"action", "by", ...}``.
DECISION_EVENT = "decision"


def decision_event(action: str, by: str, **data: Any) -> EventWrite:
    """The ``decision`` event of ``action`` taken by ``by``, with ``data`` beside."""
    return EventWrite(DECISION_EVENT, {"action": action, "by": by, **data})


#: What ``--to-phase`` accepts: our planning, or strategize, other tools' name for it.
REVERSION_TARGETS = (PLANNING, "strategize")

#: Counters that bound a phase's own retries; a person's resume grants a new set.
_RETRY_COUNTERS: WorkflowState = {
    "test_retries": 0,
    "verification_attempt": 0,
    "verification_parse_failures": 0,
}


def _open(ctx: WorkflowContext) -> None:
    if ctx.status == "completed":
        raise ContractViolation(f"workflow {ctx.id} is completed")


def resume(ctx: WorkflowContext) -> PhaseResult:
    """Run the current phase again, with fresh retry counters (failed, paused, interrupted).

    A ``blocked`` workflow starts without waiting any longer for what has not completed
    (the commit drops those dependencies: docs/epics.md). An epic's parent waiting for
    its pieces is refused here: only the store sees whether a piece ended without
    completing (``operations.resume`` lets it go on without those)."""
    _open(ctx)
    if ctx.status == PIECES:
        raise ContractViolation(pieces_refusal(ctx.id, ctx.error))
    return PhaseResult(
        "retry", status=PHASE_STATUS_MAP[ctx.current_phase], state=_RETRY_COUNTERS.copy()
    )


def pieces_refusal(workflow_id: str, error: str | None) -> str:
    """Why a resume of an epic's parent whose pieces are all still running is refused."""
    return (
        f"workflow {workflow_id} waits for its pieces ({error or 'see `phasegate show`'}) and "
        "none of them failed or was cancelled: it completes when they do; "
        f"`phasegate cancel {workflow_id}` stops it and its pieces"
    )


def approved_by(ctx: WorkflowContext) -> str | None:
    """Who approved the merge of a workflow in wait that has not merged yet
    (``approve_merge``), else None."""
    if ctx.current_phase != WAIT or not ctx.state.get("merge_approved"):
        return None
    return str(ctx.state.get("merge_approved_by") or "a person")


def feedback(ctx: WorkflowContext, text: str) -> PhaseResult:
    """Give the agents ``text``: a waiting workflow goes back to development with it
    (docs/contracts/lifecycle.md: wait); any other goes on in its phase with it in the next prompt.
    Refused (ContractViolation) once its merge is approved: that would drop the
    approval without a word; a person who changed their mind reverts it."""
    _open(ctx)
    if not text.strip():
        raise ContractViolation("the feedback is empty")
    who = approved_by(ctx)
    if who is not None:
        raise ContractViolation(
            f"workflow {ctx.id}'s merge is approved (by {who}) and it merges next; feedback "
            f"now would drop that approval. To change it anyway: `phasegate revert {ctx.id} "
            "--reason ...`"
        )
    return PhaseResult(
        "retry", status=PHASE_STATUS_MAP[ctx.current_phase], updates={"user_feedback": text}
    )


def _where(ctx: WorkflowContext) -> str:
    """Where the workflow is, for a refusal: "is completed", "is in wait (waiting)"."""
    if ctx.current_phase == ctx.status:
        return f"is {ctx.status}"
    return f"is in {ctx.current_phase} ({ctx.status})"


def approve_merge(ctx: WorkflowContext, by: str) -> PhaseResult:
    """Let a waiting workflow merge. Only what a person has seen may be approved:
    the report of a workflow in wait."""
    if ctx.current_phase != WAIT:
        raise ContractViolation(
            f"workflow {ctx.id} {_where(ctx)}, not waiting for a merge approval; "
            "`phasegate show` says what it needs"
        )
    who = approved_by(ctx)
    if who is not None:
        raise ContractViolation(f"workflow {ctx.id}'s merge is already approved (by {who})")
    if not by.strip():
        # The name is the record of who let a held change through: it cannot be blank.
        raise ContractViolation("an approval needs a name: --by NAME")
    return PhaseResult(
        "retry",
        status=PHASE_STATUS_MAP[WAIT],
        state={"merge_approved": True, "merge_approved_by": by.strip()},
    )


def revert_refusal(ctx: WorkflowContext) -> str | None:
    """Why the workflow's state admits no manual reversion now (its phase, a merge
    done, the loop guard), else None: what ``revert`` refuses whatever its reason."""
    merged = ctx.milestone("merge_completed")
    if ctx.current_phase not in REVERTIBLE_PHASES or (merged and merged.status == "completed"):
        return (
            f"workflow {ctx.id} {_where(ctx)}; a reversion to planning is possible "
            f"from {', '.join(REVERTIBLE_PHASES)} before the merge"
        )
    return reversion_refusal(ctx.id, ctx.state)


def revert(ctx: WorkflowContext, to_phase: str, reason: str, at: datetime) -> PhaseResult:
    """A person reverts the workflow to planning (docs/contracts/autonomy.md: manual reversion).

    The profile's thresholds do not apply; the loop guard does (at most
    MAX_REVERSIONS). Allowed from development, pr_review, report, wait and a
    merge not yet done. ``at`` is the decision record's timestamp (the
    engine's clock). Raises ContractViolation, changing nothing, otherwise.
    """
    _open(ctx)
    to_phase = to_phase.strip().lower()
    if to_phase not in REVERSION_TARGETS:
        raise ContractViolation(
            f"a workflow reverts to planning only (or strategize, its other name), not {to_phase!r}"
        )
    if not reason.strip():
        raise ContractViolation("the reason is empty; say why the plan must change")
    refusal = revert_refusal(ctx)
    if refusal is not None:
        raise ContractViolation(refusal)
    context = f"A person reverted the workflow from {ctx.current_phase}: {reason}"
    stopped_on = ctx.state.get("stopped_on") or ctx.error
    if stopped_on:  # the failure it had stopped on is the next plan's input too
        context += f"\n\nIt had stopped on: {stopped_on}"
    return reversion_result(ctx, reason=reason, context=context, at=at, automatic=False)
