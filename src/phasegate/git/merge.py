"""Merging: a base into a workflow's worktree, a workflow's branch into its base.

``BaseMerging`` is the merging half of ``phasegate.git.workspace.Workspace`` (split
out by responsibility); its methods use the worktree methods ``Workspace``
defines. Errors as there: ``GitError``, ``GitTransient``, ``DirtyCheckout``, and
``MergeConflict`` when a branch conflicts with the base it lands on.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from subprocess import CompletedProcess
from typing import TYPE_CHECKING

from phasegate.core.closing import defuse_closing
from phasegate.git import files as _gitfs
from phasegate.git.command import (
    IDENTITY,
    TRANSIENT_ATTEMPTS,
    DirtyCheckout,
    GitError,
    GitTransient,
    git,
    is_transient,
    own_path,
    repository_flock,
    run_git,
)
from phasegate.git.errors import MergeConflict
from phasegate.git.repair import remove_stale_locks


class BaseMerging:
    """The merges of ``Workspace``: syncing a worktree with its base, and landing a
    branch on its base where the base is checked out or in a scratch worktree."""

    if TYPE_CHECKING:  # what Workspace defines and the merges use

        def rev(self, repo: Path, ref: str) -> str: ...
        def common_dir(self, repo: Path) -> Path: ...
        def repair(self, repo: Path) -> list[str]: ...
        def remove_worktree(self, repo: Path, path: Path) -> None: ...
        def _drop_worktree(self, repo: Path, path: Path) -> None: ...
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
        lock contention that persists GitTransient (``phasegate.git.command``).
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
        return own_path(self.common_dir(repo), name).resolve()

    def scratch_holders(self, repo: Path) -> list[tuple[Path, str]]:
        """phasegate's own checkouts (under ``<common>/phasegate/``) that hold a
        branch, each with the branch: a merge's scratch worktree, while it merges
        or after it was killed. Read from git's files (no git call, nothing changed)."""
        own = (self.common_dir(repo) / "phasegate").resolve()
        return [
            (path, branch)
            for path, branch in self._registered_worktrees(repo).items()
            if branch is not None and path.parent == own
        ]

    def left_scratch_checkouts(self, repo: Path) -> list[tuple[Path, str]]:
        """``scratch_holders`` that no live merge holds (the repository's merge lock
        is free): what a killed merge left holding its base, so the person cannot
        check the base out. Changes nothing but the lock file's existence."""
        if not self.scratch_holders(repo):
            return []
        with self._merge_lock_if_free(repo) as free:
            return self.scratch_holders(repo) if free else []

    def release_scratch_checkouts(self, repo: Path) -> list[str]:
        """Remove every scratch checkout a killed merge left holding a branch,
        releasing the branch; returns what was done. A scratch checkout of a live
        merge (its merge lock held, in this process too) is that merge's: left
        alone, and removed by the merge itself. Raises GitError."""
        if not self.scratch_holders(repo):
            return []
        notes = []
        with self._merge_lock_if_free(repo) as free:
            if not free:
                return []
            for path, branch in self.scratch_holders(repo):  # looked at again, under the lock
                self._drop_worktree(repo, path)
                notes.append(
                    f"removed the scratch checkout {path} a killed merge left holding {branch}"
                )
            git(["worktree", "prune"], repo)
        return notes

    @contextmanager
    def _merge_lock_if_free(self, repo: Path) -> Iterator[bool]:
        """Hold the merge lock (``merge_lock``) for the block when nobody holds it;
        yields whether it is held here. Never waits."""
        path = self.common_dir(repo) / "phasegate" / "merge.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def merge_into_base(self, repo: Path, base: str, branch: str, message: str) -> str:
        """A real ``git merge --no-ff branch`` into ``base``; return the merge SHA.

        Runs where ``base`` is checked out when a worktree has it (raising
        DirtyCheckout, before git runs, when uncommitted changes there are at
        paths the merge changes; journaled, so a killed merge is undone by the
        next: ``_merge_in_checkout``), else in a scratch worktree of ``base``; under the
        repository's ``merge_lock``, after ``repair``. Raises MergeConflict (the
        merge aborted, nothing landed) when ``branch`` conflicts with ``base``: the
        base moved since the branch was synced with it. Raises GitError, or
        GitTransient when git keeps failing on a lock.
        """
        with self.merge_lock(repo):
            self.repair(repo)  # a killed merge's locks would fail this one
            # a closing keyword would close an issue before verification (or another)
            return self._merge_into_base(repo, base, branch, defuse_closing(message))

    def _merge_into_base(self, repo: Path, base: str, branch: str, message: str) -> str:
        scratch = self.scratch_path(repo, f"merge-{base}")
        self.remove_worktree(repo, scratch)  # a crashed merge's leftover, if any
        holder = next((p for p, b in self._registered_worktrees(repo).items() if b == base), None)
        if holder is not None:
            return self._merge_in_checkout(holder, base, branch, message)
        scratch.parent.mkdir(parents=True, exist_ok=True)
        git(["worktree", "add", str(scratch), base], repo)
        try:
            proc = run_git([*IDENTITY, "merge", "--no-ff", "-m", message, branch], scratch)
            if proc.returncode != 0:
                _raise_conflict(scratch, base, branch, proc)
                detail = (proc.stderr or proc.stdout).strip()
                raise GitError(f"git merge {branch} failed in {scratch}: {detail}")
            return self.rev(scratch, "HEAD")
        finally:
            self.remove_worktree(repo, scratch)

    def _merge_in_checkout(self, holder: Path, base: str, branch: str, message: str) -> str:
        """``git merge --no-ff branch`` in ``holder``, where ``base`` is checked out: a
        person's own checkout, whose unrelated edits do not block the merge (git
        refuses, touching nothing, when the merge would overwrite one).

        Journaled: an intent file names the merge before git runs, so what a
        killed merge left in the checkout is told from the person's edits and
        undone first (``_undo_killed_merge``). A merge stopped by a lock (git's
        ref or index lock held by another process) is undone and run again, up
        to ``TRANSIENT_ATTEMPTS`` times; then GitTransient.
        """
        intent = _MergeIntent(self.common_dir(holder), base)
        for attempt in range(1, TRANSIENT_ATTEMPTS + 1):
            # Every try first undoes what a killed merge, or this one's last try, left.
            left = self._undo_killed_merge(holder, intent, message)
            if left is None:
                head, merged = self.rev(holder, "HEAD"), self.rev(holder, branch)
                _refuse_edits_in_the_way(holder, base, head, merged)
                intent.write(head, merged)
                proc = run_git(
                    [*IDENTITY, "merge", "--no-ff", "-m", message, branch], holder, attempts=1
                )
                if proc.returncode == 0:
                    intent.clear()
                    return self.rev(holder, "HEAD")
                # Stopped at its ref update, git leaves the merge begun (MERGE_HEAD, the
                # index and files merged); refused, it touched nothing.
                conflicted = _unmerged(holder) if self.merge_in_progress(holder) else []
                left = self._abort(holder)
                if left is None:
                    intent.clear()  # else the next try undoes it, by the intent
                    if conflicted:
                        raise _conflict(holder, base, branch, conflicted, proc)
                # With edits in the checkout, git stashes around the merge and says only
                # "stash failed" when another git (a person's commit) holds index.lock.
                index_locked = self._index_locked(holder)
                if left is None and not index_locked and not is_transient(proc):
                    break
                detail = (proc.stderr or proc.stdout).strip()
                held = "its index.lock is held" if index_locked else "a lock git needs is held"
            else:
                detail, held = left, "the merge begun could not be aborted"
            if attempt == TRANSIENT_ATTEMPTS:
                raise GitTransient(
                    f"git merge {branch} failed in {holder} {attempt} times: {detail} "
                    f"({held}: another git process is working there)"
                )
            time.sleep(0.2 * attempt)
            # A lock judged held before this merge may have been a killed git's that was
            # still dying then: judged again, a stale one is removed.
            remove_stale_locks(self.common_dir(holder))
        detail = (proc.stderr or proc.stdout).strip()
        if "local changes" in detail or "untracked working tree files" in detail:
            raise DirtyCheckout(
                f"cannot merge into {base}: changes in {holder} are in the way: {detail}"
            )
        raise GitError(f"git merge {branch} failed in {holder}: {detail}")

    def _undo_killed_merge(self, holder: Path, intent: _MergeIntent, message: str) -> str | None:
        """Undo what a merge killed in ``holder`` left there, as its intent file tells;
        None when done, else git's words for why the merge it began could not be
        aborted (a lock held: the intent is kept, for the next try).

        Killed after its ref update, the merge is done (HEAD moved): nothing to
        undo but git's leftover MERGE_HEAD. Killed before, HEAD is where it was:
        with MERGE_HEAD the merge is aborted; without it (killed while git wrote
        the merged files or the index) each path the merge changes whose file or
        index entry holds the merge's content is put back as HEAD has it, and
        every other path (a person's edit) is left as it is. With no intent file
        (a merge of an earlier phasegate), ``_abort_our_killed_merge``.
        """
        begun = intent.read()
        if begun is None:
            self._abort_our_killed_merge(holder, message)
            return None
        head, merged = begun
        if self.merge_in_progress(holder):
            found = git(["rev-parse", "-q", "--verify", "MERGE_HEAD"], holder, check=False)
            if found != merged:  # begun since, by the person: theirs
                raise _persons_merge(holder)
        elif self.rev(holder, "HEAD") == head:
            _put_back_partial_merge(holder, head, merged)
        left = self._abort(holder)
        if left is None:
            intent.clear()
        return left

    def _abort(self, holder: Path) -> str | None:
        """``git merge --abort`` in ``holder`` when a merge is begun there; None when
        none is left begun, else git's words for why it stays."""
        if not self.merge_in_progress(holder):
            return None
        proc = run_git(["merge", "--abort"], holder)
        if not self.merge_in_progress(holder):
            return None
        return (proc.stderr or proc.stdout).strip() or "git merge --abort left MERGE_HEAD"

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
        raise _persons_merge(holder)

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


