"""preparation: the issue, the branch and the worktree.

The only phase that creates the worktree, so ``advance()`` skips the worktree
self-heal for it (spec 000, preparation).

- preconditions: current_phase == "preparation", status == "preparing"; the
  repository exists and has the base branch.
- inputs: title, ticket, repo_path, base_branch, the cartridge's worktree_root.
- authoritative evidence: the ``branch_created`` milestone (completed); also
  ``issue_created`` and ``worktree_ready``.
- side effects: forge issue (journaled), git branch (journaled), git worktree.
- postconditions: issue_number, branch_name, worktree_path set;
  current_phase == "planning", status == "planning".
- re-entry point: current_phase == "preparation". A completed issue or branch
  milestone is reused, a surviving branch is attached to, a leftover directory
  at the worktree path is cleared (#814).
- recovery behavior: a git or forge error leaves ``branch_created`` failed and
  the workflow failed with the reason; ``phasegate resume`` re-runs the phase
  without a second issue.
- terminal outcomes: completed → planning; failed on a git or forge error.
"""

from __future__ import annotations

import re
from pathlib import Path

from phasegate.contract import PLANNING, PREPARATION, MilestoneWrite, PhaseResult, WorkflowContext
from phasegate.phases.deps import PhaseDeps

__all__ = ["branch_name_for", "run"]


def branch_name_for(ctx: WorkflowContext) -> str:
    """``phasegate/<id>-<slug of the title>``, at most 60 characters."""
    slug = re.sub(r"[^a-z0-9]+", "-", ctx.title.lower()).strip("-")[:40].rstrip("-")
    return f"phasegate/{ctx.id}-{slug}" if slug else f"phasegate/{ctx.id}"


def run(ctx: WorkflowContext, deps: PhaseDeps) -> PhaseResult:
    repo = Path(ctx.repo_path)
    body = f"{ctx.ticket}\n\n_Filed by phasegate for workflow `{ctx.id}`._"
    issue = deps.effects.create_issue(PREPARATION, ctx.title, body)

    branch = ctx.branch_name or branch_name_for(ctx)
    base_sha = deps.workspace.rev(repo, ctx.base_branch)
    deps.effects.create_branch(PREPARATION, branch, ctx.base_branch)

    path = deps.cartridge.landing_areas.worktree_dir(repo) / ctx.id
    worktree = deps.workspace.ensure_worktree(repo, branch, path)

    return PhaseResult.advance(
        PLANNING,
        updates={
            "issue_number": issue,
            "branch_name": branch,
            "worktree_path": str(worktree),
            "current_round": 0,
        },
        state={"base_sha": base_sha},
        milestones=(
            MilestoneWrite(
                "worktree_ready",
                summary=f"worktree at {worktree}",
                data={"path": str(worktree), "branch": branch},
            ),
        ),
    )
