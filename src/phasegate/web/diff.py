"""A workflow's diff for the page, the lines a person comments on: the comments
become review feedback for the next development round, with path and line.

What a comment becomes is ``phasegate.core.review``'s, recorded through
``phasegate.operations``. Where the diff is read (the branch, the merge commit,
the forge) is ``phasegate.changes``'; git's output is parsed by
``phasegate.git.diffs``. Here each line is highlighted for its file's language.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from markupsafe import Markup, escape
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import get_lexer_for_filename
from pygments.util import ClassNotFound

from phasegate.git.diffs import DiffFile, DiffLine, parse_diff

__all__ = [
    "HIGHLIGHT_CSS",
    "DiffFile",
    "DiffLine",
    "files_as_dicts",
    "parse_diff",
]

#: The marker a line of each kind is shown with (a hunk's header has none).
MARKERS = {"add": "+", "del": "\u2212", "ctx": " ", "hunk": ""}


def files_as_dicts(
    files: list[DiffFile], clean: Callable[[str], str] = lambda text: text
) -> list[dict[str, Any]]:
    """``files`` for a template: ``{"path", "old_path", "status", "added",
    "removed", "binary", "index", "lines"}``, each line a ``{"kind", "text",
    "old", "new", "marker", "html"}``; ``html`` the line highlighted for
    its file's language (pygments; escaped text when none is known), made from
    ``clean(text)``: secrets go before highlighting, which splits text into tokens
    a redaction afterwards could no longer find whole."""
    shown = []
    for i, f in enumerate(files):
        lexer = _lexer(f.path)
        lines = [
            {
                **vars(line),
                "marker": MARKERS[line.kind],
                "html": _highlighted(clean(line.text), lexer, line.kind),
            }
            for line in f.lines
        ]
        shown.append({**f.as_dict(), "lines": lines, "index": i})
    return shown


#: The diff page's token colours (pygments' default style, without its background:
#: a line's tint is the whole row's, gutter and code alike; static/dashboard.css has it).
HIGHLIGHT_CSS = HtmlFormatter(nobackground=True).get_style_defs(".code")
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
