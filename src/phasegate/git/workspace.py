"""Git worktrees, commits, patches and merges: the real git, run as a subprocess.

Every function takes explicit paths; nothing here reads the store. Errors are
``GitError`` (with the git command and its stderr; see ``phasegate.git.command``) or
``PatchError``. Running the checks is ``phasegate.git.checks``.
"""

from __future__ import annotations

import re
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

from phasegate.core.closing import defuse_closing
from phasegate.core.contract import PhasegateError
from phasegate.git import files as _gitfs
from phasegate.git import repair as _repair
from phasegate.git.checks import CheckResult, run_checks
from phasegate.git.command import (
    IDENTITY,
    DirtyCheckout,
    GitError,
    GitTransient,
    common_dir,
    git,
    list_refs,
    run_git,
)
from phasegate.git.merge import BaseMerging
from phasegate.proc.sandbox import Confinement

__all__ = [
    "CheckResult",
    "DirtyCheckout",
    "GitError",
    "GitTransient",
    "PatchError",
    "normalize_diff",
    "Workspace",
    "git",
]


class PatchError(PhasegateError):
    """A patch does not apply, or reaches outside its worktree; nothing was changed."""


#: git's extended header lines: never part of a hunk, and dropped by normalize_diff.
_GIT_HEADER = re.compile(
    r"^(diff --git |index |(old|new|deleted file|new file) mode |similarity index |"
    r"dissimilarity index |rename (from|to) |copy (from|to) )"
)


def normalize_diff(diff: str) -> str:
    """``diff`` as a plain unified diff that ``git apply --recount`` reads as meant.

    Models write git-style headers without the ``new file mode`` line (git
    would then create a file named ``dev/null``) and plain multi-file diffs
    (``--recount`` would count the next file's ``---`` line as a removal). So
    git's extended headers are dropped, and each file's ``---``/``+++`` pair is
    preceded by a ``diff`` line, which ends the previous hunk; a path missing
    its ``a/``/``b/`` prefix gets it. File modes and renames are lost; a model
    cannot be trusted with them anyway.
    """
    lines = [line for line in diff.splitlines(keepends=True) if not _GIT_HEADER.match(line)]
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = _header_path(line, "a/"), _header_path(lines[i + 1], "b/")
            out += [f"diff {old} {new}\n", f"--- {old}\n", f"+++ {new}\n"]
            i += 2
        else:
            out.append(line)
            i += 1
    return "".join(out)


def _header_path(line: str, prefix: str) -> str:
    path = line[4:].rstrip("\r\n").split("\t")[0].strip()
    if path == "/dev/null" or path.startswith(prefix):
        return path
    return prefix + path


def _patch_paths(patch: str) -> list[str]:
    paths = []
    for line in patch.splitlines():
        if line.startswith(("--- ", "+++ ")):
            name = line[4:].split("\t")[0].strip()
            if name == "/dev/null":
                continue
            if name.startswith(("a/", "b/")):
                name = name[2:]
            paths.append(name)
        elif line.startswith("diff --git "):
            paths.extend(p[2:] if p[:2] in ("a/", "b/") else p for p in line.split()[2:4])
    return paths


def _deleted(fields: list[str]) -> list[str]:
    """The paths ``git status --porcelain=v2 -z`` says are deleted vs HEAD, staged or not."""
    found, i = [], 0
    while i < len(fields):
        entry = fields[i]
        kind, xy = entry[:2], entry[2:4]
        if kind in ("1 ", "2 ") and "D" in xy:
            found.append(entry.split(" ", 8 if kind == "1 " else 9)[-1])
        i += 2 if kind == "2 " else 1  # a rename's or copy's origin path follows it
    return found


