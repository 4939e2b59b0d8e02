"""Another clone takes over: whose a workflow is, and a workflow moved to this clone
(many machines share one store, each with its own clone of the repository).

A workflow is of one repository: of its team forge's repository (``owner/name``,
``workflows.repository``) when the forge is GitHub, else of the repository at its
``repo_path`` (the local forge keeps issues and pull requests in the store and
branches in that one repository). A worker claims only its own repository's
(``store.leases.of_repository``); an engine asked to advance another's refuses
(ForeignWorkflow) before touching git or the forge.

A workflow of this engine's forge repository whose ``repo_path`` is another
clone's (a worker on another machine started it and died; its lease expired)
is moved here before its phase runs: ``repo_path`` becomes this clone and
``worktree_path`` the same workflow's place under this cartridge's worktree
directory, committed through the single commit path with a ``taken_over``
event, so the row says where the work now is. Self-heal then makes the
worktree from the branch the forge has (``healing.restore_branch``). Every
forge effect was journaled and is found again by lookup on the forge, so
nothing is done twice.

A clone taking a workflow back that it had before keeps an older copy of its
branch, and maybe of its worktree: the forge's branch is what the clone that
had it since pushed, and phasegate's pushes are forced (its branches are its
own), so working on the older copy would push the other clone's work away.
``take_over`` points the branch here at the forge's and removes the older
worktree (self-heal makes it again), with a ``branch_fetched`` event naming
what was replaced.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from phasegate.config.cartridge import Cartridge
from phasegate.core.contract import EventWrite, PhasegateError, PhaseResult, WorkflowContext
from phasegate.forge import Forge
from phasegate.forge.base import ForgeNotFound
from phasegate.git.command import run_git
from phasegate.git.workspace import Workspace
from phasegate.store import Store

__all__ = [
    "Commit",
    "Emit",
    "ForeignWorkflow",
    "Here",
    "forge_repository",
    "moved_here",
    "placed_here",
    "take_over",
]

log = logging.getLogger(__name__)

#: Commits a PhaseResult for a context, retrying a stale one (``Engine``'s commit).
Commit = Callable[[WorkflowContext, PhaseResult], "dict[str, Any] | None"]
#: Writes one event of a workflow.
Emit = Callable[[str, EventWrite], None]


class Here(Protocol):
    """The clone a workflow is taken over into, as the engine holds it
    (``runtime.engine.Engine`` is one): passed in, so this module does not import
    the engine that calls it."""

    store: Store
    repo: Path
    repository: str | None
    cartridge: Cartridge
    owner: str
    workspace: Workspace
    forge: Forge


class ForeignWorkflow(PhasegateError):
    """The workflow is another repository's: this engine's cartridge must not run it."""


def forge_repository(cartridge: Cartridge, forge: Forge) -> str | None:
    """The team forge's repository (``owner/name``, lower-cased: GitHub's names are
    case-insensitive, and two clones' cartridges may spell one differently) the
    engine works on, or None on the local forge (whose workflows are their
    clone's alone)."""
    if cartridge.forge.kind == "local":
        return None
    name = getattr(forge, "repository", None) or cartridge.forge.repository
    return str(name).lower() if name else None


def placed_here(
    row: Mapping[str, Any], repo: Path, repository: str | None, cartridge: Cartridge
) -> dict[str, str] | None:
    """The ``repo_path`` and ``worktree_path`` that move the workflow ``row`` to the
    clone at ``repo`` (resolved) of forge repository ``repository``; None when the
    row names this clone already. The worktree goes where this ``cartridge`` puts
    the workflow's (``landing_areas.worktree_dir(repo)``, as preparation does).

    Raises ForeignWorkflow when the row is another repository's: another forge
    repository, or (no forge repository recorded) another path.
    """
    here = str(repo)
    theirs = row.get("repository")
    same_path = row["repo_path"] == here or Path(row["repo_path"]).resolve() == repo
    if theirs is None or theirs != repository:
        if theirs is None and same_path:
            return None
        raise ForeignWorkflow(
            f"workflow {row['id']} is of "
            f"{theirs or 'the repository at ' + str(row['repo_path'])}, not of "
            f"{repository or here}: run it from a clone of its own repository"
        )
    if same_path:
        return None
    moved = {"repo_path": here}
    if row.get("worktree_path"):
        moved["worktree_path"] = str(cartridge.landing_areas.worktree_dir(repo) / row["id"])
    return moved


def moved_here(ctx: WorkflowContext, moved: Mapping[str, str], owner: str) -> PhaseResult:
    """The commit that records the workflow's move to this clone (``placed_here``):
    its phase and status kept, the new paths set, a ``taken_over`` event saying from
    where and by which worker (``owner``, its lease owner)."""
    return PhaseResult(
        "retry",
        status=ctx.status,
        updates=dict(moved),
        events=(
            EventWrite(
                "taken_over",
                {
                    "from_repo_path": ctx.repo_path,
                    "from_worktree_path": ctx.worktree_path,
                    **moved,
                    "phase": ctx.current_phase,
                    "by": owner,
                },
            ),
        ),
    )


def take_over(
    engine: Here, ctx: WorkflowContext, commit: Commit, emit: Emit
) -> WorkflowContext | None:
    """Move the workflow to ``engine``'s clone when it is another clone's of the
    engine's forge repository (``placed_here``; committed with a ``taken_over``
    event, through ``commit``), its branch here brought level with the forge's
    (``_level_branch``, its event through ``emit``), and return its context;
    ``ctx`` itself when it is this clone's already; None when the move was not
    committed. Raises ForeignWorkflow for another repository's
    workflow, nothing written; ForgeError and GitError from bringing the branch."""
    row = engine.store.workflow_row(ctx.id)
    moved = placed_here(row, engine.repo, engine.repository, engine.cartridge)
    if moved is None:
        return ctx
    if commit(ctx, moved_here(ctx, moved, engine.owner)) is None:
        return None
    log.warning("workflow %s taken over from %s into %s", ctx.id, ctx.repo_path, engine.repo)
    here = engine.store.load_context(ctx.id)
    _level_branch(engine, here, emit)
    return here


def _level_branch(engine: Here, ctx: WorkflowContext, emit: Emit) -> None:
    """When this clone has the workflow's branch already (it had the workflow
    before) and the forge's differs, point the branch at the forge's and remove
    this clone's worktree of the workflow: both are older than what the clone
    that had it since pushed. A branch the forge lacks (never pushed) is left."""
    branch, repo = ctx.branch_name, engine.repo
    if not branch or not engine.workspace.branch_exists(repo, branch):
        return  # self-heal brings it (healing.restore_branch)
    try:
        forge_ref = engine.forge.branch_ref(branch)
    except ForgeNotFound:
        return
    ours, theirs = engine.workspace.rev(repo, branch), engine.workspace.rev(repo, forge_ref)
    if ours == theirs:
        return
    for path in {Path(p) for p in (ctx.worktree_path, _checked_out_at(repo, branch)) if p}:
        engine.workspace.remove_worktree(repo, path)
    proc = run_git(["branch", "--force", branch, theirs], repo)
    if proc.returncode != 0:
        raise PhasegateError(f"git branch --force {branch} {theirs}: {proc.stderr.strip()}")
    emit(
        ctx.id,
        EventWrite(
            "branch_fetched",
            {
                "branch": branch,
                "sha": theirs,
                "ref": forge_ref,
                "replaced": ours,
                "note": f"this clone's copy of {branch} ({ours[:12]}) was older than the "
                f"forge's ({theirs[:12]}), pushed by the clone that had the workflow since: "
                "the forge's is taken, and the worktree is made again from it",
            },
        ),
    )


def _checked_out_at(repo: Path, branch: str) -> str | None:
    """The worktree of ``repo`` that has ``branch`` checked out, if one does."""
    listed = run_git(["worktree", "list", "--porcelain"], repo).stdout
    path = None
    for line in listed.splitlines():
        if line.startswith("worktree "):
            path = line.removeprefix("worktree ")
        elif line == f"branch refs/heads/{branch}":
            return path
    return None
