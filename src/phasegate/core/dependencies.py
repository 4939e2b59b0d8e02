"""Dependencies between workflows: the ``Depends on #N`` lines of a ticket, and cycles.

Pure module: no I/O. The store keeps the edges and decides when a workflow that
waits for others runs (``phasegate.store.dependencies``); docs/epics.md says how a
person declares them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence

from phasegate.core.contract import PhasegateError

__all__ = ["DependencyCycle", "cycle_path", "depends_on_issues"]

#: ``Depends on #12``, ``depends on #3, #4 and #5``: one line, at its start (a list
#: item's dash or star allowed), so prose that mentions a dependency in passing
#: does not declare one.
_DEPENDS_LINE = re.compile(r"^[ \t]*(?:[-*][ \t]+)?depends[ \t]+on[ \t]*:?[ \t]*(.+)$", re.I | re.M)
_ISSUE_NUMBER = re.compile(r"#([1-9][0-9]{0,9})\b")


class DependencyCycle(PhasegateError):
    """The dependencies asked for would close a cycle; nothing was recorded.

    ``path``: the workflows (or issues) around it, the first repeated last.
    """

    def __init__(self, path: Sequence[str]) -> None:
        super().__init__(
            f"a dependency cycle: {' → '.join(path)}; nothing recorded "
            "(a workflow can only wait for work that does not wait for it)"
        )
        self.path = tuple(path)


def depends_on_issues(text: str) -> list[int]:
    """The issue numbers ``text``'s ``Depends on #N`` lines name, each once, in order."""
    found: dict[int, None] = {}
    for line in _DEPENDS_LINE.findall(text):
        for number in _ISSUE_NUMBER.findall(line):
            found[int(number)] = None
    return list(found)


def cycle_path(start: str, edges: Callable[[str], Iterable[str]]) -> list[str] | None:
    """A path of dependencies from ``start`` back to ``start`` (``[start, ..., start]``),
    following ``edges(node)``: the nodes ``node`` depends on; None when there is none.
    Each node is asked for its edges once."""
    seen: set[str] = set()
    path = [start]
    stack: list[Iterator[str]] = [iter(edges(start))]
    while stack:
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            path.pop()
            continue
        if nxt == start:
            return [*path, start]
        if nxt in seen:
            continue
        seen.add(nxt)
        path.append(nxt)
        stack.append(iter(edges(nxt)))
    return None
