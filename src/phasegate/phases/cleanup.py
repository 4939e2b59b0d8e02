"""cleanup: tidying after a workflow, kept apart from its outcome: a merged one's
worktree and branch, a cancelled one's pull request.

Cleanup retries are tracked apart from the merge (docs/contracts/lifecycle.md: merge).

The merge is decided by ``merge_completed`` alone; cleanup is its own
``cleanup`` milestone in phase merge, ``completed`` or ``failed`` with git's
(or the file system's) reason, and never decides the merge's outcome. A
failed cleanup is retried later: at the top of the workflow's next
``advance`` (whatever its phase, completed included), on every pass of
``phasegate worker``, and by ``phasegate cleanup``. Each retry settles the
same row in place, counting its attempts; it is never shown completed while
the worktree or the branch is still there.

The branch goes on the forge too when ``forge.delete_merged_branches`` is on
(the default): only the workflow's own ``branch_name``, never its base, and
a forge that fails the deletion is one more problem of the milestone, retried
like the others (docs/github.md: what phasegate does on GitHub).

A cancelled workflow's pull request is closed when phasegate opened it (a
completed ``pr_created`` of the same number: never a person's) and it is
still open: ``close_pull_request``, journaled as ``pr_closed``, run by the
cancel itself before the status changes (operations.cancel). A forge that
fails it leaves that effect ``failed`` on the cancelled workflow, and the same
retries as a failed cleanup close it later (``retry``).

Every step is idempotent (removing a removed worktree, deleting a deleted
branch, here or on the forge, closing a closed pull request), so a retry after a
crash or a partial success redoes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from phasegate.config.cartridge import Cartridge
from phasegate.core.contract import (
    CANCELLED,
    MERGE,
    MilestoneView,
    MilestoneWrite,
    WorkflowContext,
)
from phasegate.forge.base import Forge, ForgeError
from phasegate.git.workspace import GitError, Workspace
from phasegate.journal import SideEffects
from phasegate.phases.deps import PhaseDeps
from phasegate.store import Store

__all__ = [
    "CLOSE_KIND",
    "KIND",
    "KINDS",
    "Cleanup",
    "after_merge",
    "clean_up",
    "close_pull_request",
    "latest",
    "own_pull_request",
    "pending",
    "retry",
    "waiting",
]

log = logging.getLogger(__name__)

KIND = "cleanup"
#: The journaled effect closing a cancelled workflow's own pull request.
CLOSE_KIND = "pr_closed"
#: The milestone kinds whose ``failed`` rows wait for a retry.
KINDS = (KIND, CLOSE_KIND)


@dataclass(frozen=True)
class Cleanup:
    """What one cleanup did: ``problems`` is empty when both steps succeeded."""

    worktree_removed: bool
    branch_deleted: bool
    problems: tuple[str, ...]
    #: None: the forge's branch was not to be deleted (the setting is off, or the
    #: forge shares the repository's branches).
    forge_branch_deleted: bool | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def milestone(self, attempts: int) -> MilestoneWrite:
        """The ``cleanup`` milestone (phase merge, round 0, attempt 0: one row per
        workflow, settled in place by every retry)."""
        return MilestoneWrite(
            KIND,
            status="completed" if self.ok else "failed",
            summary="worktree and branch removed" if self.ok else "; ".join(self.problems)[:500],
            data={
                # the summary column is short; the whole of git's reason is for show
                "reason": "; ".join(self.problems) or None,
                "attempts": attempts,
                "worktree_removed": self.worktree_removed,
                "branch_deleted": self.branch_deleted,
                "forge_branch_deleted": self.forge_branch_deleted,
            },
            phase=MERGE,
        )


def clean_up(
    workspace: Workspace,
    repo: Path,
    worktree: Path | None,
    branch: str,
    *,
    forge: Forge | None = None,
) -> Cleanup:
    """Remove ``worktree`` (when given), delete ``branch``, and delete it on
    ``forge`` too when one is given, each step on its own.

    Never raises for a step that fails: git's error, the OSError (a file that
    cannot be removed) or the ForgeError becomes one of the result's
    ``problems``, and the other steps still run.
    """
    problems: list[str] = []
    worktree_removed = True
    if worktree is not None:
        try:
            workspace.remove_worktree(repo, worktree)
        except (GitError, OSError) as exc:
            problems.append(f"removing the worktree {worktree}: {exc}")
        worktree_removed = not worktree.exists()
    branch_deleted = True
    try:
        workspace.delete_branch(repo, branch)
    except GitError as exc:
        problems.append(f"deleting the branch {branch}: {exc}")
        branch_deleted = not workspace.branch_exists(repo, branch)
    on_forge = None
    if forge is not None:
        try:
            forge.delete_branch(branch)
            on_forge = True
        except ForgeError as exc:
            problems.append(f"deleting the branch {branch} on the forge: {exc}")
            on_forge = False
    return Cleanup(worktree_removed, branch_deleted, tuple(problems), on_forge)


def branch_forge(cartridge: Cartridge, forge: Forge, ctx: WorkflowContext) -> Forge | None:
    """The forge to delete the workflow's branch on after its merge, or None: the
    setting is off, or the branch is its base (phasegate deletes only its own)."""
    if not cartridge.forge.delete_merged_branches or ctx.branch_name in (None, ctx.base_branch):
        return None
    return forge


def after_merge(ctx: WorkflowContext, deps: PhaseDeps) -> Cleanup:
    """The first cleanup, right after the merge landed: the worktree, the branch
    and, by ``forge.delete_merged_branches``, the branch on the forge."""
    assert ctx.branch_name is not None
    return clean_up(
        deps.workspace,
        Path(ctx.repo_path),
        Path(ctx.worktree_path) if ctx.worktree_path else None,
        ctx.branch_name,
        forge=branch_forge(deps.cartridge, deps.forge, ctx),
    )


def pending(ctx: WorkflowContext) -> MilestoneView | None:
    """The workflow's failed ``cleanup`` milestone, when one waits for a retry."""
    found = ctx.milestone(KIND, phase=MERGE)
    return found if found is not None and found.status == "failed" else None