def scratch_note(path: Path, branch: str) -> str:
    """What a person is told of a scratch checkout a killed merge left holding
    ``branch`` (``left_scratch_checkouts``): what it blocks and how to free it."""
    return (
        f"the scratch checkout {path} holds {branch}, left there by a merge that was "
        f"killed: `git checkout {branch}` fails until it is freed; the next "
        "`phasegate resume`, `run` or `worker` frees it, or now: "
        f"`git worktree remove --force {path}`"
    )


_OBJECT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


class _MergeIntent:
    """The journal of a merge into ``base`` in a person's checkout:
    ``<common>/phasegate/merge-intent-<base>``, two lines (HEAD before the merge,
    the commit merged), written durably before git runs and removed once git has
    ended; found by the next merge when the process that wrote it was killed."""

    def __init__(self, common: Path, base: str) -> None:
        # the digest keeps release/1.0 and release-1.0 apart
        digest = hashlib.sha256(base.encode()).hexdigest()[:12]
        self.path = own_path(common, f"merge-intent-{base}-{digest}")

    def write(self, head: str, merged: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".new")
        with partial.open("w") as f:
            f.write(f"{head}\n{merged}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, self.path)

    def read(self) -> tuple[str, str] | None:
        """(HEAD before, commit merged), or None: no intent, or one cut short."""
        try:
            lines = self.path.read_bytes().decode("ascii").split()
        except (OSError, UnicodeDecodeError):  # none, a directory, garbage
            return None
        if len(lines) != 2 or not all(_OBJECT_ID.fullmatch(line) for line in lines):
            return None
        return lines[0], lines[1]

    def clear(self) -> None:
        if self.path.is_dir() and not self.path.is_symlink():
            shutil.rmtree(self.path, ignore_errors=True)
        else:
            self.path.unlink(missing_ok=True)


def _unmerged(checkout: Path) -> list[str]:
    """The paths a merge begun in ``checkout`` left unmerged (its conflicts)."""
    return git(["diff", "--name-only", "--diff-filter=U"], checkout, check=False).splitlines()


def _conflict(
    checkout: Path, base: str, branch: str, conflicted: list[str], proc: CompletedProcess[str]
) -> MergeConflict:
    """The MergeConflict of merging ``branch`` into ``base`` in ``checkout``."""
    detail = (proc.stdout or proc.stderr).strip()
    return MergeConflict(
        f"git merge {branch} into {base} conflicts in {checkout} "
        f"({', '.join(conflicted[:10])}): {detail}",
        conflicted,
    )


def _raise_conflict(checkout: Path, base: str, branch: str, proc: CompletedProcess[str]) -> None:
    """Raise MergeConflict when the failed merge in ``checkout`` left unmerged paths."""
    conflicted = _unmerged(checkout)
    if conflicted:
        raise _conflict(checkout, base, branch, conflicted, proc)


def _persons_merge(holder: Path) -> DirtyCheckout:
    """What a merge of the person's own, begun in ``holder``, is: theirs, untouched."""
    return DirtyCheckout(
        f"cannot merge into the base in {holder}: a merge of your own is in progress "
        "there (MERGE_HEAD); conclude or abort it, then resume"
    )


def _refuse_edits_in_the_way(holder: Path, base: str, head: str, merged: str) -> None:
    """Raise DirtyCheckout, before git runs, when an uncommitted change in ``holder``
    (staged, unstaged, untracked) is at a path the merge of ``merged`` changes.

    git would refuse too, but only after stashing the person's edits and
    resetting the checkout: killed then, their edits would be in no file. And a
    merge begun only over clean paths lets ``_put_back_partial_merge`` take any
    of those paths holding the merge's content for git's.
    """
    changed = git(["diff", "--name-only", "-z", "--no-renames", f"{head}...{merged}"], holder)
    if not changed:
        return
    status = git(["status", "--porcelain", "-z", "--no-renames", "--untracked-files=all"], holder)
    dirty = {entry[3:] for entry in status.split("\0") if len(entry) > 3}
    in_the_way = sorted(dirty & set(filter(None, changed.split("\0"))))
    if in_the_way:
        raise DirtyCheckout(
            f"cannot merge into {base}: changes in {holder} are in the way: "
            f"{', '.join(in_the_way[:10])} (commit, stash or discard them, then resume)"
        )


def _put_back_partial_merge(holder: Path, head: str, merged: str) -> None:
    """Put back, as ``head`` has them, the paths of ``holder`` that a merge of
    ``merged`` into ``head``, killed before its MERGE_HEAD, had written.

    A path is the merge's when the merge changes it and its file (or index
    entry) holds the merge's content; a path of the same name holding anything
    else is a person's, and kept. A merge whose result git cannot compute
    without conflicts would have stopped with MERGE_HEAD: nothing to put back.
    """
    proc = run_git(["merge-tree", "--write-tree", "--no-messages", head, merged], holder)
    if proc.returncode != 0:
        return
    tree = proc.stdout.split()[0]
    paths = [
        p
        for p in git(["diff", "--name-only", "-z", "--no-renames", head, tree], holder).split("\0")
        if p
    ]
    if not paths:
        return
    result = _blobs(git(["ls-tree", "-r", "-z", tree, "--", *paths], holder), blob_field=2)
    before = _blobs(git(["ls-tree", "-r", "-z", head, "--", *paths], holder), blob_field=2)
    staged = _blobs(git(["ls-files", "-s", "-z", "--", *paths], holder), blob_field=1)
    files = [p for p in paths if (holder / p).is_file() and not (holder / p).is_symlink()]
    written = (
        dict(zip(files, git(["hash-object", "--", *files], holder).split(), strict=True))
        if files
        else {}
    )
    # A path the merge deletes is its when the index or the checkout lacks it.
    ours_staged = [p for p in paths if staged.get(p) == result.get(p) != before.get(p)]
    ours_written = [p for p in paths if p in written and written[p] == result.get(p)]
    gone = [p for p in paths if p not in result and p in before and not (holder / p).exists()]
    if ours_staged:
        git(["reset", "-q", head, "--", *ours_staged], holder)
    restore = [p for p in ours_written if p in before] + gone
    if restore:
        git(["checkout", head, "--", *restore], holder)
    for p in ours_written:
        if p not in before:
            (holder / p).unlink()


def _blobs(listing: str, *, blob_field: int) -> dict[str, str]:
    """``path -> blob`` from ``ls-tree -z`` (``blob_field`` 2) or ``ls-files -s -z``
    (``blob_field`` 1) output."""
    found = {}
    for entry in filter(None, listing.split("\0")):
        meta, path = entry.split("\t", 1)
        found[path] = meta.split()[blob_field]
    return found
