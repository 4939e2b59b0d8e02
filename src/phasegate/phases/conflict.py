"""The conflict fork: a child workflow resolves a merge conflict for its parent.

A conflict forks a child, the parent pauses, the child resolves, and the parent
resumes its merge (docs/contracts/lifecycle.md: merge); the child works on a
fresh session line. Written against the Forge protocol only: the resolution
reaches the forge through ``publish_branch``, so a GitHub pull request sees it
as the local forge's branch does.

"The base" is the forge's (``forge.branch_ref``): the base branch itself on
the local forge, GitHub's fetched on GitHub, where the local one is stale once
a pull request merged there.

The parent's side (``on_conflict``, called by merge when the base does not
merge into the branch):

- fork round ``n``: a ``conflict_fork`` milestone (round ``n``) is written
  in_progress before the child exists, the child is looked up by parent id and
  ``state["fork_round"]`` before one is created, and the milestone is settled
  with the child's id: a crash anywhere in between never forks twice.
- the parent pauses with ``state["conflict_child"]`` naming the child; the
  child's completed, failed or cancelled commit wakes it in the same transaction
  (``store.commit._wake_parent``), and merge runs again: the branch now
  holds the base (it merges), or the child failed and the profile's
  ``reversion_or_stop`` decides, as for a conflict before the fork existed.

The child (``resolve``; a workflow in merge with ``state["kind"] == "conflict"``,
the parent's repository, base and branch, no issue and no pull request of its
own):

- preconditions: its parent is paused for it (it waits while the parent's
  pause, naming it, is not committed yet; it fails once the parent was moved
  on from that pause); the parent's branch is still at
  ``state["parent_head"]``, where the fork found it.
- inputs: state.conflicted (the files ``git merge-tree`` named), the
  parent's title and ticket, the last attempt's failure.
- its worktree: a detached checkout of ``parent_head`` at
  ``<worktree_root>/<child id>``, made anew per attempt and removed after it.
  Detached, not a branch: git refuses a second worktree of the parent's
  branch, and a child branch would be one more ref to publish, guard and
  clean up; each attempt starts from the recorded head, so a killed attempt
  leaves only a directory the next one clears. It is prepared as a worktree
  is (``landing.prepare_checkout``: the ``copy`` and ``link`` entries, then
  ``setup``, a failed one counted as a failed check).
- an attempt: merge the forge's base in (``forge.branch_ref``, fetched anew
  per attempt on GitHub), ask the ``build`` role on a session line of
  its own (``conflict-a<N>``, never the parent's ``main``) to resolve the
  markers, refuse the result while a marker remains, the resolution (what
  the merge commit holds that neither side had) is over
  ``limits.max_diff_bytes`` or holds a secret, or ``landing_areas.checks``
  fail. Evidence: a ``conflict_attempt`` milestone per attempt (the
  resolution's diff of the conflicted files, the checks' results, the
  markers left).
- bounded: ``1 + limits.max_dev_retries`` attempts (``test_retries`` counts
  them, so ``resume`` grants a fresh set); then the child fails closed, its
  evidence kept.
- landing: the merge commit (trailer ``Phasegate-Conflict: <child id>``)
  becomes the parent's branch by a compare-and-swap ``update-ref`` from
  ``parent_head``; the parent's worktree is reset to it; the branch is
  published (journaled ``branch_pushed``). Re-entered after a crash with the
  branch already at a commit carrying the trailer, the child only publishes
  and completes.
- terminal outcomes: completed → completed (wakes the parent); retry (another
  attempt); wait (the parent has not paused yet); failed (attempts spent,
  the branch moved since the fork, the parent no longer waits, the build
  agent failed every try).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from phasegate.agents.env import cartridge_secrets, files_with_secrets
from phasegate.agents.service import AgentFailed
from phasegate.core.closing import defuse_closing
from phasegate.core.contract import (
    COMPLETED,
    ENDED_STATUSES,
    MERGE,
    MilestoneWrite,
    PhaseResult,
    WorkflowContext,
)
from phasegate.core.profiles import reversion_or_stop
from phasegate.git.checks import CheckResult
from phasegate.git.command import IDENTITY, run_git
from phasegate.git.workspace import git
from phasegate.phases import landing
from phasegate.phases.deps import PhaseDeps, agent_failure

__all__ = ["FORK_KIND", "KIND", "TRAILER", "conflicted_files", "is_child", "on_conflict", "resolve"]

#: ``state["kind"]`` of a conflict-resolution child.
KIND = "conflict"
#: The parent's milestone recording one fork (round = the fork's number).
FORK_KIND = "conflict_fork"
#: The trailer of a child's merge commit: the child that made it.
TRAILER = "Phasegate-Conflict"

_DIFF_LIMIT = 20_000  # characters of an attempt's resolution diff kept as evidence
_MARKER = re.compile(r"^(<{7} |={7}$|>{7} )", re.M)

CONFLICT_PROMPT = """{base} was merged into the branch of the change below, and these files
conflict (git left conflict markers in them):

