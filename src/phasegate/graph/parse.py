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
    "subtask_pieces",
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


#: A SUBTASK's title with the earlier pieces it needs: ``title [after 1, 2]``.
_AFTER = re.compile(r"^(?P<title>.*?)[ \t]*\[[ \t]*after\b(?P<refs>[^\]]*)\][ \t]*$", re.I)
_AFTER_REF = re.compile(r"[0-9]+")


def subtask_pieces(values: list[str]) -> list[tuple[str, list[int]]]:
    """Each SUBTASK value as ``(title, the 1-based places of the earlier pieces it
    needs)``, read from ``title [after 1, 2]``. Raises ValueError, saying which line,
    for a title left empty, an ``[after ...]`` naming no number, or a number that is
    not an earlier piece (the pieces form no cycle: each follows only those before)."""
    pieces: list[tuple[str, list[int]]] = []
    for place, value in enumerate(values, 1):
        found = _AFTER.match(value)
        if found is None:
            if re.search(r"\[[ \t]*after\b", value, re.I):
                closed = re.search(r"\[[ \t]*after\b[^\]]*\]", value, re.I)
                wrong = "text after its [after ...]" if closed else "an unclosed [after ...]"
                raise ValueError(f"SUBTASK {place} has {wrong}: {value!r}")
            pieces.append((value, []))
            continue
        title, refs = found.group("title").strip(), found.group("refs")
        numbers = [int(n) for n in _AFTER_REF.findall(refs)]
        leftover = _AFTER_REF.sub("", refs).replace(",", " ").replace("and", " ").strip()
        if not title or not numbers or leftover:
            raise ValueError(
                f"SUBTASK {place} is not `<title> [after N, M]` with earlier pieces' numbers: "
                f"{value!r}"
            )
        later = [n for n in numbers if not 1 <= n < place]
        if later:
            raise ValueError(
                f"SUBTASK {place} ({title!r}) names piece(s) {', '.join(map(str, later))} in "
                f"[after ...]: a piece can only follow the pieces listed before it (1 to "
                f"{place - 1})"
                if place > 1
                else f"SUBTASK 1 ({title!r}) has [after ...]: the first piece follows none"
            )
        pieces.append((title, sorted(set(numbers))))
    return pieces


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
