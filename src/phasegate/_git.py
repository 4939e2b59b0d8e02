"""Running the real ``git``: one way to call it, and the errors it raises.

Every git call phasegate makes goes through ``run_git`` (whatever it exits
with) or ``git`` (raising on failure), with the same environment: never
prompting, in the C locale so the messages phasegate reads stay English.

Errors::

    PhasegateError
     └── GitError            a git command failed (the command and its stderr)
          ├── DirtyCheckout  the checkout holding the base has edits in a merge's way
          └── GitTransient   a failure that reads as passing (a lock held, a ref
                             locked): worth retrying, never a conflict
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from phasegate.contract import PhasegateError

__all__ = ["IDENTITY", "DirtyCheckout", "GitError", "GitTransient", "git", "run_git"]


class GitError(PhasegateError):
    """A git command failed; the message holds the command and its stderr."""


class DirtyCheckout(GitError):
    """The checkout that holds the base branch has uncommitted changes; nothing was merged."""


class GitTransient(GitError):
    """A git failure that reads as transient (lock contention, exit 128 without a
    conflict), still failing after bounded retries; the workflow pauses with it."""


#: Who phasegate's own commits and merges are by.
IDENTITY = ("-c", "user.name=phasegate", "-c", "user.email=phasegate@localhost")


def run_git(
    args: Sequence[str], cwd: Path | str, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``git args`` in ``cwd``, never prompting, in the C locale (messages phasegate
    reads stay English); whatever it exits with."""
    return subprocess.run(
        ["git", *args],
        cwd=cwd,
        capture_output=True,
        encoding="utf-8",
        errors="replace",
        input=input,
        env={**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"},
    )


def git(
    args: Sequence[str], cwd: Path | str, *, check: bool = True, input: str | None = None
) -> str:
    """Run ``git args`` in ``cwd``; return stdout stripped of its trailing newline.

    Raises GitError (with the command and git's stderr) when ``check`` and git fails.
    """
    proc = run_git(args, cwd, input)
    if check and proc.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr.strip()}")
    return proc.stdout.rstrip("\n")
