"""A person's review of a workflow's diff: line comments kept as drafts, then sent
as one feedback: a person comments on a line, and the comments become review
feedback for the next development round, with path and line.

Pure: reads event rows, returns what to record. ``operations.comment`` records
a draft and ``operations.send_review`` sends them (the CLI and the dashboard
both call those, so the rules live once).

Why drafts: a comment committed as feedback at once would start the next
development round under a running worker, and the person's later comments
would miss that round. So each comment is an event row of its own type
(``review_comment``), which changes no workflow state and so moves no worker;
sending the review commits one feedback naming every draft's path and line,
and in the same commit a ``review_sent`` event listing the drafts it covered.
A draft is a ``review_comment`` row no ``review_sent`` covers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_COMMENT_BYTES",
    "REVIEW_COMMENT",
    "REVIEW_SENT",
    "Draft",
    "comment_line",
    "drafts",
    "review_feedback",
]

#: A draft comment: ``{"path", "line", "text", "by"}``.
REVIEW_COMMENT = "review_comment"
#: A review sent: ``{"comments": [event ids of the drafts it covered], "by"}``.
REVIEW_SENT = "review_sent"
#: The most one comment may have, in bytes (UTF-8): a review is read whole by every
#: prompt of the next round.
MAX_COMMENT_BYTES = 20_000


@dataclass(frozen=True)
class Draft:
    """A comment not sent yet: ``id`` its event row's id, ``line`` a line number
    in the branch (1-based), ``by`` who wrote it."""

    id: int
    path: str
    line: int
    text: str
    by: str


def drafts(events: Iterable[Mapping[str, Any]]) -> list[Draft]:
    """The drafts among a workflow's event rows (``Store.events``: ``{"id", "type",
    "data"}``): each ``review_comment`` row no ``review_sent`` row lists, in id order."""
    written: list[Mapping[str, Any]] = []
    sent: set[int] = set()
    for row in events:
        if row["type"] == REVIEW_COMMENT:
            written.append(row)
        elif row["type"] == REVIEW_SENT:
            sent.update(int(i) for i in (row["data"] or {}).get("comments", ()))
    return [
        Draft(
            id=int(row["id"]),
            path=str(row["data"]["path"]),
            line=int(row["data"]["line"]),
            text=str(row["data"]["text"]),
            by=str(row["data"].get("by", "")),
        )
        for row in sorted(written, key=lambda r: int(r["id"]))
        if int(row["id"]) not in sent
    ]


def comment_line(path: str, line: int, text: str) -> str:
    """How one comment reads in the feedback: ``Review comment on PATH line N: TEXT``."""
    return f"Review comment on {path} line {line}: {text.strip()}"


def review_feedback(earlier: str | None, summary: str, comments: Sequence[Draft]) -> str:
    """The feedback a review becomes: ``earlier`` (the feedback given and not yet
    taken up by a round, so it is not lost), then the person's ``summary``, then
    each comment (``comment_line``) in order, separated by blank lines."""
    parts = [(earlier or "").strip(), summary.strip()]
    parts += [comment_line(c.path, c.line, c.text) for c in comments]
    return "\n\n".join(part for part in parts if part)
