"""The eight phase handlers behind one registry (docs/contracts/lifecycle.md: phase handlers).

Each module's docstring states its phase's eight contract fields.
"""

from __future__ import annotations

from collections.abc import Callable

from phasegate.core.contract import (
    ACCEPTANCE_VERIFICATION,
    DEVELOPMENT,
    MERGE,
    PLANNING,
    PR_REVIEW,
    PREPARATION,
    REPORT,
    WAIT,
    PhasegateError,
    PhaseResult,
    WorkflowContext,
)
from phasegate.phases import (
    acceptance_verification,
    development,
    merge,
    planning,
    pr_review,
    preparation,
    report,
    wait,
)
from phasegate.phases.deps import PhaseDeps

__all__ = ["PHASE_HANDLERS", "PhaseDeps", "PhaseHandler", "resolve_phase_handler"]

PhaseHandler = Callable[[WorkflowContext, PhaseDeps], PhaseResult]

PHASE_HANDLERS: dict[str, PhaseHandler] = {
    PREPARATION: preparation.run,
    PLANNING: planning.run,
    DEVELOPMENT: development.run,
    PR_REVIEW: pr_review.run,
    REPORT: report.run,
    WAIT: wait.run,
    MERGE: merge.run,
    ACCEPTANCE_VERIFICATION: acceptance_verification.run,
}


def resolve_phase_handler(phase: str) -> PhaseHandler:
    """The handler of ``phase``. Raises PhasegateError for a phase with none."""
    try:
        return PHASE_HANDLERS[phase]
    except KeyError:
        raise PhasegateError(f"no handler for phase {phase!r}") from None
