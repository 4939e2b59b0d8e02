"""What a killed git leaves behind, recognised and cleared.

A git process killed mid-command leaves lock files (``index.lock``,
``HEAD.lock``, ``config.lock``, ``packed-refs.lock`` with its
``packed-refs.new``, ``refs/heads/x.lock``)
that fail every later command, and a ``git worktree add`` killed midway
leaves a worktree registered as ``locked`` ("initializing"), maybe without
its ``.git`` file, its HEAD or its index. This module finds them and says
whether a live process still holds them; ``Workspace`` does the repairing.

A lock is *held* when a process has it open (git keeps a lock file open
while it writes it: found through ``/proc/*/fd``), or while any live git
process works in the repository or one of its worktrees, whatever the lock's
age: git closes some locks long before it is done with them (a ref's lock
before renaming it into place; ``index.lock`` while ``git commit`` waits for
its editor), so a person's running commit must never lose its lock. Only a
lock nobody can hold is stale; one a live git keeps is contention, retried
and then a pause with git's message.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from phasegate.git import files as _gitfs

__all__ = [
    "WorktreeEntry",
    "held",
    "lock_files",
    "parse_worktrees",
    "read_worktrees",
    "registration",
    "remove_stale_locks",
    "worktree_dirs",
]


@dataclass(frozen=True)
class WorktreeEntry:
    """One record of ``git worktree list --porcelain``."""

    path: Path
    branch: str | None  # None when detached
    locked: str | None  # the lock's reason ("" when none given); None when not locked
    prunable: bool


def parse_worktrees(porcelain: str) -> list[WorktreeEntry]:
    """The records of ``git worktree list --porcelain`` output, in its order."""
    entries: list[WorktreeEntry] = []
    for block in porcelain.strip().split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, _, value = line.partition(" ")
            fields[key] = value
        if "worktree" not in fields:
            continue
        branch = fields.get("branch")
        entries.append(
            WorktreeEntry(
                path=Path(fields["worktree"]).resolve(),
                branch=branch.removeprefix("refs/heads/") if branch else None,
                locked=fields.get("locked"),
                prunable="prunable" in fields,
            )
        )
    return entries


def read_worktrees(common: Path) -> list[WorktreeEntry] | None:
    """What ``git worktree list --porcelain`` says, read from the git directory (the
    main checkout's ``HEAD``, each registration's ``gitdir``, ``HEAD`` and
    ``locked``: ``phasegate.git.files``); None when anything there is not plain (a
    bare repository, a registration without a readable ``gitdir`` or ``HEAD``):
    ask git then."""
    if common.name != ".git" or _gitfs.head(common) is None:
        return None
    heads: list[tuple[Path, Path, str | None, bool]] = [
        (common.parent.resolve(), common, None, False)
    ]
    for entry in _gitfs.registrations(common):
        if entry.path is None:
            return None
        heads.append((entry.path, entry.admin, entry.locked, entry.prunable))
    found = []
    for path, gitdir, locked, prunable in heads:
        head = _gitfs.head(gitdir)
        if head is None:
            return None
        branch = head[5:].removeprefix("refs/heads/") if head.startswith("ref: ") else None
        found.append(WorktreeEntry(path, branch, locked, prunable))
    return found


def worktree_dirs(common: Path) -> list[Path]:
    """The main checkout and every linked worktree's directory, read from the
    git directory itself (no git call: git may be what is broken)."""
    dirs = [common.parent] if common.name == ".git" else []
    for gitdir_file in (common / "worktrees").glob("*/gitdir"):
        try:
            dirs.append(Path(gitdir_file.read_text().strip()).parent)
        except OSError:
            continue  # a half-made registration: prune clears it
    return dirs


def registration(common: Path, path: Path) -> Path | None:
    """The git dir (``<common>/worktrees/<id>``) registering the worktree at ``path``."""
    target = path.resolve() / ".git"
    # The worktree's own ``.git`` file names its registration: one read, not one per
    # registration, when the two agree (else, or when it is gone, look at them all).
    try:
        pointed = target.read_text().strip()
        if pointed.startswith("gitdir: "):
            admin = (target.parent / pointed.removeprefix("gitdir: ")).resolve()
            back = Path((admin / "gitdir").read_text().strip())
            if admin.parent == (common / "worktrees").resolve() and back.resolve() == target:
                return admin
    except OSError:
        pass
    for gitdir_file in (common / "worktrees").glob("*/gitdir"):
        try:
            if Path(gitdir_file.read_text().strip()).resolve() == target:
                return gitdir_file.parent
        except OSError:
            continue
    return None


def lock_files(common: Path) -> list[Path]:
    """Every git lock file in the common directory and the worktrees' git dirs, and
    ``packed-refs.new`` (rewriting packed-refs, git creates it exclusively too)."""
    found = [p for p in [common / "packed-refs.new"] if p.is_file()]
    for root in (common, *(p for p in (common / "worktrees").glob("*") if p.is_dir())):
        try:
            found += [p for p in root.glob("*.lock") if p.is_file()]
        except FileNotFoundError:  # a worktree another process removed meanwhile
            continue
    for sub in ("refs", "logs"):
        try:
            found += [p for p in (common / sub).rglob("*.lock") if p.is_file()]
        except FileNotFoundError:  # a ref directory git pruned meanwhile
            continue
    return found


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _open_paths(pid: int) -> list[str]:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone, or not ours to read
        return []
    paths = []
    for fd in fds:
        try:
            paths.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue  # closed meanwhile
    return paths


def _live_git_in(dirs: Iterable[Path]) -> bool:
    roots = [str(d.resolve()) for d in dirs]
    for pid in _pids():
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "git":
                continue
            cwd = os.readlink(f"/proc/{pid}/cwd")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(cwd == r or cwd.startswith(r + os.sep) for r in roots):
            return True
    return False


def held(path: Path, common: Path) -> bool:
    """Whether a live process holds the lock file (or git marker) at ``path``: one has
    it open, or a git runs in the repository or one of its worktrees."""
    target = str(path.resolve())
    if any(target in _open_paths(pid) for pid in _pids()):
        return True
    if not path.exists():
        return True  # its git finished with it: nothing stale to remove
    return _live_git_in([common, *worktree_dirs(common)])


def remove_stale_locks(common: Path) -> list[Path]:
    """Remove every lock file under ``common`` that nobody holds; the removed ones.

    A lock gone, or replaced (another inode or mtime) while it was being
    judged, is a live git's: only the very file judged stale is removed.
    """
    removed = []
    for lock in lock_files(common):
        try:
            before = lock.lstat()
            if held(lock, common):
                continue
            after = lock.lstat()
        except FileNotFoundError:
            continue  # its git finished with it meanwhile
        if (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns):
            lock.unlink(missing_ok=True)
            removed.append(lock)
    return removed