def own_pull_request(ctx: WorkflowContext) -> int | None:
    """The workflow's pull request when phasegate opened it (its journal holds a
    completed ``pr_created`` of that number), else None: one a person opened is
    theirs to close."""
    if not ctx.pr_number:
        return None
    opened = [m.data.get("result", {}).get("number") for m in ctx.milestones_of("pr_created")]
    return ctx.pr_number if ctx.pr_number in opened else None


def close_pull_request(ctx: WorkflowContext, effects: SideEffects, phase: str) -> str | None:
    """Close the workflow's own pull request (``own_pull_request``) when it is open,
    journaled as ``pr_closed`` in ``phase``. Returns None when it is closed now (or
    there is none of phasegate's), else the forge's reason it is not: the effect is
    left ``failed``, for ``retry``. Raises FenceLost."""
    number = own_pull_request(ctx)
    if number is None:
        return None
    try:
        effects.close_pull_request(phase, number)
    except ForgeError as exc:
        log.warning("pull request #%s of workflow %s not closed: %s", number, ctx.id, exc)
        return str(exc)
    return None


def waiting(store: Store) -> list[str]:
    """Every workflow with a cleanup or a pull request close waiting for a retry,
    oldest first."""
    found = (store.workflow_ids_with_milestone(kind, "failed") for kind in KINDS)
    return list(dict.fromkeys(x for ids in found for x in ids))


def latest(ctx: WorkflowContext) -> MilestoneView | None:
    """The workflow's cleanup as it stands: a cancelled one's ``pr_closed``, else a
    merged one's ``cleanup``; None when it has none."""
    if ctx.status == CANCELLED:
        return ctx.milestone(CLOSE_KIND)
    return ctx.milestone(KIND, phase=MERGE)


def _close_pending(ctx: WorkflowContext) -> MilestoneView | None:
    """A cancelled workflow's ``pr_closed`` the forge failed, waiting for a retry."""
    found = ctx.milestone(CLOSE_KIND)
    if ctx.status != CANCELLED or found is None or found.status != "failed":
        return None
    return found


def retry(ctx: WorkflowContext, deps: PhaseDeps) -> MilestoneView | None:
    """Retry the workflow's failed cleanup; returns its settled milestone, or None
    when no cleanup was waiting. The caller holds the workflow's lease; ``ctx`` is
    the workflow as the caller read it under that lease. A merged workflow's
    worktree and branches are removed again (on the forge too, as
    ``branch_forge`` says); a cancelled workflow's pull request the forge failed
    to close is closed, and its ``pr_closed`` row, settled, returned.
    """
    closing = _close_pending(ctx)
    if closing is not None:
        close_pull_request(ctx, deps.effects, closing.phase)
        return deps.store.load_context(ctx.id).milestone(CLOSE_KIND)
    failed = pending(ctx)
    if failed is None or not ctx.branch_name:
        return None
    outcome = clean_up(
        deps.workspace,
        Path(ctx.repo_path),
        Path(ctx.worktree_path) if ctx.worktree_path else None,
        ctx.branch_name,
        forge=branch_forge(deps.cartridge, deps.forge, ctx),
    )
    attempts = int(failed.data.get("attempts") or 1) + 1
    return deps.store.write_milestone(ctx.id, MERGE, outcome.milestone(attempts))
