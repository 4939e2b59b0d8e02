"""What a patch is, counted from its text, never asked of the model (docs/contracts/graph.md).

- ``extract_patch``: the unified diff in a build answer, and the prose around it.
- ``change_facts``: files, insertions, deletions, paths and the governance
  paths a patch touches.
- ``similarity``: how alike two successive patches are (difflib, line by
  line); at ``NO_PROGRESS_SIMILARITY`` or more the fix loop stops as
  ``no_progress``.
- ``governance_touched``: the paths that make a change ``self_modification``:
  the cartridge (``phasegate.toml``), ``.ci/`` and the cartridge's own list.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

__all__ = [
    "GOVERNANCE_PATHS",
    "NO_PROGRESS_SIMILARITY",
    "ChangeFacts",
    "change_facts",
    "extract_patch",
    "governance_touched",
    "path_matches",
    "similarity",
]

#: Successive patches at least this similar are no progress (docs/contracts/graph.md: the
#: loop's stops).
NO_PROGRESS_SIMILARITY = 0.98

#: Governance paths every repository has: the cartridge (``cartridge.CARTRIDGE_FILE``,
#: not imported: the cartridge module reads disk) and the CI directory.
GOVERNANCE_PATHS: tuple[str, ...] = ("phasegate.toml", ".ci/")

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
_DIFF_START = re.compile(r"^(diff --git |--- \S)", re.M)
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def _looks_like_diff(text: str) -> bool:
    return bool(re.search(r"^(diff |--- |\+\+\+ |@@ )", text, re.M))


def extract_patch(answer: str) -> tuple[str, str]:
    """``(patch, summary)`` from a build answer.

    The patch is every fenced block that holds a diff, joined; without such a
    block, everything from the first ``diff --git`` or ``---`` line on. The
    summary is the rest of the answer, stripped. A patch is kept verbatim
    (a missing final newline stays missing: the harness normalizes it when it
    applies the patch). No diff at all gives ``("", answer.strip())``.
    """
    blocks = [m for m in _FENCE.finditer(answer) if _looks_like_diff(m.group(1))]
    if blocks:
        patch = "".join(m.group(1) for m in blocks)
        summary = answer
        for m in reversed(blocks):
            summary = summary[: m.start()] + summary[m.end() :]
        return patch, summary.strip()
    start = _DIFF_START.search(answer)
    if start is None:
        return "", answer.strip()
    return answer[start.start() :], answer[: start.start()].strip()


@dataclass(frozen=True)
class ChangeFacts:
    """The facts of one patch. ``paths`` sorted, without ``a/``/``b/``; lines are counts."""

    files: int
    insertions: int
    deletions: int
    paths: tuple[str, ...]
    governance_paths: tuple[str, ...]

    @property
    def lines(self) -> int:
        """Insertions plus deletions."""
        return self.insertions + self.deletions

    @property
    def self_modification(self) -> bool:
        """Whether the patch touches a governance path."""
        return bool(self.governance_paths)

    def as_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "insertions": self.insertions,
            "deletions": self.deletions,
            "paths": list(self.paths),
            "governance_paths": list(self.governance_paths),
            "self_modification": self.self_modification,
        }


def _header_path(line: str) -> str | None:
    name = line[4:].split("\t")[0].strip()
    if name == "/dev/null" or not name:
        return None
    if name.startswith(("a/", "b/")):
        name = name[2:]
    return name.removeprefix("./")


def change_facts(patch: str, governance_paths: Sequence[str] = ()) -> ChangeFacts:
    """Count ``patch``: files, inserted and deleted lines, paths, governance paths.

    Hunk headers' counts are followed while they hold, so a removed line
    starting ``-- `` is not taken for a file header; past them (models
    miscount), ``+``/``-`` lines still count, as ``git apply --recount``
    would read them. ``governance_paths`` are the cartridge's, besides
    GOVERNANCE_PATHS. A patch without a final newline counts the same.
    """
    lines = patch.splitlines()
    paths: list[str] = []
    insertions = deletions = 0
    old_left = new_left = 0  # lines the current hunk header still announces
    in_hunk = False
    i = 0
    while i < len(lines):
        line = lines[i]
        counted = old_left > 0 or new_left > 0
        if not counted and line.startswith("diff --git "):
            in_hunk = False
            parts = line.split()
            if len(parts) >= 4:
                name = _header_path("--- " + parts[3])
                if name:
                    paths.append(name)
        elif (
            not counted
            and line.startswith("--- ")
            and i + 1 < len(lines)
            and lines[i + 1].startswith("+++ ")
        ):
            in_hunk = False
            name = _header_path(lines[i + 1]) or _header_path(line)
            if name:
                paths.append(name)
            i += 1
        elif line.startswith("@@"):
            in_hunk = True
            hunk = _HUNK.match(line)
            if hunk:
                old_left = int(hunk.group(1) if hunk.group(1) is not None else 1)
                new_left = int(hunk.group(2) if hunk.group(2) is not None else 1)
            else:
                old_left = new_left = 0
        elif in_hunk and line.startswith("+"):
            insertions += 1
            new_left -= 1
        elif in_hunk and line.startswith("-"):
            deletions += 1
            old_left -= 1
        elif in_hunk and (line.startswith(" ") or line == ""):
            old_left -= 1
            new_left -= 1
        i += 1
    unique = tuple(sorted(set(paths)))
    return ChangeFacts(
        files=len(unique),
        insertions=insertions,
        deletions=deletions,
        paths=unique,
        governance_paths=governance_touched(unique, governance_paths),
    )


def path_matches(path: str, pattern: str) -> bool:
    """Whether ``path`` is ``pattern``: the same path, under it (a pattern ending
    in ``/``), or matched by it as a glob (``fnmatch``, ``*`` crosses ``/``; a
    leading ``**/`` may match no directory at all)."""
    if pattern.startswith("**/") and path_matches(path, pattern[3:]):
        return True  # `**/name` also names a top-level `name`, as in .gitignore
    if pattern.endswith("/"):
        return path.startswith(pattern)
    return path == pattern or fnmatchcase(path, pattern)


def governance_touched(paths: Iterable[str], extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The ``paths`` that are governance paths (GOVERNANCE_PATHS and ``extra``), sorted."""
    patterns = (*GOVERNANCE_PATHS, *extra)
    return tuple(sorted({p for p in paths if any(path_matches(p, pat) for pat in patterns)}))


def similarity(previous: str, patch: str) -> float:
    """How alike two patches are, 0.0 to 1.0: ``difflib.SequenceMatcher`` over
    their lines (no junk heuristic, so the result depends on the text alone)."""
    if previous == patch:
        return 1.0
    matcher = difflib.SequenceMatcher(None, previous.splitlines(), patch.splitlines(), False)
    return matcher.ratio()
