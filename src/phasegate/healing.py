"""Self-heal: a workflow's worktree re-created from its branch before a phase runs
(DESIGN.md §1; split out of engine.py, which calls it once per step)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from phasegate.contract import (
    ACCEPTANCE_VERIFICATION,
    PREPARATION,
    WAIT,
    EventWrite,
    PhaseResult,
    WorkflowContext,
)
from phasegate.phases import PhaseDeps

__all__ = ["self_heal"]


def _merged(ctx: WorkflowContext) -> bool:
    """Whether the pull request's merge is settled (reconciliation has run by then)."""
    merge = ctx.milestone("merge_completed")
    return merge is not None and merge.status == "completed"


def self_heal(
    ctx: WorkflowContext, deps: PhaseDeps, emit: Callable[[EventWrite], None]
) -> PhaseResult | None:
    """Re-create a missing or broken worktree from its branch; ``emit`` records
    what was repaired or healed as the workflow's events.

    Not in preparation, which creates it, nor in acceptance_verification,
    which works on a temporary checkout of the merge commit after merge
    removed the worktree and the branch; nor once ``merge_completed`` is
    settled, since merge removes both right after merging and a process
    killed before merge committed must find them gone, not broken.

    First, always, clears what killed git processes left in the
    repository (``Workspace.repair``: stale locks, a killed add's locked
    worktree), so no phase trusts or sticks on it.

    Nothing at all in wait, which must not touch git (spec 000, wait) and is
    looked at again and again while people decide: the phase after it
    (development, merge) repairs and heals first (issue 12: a worker's look at
    an idle waiting workflow runs no git).

    Returns a failed result when the branch itself is gone: a phase must
    never run against the wrong checkout.
    """
    if ctx.current_phase == WAIT:
        return None
    for note in deps.workspace.repair(Path(ctx.repo_path)):
        emit(EventWrite("git_repaired", {"note": note}))
    if (
        ctx.current_phase in (PREPARATION, ACCEPTANCE_VERIFICATION)
        or not ctx.worktree_path
        or not ctx.branch_name
        or ctx.state.get("worktree_removed")
        or _merged(ctx)
    ):
        return None
    path = Path(ctx.worktree_path)
    if deps.workspace.is_healthy(path, ctx.branch_name):
        return None
    repo = Path(ctx.repo_path)
    if not deps.workspace.branch_exists(repo, ctx.branch_name):
        return PhaseResult(
            "failed", reason=f"branch {ctx.branch_name} is gone; cannot heal the worktree"
        )
    deps.workspace.ensure_worktree(repo, ctx.branch_name, path)
    emit(EventWrite("worktree_healed", {"path": str(path)}))
    return None
