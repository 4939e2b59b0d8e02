"""A person's decisions, as PhaseResults for the single commit path.

Pure: each function reads the context and returns the result to commit
(``Engine.decide`` commits it under the workflow's lease). Raises
ContractViolation, changing nothing, when the decision does not fit the
workflow's state. The acceptance override lives with its phase
(``phases.acceptance_verification.override``).
"""

from __future__ import annotations

from phasegate.contract import (
    PHASE_STATUS_MAP,
    WAIT,
    ContractViolation,
    PhaseResult,
    WorkflowContext,
)

__all__ = ["approve_merge", "feedback", "resume"]

#: Counters that bound a phase's own retries; a person's resume grants a new set.
_RETRY_COUNTERS = {"test_retries": 0, "verification_attempt": 0, "verification_parse_failures": 0}


def _open(ctx: WorkflowContext) -> None:
    if ctx.status == "completed":
        raise ContractViolation(f"workflow {ctx.id} is completed")


def resume(ctx: WorkflowContext) -> PhaseResult:
    """Run the current phase again, with fresh retry counters (failed, paused, interrupted)."""
    _open(ctx)
    return PhaseResult(
        "retry", status=PHASE_STATUS_MAP[ctx.current_phase], state=dict(_RETRY_COUNTERS)
    )


def feedback(ctx: WorkflowContext, text: str) -> PhaseResult:
    """Give the agents ``text``: a waiting workflow goes back to development with it
    (spec 000, wait); any other goes on in its phase with it in the next prompt."""
    _open(ctx)
    if not text.strip():
        raise ContractViolation("the feedback is empty")
    return PhaseResult(
        "retry", status=PHASE_STATUS_MAP[ctx.current_phase], updates={"user_feedback": text}
    )


def approve_merge(ctx: WorkflowContext, by: str) -> PhaseResult:
    """Let a waiting workflow merge. Only what a person has seen may be approved:
    the report of a workflow in wait."""
    if ctx.current_phase != WAIT:
        raise ContractViolation(
            f"workflow {ctx.id} is in {ctx.current_phase} ({ctx.status}), not waiting for a "
            "merge approval; `phasegate show` says what it needs"
        )
    return PhaseResult(
        "retry",
        status=PHASE_STATUS_MAP[WAIT],
        state={"merge_approved": True, "merge_approved_by": by},
    )