class Workspace(BaseMerging):
    """Worktrees and git operations for one machine."""

    # -- branches and worktrees -------------------------------------------------

    def branch_exists(self, repo: Path, branch: str) -> bool:
        """Whether ``refs/heads/<branch>`` exists (read from the ref files when plain)."""
        if _gitfs.branch_name_is_plain(branch):
            return f"refs/heads/{branch}" in list_refs(repo)
        return bool(git(["branch", "--list", branch], repo))

    def rev(self, repo: Path, ref: str) -> str:
        """The commit ``ref`` names (``rev-parse --verify <ref>^{commit}``; HEAD and a
        plain branch read from the ref files: ``_gitfs.resolve``). Raises GitError."""
        found = _gitfs.resolve(repo, ref)
        return (
            found
            if found is not None
            else git(["rev-parse", "--verify", f"{ref}^{{commit}}"], repo)
        )

    def create_branch(self, repo: Path, branch: str, base: str) -> str:
        """Create ``branch`` at ``base`` unless it exists; return its head SHA."""
        if not self.branch_exists(repo, branch):
            git(["branch", branch, base], repo)
        return self.rev(repo, branch)

    def delete_branch(self, repo: Path, branch: str) -> None:
        if self.branch_exists(repo, branch):
            git(["branch", "-D", branch], repo)

    def _worktrees(self, repo: Path) -> dict[Path, _repair.WorktreeEntry]:
        """Worktree path → its record in ``git worktree list --porcelain`` (read from
        the git directory when it is plain: ``_repair.read_worktrees``)."""
        entries = _repair.read_worktrees(self.common_dir(repo))
        if entries is None:
            entries = _repair.parse_worktrees(git(["worktree", "list", "--porcelain"], repo))
        return {e.path: e for e in entries}

    def _registered_worktrees(self, repo: Path) -> dict[Path, str | None]:
        """Worktree path → checked-out branch (None when detached)."""
        return {path: e.branch for path, e in self._worktrees(repo).items()}

    def common_dir(self, repo: Path) -> Path:
        """The repository's git common directory (``.git`` of the main checkout), absolute."""
        common = common_dir(repo)
        if common is None:
            raise GitError(f"{repo} is not in a git repository")
        return common

    def repair(self, repo: Path) -> list[str]:
        """Clear what killed git processes left in ``repo``; returns what was done.

        Removes lock files nobody holds (``phasegate.git.repair``: index, HEAD,
        config, packed-refs and ref locks, in the common directory and every
        worktree's git dir), unlocks worktrees a killed ``git worktree add``
        left locked ("initializing") while no git runs in the repository
        (an add in flight looks the same), prunes registrations whose
        directory is gone, and removes the scratch checkout a killed merge
        left holding its base (``release_scratch_checkouts``), which would
        keep the person from checking the base out. A lock a live process
        holds, a live merge's scratch checkout and a worktree a person locked
        are left alone. Raises GitError when ``repo`` is not a repository.
        """
        common = self.common_dir(repo)
        notes = [f"removed stale {p}" for p in _repair.remove_stale_locks(common)]
        # Read once, for the unlocks and the prune: this runs before every step.
        listed = _repair.read_worktrees(common)
        entries = listed
        if entries is None:
            entries = _repair.parse_worktrees(git(["worktree", "list", "--porcelain"], repo))
        for entry in entries:
            if entry.locked is None or not entry.locked.startswith("initializing"):
                continue  # (asked first: finding a registration reads them all)
            marker = _repair.registration(common, entry.path)
            if marker is None or _repair.held(marker / "locked", common):
                continue
            proc = run_git(["worktree", "unlock", str(entry.path)], repo)
            if proc.returncode == 0:
                notes.append(f"unlocked {entry.path}, left locked by a killed worktree add")
            elif not re.search("is not locked|is not a working tree", proc.stderr):
                # (else its add finished, or its remove did, since the listing)
                raise GitError(f"git worktree unlock {entry.path}: {proc.stderr.strip()}")
        if listed is None or any(e.prunable for e in listed):
            git(["worktree", "prune"], repo)
        return notes + self.release_scratch_checkouts(repo)

    def _prune(self, repo: Path) -> None:
        """``git worktree prune`` when a registration is prunable, or when the git
        directory is not plain enough to tell: a healthy repository costs no git."""
        listed = _repair.read_worktrees(self.common_dir(repo))
        if listed is None or any(e.prunable for e in listed):
            git(["worktree", "prune"], repo)

    def exclude(self, repo: Path, pattern: str) -> None:
        """Add ``pattern`` to the repository's ``info/exclude`` (once), so phasegate's
        own state never shows up as untracked, whoever wrote the cartridge."""
        path = self.common_dir(repo) / "info" / "exclude"  # where --git-path puts it
        lines = path.read_text().splitlines() if path.exists() else []
        if pattern not in lines:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join([*lines, pattern]) + "\n")

    def ensure_worktree(self, repo: Path, branch: str, path: Path) -> Path:
        """A healthy worktree of ``branch`` at ``path``, reusing or rebuilding what is there.

        A surviving healthy worktree of the same branch is kept (a partial
        earlier attempt is idempotent: docs/contracts/lifecycle.md, preparation); one whose
        only fault is tracked files missing gets them back from HEAD; anything
        else there (a half-made or locked worktree, a stale registration, a
        leftover directory) is removed and the worktree made again from the
        branch, as is another worktree holding the branch. Raises GitError.
        """
        path = path.resolve()
        self.repair(repo)
        registered = self._worktrees(repo)
        mine = registered.get(path)
        if mine is not None and mine.branch == branch:
            problem = self.checkout_problem(path, branch)
            if problem is None:
                return path
            if problem.startswith("tracked files missing"):
                missing = git(["diff", "--name-only", "--diff-filter=D", "HEAD"], path)
                git(["checkout", "HEAD", "--", *missing.splitlines()], path)
                if self.checkout_problem(path, branch) is None:
                    return path
        for other, entry in registered.items():
            if other == path or (entry.branch == branch and other != repo.resolve()):
                self._drop_worktree(repo, other)
        if path.exists():
            shutil.rmtree(path)
        self._prune(repo)
        path.parent.mkdir(parents=True, exist_ok=True)
        git(["worktree", "add", str(path), branch], repo)
        return path

    def checkout_problem(self, path: Path, branch: str) -> str | None:
        """Why the worktree at ``path`` is not a complete checkout of ``branch``; None
        when it is: its ``.git`` file leads to a git dir with HEAD and an index,
        no killed ``worktree add`` left it locked, HEAD is ``branch`` and
        resolves, ``git status`` works and no tracked file is missing vs HEAD.
        Uncommitted edits are not a problem here (development discards them)."""
        return self.checkout_health(path, branch)[0]

    def checkout_health(
        self, path: Path, branch: str, *, ask_git: bool = True
    ) -> tuple[str | None, bool]:
        """``checkout_problem`` and whether the checkout is clean (git's status lists
        nothing: no change, no untracked file), from the same one git call. With
        ``ask_git`` False only git's files are looked at (no git runs) and clean
        is False (the self-heal's and the read-only check's, which run often)."""
        dot_git = path / ".git"
        if not dot_git.is_file():
            return "no .git file", False
        gitdir = Path(dot_git.read_text().removeprefix("gitdir:").strip())
        gitdir = gitdir if gitdir.is_absolute() else path / gitdir
        for name in ("HEAD", "commondir", "index"):
            if not (gitdir / name).is_file():
                return f"git dir {gitdir} has no {name}", False
        locked = gitdir / "locked"
        if locked.exists() and locked.read_text().startswith("initializing"):
            return "left locked by a killed worktree add", False
        if _gitfs.head(gitdir) not in (None, f"ref: refs/heads/{branch}"):
            return f"HEAD is not {branch}", False
        if not ask_git:
            return None, False
        # One status tells all the rest: HEAD's branch (git's own reading, should the
        # file above be unusual), whether it resolves, and what is deleted vs HEAD
        # (staged or not: what ``diff --diff-filter=D HEAD`` lists).
        # untracked files listed whatever status.showUntrackedFiles says: "clean" means none
        status = run_git(["status", "--porcelain=v2", "--branch", "-z", "-unormal"], path)
        if status.returncode != 0:
            return f"git status fails: {status.stderr.strip()}", False
        fields = status.stdout.split("\0")
        if f"# branch.head {branch}" not in fields:
            return f"HEAD is not {branch}", False
        if "# branch.oid (initial)" in fields:
            return "HEAD does not resolve", False
        if missing := _deleted(fields):
            return f"tracked files missing: {' '.join(missing[:5])}", False
        return None, not any(f and not f.startswith("# ") for f in fields)

    def is_healthy(self, path: Path, branch: str) -> bool:
        """Whether ``path`` is a complete checkout of ``branch`` (``checkout_problem``)."""
        return self.checkout_problem(path, branch) is None

    def _drop_worktree(self, repo: Path, path: Path) -> None:
        # -f -f: a locked worktree (a killed add's, or missing but locked) goes too.
        git(["worktree", "remove", "-f", "-f", str(path)], repo, check=False)
        if path.exists():
            shutil.rmtree(path)

    def remove_worktree(self, repo: Path, path: Path) -> None:
        """Remove the worktree at ``path`` whatever state it is in (locked, half-made,
        a bare directory), and its registration. Raises GitError."""
        path = path.resolve()
        if path in self._worktrees(repo) or path.exists():
            self._drop_worktree(repo, path)
        self._prune(repo)

    @contextmanager
    def temporary_checkout(self, repo: Path, sha: str, path: Path) -> Iterator[Path]:
        """A detached worktree of ``sha`` at ``path``, removed afterwards.

        Whatever a killed process left at ``path`` (or as stale git locks) is
        cleared first, so a checkout leaked by a crash is reclaimed by the
        next one.
        """
        path = path.resolve()
        self.repair(repo)
        self.remove_worktree(repo, path)
        path.parent.mkdir(parents=True, exist_ok=True)
        git(["worktree", "add", "--detach", str(path), sha], repo)
        try:
            yield path
        finally:
            self.remove_worktree(repo, path)

    # -- changes ----------------------------------------------------------------

    def has_changes(self, path: Path) -> bool:
        return bool(git(["status", "--porcelain"], path))

    def discard_changes(self, path: Path) -> None:
        """Put the worktree back to its HEAD: tracked files restored, untracked ones removed.

        Ignored files stay: ``git add -A`` never commits them, and they are
        usually caches (virtualenvs, build trees) the next run wants.
        """
        git(["reset", "-q", "--hard", "HEAD"], path)
        git(["clean", "-ffdq"], path)  # -ff: a repository nested in it goes too

    def commit_message(self, path: Path, rev: str) -> str:
        """The full message of commit ``rev`` in the repository at ``path``."""
        return git(["log", "-1", "--format=%B", rev], path)

    def change_since(self, path: Path, rev: str) -> str:
        """Everything the worktree at ``path`` holds beyond ``rev``: commits made
        since, staged, unstaged and untracked changes, as one diff text."""
        git(["add", "-A", "--intent-to-add"], path)
        return git(["diff", rev], path)

    def reset_to(self, path: Path, rev: str) -> None:
        """Put the worktree's branch back at ``rev`` and drop every change since."""
        git(["reset", "-q", "--hard", rev], path)
        git(["clean", "-ffdq"], path)  # -ff: a repository nested in it goes too

    def commit_all(self, path: Path, message: str) -> str | None:
        """Commit every change in the worktree; the new SHA, or None if clean. Closing
        keywords in ``message`` are defused (``defuse_closing``): the commit may reach
        the default branch before verification, and the forge would close the issue."""
        if not self.has_changes(path):
            return None
        git(["add", "-A"], path)
        git([*IDENTITY, "commit", "-q", "--no-verify", "-m", defuse_closing(message)], path)
        return self.rev(path, "HEAD")

    def commit_empty(self, path: Path, message: str) -> str:
        """A commit with no change of its own (a marker naming what came before it);
        its SHA. Closing keywords in ``message`` are defused, as by ``commit_all``."""
        message = defuse_closing(message)
        git([*IDENTITY, "commit", "-q", "--no-verify", "--allow-empty", "-m", message], path)
        return self.rev(path, "HEAD")

    def diff(self, repo: Path, base: str, head: str) -> str:
        return git(["diff", f"{base}...{head}"], repo)

    def diff_stat(self, repo: Path, base: str, head: str) -> dict[str, int]:
        """Files changed, insertions and deletions between ``base`` and ``head``."""
        out = git(["diff", "--numstat", f"{base}...{head}"], repo)
        files = insertions = deletions = 0
        for line in out.splitlines():
            added, removed, _ = line.split("\t", 2)
            files += 1
            insertions += int(added) if added.isdigit() else 0
            deletions += int(removed) if removed.isdigit() else 0
        return {"files": files, "insertions": insertions, "deletions": deletions}

    def change_entries(self, repo: Path, base: str, head: str) -> list[tuple[str, str, str, str]]:
        """``(path, mode, blob, status)`` of each path ``head`` changes since its merge
        base with ``base``, in git's order; ``status`` is git's letter (``A`` a path
        the base lacks, ``M``, ``D``, ``T``), a rename counts as both of its paths,
        a deleted path has mode ``000000``. One ``git diff --raw``."""
        raw = git(["diff", "--raw", "--no-renames", "--no-abbrev", "-z", f"{base}...{head}"], repo)
        fields = raw.split("\0")
        entries = []
        for meta, path in zip(fields[::2], fields[1::2], strict=False):
            parts = meta.split()
            if len(parts) >= 5:
                entries.append((path, parts[1], parts[3], parts[4][:1]))
        return entries

    def blob_text(self, repo: Path, blob: str) -> str:
        """The text of the blob ``blob`` (a symbolic link's target, say)."""
        return git(["cat-file", "blob", blob], repo)

    def file_diff(self, repo: Path, base: str, head: str, paths: Sequence[str]) -> str:
        """The unified diff of ``paths`` alone, ``head`` since its merge base with ``base``."""
        if not paths:
            return ""
        return git(["diff", "--no-renames", f"{base}...{head}", "--", *paths], repo)

    def change_between(self, repo: Path, old: str, new: str) -> dict[str, Any]:
        """What changed from commit ``old`` to commit ``new`` (their trees, not a
        merge base): ``{"files": int, "insertions": int, "deletions": int,
        "paths": [{"path", "insertions", "deletions"}]}``, lines counted as git's
        ``--numstat`` counts them (a binary file counts 0). Raises GitError for an
        unknown commit."""
        out = git(["diff", "--numstat", "-z", "--no-renames", old, new, "--"], repo)
        counted: list[tuple[str, int, int]] = []
        for entry in out.split("\0"):
            if not entry.strip():
                continue
            added, removed, name = entry.split("\t", 2)
            lines = [int(n) if n.isdigit() else 0 for n in (added, removed)]
            counted.append((name, lines[0], lines[1]))
        return {
            "files": len(counted),
            "insertions": sum(c[1] for c in counted),
            "deletions": sum(c[2] for c in counted),
            "paths": [{"path": n, "insertions": i, "deletions": d} for n, i, d in counted],
        }

    def commits_ahead(self, repo: Path, base: str, head: str) -> int:
        return int(git(["rev-list", "--count", f"{base}..{head}"], repo))

    def apply_patch(self, path: Path, patch: str) -> list[str]:
        """Apply a unified diff in the worktree at ``path``; return the files it touches.

        Agents write diffs loosely, so the patch is read as ``normalize_diff``
        makes it (a multi-file diff without ``diff`` lines, a new file without
        its mode line, paths without ``a/``/``b/``); a patch missing its final
        newline is accepted. Raises PatchError, changing nothing, when a path
        is absolute or climbs out of the worktree, or when git cannot apply it.
        """
        if not patch.strip():
            raise PatchError("the patch is empty")
        patch = normalize_diff(patch)
        files = _patch_paths(patch)
        for name in files:
            pure = PurePosixPath(name)
            if pure.is_absolute() or ".." in pure.parts or name.startswith("~"):
                raise PatchError(f"the patch reaches outside its worktree: {name}")
        if not patch.endswith("\n"):
            patch += "\n"
        check = run_git(["apply", "--check", "--recount", "--whitespace=nowarn", "-"], path, patch)
        if check.returncode != 0:
            raise PatchError(f"the patch does not apply: {check.stderr.strip()}")
        git(["apply", "--recount", "--whitespace=nowarn", "-"], path, input=patch)
        return sorted(set(files))

    # -- checks -----------------------------------------------------------------

    def run_checks(
        self,
        commands: Sequence[str],
        cwd: Path,
        timeout_s: float,
        cancel: threading.Event | None = None,
        *,
        env: Mapping[str, str] | None = None,
        secrets: Sequence[str] = (),
        on_spawn: Callable[[str, int], None] | None = None,
        confinement: Confinement | None = None,
        key: str | None = None,
    ) -> list[CheckResult]:
        """``phasegate.git.checks.run_checks``: the seam phases and the harness call."""
        return run_checks(
            commands,
            cwd,
            timeout_s,
            cancel,
            env=env,
            secrets=secrets,
            on_spawn=on_spawn,
            confinement=confinement,
            key=key,
        )
