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


#: The diff page's CSS: the highlighted tokens (pygments' default style, without its
#: background: a line's tint is the whole row's, gutter and code alike), the rows
#: tinted by kind, and the file list.
HIGHLIGHT_CSS = (
    HtmlFormatter(nobackground=True).get_style_defs(".code")
    + """
table.diff { width: 100%; table-layout: fixed;
  font-family: ui-monospace, monospace; font-size: .8rem; }
table.diff td { border: none; padding: 0 .4rem; white-space: pre-wrap; overflow-wrap: anywhere; }
table.diff td.ln-old, table.diff td.ln-new { width: 3rem; text-align: right; color: #57606a; }
table.diff td.marker { width: 1rem; padding: 0; text-align: center; user-select: none; }
table.diff tr.diff-add td { background: #e6ffec; }
table.diff tr.diff-add td.ln-old, table.diff tr.diff-add td.ln-new { background: #ccffd8; }
table.diff tr.diff-add td.marker { color: #1a7f37; }
table.diff tr.diff-del td { background: #ffebe9; }
table.diff tr.diff-del td.ln-old, table.diff tr.diff-del td.ln-new { background: #ffd7d5; }
table.diff tr.diff-del td.marker { color: #cf222e; }
table.diff tr.diff-hunk td { background: #ddf4ff; color: #57606a; }
details.diff-file { background: #fff; border: 1px solid #d8dde3; border-radius: 6px;
  margin: .8rem 0; }
details.diff-file > summary { cursor: pointer; padding: .4rem .6rem; background: #f6f8fa;
  border-bottom: 1px solid #d8dde3; font-family: ui-monospace, monospace; font-size: .85rem; }
details.diff-file:not([open]) > summary { border-bottom: none; }
.plus { color: #1a7f37; font-weight: 600; } .minus { color: #cf222e; font-weight: 600; }
.from { opacity: .7; }
.file-status { font-size: .75rem; border-radius: 1rem; padding: 0 .45rem;
  border: 1px solid currentColor; }
.file-added { color: #1a7f37; } .file-deleted { color: #cf222e; } .file-renamed { color: #9a6700; }
table.diff-files td { border: none; padding: .1rem .5rem; }
.diff-summary { margin-bottom: 1rem; }
.diff-source { opacity: .7; margin-top: -.4rem; }
"""
)
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
