"""The cartridge's ``[landing_areas]`` table: where worktrees go, how each is prepared, the checks.

A worktree is prepared as a developer's checkout would be: the ignored files
``copy`` and ``link`` name are brought from the main checkout, ``setup`` runs
once in it, and ``ports`` free ports are reserved for it (docs/worktrees.md).
``keep_failed_days`` and ``keep_cancelled_days`` say how long a failed or
cancelled workflow's worktree and branch stay. ``CartridgeError`` lives here
because ``worktree_dir`` raises it; ``phasegate.config.cartridge`` re-exports it.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from phasegate.config.store_url import CARTRIDGE_FILE
from phasegate.core.contract import PhasegateError

__all__ = ["OWN_DIRS", "CartridgeError", "LandingAreas", "entry_problem"]

#: What no copy or link entry may name or reach into: git's own directory and
#: phasegate's (its store, its worktrees, its agents' homes).
OWN_DIRS = (".git", ".phasegate")


class CartridgeError(PhasegateError):
    """The cartridge is missing, unreadable or invalid; the message names the key."""


def entry_problem(entry: str) -> str | None:
    """Why ``entry`` (a ``copy`` or ``link`` path or glob) cannot be one; None when it can.

    An entry is relative to the repository root, has no ``..`` part and names
    neither ``.git`` nor ``.phasegate`` at its start: an entry that escapes the
    repository would copy a person's other files into an agent's reach.
    """
    text = entry.strip()
    if not text:
        return "an empty entry"
    if "\\" in text:
        return f"{entry!r} holds a backslash; write paths with /"
    path = PurePosixPath(text)
    if path.is_absolute() or text.startswith("~"):
        return f"{entry!r} is not relative to the repository root"
    if ".." in path.parts:
        return f"{entry!r} climbs out of the repository (..)"
    if path.parts and path.parts[0] in OWN_DIRS:
        return f"{entry!r} is inside {path.parts[0]}, which is never copied"
    return None


class LandingAreas(BaseModel):
    """``[landing_areas]``: where workflows' worktrees are made and how each new one is
    prepared (``copy``, ``link``, ``setup``, ``ports``: docs/worktrees.md), the checks
    run in them, and how long a failed or cancelled workflow's worktree stays."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    worktree_root: str = ".phasegate/worktrees"
    """Where workflows' worktrees are made: inside ``.phasegate/`` or outside the repository."""
    checks: list[str] = Field(default_factory=list)
    """Shell commands run after each build and on the merge commit; a check passes when it exits 0.
    """
    check_timeout: float = Field(default=600.0, gt=0, description="seconds per check")
    pass_env: list[str] = Field(
        default_factory=list, description="variables the checks see besides PATH, HOME, locale"
    )
    # How the checks are confined: as a role's ``sandbox`` and ``network``;
    # writable are the checkout and a private temp dir.
    sandbox: Literal["bwrap", "none"] | None = None
    network: bool = True
    """False cuts the checks off the network (a loopback of their own)."""
    copy_files: list[str] = Field(
        default_factory=list,
        alias="copy",
        description="paths or globs, relative to the repository root, of files git ignores "
        "(.env, local config) copied from the main checkout into each new worktree; "
        "a missing entry is skipped with an event",
    )
    link: list[str] = Field(
        default_factory=list,
        description="paths or globs of ignored files or directories (big caches) symlinked "
        "from the main checkout into each new worktree instead of copied",
    )
    setup: str | None = Field(
        default=None,
        min_length=1,
        description="a shell command run once in each new worktree (npm ci, uv sync), "
        "sandboxed like the checks; a failing setup pauses the workflow",
    )
    setup_timeout: float = Field(default=900.0, gt=0, description="seconds the setup may run")
    ports: int = Field(
        default=0,
        ge=0,
        le=100,
        description="free ports reserved per worktree, given to its agents, checks and setup "
        "as PHASEGATE_PORT_BASE and PHASEGATE_PORT_COUNT; 0: none",
    )
    keep_failed_days: float | None = Field(
        default=None,
        ge=0,
        description="days after a failed workflow ended that its worktree and local branch "
        "are removed (by phasegate cleanup and the worker); unset: kept",
    )
    keep_cancelled_days: float | None = Field(
        default=None,
        ge=0,
        description="days after a cancelled workflow ended that its worktree and local "
        "branch are removed; unset: kept",
    )

    @field_validator("copy_files", "link")
    @classmethod
    def _inside_the_repository(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            problem = entry_problem(entry)
            if problem is not None:
                raise ValueError(f"{problem}; entries are paths or globs inside the repository")
        return entries

    @property
    def prepares(self) -> bool:
        """Whether a new worktree gets anything beyond its checkout: files or a setup."""
        return bool(self.copy_files or self.link or self.setup)

    def worktree_dir(self, repo: Path) -> Path:
        """Where the workflows' worktrees are made: ``worktree_root`` resolved against
        ``repo`` (an absolute path, or relative to the repository root).

        Raises CartridgeError naming ``landing_areas.worktree_root`` unless it is
        inside the repository's ``.phasegate/`` or outside the repository
        altogether and not one of its ancestors: worktrees made at ``/``, beside
        the repository's files, in its ``.git`` or in the checkout itself would
        mix agents' files with the person's.
        """
        repo = repo.resolve()
        root = Path(self.worktree_root).expanduser()
        path = (root if root.is_absolute() else repo / root).resolve()
        own = repo / ".phasegate"
        key = f"{repo / CARTRIDGE_FILE}: landing_areas.worktree_root = {self.worktree_root!r}"
        if path == repo or path in repo.parents:
            where = "the repository itself" if path == repo else "an ancestor of the repository"
            raise CartridgeError(
                f"{key}: {path} is {where}; use a directory "
                "inside .phasegate/ (the default .phasegate/worktrees) or one "
                "outside the repository"
            )
        if path.is_relative_to(repo) and not (path != own and path.is_relative_to(own)):
            raise CartridgeError(
                f"{key}: {path} is inside the checkout; "
                "worktrees go inside .phasegate/ (the default "
                ".phasegate/worktrees) or outside the repository"
            )
        return path
