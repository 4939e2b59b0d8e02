"""A workflow's priority: the integer workers claim by, read from a person's word or a forge label.

A priority is an integer from ``MIN_PRIORITY`` to ``MAX_PRIORITY``; a larger one
is claimed first, and workflows of one priority are claimed oldest first
(docs/queues.md). Three names stand for the usual values: ``high`` (1),
``normal`` (0, every workflow's default) and ``low`` (-1). A forge issue
labelled ``priority:<name or integer>`` starts its workflow at that priority.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from phasegate.core.inputs import ActionRefused

__all__ = [
    "DEFAULT_PRIORITY",
    "LABEL_PREFIX",
    "check_priority",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "PRIORITY_NAMES",
    "parse_priority",
    "priority_from_labels",
    "priority_name",
]

#: The named priorities and the integer each stands for.
PRIORITY_NAMES: dict[str, int] = {"high": 1, "normal": 0, "low": -1}

#: Every workflow's priority unless a person or a label gives another.
DEFAULT_PRIORITY = 0

#: The range a priority may take (a person's typo of 1000 is refused, not queued first).
MIN_PRIORITY = -100
MAX_PRIORITY = 100

#: The forge label that carries a priority: ``priority:high``, ``priority:2``.
LABEL_PREFIX = "priority:"


def parse_priority(text: str) -> int:
    """The priority ``text`` names: ``high``, ``normal``, ``low`` (any case) or an
    integer from MIN_PRIORITY to MAX_PRIORITY. Raises ActionRefused otherwise,
    naming what is accepted."""
    word = text.strip().lower()
    if word in PRIORITY_NAMES:
        return PRIORITY_NAMES[word]
    try:
        value = int(word)
    except ValueError:
        raise ActionRefused(_refusal(text)) from None
    return check_priority(value, text)


def check_priority(value: int, given: str | None = None) -> int:
    """``value`` unchanged when it is a priority (MIN_PRIORITY to MAX_PRIORITY); raises
    ActionRefused naming ``given`` (what the person wrote; default ``value``) otherwise."""
    if isinstance(value, bool) or not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ActionRefused(_refusal(str(value) if given is None else given))
    return value


def _refusal(given: str) -> str:
    return (
        f"priority {given!r}: give high, normal, low or an integer from {MIN_PRIORITY} "
        f"to {MAX_PRIORITY} (larger is claimed first)"
    )


def priority_name(priority: int) -> str:
    """How ``priority`` is shown: its name when it has one, else the integer."""
    for name, value in PRIORITY_NAMES.items():
        if value == priority:
            return name
    return str(priority)


def priority_from_labels(labels: Iterable[str]) -> int | None:
    """The priority a forge issue's ``labels`` give (``priority:<value>``, any case;
    the highest when several do), else None. A label whose value is no priority
    is passed over: a forge's label is not a person's typo to refuse."""
    found: list[int] = []
    for label in labels:
        if not label.lower().startswith(LABEL_PREFIX):
            continue
        try:
            found.append(parse_priority(label[len(LABEL_PREFIX) :]))
        except ActionRefused:
            continue
    return max(found) if found else None
