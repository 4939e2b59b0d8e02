"""Merging: a base into a workflow's worktree, a workflow's branch into its base.

``BaseMerging`` is the merging half of ``phasegate.workspace.Workspace`` (split
out by responsibility); its methods use the worktree methods ``Workspace``
defines. Errors as there: ``GitError``, ``GitTransient``, ``DirtyCheckout``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from phasegate import _gitfs
from phasegate._git import (
    IDENTITY,
    TRANSIENT_ATTEMPTS,
    DirtyCheckout,
    GitError,
    GitTransient,
    git,
    repository_flock,
    run_git,
)


class BaseMerging:
    """The merges of ``Workspace``: syncing a worktree with its base, and landing a
    branch on its base where the base is checked out or in a scratch worktree."""

    if TYPE_CHECKING:  # what Workspace defines and the merges use

        def rev(self, repo: Path, ref: str) -> str: ...
        def common_dir(self, repo: Path) -> Path: ...
        def repair(self, repo: Path) -> list[str]: ...
        def remove_worktree(self, repo: Path, path: Path) -> None: ...
        def _registered_worktrees(self, repo: Path) -> dict[Path, str | None]: ...

    def merge_in_progress(self, path: Path) -> bool:
        """Whether the worktree at ``path`` has a merge begun and not concluded (MERGE_HEAD)."""
        found = _gitfs.merge_head(path)
        if found is not None:
            return found
        return bool(git(["rev-parse", "-q", "--verify", "MERGE_HEAD"], path, check=False))

    def _merge_base_in(self, worktree: Path, base: str) -> list[str]:
        """``git merge base`` in ``worktree``: [] when it committed, else the conflicted
        files, the merge left in progress. Raises GitError (the merge aborted) when
        it failed without conflicts, GitTransient when on a lock."""
        proc = run_git([*IDENTITY, "merge", "--no-edit", "-q", base], worktree)
        if proc.returncode == 0:
            return []
        conflicted = git(["diff", "--name-only", "--diff-filter=U"], worktree).splitlines()
        if not conflicted:
            if self.merge_in_progress(worktree):
                git(["merge", "--abort"], worktree, check=False)
            detail = (proc.stderr or proc.stdout).strip()
            raise GitError(f"git merge {base} failed in {worktree}: {detail}")
        return conflicted

    def sync_base(self, worktree: Path, base: str) -> bool:
        """Merge ``base`` into the worktree's branch; False (and aborted) on a conflict.

        Only unmerged paths are a conflict: any other failure raises GitError,
        lock contention that persists GitTransient (``phasegate._git``).
        """
        if self.merge_in_progress(worktree):
            git(["merge", "--abort"], worktree, check=False)  # a killed attempt's
        if self._merge_base_in(worktree, base):
            git(["merge", "--abort"], worktree, check=False)
            return False
        return True

    def start_base_merge(self, worktree: Path, base: str) -> list[str]:
        """Merge ``base`` into the worktree's branch, leaving conflicts for an agent.

        Returns the conflicted files ([] when the merge committed cleanly); with
        conflicts the merge stays in progress, and committing the resolved
        files concludes it. A merge some earlier attempt left open is aborted
        first. Raises GitError when the merge failed without conflicts,
        GitTransient when on a lock.
        """
        if self.merge_in_progress(worktree):
            git(["merge", "--abort"], worktree, check=False)
        return self._merge_base_in(worktree, base)

    def find_merge_commit(self, repo: Path, base: str, head_sha: str) -> str | None:
        """The merge commit on ``base``'s first-parent line whose parents include ``head_sha``."""
        if run_git(["merge-base", "--is-ancestor", head_sha, base], repo).returncode != 0:
            return None
        for line in git(["log", "--first-parent", "--format=%H %P", base], repo).splitlines():
            sha, *parents = line.split()
            if head_sha in parents[1:]:
                return sha
            if sha == head_sha:
                return sha
        return None

    def scratch_path(self, repo: Path, name: str) -> Path:
        """A path for phasegate's own short-lived checkouts, inside the git directory.

        Fixed per ``name``, so what a killed process left there is found and
        cleared by the next run, and never shows up as an untracked file.
        """
        common = self.common_dir(repo)
        safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)
        return (common / "phasegate" / safe).resolve()

    def merge_into_base(self, repo: Path, base: str, branch: str, message: str) -> str:
        """A real ``git merge --no-ff branch`` into ``base``; return the merge SHA.

        Runs where ``base`` is checked out when a worktree has it (raising
        DirtyCheckout, with nothing touched, when uncommitted changes there are
        in the merge's way), else in a scratch worktree of ``base``; under the
        repository's ``merge_lock``, after ``repair``. Raises GitError, or
        GitTransient when git keeps failing on a lock.
        """
        with self.merge_lock(repo):
            self.repair(repo)  # a killed merge's locks would fail this one
            return self._merge_into_base(repo, base, branch, message)

    def _merge_into_base(self, repo: Path, base: str, branch: str, message: str) -> str:
        scratch = self.scratch_path(repo, f"merge-{base}")
        self.remove_worktree(repo, scratch)  # a crashed merge's leftover, if any
        holder = next((p for p, b in self._registered_worktrees(repo).items() if b == base), None)
        if holder is not None:
            self._abort_our_killed_merge(holder, message)
            # A person's own checkout: their unrelated edits do not block the merge,
            # and git refuses, touching nothing, when the merge would overwrite one.
            for attempt in range(1, TRANSIENT_ATTEMPTS + 1):
                proc = run_git([*IDENTITY, "merge", "--no-ff", "-m", message, branch], holder)
                # With edits in the checkout, git stashes around the merge and says only
                # "stash failed" when another git (a person's commit) holds index.lock.
                if proc.returncode == 0 or not self._index_locked(holder):
                    break
                if attempt == TRANSIENT_ATTEMPTS:
                    raise GitTransient(
                        f"git merge {branch} failed in {holder} {attempt} times: "
                        f"{(proc.stderr or proc.stdout).strip()} (its index.lock is held: "
                        "another git process is working there)"
                    )
                time.sleep(0.2 * attempt)
            if proc.returncode != 0:
                if self.merge_in_progress(holder):
                    git(["merge", "--abort"], holder, check=False)
                detail = (proc.stderr or proc.stdout).strip()
                if "local changes" in detail or "untracked working tree files" in detail:
                    raise DirtyCheckout(
                        f"cannot merge into {base}: changes in {holder} are in the way: {detail}"
                    )
                raise GitError(f"git merge {branch} failed in {holder}: {detail}")
            return self.rev(holder, "HEAD")
        scratch.parent.mkdir(parents=True, exist_ok=True)
        git(["worktree", "add", str(scratch), base], repo)
        try:
            git([*IDENTITY, "merge", "--no-ff", "-m", message, branch], scratch)
            return self.rev(scratch, "HEAD")
        finally:
            self.remove_worktree(repo, scratch)

    def _abort_our_killed_merge(self, holder: Path, message: str) -> None:
        """Abort the merge a killed phasegate left begun in ``holder`` (MERGE_HEAD, and
        MERGE_MSG says it is this merge's); a merge of the person's is theirs: raises
        DirtyCheckout, touching nothing."""
        if not self.merge_in_progress(holder):
            return
        msg = Path(git(["rev-parse", "--path-format=absolute", "--git-path", "MERGE_MSG"], holder))
        begun = msg.read_text(errors="replace") if msg.is_file() else ""
        if begun.splitlines()[:1] == message.splitlines()[:1]:
            git(["merge", "--abort"], holder, check=False)
            return
        raise DirtyCheckout(
            f"cannot merge into the base in {holder}: a merge of your own is in progress "
            "there (MERGE_HEAD); conclude or abort it, then resume"
        )

    @staticmethod
    def _index_locked(checkout: Path) -> bool:
        """Whether the checkout's ``index.lock`` exists: another git is working there."""
        lock = Path(
            git(["rev-parse", "--path-format=absolute", "--git-path", "index.lock"], checkout)
        )
        return lock.exists()

    @contextmanager
    def merge_lock(self, repo: Path, timeout_s: float = 600.0) -> Iterator[None]:
        """Hold the repository's merge lock (``<common>/phasegate/merge.lock``) while
        the block runs: one merge into a base at a time, across threads and
        processes (an flock per acquisition: each holder opens the file anew).
        The kernel drops it when its holder dies. Raises GitTransient after
        ``timeout_s`` seconds of waiting."""
        path = self.common_dir(repo) / "phasegate" / "merge.lock"
        with repository_flock(path, timeout_s, poll_s=0.05):
            yield
