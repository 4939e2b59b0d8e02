"""Reading agents' answers: ``NAME: value`` lines, verdicts, objections, a merged plan.

Each reader returns None (or an empty list) for what is not there; the node
that asked decides whether that stops the graph (a ``garbage`` stop).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = [
    "REVIEW_VERDICTS",
    "claim_key",
    "field",
    "items",
    "section",
    "verdict",
    "without_fields",
]

#: What a reviewer, adversary or arbitrator may say, and what each means.
REVIEW_VERDICTS: Mapping[str, str] = {
    "approve": "approve",
    "ship": "approve",
    "request_changes": "request_changes",
    "revise": "request_changes",
    "reject": "request_changes",
}


def _line(name: str) -> re.Pattern[str]:
    # "VERDICT: x", "- OBJECTION: x", "**PRICE**: x"
    return re.compile(
        rf"^[ \t]*(?:[-*][ \t]+)?\**[ \t]*{name}[ \t]*\**[ \t]*[:=][ \t]*\**[ \t]*(.*?)[ \t]*$",
        re.I | re.M,
    )


def items(text: str, name: str) -> list[str]:
    """Every non-empty value of a ``NAME: value`` line, in order, verbatim but stripped."""
    return [v.strip() for v in _line(name).findall(text) if v.strip()]


def field(text: str, name: str) -> str | None:
    """The last ``NAME: value`` line's value, or None."""
    found = items(text, name)
    return found[-1] if found else None


def verdict(text: str, allowed: Mapping[str, str] | tuple[str, ...]) -> str | None:
    """The last ``VERDICT:`` word, lower-cased, mapped through ``allowed`` (a
    mapping of synonyms, or a tuple of accepted words); None when missing or
    not allowed."""
    value = field(text, "verdict")
    if value is None:
        return None
    word = value.strip("*`'\". ").lower().replace("-", "_").replace(" ", "_")
    if isinstance(allowed, tuple):
        return word if word in allowed else None
    return allowed.get(word)


def section(text: str, name: str) -> str | None:
    """What follows a ``NAME:`` line: the rest of that line and every line after
    it, stripped; None when there is no such line or nothing follows it."""
    match = _line(name).search(text)
    if match is None:
        return None
    body = (match.group(1) + text[match.end() :]).strip()
    return body or None


def without_fields(text: str, *names: str) -> str:
    """``text`` without its ``NAME: value`` lines for ``names``, stripped."""
    for name in names:
        text = _line(name).sub("", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def claim_key(claim: str) -> str:
    """How two objections are compared: stripped, case-insensitively (docs/contracts/graph.md:
    the loop's stops)."""
    return claim.strip().casefold()
