"""A workflow's diff for the page, the lines a person comments on: the comments
become review feedback for the next development round, with path and line.

What a comment becomes is ``phasegate.core.review``'s, recorded through
``phasegate.operations``.

The diff is git's (``Workspace.diff``: the branch against its base, merge
base to head). Parsing it here is a few lines of git's own fixed format, not
a model's output: no library is worth a dependency for it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from markupsafe import Markup, escape
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import get_lexer_for_filename
from pygments.util import ClassNotFound

__all__ = [
    "HIGHLIGHT_CSS",
    "DiffFile",
    "DiffLine",
    "files_as_dicts",
    "parse_diff",
]

_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")
_PATH = re.compile(r"^diff --git a/(.*) b/(.*)$")


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
    path: str
    lines: list[DiffLine] = field(default_factory=list)


def parse_diff(diff: str) -> list[DiffFile]:
    """``git diff``'s unified output as files of numbered lines, in its order."""
    files: list[DiffFile] = []
    old = new = 0
    for raw in diff.splitlines():
        header = _PATH.match(raw)
        if header:
            files.append(DiffFile(header.group(2)))
            continue
        if not files or raw.startswith(("--- ", "+++ ", "index ", "new file", "deleted file")):
            continue
        hunk = _HUNK.match(raw)
        if hunk:
            old, new = int(hunk.group(1)), int(hunk.group(2))
            files[-1].lines.append(DiffLine("hunk", raw))
        elif raw.startswith("+"):
            files[-1].lines.append(DiffLine("add", raw[1:], new=new))
            new += 1
        elif raw.startswith("-"):
            files[-1].lines.append(DiffLine("del", raw[1:], old=old))
            old += 1
        elif raw.startswith(" "):
            files[-1].lines.append(DiffLine("ctx", raw[1:], old=old, new=new))
            old, new = old + 1, new + 1
    return files


def files_as_dicts(
    files: list[DiffFile], clean: Callable[[str], str] = lambda text: text
) -> list[dict[str, Any]]:
    """``files`` for a template: ``{"path", "index", "lines"}``, each line a
    ``{"kind", "text", "old", "new", "html"}``; ``html`` the line highlighted for
    its file's language (pygments; escaped text when none is known), made from
    ``clean(text)``: secrets go before highlighting, which splits text into tokens
    a redaction afterwards could no longer find whole."""
    shown = []
    for i, f in enumerate(files):
        lexer = _lexer(f.path)
        lines = [
            {**vars(line), "html": _highlighted(clean(line.text), lexer, line.kind)}
            for line in f.lines
        ]
        shown.append({"path": f.path, "lines": lines, "index": i})
    return shown


#: The CSS of the highlighted tokens (pygments' default style), for the diff page.
HIGHLIGHT_CSS = HtmlFormatter().get_style_defs(".code")
_FORMATTER = HtmlFormatter(nowrap=True)


def _lexer(path: str) -> Lexer | None:
    try:
        return get_lexer_for_filename(path, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


def _highlighted(text: str, lexer: Lexer | None, kind: str) -> Markup:
    if lexer is None or kind == "hunk":
        return escape(text)
    return Markup(highlight(text, lexer, _FORMATTER))