{files}

Resolve every conflict in your working directory: keep what both sides meant (the
change's intent, and what {base} holds now), remove every conflict marker
(<<<<<<<, =======, >>>>>>>), and keep the project's checks passing. Do not commit;
phasegate concludes the merge. Finish with a short summary of how you resolved each file.

## The change: {title}

{ticket}
{extra}"""


def is_child(ctx: WorkflowContext) -> bool:
    """Whether ``ctx`` is a conflict-resolution child (merge hands it to ``resolve``)."""
    return ctx.state.get("kind") == KIND


def conflicted_files(repo: Path, base: str, branch: str) -> list[str]:
    """The files a merge of ``base`` into ``branch`` leaves in conflict, from
    ``git merge-tree --write-tree`` (no checkout touched); [] when it merges."""
    proc = run_git(
        ["merge-tree", "--write-tree", "--name-only", "--no-messages", branch, base], repo
    )
    if proc.returncode == 0:
        return []
    return [line for line in proc.stdout.splitlines()[1:] if line.strip()]


# -- the parent ---------------------------------------------------------------------


def on_conflict(ctx: WorkflowContext, deps: PhaseDeps, base: str) -> PhaseResult:
    """The parent's answer to a conflict with the base: fork a child (or find the one
    a crash left), wait for a running one, or, once its child failed, the profile's
    reversion or a pause (``profiles.reversion_or_stop``). ``base`` is the ref the
    conflict was found with (``forge.branch_ref``): the fork names its conflicted files."""
    forks = ctx.milestones_of(FORK_KIND)
    latest = forks[-1] if forks else None
    number = 1
    if latest is not None and latest.status == "completed":
        child = deps.store.workflow_row(str(latest.data["child"]))
        if child["status"] not in ENDED_STATUSES:
            return _waiting(child)
        # A child a person cancelled resolved nothing: as one that failed.
        unresolved = child["status"] != "completed"
        if unresolved and ctx.state.get("conflict_settled") != child["id"]:
            return _child_failed(ctx, deps, child)
        # Resolved, and the base moved on since; or failed, decided, and resumed by a
        # person: a new round.
        number = latest.round + 1
    elif latest is not None:
        number = latest.round  # a fork a crash left unsettled: redone under its key
    return _fork(ctx, deps, number, base)


def _fork(ctx: WorkflowContext, deps: PhaseDeps, number: int, base: str) -> PhaseResult:
    assert ctx.branch_name is not None
    repo = Path(ctx.repo_path)
    files = conflicted_files(repo, base, ctx.branch_name)
    head = deps.workspace.rev(repo, ctx.branch_name)
    if deps.effects.fence is not None:
        deps.effects.fence.check()
    row = deps.store.write_milestone(
        ctx.id,
        MERGE,
        MilestoneWrite(
            FORK_KIND,
            status="in_progress",
            round=number,
            summary=f"forking conflict resolution {number}",
            data={"files": files, "head": head},
        ),
    )
    found = [
        c for c in deps.store.child_workflows(ctx.id) if c["state"].get("fork_round") == number
    ]
    if found:
        child_id = found[0]["id"]
    else:
        listed = "\n".join(f"- {name}" for name in files) or "- (git named none)"
        child_id = deps.store.create_workflow(
            title=f"Resolve the conflict of {ctx.branch_name} with {ctx.base_branch}",
            ticket=f"Merging {ctx.base_branch} into {ctx.branch_name} (workflow {ctx.id}: "
            f"{ctx.title}) conflicts in:\n{listed}",
            repo_path=ctx.repo_path,
            base_branch=ctx.base_branch,
            auto_merge=False,
            content_language=ctx.content_language,
            parent_workflow_id=ctx.id,
            phase=MERGE,
            branch_name=ctx.branch_name,
            state={
                "kind": KIND,
                "fork_round": number,
                "parent_head": head,
                "parent_worktree": ctx.worktree_path,
                "parent_title": ctx.title,
                "parent_ticket": ctx.ticket,
                "conflicted": files,
                "profile": ctx.state.get("profile"),
                "graph_mode": False,
            },
        )
    deps.store.settle_milestone(
        row,
        "completed",
        summary=f"forked child {child_id} to resolve {len(files)} conflicted file(s)",
        data={"child": child_id},
    )
    return _waiting(deps.store.workflow_row(child_id))


def _waiting(child: dict[str, Any]) -> PhaseResult:
    note = f" (child {child['status']}: {child['error']})" if child.get("error") else ""
    return PhaseResult(
        "pause",
        reason=f"waiting for conflict resolution by child {child['id']}{note}",
        state={"conflict_child": child["id"]},
    )


def _child_failed(ctx: WorkflowContext, deps: PhaseDeps, child: dict[str, Any]) -> PhaseResult:
    reason = (
        f"{ctx.branch_name} conflicts with {ctx.base_branch} and child {child['id']} "
        f"could not resolve it: {child['error']}"
    )
    return reversion_or_stop(
        ctx,
        reason=reason[:1500],
        hint="resolve the conflict on the branch, then `phasegate resume`",
        context=f"The merge could not proceed: {ctx.branch_name} conflicts with "
        f"{ctx.base_branch}, which changed the same lines since the branch was made, and "
        f"a conflict resolution failed ({child['error']}). The new plan must fit what "
        f"{ctx.base_branch} holds now.",
        at=deps.clock.now(),
        state={"conflict_settled": child["id"]},
        milestones=(
            MilestoneWrite(
                "merge_failed",
                status="failed",
                round=ctx.dev_round,
                key=f"conflict-{child['id']}",
                summary=f"conflict with base; child {child['id']} failed",
            ),
        ),
    )


# -- the child ----------------------------------------------------------------------


def resolve(ctx: WorkflowContext, deps: PhaseDeps) -> PhaseResult:
    """Run one attempt of the child's resolution; see the module docstring."""
    assert ctx.parent_workflow_id is not None and ctx.branch_name is not None
    parent = deps.store.workflow_row(ctx.parent_workflow_id)
    if parent["state"].get("conflict_child") != ctx.id:
        return PhaseResult("wait")  # the parent's pause is not committed yet
    if parent["status"] != "paused":
        # Its pause named this child, and something else moved it on since (a
        # reversion, a person): a resolution now would land on a branch nobody waits on.
        return PhaseResult(
            "failed",
            reason=f"parent {parent['id']} no longer waits for this resolution "
            f"({parent['current_phase']}, {parent['status']})",
        )
    repo = Path(ctx.repo_path)
    start = str(ctx.state["parent_head"])
    head = deps.workspace.rev(repo, ctx.branch_name)
    if head != start:
        if _trailer(deps, repo, head) == ctx.id:
            return _landed(ctx, deps, head, ())  # a crash came between landing and this
        return PhaseResult(
            "failed",
            reason=f"{ctx.branch_name} moved from {start[:12]} to {head[:12]} since the fork; "
            "the resolution is left to whoever moved it",
        )
    number = int(ctx.state.get("test_retries", 0)) + 1
    base = deps.forge.branch_ref(ctx.base_branch)  # what the forge holds now, not at the fork
    path = deps.cartridge.landing_areas.worktree_dir(repo) / ctx.id
    with deps.workspace.temporary_checkout(repo, start, path) as cwd:
        # Prepared as the parent's worktree was: the checks of the resolution read the
        # same ignored files and run after the same setup.
        setup = landing.prepare_checkout(ctx, deps, cwd, MERGE, "conflict resolution")
        outcome = _attempt(ctx, deps, cwd, number, base, setup)
        if isinstance(outcome, PhaseResult):
            return outcome
        sha, evidence = outcome
        if deps.effects.fence is not None:  # a worker that lost the lease lands nothing
            deps.effects.fence.check()
        # Compare-and-swap: only from the head the child started from.
        git(["update-ref", f"refs/heads/{ctx.branch_name}", sha, start], repo)
    return _landed(ctx, deps, sha, (evidence,))


