"""merge: sync the forge's base into the branch, merge the pull request, clean up.

(docs/contracts/lifecycle.md: merge)

- preconditions: current_phase == "merge", status == "merging"; a pull
  request exists (pr_number).
- inputs: pr_number, branch_name, base_branch, worktree_path.
- authoritative evidence: ``merge_completed`` (journaled, with the merge
  SHA) or ``merge_failed``; ``cleanup`` is tracked apart and never decides
  the outcome.
- side effects: ``git merge`` of the forge's base (``forge.branch_ref``:
  the base branch on the local forge, GitHub's fetched on GitHub) into the
  branch (sync), the synced branch published (journaled ``branch_pushed``)
  when it moved or the forge's pull request has another head, the forge
  merge (``git merge --no-ff`` into the base; GitHub's merge API, at the
  exact head checked), worktree and branch removal (on the forge too:
  ``forge.delete_merged_branches``); phasegate's own commit
  status (success) on that head just before the merge.
- checks on the merged head: the forge's required checks (``forge.required_checks``
  and the base's protection) must have passed on the head about to merge, a
  sync commit included (phases/ci.py). Pending: ``wait`` in merge, no worker
  held, looked at again after ``forge.poll_s``; failed: a CI-repair round
  (development, dev_round + 1), bounded by ``forge.max_ci_repairs``.
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
  cannot proceed within the plan (docs/contracts/autonomy.md: phase
  reversion): a reversion to planning with the conflict as the next plan's
  input where the profile's ``auto_reversion_from_apply`` < 1.0 allows it,
  else a pause for a person (resolve and resume, or ``phasegate revert``);
  past the loop guard, failed (pause where a person decides anyway). A forge
  that refuses the merge as not mergeable (``ForgeNotMergeable``, GitHub's
  405; the local forge's merge conflicting under the repository's merge lock:
  its base moved after the sync, which runs outside that lock, as a sibling
  merged first) has the base synced again: a conflict
  forks as above, a clean merge is pushed and merged again (retry), and a
  branch already holding the forge's base pauses with the forge's reason.
  Uncommitted edits in the merge's way in the checkout holding the base pause
  the workflow with the reason (fix, then resume). Once the merge landed
  nothing fails the phase: a failed worktree or branch removal is a failed
  ``cleanup`` milestone with its reason, retried later (phases/cleanup.py),
  and the phase still advances with merge_sha.
- terminal outcomes: completed → acceptance_verification; completed →
  planning (reversion); completed → wait (an unattended merge whose head the
  merge gate holds: phases/merge_gate.py); completed → development (CI failed
  on the head to merge); wait (its checks pending); pause (conflict fork, a failed
  child's conflict, edits in the way, git still failing on a lock after its retries:
  GitTransient, never read as a conflict);
  failed (merge error, loop guard).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from phasegate.agents.env import cartridge_secrets
from phasegate.core.contract import (
    ACCEPTANCE_VERIFICATION,
    COMPLETED,
    MERGE,
    WAIT,
    EventWrite,
    MilestoneWrite,
    PhaseResult,
    WorkflowContext,
)
from phasegate.forge.base import OWN_PASSED, OWN_WAITING, ForgeNotMergeable
from phasegate.git.workspace import DirtyCheckout, GitError, GitTransient
from phasegate.phases import ci, cleanup, conflict, merge_gate
from phasegate.phases.deps import PhaseDeps

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
    if merged is None and worktree is not None and worktree.exists():
        synced = _sync(ctx, deps, worktree)
        if synced is not None:
            return synced
    # Once merged (a restart after the merge) the branch may be gone: nothing to judge.
    head = deps.workspace.rev(repo, ctx.branch_name) if merged is None else None
    if head is not None and head != ctx.state.get("merge_judged_head"):
        # A head the report did not judge (a sync with the base, a commit pushed to
        # the branch since) is judged now. A person's approval stands only for what
        # they saw held: a sync changes the head, not the branch's own change.
        hold = merge_gate.merge_hold(ctx, deps, head)
        approved = ctx.state.get("merge_approved")
        if hold is not None and not (approved and merge_gate.covers(merge_gate.held(ctx), hold)):
            secrets = cartridge_secrets(deps.cartridge)
            return PhaseResult.advance(
                WAIT,
                state={
                    "merge_hold": hold.as_state(),
                    "merge_judged_head": head,
                    "merge_approved": False,
                },
                events=merge_gate.found_events(hold, secrets),
            )
    evidence: tuple[MilestoneWrite, ...] = ()
    checked = {m.data.get("sha") for m in ctx.milestones_of("ci_passed")}
    # A head the forge refused for a check it came to require is looked at afresh.
    rechecked = head is not None and ctx.state.get("merge_rechecked") == head
    if head is not None and (head not in checked or rechecked):
        # The forge merges this exact head: its required checks must have passed on
        # it, a sync with the base included, however the review's head fared.
        gate = ci.ci_gate(ctx, deps, ctx.pr_number, head)
        if isinstance(gate, PhaseResult):
            return gate
        evidence = () if gate is None else (gate,)
    if head is not None and (rechecked or not _reported_passed(ctx, head)):
        deps.forge.set_commit_status(head, "success", OWN_PASSED)
    message = f"Merge #{ctx.pr_number}: {ctx.title}\n\nphasegate workflow {ctx.id}"
    try:
        sha = deps.effects.merge(MERGE, ctx.pr_number, message, head)
    except ForgeNotMergeable as exc:
        return _refused(ctx, deps, worktree, exc)
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
    done = cleanup.after_merge(ctx, deps)
    # A UI that takes the merge as the end reads phase_change completed here, before
    # acceptance verification's own (docs/contracts/lifecycle.md: phase_change events).
    return PhaseResult.advance(
        ACCEPTANCE_VERIFICATION,
        updates={"merge_sha": sha},
        state={"worktree_removed": done.worktree_removed},
        milestones=(*evidence, done.milestone(attempts=1)),
        events=(EventWrite("phase_change", {"phase": COMPLETED}),),
    )


def _reported_passed(ctx: WorkflowContext, head: str) -> bool:
    """Whether the report already posted phasegate's own success on ``head``: it
    described that head and nothing held its merge."""
    report = ctx.state.get("report") or {}
    return report.get("head") == head and not report.get("merge_hold")


def _sync(ctx: WorkflowContext, deps: PhaseDeps, worktree: Path) -> PhaseResult | None:
    """Merge the forge's base (``forge.branch_ref``) into the branch and publish what
    the forge lacks (journaled ``branch_pushed``); None when the merge may go on,
    else the result that stops it here (a conflict forks, a lock pauses)."""
    assert ctx.branch_name is not None and ctx.pr_number is not None
    base = deps.forge.branch_ref(ctx.base_branch)
    before = deps.workspace.rev(worktree, "HEAD")
    try:
        if not deps.workspace.sync_base(worktree, base):
            return conflict.on_conflict(ctx, deps, base)
    except GitTransient as exc:  # a lock, not a conflict: nothing to re-plan
        return PhaseResult("pause", reason=f"syncing {ctx.base_branch} failed: {exc}")
    head = deps.workspace.rev(worktree, "HEAD")
    # The forge merges its pull request's head: it must be the synced one. A forge
    # that tracks heads says which it has (a sync pushed before a crash is not
    # pushed again); the local forge shares the repository and says none.
    known = deps.forge.pull_request(ctx.pr_number).head_sha
    if head != before or (known is not None and known != head):
        deps.effects.push_branch(MERGE, ctx.branch_name, head)
    return None


def _refused(
    ctx: WorkflowContext, deps: PhaseDeps, worktree: Path | None, exc: ForgeNotMergeable
) -> PhaseResult:
    """The forge would not merge the pull request: its base most likely moved since
    the sync (another pull request merged meanwhile). Synced again: a conflict
    forks its resolution, a base that moved is merged again (retry). A branch that
    holds the forge's base already has its required checks read again (the base's
    protection may have changed): one not passed yet is waited for, else the forge
    refused it for a reason of its own and a person settles it."""
    if worktree is None or not worktree.exists():
        return PhaseResult("pause", reason=f"{exc}; the worktree to sync it in is gone")
    before = deps.workspace.rev(worktree, "HEAD")
    stopped = _sync(ctx, deps, worktree)
    if stopped is not None:
        return stopped
    if deps.workspace.rev(worktree, "HEAD") != before:
        return PhaseResult("retry")  # pushed with the base that moved: merge it again
    # A check the base's protection came to require since it was last read: the head
    # waits for it (or is repaired), and phasegate's own status says it is not done.
    assert ctx.pr_number is not None
    gate = ci.ci_gate(ctx, deps, ctx.pr_number, before, fresh=True)
    if isinstance(gate, PhaseResult):
        if gate.outcome == "wait":
            deps.forge.set_commit_status(before, "pending", OWN_WAITING)
        return replace(gate, state={**gate.state, "merge_rechecked": before})
    return PhaseResult(
        "pause",
        reason=f"{exc}; {ctx.branch_name} holds {ctx.base_branch} and merges cleanly, so the "
        "forge refused it for a reason of its own (branch protection, required checks, a "
        "draft): settle that on the forge, then `phasegate resume`",
    )
