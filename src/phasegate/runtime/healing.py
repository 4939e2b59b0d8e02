"""Self-heal: a workflow's worktree re-created from its branch before a phase
runs (docs/contracts/lifecycle.md: advancing a workflow; split out of engine.py,
which calls it once per step).

A branch this clone does not have (the workflow was started in another clone,
on a machine that died: ``phasegate.runtime.takeover``) is brought
from the forge first, where it was pushed (``Forge.branch_ref``: GitHub's is
fetched with the forge's token). One that was never pushed is re-created from
the commit it was made from, and the phase redoes its work: what the dead
machine had built on it is lost with it, and an event says so.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from phasegate.core.contract import (
    ACCEPTANCE_VERIFICATION,
    PREPARATION,
    WAIT,
    EventWrite,
    PhaseResult,
    WorkflowContext,
)
from phasegate.forge.base import ForgeNotFound
from phasegate.git.command import changes, run_git
from phasegate.git.workspace import git
from phasegate.phases import PhaseDeps, landing

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

    Nothing at all in wait, which must not touch git (docs/contracts/lifecycle.md:
    wait) and is looked at again and again while people decide: the phase after
    it (development, merge) repairs and heals first, so a worker's look at an
    idle waiting workflow runs no git.

    A worktree made again is prepared again (``phases.landing``: the
    cartridge's copied files, its setup); a preparation still owed (a crash
    during it, a setup that failed) runs again before the phase, and a setup
    that fails pauses the workflow.

    The health check is skipped when this advance already found the worktree
    healthy and nothing that may write a checkout ran since (no agent but a
    read-only one that left it clean, no git call but reads, no check:
    ``CheckoutSeen``); a new advance (after a person's decision) looks again.

    A branch missing here is restored (``restore_branch``) before the
    worktree is made; in preparation too, once its ``branch_created`` is
    settled (a restarted preparation in another clone makes the worktree
    of the branch the journal recorded). Returns a failed result when the
    branch was pushed and is gone, here and on the forge: a phase must
    never run against the wrong checkout.
    """
    if ctx.current_phase == WAIT:
        return None
    for note in deps.workspace.repair(Path(ctx.repo_path)):
        emit(EventWrite("git_repaired", {"note": note}))
    if ctx.current_phase == PREPARATION:
        made = ctx.milestone("branch_created")
        if made is None or made.status != "completed":
            return None
        branch = str(made.data.get("params", {}).get("branch") or "")
        return restore_branch(ctx, deps, branch, emit) if branch else None
    if (
        ctx.current_phase == ACCEPTANCE_VERIFICATION
        or not ctx.worktree_path
        or not ctx.branch_name
        or ctx.state.get("worktree_removed")
        or _merged(ctx)
    ):
        return None
    path = Path(ctx.worktree_path)
    if landing.owed(ctx, deps) and deps.workspace.is_healthy(path, ctx.branch_name):
        # A preparation a crash or a failing setup left owed: run again, never skipped.
        return landing.prepare(ctx, deps, path, ctx.current_phase)
    # Looked at in this advance and nothing has written a checkout since
    # (agents/service.py CheckoutSeen): no git asked again.
    if (seen := deps.agents.seen(ctx.id, path)) is not None and seen.healthy:
        return None
    at = changes()
    problem, clean = deps.workspace.checkout_health(path, ctx.branch_name)
    if problem is None:
        deps.agents.saw(ctx.id, path, at, healthy=True, clean=clean)
        return None
    repo = Path(ctx.repo_path)
    failed = restore_branch(ctx, deps, ctx.branch_name, emit)
    if failed is not None:
        return failed
    deps.workspace.ensure_worktree(repo, ctx.branch_name, path)
    emit(EventWrite("worktree_healed", {"path": str(path)}))
    # A worktree made again is a new one: its files and its setup again.
    return landing.prepare(ctx, deps, path, ctx.current_phase, new=True)


def restore_branch(
    ctx: WorkflowContext, deps: PhaseDeps, branch: str, emit: Callable[[EventWrite], None]
) -> PhaseResult | None:
    """Make ``branch`` exist in ``ctx.repo_path`` when it does not: the forge's
    (``branch_fetched``), else, when it was never pushed (no completed
    ``branch_pushed``), made again at the commit it was first made from
    (``branch_recreated``: the phase redoes what was lost). None when the branch
    is there now; a failed result when it was pushed and is gone everywhere.
    Raises ForgeError (ForgeUnavailable: the engine pauses) and GitError."""
    repo = Path(ctx.repo_path)
    if deps.workspace.branch_exists(repo, branch):
        return None
    try:
        ref: str | None = deps.forge.branch_ref(branch)
    except ForgeNotFound:
        ref = None
    if ref is not None and _commit(repo, ref):
        git(["branch", branch, ref], repo)
        sha = deps.workspace.rev(repo, branch)
        emit(EventWrite("branch_fetched", {"branch": branch, "sha": sha, "ref": ref}))
        return None
    if any(m.kind == "branch_pushed" and m.status == "completed" for m in ctx.milestones):
        return PhaseResult(
            "failed",
            reason=f"branch {branch} is gone, here and on the forge; cannot heal the worktree",
        )
    made = ctx.milestone("branch_created")
    start = str((made.data.get("result") or {}).get("sha", "")) if made is not None else ""
    start = start or str(ctx.state.get("base_sha") or "")
    if not start or not _commit(repo, start):
        start = deps.workspace.rev(repo, deps.forge.branch_ref(ctx.base_branch))
    git(["branch", branch, start], repo)
    emit(
        EventWrite(
            "branch_recreated",
            {
                "branch": branch,
                "sha": start,
                "note": f"{branch} was never pushed and is not in {repo}: made again at "
                f"{start[:12]}, where it started; what the clone that made it had built "
                f"on it is lost with that clone, and {ctx.current_phase} does its work again",
            },
        )
    )
    return None


def _commit(repo: Path, ref: str) -> bool:
    """Whether ``ref`` names a commit ``repo`` has."""
    return run_git(["rev-parse", "--verify", "-q", f"{ref}^{{commit}}"], repo).returncode == 0
