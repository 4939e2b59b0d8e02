"""What a person gives an action, checked before anything is recorded.

The checks cover who acts (``--by``), a ticket, a title, and the size of what
they say. ``phasegate.operations`` applies them to every action, so the CLI,
the dashboard and the API refuse alike.
"""

from __future__ import annotations

from phasegate.core.contract import PhasegateError

__all__ = [
    "MAX_NAME_CHARS",
    "MAX_TICKET_BYTES",
    "MAX_TITLE_CHARS",
    "ActionRefused",
    "check_by",
    "check_size",
    "check_ticket",
    "check_title",
    "title_of",
]

#: The longest name of a person, in characters (the people table's ``users.name``).
MAX_NAME_CHARS = 64

#: The most a ticket may have, in bytes (UTF-8): every prompt and the store carry it.
MAX_TICKET_BYTES = 1_000_000

#: The most characters a given title may have (a derived one is cut at 120).
MAX_TITLE_CHARS = 300


class ActionRefused(PhasegateError):
    """The action's input does not fit it; nothing was recorded."""


def check_by(by: str) -> str:
    """``by`` unchanged when it may be recorded as who acted: the rules of the
    people table's names (``phasegate.store.users``, whose MAX_NAME this is), a
    slash allowed (a sign-on provider's name may hold one). Raises ActionRefused
    naming --by: a name that is empty, has white space at its ends, a control
    character (a record must read as one line) or over MAX_NAME_CHARS characters."""
    if not by.strip():
        raise ActionRefused("--by needs a name")
    if by != by.strip():
        raise ActionRefused(f"--by {by!r} has white space at its ends")
    if not by.isprintable():
        raise ActionRefused(f"--by {by!r} holds a control character")
    if len(by) > MAX_NAME_CHARS:
        raise ActionRefused(f"--by has {len(by)} characters; at most {MAX_NAME_CHARS}")
    return by


def check_ticket(ticket: str) -> str:
    """``ticket`` unchanged when a workflow may be filed for it. Raises ActionRefused
    when it is empty, over MAX_TICKET_BYTES (UTF-8) or holds a NUL character (no
    prompt, file or program argument can carry one: it would fail in development)."""
    check_size(ticket, "ticket")
    if "\x00" in ticket:
        raise ActionRefused("the ticket holds a NUL character (\\x00): no agent can be given it")
    if not ticket.strip():
        raise ActionRefused("the ticket is empty")
    return ticket


def check_size(text: str, what: str) -> None:
    """Refuse ``text`` (a ticket, feedback, a review) over MAX_TICKET_BYTES: what a
    person says reaches every prompt and the store whole, as a ticket does."""
    if len(text.encode("utf-8", "surrogateescape")) > MAX_TICKET_BYTES:
        raise ActionRefused(
            f"the {what} is over {MAX_TICKET_BYTES} bytes: every prompt and the store carry "
            "it whole; put what is long in the repository and point to it"
        )


def check_title(title: str) -> str:
    """``title`` unchanged when a workflow may carry it. Raises ActionRefused when it
    is over MAX_TITLE_CHARS or holds a NUL character: a title names the branch, the
    commits and the pull request, which git and the forge bound."""
    if "\x00" in title:
        raise ActionRefused("the title holds a NUL character (\\x00)")
    if len(title) > MAX_TITLE_CHARS:
        raise ActionRefused(
            f"the title is over {MAX_TITLE_CHARS} characters: say the rest in the ticket"
        )
    return title


def title_of(ticket: str) -> str:
    """A ticket's title when none is given: its first non-blank line, without
    Markdown's heading marks, at most 120 characters."""
    first = next((line.strip() for line in ticket.splitlines() if line.strip()), "untitled")
    return first.lstrip("#").strip()[:120]
