"""The errors phasegate's git raises (``phasegate.git.command`` re-exports them).

The hierarchy::

PhasegateError
 └── GitError            a git command failed (the command and its stderr)
      ├── DirtyCheckout  the checkout holding the base has edits in a merge's way
      ├── MergeConflict  a branch conflicts with the base it was to merge into
      └── GitTransient   a failure that reads as passing, still failing after
                         bounded retries; never a conflict
"""

from __future__ import annotations

from phasegate.core.contract import PhasegateError

__all__ = ["DirtyCheckout", "GitError", "GitTransient", "MergeConflict"]


class GitError(PhasegateError):
    """A git command failed; the message holds the command and its stderr."""


class DirtyCheckout(GitError):
    """The checkout that holds the base branch has uncommitted changes; nothing was merged."""


class MergeConflict(GitError):
    """Merging a branch into its base conflicts (the base moved since the branch was
    synced with it); nothing was merged, ``conflicted`` names the paths."""

    def __init__(self, message: str, conflicted: list[str]) -> None:
        super().__init__(message)
        self.conflicted = conflicted


class GitTransient(GitError):
    """A git failure that reads as transient (lock contention, exit 128 without a
    conflict), still failing after bounded retries; the workflow pauses with it."""
