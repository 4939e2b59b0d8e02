"""wait: park until feedback arrives or the merge is allowed.

Must not touch the git working tree (docs/contracts/lifecycle.md: wait): only the store.

- preconditions: current_phase == "wait", status == "waiting".
- inputs: user_feedback (``phasegate feedback``), auto_merge,
  state.merge_approved (``phasegate approve-merge``), pr_number; on a team's
  forge what trusted people wrote on the pull request and the issue since
  state.wait_started_at, and the pull request's state (phases/forge_feedback.py).
- authoritative evidence: ``requirement_received`` for new feedback; its
  absence keeps the workflow waiting.
- side effects: none outside the store (the forge is only read).
- postconditions: feedback → current_phase == "development", dev_round + 1
  (the feedback stays in user_feedback for the build prompt); auto_merge while
  nothing holds the merge (state.merge_hold: phases/merge_gate.py), or an
  approval with a pull request (an approving review or ``/phasegate merge`` by a
  trusted person, a merge a person did on the forge) → current_phase ==
  "merge", status "merging"; the pull request closed unmerged, or the issue
  closed by a person → status "cancelled"; otherwise unchanged, status "waiting".
- re-entry point: re-entered every worker cycle while waiting; no memory.
- recovery behavior: no failure path of its own; a forge that does not answer
  pauses the workflow (forge_unavailable) and ``resume`` listens again.
- terminal outcomes: completed → development (feedback); completed → merge;
  failed (cancelled: the pull request or the issue was closed); wait.
"""

from __future__ import annotations

from phasegate.core.contract import DEVELOPMENT, MERGE, MilestoneWrite, PhaseResult, WorkflowContext
from phasegate.phases import forge_feedback, merge_gate
from phasegate.phases.deps import PhaseDeps

__all__ = ["run"]


def run(ctx: WorkflowContext, deps: PhaseDeps) -> PhaseResult:
    if ctx.user_feedback:
        return PhaseResult.advance(
            DEVELOPMENT,
            updates={"dev_round": ctx.dev_round + 1, "current_round": 0},
            state={"merge_approved": False},
            milestones=(
                MilestoneWrite(
                    "requirement_received",
                    round=ctx.dev_round + 1,
                    summary=ctx.user_feedback[:200],
                    data={"feedback": ctx.user_feedback},
                ),
            ),
        )
    heard = forge_feedback.listen(ctx, deps)
    if heard is not None:
        return heard
    hold = merge_gate.held(ctx)
    by_person = bool(ctx.state.get("merge_approved"))
    if (by_person or (ctx.auto_merge and hold is None)) and ctx.pr_number:
        who = ctx.state.get("merge_approved_by", "a person") if by_person else "auto_merge"
        return PhaseResult.advance(
            MERGE,
            milestones=(
                MilestoneWrite(
                    "merge_approved",
                    round=ctx.dev_round,
                    summary=str(who),
                    data={"by": str(who), "held": hold["reason"] if hold else None},
                ),
            ),
        )
    return PhaseResult("wait")
