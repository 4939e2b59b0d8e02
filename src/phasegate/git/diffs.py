"""git's unified diff read as files of numbered lines, and the two diffs a change is:
a branch against its base, and a commit against its first parent.

Parsing is a few lines of git's own fixed format (``git diff`` with rename
detection), not a model's output: no library is worth a dependency for it.
Both diffs run read-only in the repository given; nothing here fetches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phasegate.git.command import git, run_git

__all__ = [
    "DiffFile",
    "DiffLine",
    "branch_diff",
    "commit_diff",
    "has_commit",
    "parse_diff",
]

_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")
_PATH = re.compile(r"^diff --git a/(.*) b/(.*)$")
#: What git says about a file before its first hunk: the status it gives the file.
_STATUS = {"new file mode": "added", "deleted file mode": "deleted", "rename from": "renamed"}
#: Options of every diff read here: renames found whatever the person's configuration,
#: no color, the default context, a file's path as it is (no quoting of non-ASCII).
_DIFF = ["-c", "core.quotePath=false", "diff", "--no-color", "-M", "--unified=3"]


@dataclass(frozen=True)
class DiffLine:
    """One line: ``kind`` add, del, ctx or hunk (the ``@@`` header); ``old``/``new``
    its line numbers in the base and in the branch (None where it has none)."""

    kind: str
    text: str
    old: int | None = None
    new: int | None = None


@dataclass
class DiffFile:
    """One file's change: ``status`` modified, added, deleted or renamed (then
    ``old_path`` is where it was); ``added``/``removed`` count its lines;
    ``binary`` when git showed no lines for it."""

    path: str
    lines: list[DiffLine] = field(default_factory=list)
    status: str = "modified"
    old_path: str | None = None
    binary: bool = False

    @property
    def added(self) -> int:
        return sum(1 for line in self.lines if line.kind == "add")

    @property
    def removed(self) -> int:
        return sum(1 for line in self.lines if line.kind == "del")

    def as_dict(self) -> dict[str, Any]:
        """The file for JSON: its path, status, counts and lines."""
        return {
            "path": self.path,
            "old_path": self.old_path,
            "status": self.status,
            "binary": self.binary,
            "added": self.added,
            "removed": self.removed,
            "lines": [vars(line) for line in self.lines],
        }


def parse_diff(diff: str) -> list[DiffFile]:
    """``git diff``'s unified output as files of numbered lines, in its order."""
    files: list[DiffFile] = []
    old = new = 0
    in_hunk = False
    for raw in diff.split("\n"):
        header = _PATH.match(raw)
        if header:
            files.append(DiffFile(header.group(2)))
            in_hunk = False
            continue
        if not files:
            continue
        current = files[-1]
        if not in_hunk:
            # The file's header: its status and paths, never a line of it.
            for said, status in _STATUS.items():
                if raw.startswith(said):
                    current.status = status
            if raw.startswith("rename from "):
                current.old_path = raw[len("rename from ") :]
            elif raw.startswith("rename to "):
                current.path = raw[len("rename to ") :]
            elif raw.startswith("Binary files "):
                current.binary = True
        hunk = _HUNK.match(raw)
        if hunk:
            in_hunk = True
            old, new = int(hunk.group(1)), int(hunk.group(2))
            current.lines.append(DiffLine("hunk", raw))
        elif not in_hunk or raw.startswith("\\"):
            continue  # a header line, or "\ No newline at end of file"
        elif raw.startswith("+"):
            current.lines.append(DiffLine("add", raw[1:], new=new))
            new += 1
        elif raw.startswith("-"):
            current.lines.append(DiffLine("del", raw[1:], old=old))
            old += 1
        elif raw.startswith(" "):
            current.lines.append(DiffLine("ctx", raw[1:], old=old, new=new))
            old, new = old + 1, new + 1
    return files


def branch_diff(repo: Path, base: str, head: str) -> str:
    """``head`` against its merge base with ``base`` (what a pull request shows).
    Raises GitError when either is not in ``repo``."""
    return _whole(git([*_DIFF, f"{base}...{head}", "--"], repo))


def commit_diff(repo: Path, sha: str, back: int = 1) -> str:
    """What ``sha`` and the ``back - 1`` commits before it on its first-parent line
    changed: a merge commit (or a squash) against the base it landed on; a
    rebase's several commits with ``back`` their count. Raises GitError."""
    return _whole(git([*_DIFF, f"{sha}~{back}", sha, "--"], repo))


def _whole(diff: str) -> str:
    """``diff`` with the final newline ``git`` strips: without it ``git apply``
    calls the patch corrupt. git ends a diff with exactly one newline (a blank
    context line is a space), so one put back is the diff as git printed it."""
    return f"{diff}\n" if diff else diff


def has_commit(repo: Path, sha: str) -> bool:
    """Whether ``repo`` holds commit ``sha``."""
    return run_git(["cat-file", "-e", f"{sha}^{{commit}}"], repo).returncode == 0
