"""What phasegate writes on a team forge and reads back: hidden markers, bodies
within a forge's limit, check output capped, people and times as forges give them.

GitHub's, GitLab's and Gitea's forges share these; each names its own limit.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "CHECK_OUTPUT_BYTES",
    "cap",
    "fit_body",
    "labels_of",
    "login_of",
    "marker_comment",
    "timestamp",
]

#: The most of one check's output phasegate keeps (bytes of UTF-8): it reaches a prompt.
CHECK_OUTPUT_BYTES = 8 * 1024


def marker_comment(marker: str) -> str:
    """The hidden HTML comment that carries ``marker`` in a body."""
    return f"<!-- {marker} -->"


def fit_body(text: str, suffix: str, limit: int, forge: str) -> str:
    """``text`` then ``suffix``, within ``limit`` characters: what does not fit is cut
    from ``text`` with a note naming ``forge``, never from ``suffix`` (a body's
    hidden marker, which finding it again depends on)."""
    if len(text) + len(suffix) <= limit:
        return text + suffix
    note = f"\n\n… (cut: {len(text)} characters were more than {forge} takes)"
    return text[: limit - len(suffix) - len(note)] + note + suffix


def cap(text: str, limit: int = CHECK_OUTPUT_BYTES) -> str:
    """``text`` within ``limit`` bytes of UTF-8, cut with a note when longer."""
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    note = "\n… (cut)"
    return raw[: limit - len(note.encode())].decode("utf-8", "ignore") + note


def labels_of(items: Iterable[Any]) -> tuple[str, ...]:
    """The names of an issue's ``labels`` (objects with a ``name``, or plain names)."""
    names = (item if isinstance(item, str) else (item or {}).get("name") for item in items)
    return tuple(str(n) for n in names if n)


def login_of(user: Any, key: str = "login") -> str:
    """A user object's login (GitLab's ``username``: ``key``); "" for none, as a
    deleted account is ``null``."""
    return str((user or {}).get(key) or "")


def timestamp(text: str) -> datetime:
    """A forge's ISO 8601 / RFC 3339 time (``2026-03-01T12:00:00Z``, ``…+02:00``),
    aware, in UTC."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
