"""Text from tickets, agents and git made safe to print on a terminal.

A ticket or an agent's output may carry terminal escapes: clearing the
screen, setting the window title, hyperlinks that hide their target, bidi
overrides that reorder what is read. ``visible`` turns every control
character into a visible escape (``\\x1b``, ``\\u202e``), so a person reads
what is there instead of having it act on their terminal.
``--json`` output is already escaped by the JSON encoder.
"""

from __future__ import annotations

import re

__all__ = ["visible"]

# C0 controls but tab and newline, DEL, C1 controls, and the Unicode format
# characters that reorder or hide text (bidi embeddings, overrides, isolates).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, *, one_line: bool = False) -> str:
    """``text`` with each control character written as its escape; with ``one_line``
    newlines and tabs too (for a table cell or a one-line summary)."""
    text = _CONTROL.sub(_escaped, text)
    if one_line:
        text = text.replace("\n", "\\n").replace("\t", "\\t")
    return text
