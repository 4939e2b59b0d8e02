"""Another clone takes over: whose a workflow is, and a workflow moved to this clone
(issue 12, item 2; DESIGN.md §6, "one clone per worker machine").

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
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from phasegate.cartridge import Cartridge
from phasegate.contract import EventWrite, PhasegateError, PhaseResult, WorkflowContext
from phasegate.forge import Forge

__all__ = ["ForeignWorkflow", "forge_repository", "moved_here", "placed_here"]


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
