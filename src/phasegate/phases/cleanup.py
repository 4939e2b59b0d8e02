"""cleanup: removing a merged workflow's worktree and branch, kept apart from the merge.

Cleanup retries are tracked apart from the merge (docs/contracts/lifecycle.md: merge).

The merge is decided by ``merge_completed`` alone; cleanup is its own
``cleanup`` milestone in phase merge, ``completed`` or ``failed`` with git's
(or the file system's) reason, and never decides the merge's outcome. A
failed cleanup is retried later: at the top of the workflow's next
``advance`` (whatever its phase, completed included), on every pass of
``phasegate worker``, and by ``phasegate cleanup``. Each retry settles the
same row in place, counting its attempts; it is never shown completed while
the worktree or the branch is still there.

Every step is idempotent (removing a removed worktree, deleting a deleted
branch), so a retry after a crash or a partial success redoes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from phasegate.core.contract import MERGE, MilestoneView, MilestoneWrite, WorkflowContext
from phasegate.git.workspace import GitError, Workspace
from phasegate.store import Store

__all__ = ["KIND", "Cleanup", "clean_up", "pending", "retry"]

KIND = "cleanup"


@dataclass(frozen=True)
class Cleanup:
    """What one cleanup did: ``problems`` is empty when both steps succeeded."""

    worktree_removed: bool
    branch_deleted: bool
    problems: tuple[str, ...]

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
            },
            phase=MERGE,
        )


def clean_up(workspace: Workspace, repo: Path, worktree: Path | None, branch: str) -> Cleanup:
    """Remove ``worktree`` (when given) and delete ``branch``, each step on its own.

    Never raises for a step that fails: git's error or the OSError (a file
    that cannot be removed) becomes one of the result's ``problems``, and the
    other step still runs.
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
    return Cleanup(worktree_removed, branch_deleted, tuple(problems))


def pending(ctx: WorkflowContext) -> MilestoneView | None:
    """The workflow's failed ``cleanup`` milestone, when one waits for a retry."""
    found = ctx.milestone(KIND, phase=MERGE)
    return found if found is not None and found.status == "failed" else None


def retry(
    store: Store, workspace: Workspace, workflow_id: str, ctx: WorkflowContext | None = None
) -> MilestoneView | None:
    """Retry the workflow's failed cleanup; returns its settled milestone, or None
    when no cleanup was waiting. The caller holds the workflow's lease; ``ctx``, the
    workflow as the caller read it under that lease (None: read here).

    Raises WorkflowNotFound for an unknown id.
    """
    ctx = ctx or store.load_context(workflow_id)
    failed = pending(ctx)
    if failed is None or not ctx.branch_name:
        return None
    outcome = clean_up(
        workspace,
        Path(ctx.repo_path),
        Path(ctx.worktree_path) if ctx.worktree_path else None,
        ctx.branch_name,
    )
    attempts = int(failed.data.get("attempts") or 1) + 1
    return store.write_milestone(ctx.id, MERGE, outcome.milestone(attempts))
