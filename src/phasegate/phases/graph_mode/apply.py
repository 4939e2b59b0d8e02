"""The apply arm of graph mode: an approved (or ``auto``) draft PR's patch lands as
one commit on the workflow's branch, which is published (docs/contracts/graph.md:
the harness)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from phasegate.agents.env import cartridge_secrets, redact
from phasegate.agents.service import violation_event
from phasegate.core.contract import DEVELOPMENT, MilestoneWrite, PhaseResult, WorkflowContext
from phasegate.core.state import WorkflowState
from phasegate.git.workspace import PatchError
from phasegate.phases.attempts import measure_change, refused_change
from phasegate.phases.deps import PhaseDeps, developed, worktree_of

__all__ = ["PROPOSAL_TRAILER", "apply_draft"]

#: The line of an applied proposal's commit message that names it: git is the
#: evidence that the apply arm already landed it when a restart asks again.
PROPOSAL_TRAILER = "Phasegate-Proposal"


def apply_draft(
    ctx: WorkflowContext,
    deps: PhaseDeps,
    draft: Mapping[str, Any],
    run: Mapping[str, Any],
    updates: dict[str, Any],
    state: WorkflowState,
    milestones: tuple[MilestoneWrite, ...],
) -> PhaseResult:
    """The apply arm: the approved (or auto) patch lands as one commit on the workflow's
    branch, the proposal is marked applied, the branch is published.

    The commit carries a ``Phasegate-Proposal`` trailer, so a restart that
    finds it at HEAD applies nothing twice.
    """
    cwd = worktree_of(ctx)
    trailer = f"{PROPOSAL_TRAILER}: {draft['id']}"
    if trailer not in deps.workspace.commit_message(cwd, "HEAD"):
        deps.workspace.discard_changes(cwd)  # half an apply a crash left behind
        before = deps.workspace.rev(cwd, "HEAD")
        try:
            deps.workspace.apply_patch(cwd, str(draft["payload"]["patch"]))
        except PatchError as exc:
            return PhaseResult(
                "pause",
                updates=updates,
                reason=f"proposal {draft['id']} does not apply to the branch: {exc}; "
                "`phasegate revert` re-plans",
                state=state,
                milestones=milestones,
            )
        limit = deps.limits.max_diff_bytes
        secrets = cartridge_secrets(deps.cartridge)
        change = measure_change(cwd, before, before, limit)
        refused = refused_change(change, limit, secrets, cwd)
        if refused is not None:
            # An approval does not make a key (raw or encoded) or an oversized
            # patch fit to commit: nothing of it lands, a person decides.
            deps.workspace.reset_to(cwd, before)
            return PhaseResult(
                "pause",
                updates=updates,
                reason=f"proposal {draft['id']}: {refused.name}: {refused.detail}; "
                "nothing was applied",
                state=state,
                milestones=milestones,
                events=(
                    violation_event("build", DEVELOPMENT, refused, secrets, round=ctx.dev_round),
                ),
            )
        deps.workspace.commit_all(
            cwd,
            f"{redact(ctx.title, secrets)}\n\nphasegate workflow {ctx.id}, "
            f"graph run {run['graph_run']}, attempt {draft['attempts']}\n\n{trailer}",
        )
    applied = deps.store.apply_proposal(str(draft["id"]))
    for shaped in deps.store.proposals(run_id=str(run["graph_run"]), status="proposed"):
        # scope's item_create, routed to this build: the ticket it shapes is the
        # workflow's own, filed in preparation and now built; the apply arm takes
        # it where the policy lets it (a propose one stays for a person).
        if shaped["kind"] == "item_create" and shaped["mode"] == "auto":
            deps.store.apply_proposal(str(shaped["id"]))
    head = deps.workspace.rev(cwd, "HEAD")
    assert ctx.branch_name is not None
    deps.effects.push_branch(DEVELOPMENT, ctx.branch_name, head)
    done = MilestoneWrite(
        "dev_completed",
        round=ctx.dev_round,
        summary=f"head {head[:12]}, proposal {draft['id']} applied by {applied['decided_by']}",
        data={
            "head": head,
            "attempts": draft["attempts"],
            "proposal": draft["id"],
            "run_id": run["graph_run"],
            "decided_by": applied["decided_by"],
        },
    )
    return developed(
        head,
        (*milestones, done),
        updates=updates,
        state={
            **state,
            "graph_proposal": draft["id"],
            # the next run (feedback) starts from the ticket, not from this run's rejections
            "graph_ticket": None,
        },
    )
