"""merge: sync the base into the branch, merge the pull request with real git, clean up.

(spec 000, merge)

- preconditions: current_phase == "merge", status == "merging"; a pull
  request exists (pr_number).
- inputs: pr_number, branch_name, base_branch, worktree_path.
- authoritative evidence: ``merge_completed`` (journaled, with the merge
  SHA) or ``merge_failed``; ``cleanup`` is tracked apart and never decides
  the outcome.
- side effects: ``git merge`` of the base into the branch (sync), the forge
  merge (``git merge --no-ff`` into the base), worktree and branch removal.
  The issue is NOT closed here: only a confirmed verification closes it.
- postconditions: current_phase == "acceptance_verification", status ==
  "verification_pending", merge_sha set.
- re-entry point: a completed ``merge_completed`` is reused; one left
  in_progress by a killed process is settled by looking for the merge commit
  on the base before the phase runs, so a restart never merges twice.
- recovery behavior: a conflict with the base forks a conflict-resolution
  child (phases/conflict.py: ``conflict_fork`` milestone, the parent paused
  until the child ends; a child's own merge phase is ``conflict.resolve``).
  Once the child resolved it the merge runs again; once it failed the merge
  cannot proceed within the plan (spec 003, Apply constrained): a reversion
  to planning with the conflict as the next plan's input where the profile's
  ``auto_reversion_from_apply`` < 1.0 allows it, else a pause for a person
  (resolve and resume, or ``phasegate revert``); past the loop guard, failed
  (pause where a person decides anyway). Uncommitted edits in the merge's
  way in the checkout holding the base pause the workflow with the reason
  (fix, then resume). Once the merge landed nothing fails the phase: a
  failed worktree or branch removal is a failed ``cleanup`` milestone with
  its reason, retried later (phases/cleanup.py), and the phase still
  advances with merge_sha.
- terminal outcomes: completed → acceptance_verification; completed →
  planning (reversion); pause (conflict fork, a failed child's conflict,
  edits in the way, git still failing on a lock after its retries:
  GitTransient, never read as a conflict);
  failed (merge error, loop guard).
"""

from __future__ import annotations

from pathlib import Path

from phasegate.contract import (
    ACCEPTANCE_VERIFICATION,
    MERGE,
    MilestoneWrite,
    PhaseResult,
    WorkflowContext,
)
from phasegate.phases import cleanup, conflict
from phasegate.phases.deps import PhaseDeps
from phasegate.workspace import DirtyCheckout, GitError, GitTransient

__all__ = ["run"]


def run(ctx: WorkflowContext, deps: PhaseDeps) -> PhaseResult:
    if conflict.is_child(ctx):
        return conflict.resolve(ctx, deps)
    if not ctx.pr_number:
        return PhaseResult("failed", reason="no pull request to merge")
    assert ctx.branch_name is not None
    repo = Path(ctx.repo_path)
    merged = deps.forge.find_merge(ctx.pr_number)
    worktree = Path(ctx.worktree_path) if ctx.worktree_path else None
    try:
        synced = (
            merged is not None
            or worktree is None
            or not worktree.exists()
            or deps.workspace.sync_base(worktree, ctx.base_branch)
        )
    except GitTransient as exc:  # a lock, not a conflict: nothing to re-plan
        return PhaseResult("pause", reason=f"syncing {ctx.base_branch} failed: {exc}")
    if not synced:
        return conflict.on_conflict(ctx, deps)
    message = f"Merge #{ctx.pr_number}: {ctx.title}\n\nphasegate workflow {ctx.id}"
    try:
        sha = deps.effects.merge(MERGE, ctx.pr_number, message)
    except GitTransient as exc:
        return PhaseResult("pause", reason=f"merge failed for now: {exc}")
    except DirtyCheckout as exc:
        # The person's own checkout: theirs to clean, then resume; nothing is lost.
        return PhaseResult("pause", reason=f"{exc}; commit or stash them, then `phasegate resume`")
    except GitError as exc:
        return PhaseResult(
            "failed",
            reason=f"merge failed: {exc}",
            milestones=(
                MilestoneWrite(
                    "merge_failed", status="failed", round=ctx.dev_round, summary=str(exc)[:500]
                ),
            ),
        )

    # The change landed: from here nothing may undo that record. Cleanup is its
    # own milestone, retried later when it fails (phases/cleanup.py).
    done = cleanup.clean_up(
        deps.workspace,
        repo,
        Path(ctx.worktree_path) if ctx.worktree_path else None,
        ctx.branch_name,
    )
    return PhaseResult.advance(
        ACCEPTANCE_VERIFICATION,
        updates={"merge_sha": sha},
        state={"worktree_removed": done.worktree_removed},
        milestones=(done.milestone(attempts=1),),
    )