def _attempt(
    ctx: WorkflowContext,
    deps: PhaseDeps,
    cwd: Path,
    number: int,
    base: str,
    setup: CheckResult | None,
) -> tuple[str, MilestoneWrite] | PhaseResult:
    """One attempt in the checkout ``cwd``, merging the ref ``base``: the merge commit
    and its evidence, or the result that ends the attempt (retry, failed). ``setup``:
    the checkout's ``landing_areas.setup`` run (None without one); failed, it is the
    failed check."""
    conflicted = deps.workspace.start_base_merge(cwd, base)
    extra = ""
    if ctx.state.get("last_check_failure"):
        extra = f"\n## Your last attempt was refused\n\n{ctx.state['last_check_failure']}\n"
    answer = ""
    if conflicted:
        prompt = CONFLICT_PROMPT.format(
            base=ctx.base_branch,
            files="\n".join(f"- {name}" for name in conflicted),
            title=ctx.state.get("parent_title", ctx.title),
            ticket=ctx.state.get("parent_ticket", ctx.ticket),
            extra=extra,
        )
        try:
            answer = deps.agents.ask(
                ctx,
                MERGE,
                "build",
                prompt,
                cwd,
                round=int(ctx.state.get("fork_round", 1)),
                attempt=number,
                session_line=f"conflict-a{number}",  # throwaway: never the parent's line
            ).text.strip()[-2000:]
        except AgentFailed as exc:
            return agent_failure(exc, milestones=(_evidence(number, "failed", str(exc), {}),))
    marked = [name for name in conflicted if _has_markers(cwd / name)]
    message = (
        f"Merge {ctx.base_branch} into {ctx.branch_name}: conflicts resolved\n\n"
        f"phasegate conflict resolution, attempt {number}\n\n{TRAILER}: {ctx.id}"
    )
    sha = None
    if marked:
        pass  # refused below: nothing is committed
    elif conflicted:
        sha = deps.workspace.commit_all(cwd, message) or deps.workspace.commit_empty(cwd, message)
    else:
        # git merged it by itself (the base moved on since the fork): the commit
        # still carries the trailer, which a restart recognises the landing by.
        amended = defuse_closing(message)  # as commit_all does
        git([*IDENTITY, "commit", "--amend", "-q", "--no-verify", "-m", amended], cwd)
        sha = deps.workspace.rev(cwd, "HEAD")
    start = str(ctx.state["parent_head"])
    diff = git(["diff", start, "HEAD", "--", *conflicted], cwd) if sha and conflicted else ""
    # What the merge commit holds that neither side had (the combined diff): the
    # agent's own writing, wherever it wrote; the base's changes are not its.
    own = git(["show", "--format=", "--cc", "HEAD"], cwd) if sha else ""
    oversized = len(own.encode()) > deps.limits.max_diff_bytes
    leaked = [] if oversized else files_with_secrets(own, cartridge_secrets(deps.cartridge))
    checks: list[CheckResult] = []
    if sha and not leaked and not oversized:
        # A failed setup is the failed check: the checks would only fail for want of it.
        failed_setup = setup is not None and not setup.passed
        checks = [setup] if setup is not None and failed_setup else deps.run_checks(cwd)
    failure = ""
    if marked:
        failure = "conflict markers remain in: " + ", ".join(marked)
    elif oversized:
        failure = (
            f"the resolution is {len(own.encode())} bytes > limit "
            f"{deps.limits.max_diff_bytes} (limits.max_diff_bytes)"
        )
        diff = ""  # never stored
    elif leaked:
        failure = "the resolution held a secret value in: " + ", ".join(leaked)
        diff = ""  # never stored
    elif not all(c.passed for c in checks):
        failure = "the checks failed on the resolution:\n\n" + "\n\n".join(
            f"$ {c.command}  (exit code {c.exit_code})\n{c.output[-1500:]}"
            for c in checks
            if not c.passed
        )
    data = {
        "conflicted": conflicted,
        "markers_left": marked,
        "diff": diff[:_DIFF_LIMIT],
        "checks": [c.as_dict() for c in checks],
        "commit": sha,
        "agent_summary": answer,
    }
    if not failure:
        assert sha is not None
        return sha, _evidence(number, "completed", f"resolved, commit {sha[:12]}", data)
    evidence = _evidence(number, "failed", failure[:300], data)
    if number <= deps.limits.max_dev_retries:
        return PhaseResult(
            "retry",
            state={"test_retries": number, "last_check_failure": failure[-4000:]},
            milestones=(evidence,),
        )
    return PhaseResult(
        "failed",
        reason=f"conflict unresolved after {number} attempt(s) (limits.max_dev_retries): "
        f"{failure[:1000]}",
        state={"test_retries": number, "last_check_failure": failure[-4000:]},
        milestones=(evidence,),
    )


