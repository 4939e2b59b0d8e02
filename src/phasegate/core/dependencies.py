"""Dependencies between workflows: the ``Depends on #N`` lines of a ticket, and cycles.

Pure module: no I/O. The store keeps the edges and decides when a workflow that
waits for others runs (``phasegate.store.dependencies``); docs/epics.md says how a
person declares them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from phasegate.core.contract import PhasegateError

__all__ = [
    "ENDED_UNCOMPLETED",
    "DependencyCycle",
    "cycle_path",
    "depends_on_issues",
    "waiting_text",
]

#: ``Depends on #12``, ``depends on #3, #4 and #5``: one line, at its start (a list
#: item's dash or star allowed), so prose that mentions a dependency in passing
#: does not declare one.
_DEPENDS_LINE = re.compile(r"^[ \t]*(?:[-*][ \t]+)?depends[ \t]+on[ \t]*:?[ \t]*(.+)$", re.I | re.M)
_ISSUE_NUMBER = re.compile(r"#([1-9][0-9]{0,9})\b")


#: The statuses of a dependency that ended without completing: it releases nobody.
ENDED_UNCOMPLETED = ("failed", "cancelled")


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


def waiting_text(status: str, left: Sequence[Mapping[str, Any]], total: int) -> str:
    """What a waiting workflow's error says: what it waits for (``left``: the edges not
    completed, each with ``depends_on``, ``status``, ``issue``), and the commands that
    go on when one of them failed or was cancelled. ``status``: ``blocked`` or
    ``pieces``; ``total``: how many edges it has."""
    named = ", ".join(_named(e) for e in left)
    if status == "pieces":
        said = f"waits for its pieces: {total - len(left)} of {total} completed; left: {named}"
    else:
        said = f"waits for {named} to merge and verify"
    cancelled = [str(e["depends_on"]) for e in left if e["status"] == "cancelled"]
    failed = [str(e["depends_on"]) for e in left if e["status"] == "failed"]
    if cancelled:
        said += (
            f"; {', '.join(cancelled)} cancelled: resume this one to go on without "
            f"{', '.join(cancelled)}, or cancel it"
        )
    if failed:
        said += (
            f"; {', '.join(failed)} failed: resume {', '.join(failed)}, or resume this one "
            "to go on without it"
        )
    return said


def _named(edge: Mapping[str, Any]) -> str:
    if edge["depends_on"] is None:
        return f"{edge['issue']} (no workflow yet)"
    return f"{edge['depends_on']} ({edge['status']})"
