"""preparation: the issue, the branch and the worktree.

The only phase that creates the worktree, so ``advance()`` skips the worktree
self-heal for it (docs/contracts/lifecycle.md: preparation).

- preconditions: current_phase == "preparation", status == "preparing"; the
  repository exists and has the base branch.
- inputs: title, ticket, repo_path, base_branch, the cartridge's worktree_root.
  The branch is made from the forge's base (``forge.branch_ref``: the base
  branch itself on the local forge, GitHub's fetched on GitHub, where the
  local one is stale once a pull request merged there); ``state["base_sha"]``
  is where it was.
- authoritative evidence: the ``branch_created`` milestone (completed); also
  ``issue_created`` and ``worktree_ready``.
- side effects: for a new project (``state["new_project"]``) first the forge's
  repository with its first commit (journaled as ``repo_setup``: phasegate.phases.repo_setup),
  forge issue (journaled; none for a workflow started from an
  existing issue by `watch` or `import`), git branch (journaled), git worktree,
  then the worktree prepared (``phasegate.phases.landing``: the cartridge's
  copied and linked files, its setup command; a ``worktree_setup`` milestone).
- postconditions: issue_number, branch_name, worktree_path set;
  ``state["branch_strategy"]`` (``ticket`` or ``epic``: docs/epics.md) set;
  current_phase == "planning", status == "planning".
- re-entry point: current_phase == "preparation". A completed issue or branch
  milestone is reused, a leftover directory at the worktree path is cleared.
  The fork fast path, so a partial earlier attempt is reused: a branch that
  already exists — in the repository, or on the forge (``forge.branch_ref``:
  the local forge fetches ``origin/BRANCH`` from the ``origin`` remote,
  GitHub's is fetched with the forge's token) — is attached to (a worktree on
  it) instead of being made anew from the base; its ``branch_created``
  milestone says "attached" (``local``, ``origin`` or ``forge``) and keeps the
  head found.
- recovery behavior: a git or forge error leaves ``branch_created`` failed and
  the workflow failed with the reason; ``phasegate resume`` re-runs the phase
  without a second issue.
- terminal outcomes: completed → planning; failed on a git or forge error;
  paused when ``landing_areas.setup`` fails (a resume runs it again).
"""

from __future__ import annotations

import re
from pathlib import Path

from phasegate.core.contract import (
    PLANNING,
    PREPARATION,
    MilestoneWrite,
    PhaseResult,
    WorkflowContext,
)
from phasegate.forge.base import ForgeNotFound
from phasegate.git.command import run_git
from phasegate.git.workspace import git
from phasegate.phases import landing, repo_setup
from phasegate.phases.deps import PhaseDeps

__all__ = ["branch_name", "branch_name_for", "run"]


def branch_name(workflow_id: str, title: str) -> str:
    """``phasegate/<id>-<slug of the title>``, at most 60 characters."""
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:40].rstrip("-")
    return f"phasegate/{workflow_id}-{slug}" if slug else f"phasegate/{workflow_id}"


def branch_name_for(ctx: WorkflowContext) -> str:
    """The branch preparation makes for ``ctx`` (``branch_name``)."""
    return branch_name(ctx.id, ctx.title)


def run(ctx: WorkflowContext, deps: PhaseDeps) -> PhaseResult:
    repo = Path(ctx.repo_path)
    if ctx.state.get("new_project"):  # the repository before the issue (repo_setup)
        repo_setup.set_up(ctx, deps)
    if ctx.issue_number:  # started from a person's issue (watch, import): it is the ticket
        issue = ctx.issue_number
    else:
        body = f"{ctx.ticket}\n\n_Filed by phasegate for workflow `{ctx.id}`._"
        issue = deps.effects.create_issue(PREPARATION, ctx.title, body)

    branch = ctx.branch_name or branch_name_for(ctx)
    base = deps.forge.branch_ref(ctx.base_branch)
    base_sha = deps.workspace.rev(repo, base)
    attached = _attach(ctx, deps, repo, branch)
    if attached is None:
        deps.effects.create_branch(PREPARATION, branch, base)

    path = deps.cartridge.landing_areas.worktree_dir(repo) / ctx.id
    worktree = deps.workspace.ensure_worktree(repo, branch, path)
    # The worktree as a developer's: ignored files, the setup (phasegate.phases.landing).
    paused = landing.prepare(ctx, deps, worktree, PREPARATION)
    if paused is not None:
        return paused

    return PhaseResult.advance(
        PLANNING,
        updates={
            "issue_number": issue,
            "branch_name": branch,
            "worktree_path": str(worktree),
            "current_round": 0,
        },
        # ``run --branch-strategy`` put the person's choice in the state; else the cartridge's
        state={
            "base_sha": base_sha,
            "branch_strategy": ctx.state.get("branch_strategy")
            or deps.cartridge.workflow.branch_strategy,
        },
        milestones=(
            *((attached,) if attached else ()),
            MilestoneWrite(
                "worktree_ready",
                summary=f"worktree at {worktree}",
                data={"path": str(worktree), "branch": branch},
            ),
        ),
    )


def _attach(
    ctx: WorkflowContext, deps: PhaseDeps, repo: Path, branch: str
) -> MilestoneWrite | None:
    """The ``branch_created`` milestone of a surviving branch, attached to; None when
    the branch is new (or the journal made it: its milestone is reused as it is).

    Written under the journal's own dedupe key, so the journal reads the branch as
    made. A branch only on the forge is fetched and made local: tracking
    ``origin/<branch>`` when it came from the origin remote.
    """
    journal = MilestoneWrite("branch_created", key=branch)
    made = deps.store.milestone_by_key(deps.store.dedupe_key(ctx.id, PREPARATION, journal))
    if made is not None and made.status == "completed":
        return None
    where = "local"
    if not deps.workspace.branch_exists(repo, branch):
        ref = _on_forge(deps, repo, branch)
        if ref is None:
            return None
        tracked = ref.startswith("refs/remotes/")
        git(["branch", *(["--track"] if tracked else []), branch, ref], repo)
        where = "origin" if tracked else "forge"
    sha = deps.workspace.rev(repo, branch)
    return MilestoneWrite(
        "branch_created",
        key=branch,
        summary=f"{branch}: attached to the surviving {where} branch at {sha[:12]}",
        data={
            "params": {"branch": branch, "base": ctx.base_branch},
            "result": {"sha": sha},
            "attached": where,
        },
    )


def _on_forge(deps: PhaseDeps, repo: Path, branch: str) -> str | None:
    """The local ref holding the forge's ``branch`` (``forge.branch_ref``), or None
    when the forge has none (or names a ref that holds no commit here)."""
    try:
        ref = deps.forge.branch_ref(branch)
    except ForgeNotFound:
        return None
    if run_git(["rev-parse", "--verify", "-q", f"{ref}^{{commit}}"], repo).returncode != 0:
        return None
    return ref