def _landed(
    ctx: WorkflowContext, deps: PhaseDeps, sha: str, milestones: tuple[MilestoneWrite, ...]
) -> PhaseResult:
    """The resolution is the parent's branch head: bring the parent's worktree to it,
    publish the branch, complete (which wakes the parent)."""
    assert ctx.branch_name is not None
    worktree = ctx.state.get("parent_worktree")
    if worktree and Path(worktree).is_dir():
        # Its index and files are still the old head's: update-ref moved only the ref.
        deps.workspace.discard_changes(Path(worktree))
    deps.effects.push_branch(MERGE, ctx.branch_name, sha)
    return PhaseResult.advance(
        COMPLETED,
        state={"resolution": sha},
        milestones=(
            *milestones,
            MilestoneWrite(
                "conflict_resolved",
                round=int(ctx.state.get("fork_round", 1)),
                summary=f"{ctx.branch_name} at {sha[:12]} holds {ctx.base_branch}",
                data={"sha": sha, "parent": ctx.parent_workflow_id},
            ),
        ),
    )


def _evidence(number: int, status: str, summary: str, data: dict[str, Any]) -> MilestoneWrite:
    return MilestoneWrite(
        "conflict_attempt",
        status="completed" if status == "completed" else "failed",
        attempt=number,
        summary=summary,
        data=data,
    )


def _has_markers(path: Path) -> bool:
    if not path.is_file():
        return False  # resolved by deleting it
    return bool(_MARKER.search(path.read_text(encoding="utf-8", errors="replace")))


def _trailer(deps: PhaseDeps, repo: Path, sha: str) -> str | None:
    for line in deps.workspace.commit_message(repo, sha).splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == TRAILER:
            return value.strip()
    return None
