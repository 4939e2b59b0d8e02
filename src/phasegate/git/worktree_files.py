"""Bringing the main checkout's ignored files into a new worktree: copied, or linked.

``landing_areas.copy`` and ``landing_areas.link`` name paths or globs relative
to the repository root (``config.landing_areas.entry_problem`` refuses one that
escapes it). Only what git ignores in the worktree is brought: an untracked
file git does not ignore would be swept into the agent's next commit (a
``.env`` pushed to the forge), and a tracked one is the branch's to give. What
is already in the worktree is left as it is. ``.git`` and ``.phasegate`` are
never brought, whatever a glob matches.
"""

from __future__ import annotations

import glob
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from phasegate.config.landing_areas import OWN_DIRS
from phasegate.git.command import GitError, run_git

__all__ = ["ALREADY_THERE", "Brought", "bring_files"]

#: Why an entry the worktree has already is not brought (a resume's second pass).
ALREADY_THERE = "already in the worktree"


@dataclass
class Brought:
    """What ``bring_files`` did: paths relative to the repository root, and each entry
    or path skipped with why."""

    copied: list[str] = field(default_factory=list)
    linked: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"copied": self.copied, "linked": self.linked, "skipped": self.skipped}

    def summary(self) -> str:
        """``N copied, N linked, N already there, N skipped`` for a milestone's line:
        what a resume finds in the worktree already is not what was refused."""
        there = sum(s["why"] == ALREADY_THERE for s in self.skipped)
        return (
            f"{len(self.copied)} copied, {len(self.linked)} linked, {there} already there, "
            f"{len(self.skipped) - there} skipped"
        )


def bring_files(
    repo: Path, worktree: Path, copy: Sequence[str] = (), link: Sequence[str] = ()
) -> Brought:
    """Copy the ``copy`` entries and symlink the ``link`` entries of ``repo`` (the
    main checkout) into ``worktree``. A directory is copied whole (its symbolic
    links as links); a link points at the main checkout's path, absolute.

    An entry that matches nothing, a path git does not ignore in the worktree,
    one already there and one whose real place is outside ``repo`` are skipped,
    each named in ``skipped`` with why. Raises GitError when git cannot say
    what it ignores, OSError when a copy fails.
    """
    repo = repo.resolve()
    brought = Brought()
    wanted: list[tuple[str, str]] = []  # (how, path)
    for how, entries in (("copy", copy), ("link", link)):
        for entry in entries:
            found = _matches(repo, entry)
            if not found:
                brought.skipped.append({"entry": entry, "why": "not in the main checkout"})
            wanted += [(how, path) for path in found]
    # git sees a symbolic link as a file: a pattern for a directory only ("cache/")
    # does not ignore a link named cache, and `git clean` would take it.
    asked = [(path, how == "copy" and (repo / path).is_dir()) for how, path in wanted]
    ignored = _ignored(worktree, asked)
    for how, path in dict.fromkeys(wanted):
        source, target = repo / path, worktree / path
        why = _refusal(repo, source, target, path in ignored, how)
        if why is not None:
            brought.skipped.append({"path": path, "why": why})
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if how == "link":
            target.symlink_to(source, target_is_directory=source.is_dir())
            brought.linked.append(path)
        elif source.is_dir() and not source.is_symlink():
            shutil.copytree(source, target, symlinks=True, ignore=_leading_out(repo, brought))
            brought.copied.append(path)
        else:
            shutil.copy2(source, target, follow_symlinks=False)
            brought.copied.append(path)
    return brought


def _leading_out(repo: Path, brought: Brought) -> Callable[[str, list[str]], set[str]]:
    """``copytree``'s ``ignore``: the symbolic links of a copied directory that lead
    out of ``repo``, each added to ``brought.skipped`` with why."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        left = set()
        for name in names:
            source = Path(directory, name)
            why = _outside(repo, source) if source.is_symlink() else None
            if why is not None:
                brought.skipped.append({"path": str(source.relative_to(repo)), "why": why})
                left.add(name)
        return left

    return ignore


def _matches(repo: Path, entry: str) -> list[str]:
    """The paths ``entry`` (a path or a glob, ``**`` recursive) names in ``repo``,
    sorted, without ``.git``, ``.phasegate`` or anything inside them."""
    found = glob.glob(entry.strip().rstrip("/"), root_dir=repo, recursive=True, include_hidden=True)
    paths = sorted({PurePosixPath(Path(p).as_posix()) for p in found})
    return [str(p) for p in paths if p.parts and not set(p.parts) & set(OWN_DIRS)]


def _ignored(worktree: Path, paths: list[tuple[str, bool]]) -> set[str]:
    """The paths of ``paths`` (each with whether it is a directory) git ignores in
    ``worktree``: its ``.gitignore`` files, ``info/exclude`` and global excludes."""
    if not paths:
        return set()
    asked = {path + ("/" if is_dir else ""): path for path, is_dir in paths}
    proc = run_git(["check-ignore", "-z", "--stdin"], worktree, "\0".join(asked) + "\0")
    if proc.returncode not in (0, 1):  # 1: none of them is ignored
        raise GitError(f"git check-ignore in {worktree}: {proc.stderr.strip()}")
    return {asked[name] for name in proc.stdout.split("\0") if name in asked}


def _refusal(repo: Path, source: Path, target: Path, ignored: bool, how: str) -> str | None:
    """Why ``source`` is not brought to ``target`` (``how``: copy or link); None when it is."""
    if not ignored:
        why = "git does not ignore it, so an agent's commit would take it in"
        if how == "link":
            why += f" (a link is a file to git: ignore {target.name}, not {target.name}/)"
        return why
    if os.path.lexists(target):
        return ALREADY_THERE
    return _outside(repo, source)


def _outside(repo: Path, source: Path) -> str | None:
    """Why ``source`` is not brought when a symbolic link (itself, or a linked
    directory on its way) leads out of ``repo``; None when its real place is inside."""
    real = Path(os.path.realpath(source))
    if not real.is_relative_to(repo):
        return f"its real place is outside the repository ({real})"
    return None
