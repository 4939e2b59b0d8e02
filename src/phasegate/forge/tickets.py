"""The ticket: a forge issue snapshotted with only trusted people's words.

A workflow started from an issue is asked to do what its ``TicketSnapshot``
says: the issue's title and body and the conversation comments of trusted
authors (``TRUSTED_PERMISSIONS``), each with its author. Text by anyone else
never reaches it, so it never reaches a prompt. The snapshot's hash is the
acceptance hash (``state["acceptance_hash"]``): acceptance verification takes
the snapshot again (``resnapshot``), so a new snapshot of an edited issue
verifies again. The triggers (``phasegate.integrations.triggers``) take the
first snapshot; this module sits below the phases so both can read it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal

from phasegate.core.contract import PhasegateError, WorkflowContext
from phasegate.core.dependencies import depends_on_issues
from phasegate.core.state import WorkflowState
from phasegate.forge.base import Comment, Forge, Issue, TrustCache

__all__ = [
    "IssueRef",
    "TicketSnapshot",
    "TriggerRefused",
    "parse_issue_ref",
    "resnapshot",
    "snapshot_ticket",
]

#: ``owner/name`` as GitHub spells it, or GitLab's nested ``group/…/name``
#: (forge.repository's rules, config.forge).
_OWNER_NAME = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}(?:/[A-Za-z0-9_][A-Za-z0-9._-]{0,99}?)+"
_ISSUE_REF = re.compile(rf"^(?:(?P<repo>{_OWNER_NAME})#|#)?(?P<n>[1-9][0-9]{{0,9}})$")


class TriggerRefused(PhasegateError):
    """This issue cannot start a workflow: another repository's, closed, filed by
    phasegate itself, or a ticket too big. The message says which."""


# -- the snapshot -------------------------------------------------------------------


@dataclass(frozen=True)
class TicketSnapshot:
    """What a workflow started from an issue is asked to do.

    ``text``: the issue body, then each trusted author's conversation comment
    (oldest first) headed by its author and time (UTC). ``authors``: the logins
    whose words are in ``text`` (the issue's author first, then each commenter
    once). ``vouched_by``: the trusted person who started it (labeller or
    importer), who vouches for the body. ``hash``: sha256 of ``title`` and
    ``text`` (the acceptance hash's formula), 16 hex digits. ``source``:
    ``owner/name#N``. ``left_out``: how many people's comments were not trusted.
    ``vouched_hash``: sha256 of the title and body alone, 16 hex digits: what the
    voucher vouched for (``resnapshot`` tells an edit by it). ``comment_ids``: the
    ids of every comment on the issue at that moment, trusted or not: wait hears
    only comments made after them (``state["heard_comments"]``).
    """

    title: str
    text: str
    authors: tuple[str, ...]
    hash: str
    issue_number: int
    source: str
    vouched_by: str
    vouched_hash: str
    left_out: int = 0
    comment_ids: tuple[str, ...] = ()  # Comment.key of each
    #: The issues its ``Depends on #N`` lines name (core.dependencies), in the body
    #: when its author is trusted and in trusted comments: what it runs after.
    depends_on: tuple[int, ...] = ()

    def state(self, trigger: Literal["label", "import"]) -> WorkflowState:
        """What the workflow keeps of the snapshot in its state."""
        return {
            "acceptance_hash": self.hash,
            "ticket_source": self.source,
            "ticket_authors": list(self.authors),
            "triggered_by": self.vouched_by,
            "ticket_vouched_hash": self.vouched_hash,
            "trigger": trigger,
            # Told apart by id, not by clock: what was on the issue when the
            # workflow started is in the ticket (or was left out), never feedback.
            "heard_comments": list(self.comment_ids),
        }


def _comment_block(comment: Comment) -> str:
    when = comment.created_at.strftime("%Y-%m-%d %H:%M UTC")
    return f"@{comment.author} wrote ({when}):\n\n{comment.body.strip()}"


def snapshot_ticket(
    forge: Forge,
    number: int,
    repository: str,
    *,
    vouched_by: str,
    issue: Issue | None = None,
    trust: TrustCache | None = None,
) -> TicketSnapshot:
    """Snapshot issue ``number`` of ``repository`` (``owner/name``) as a ticket.

    The body is taken whoever wrote it: ``vouched_by``, a trusted person, chose
    this issue as a ticket (a label, an import), and the usual case is an issue
    a user filed and a maintainer accepted; what it asks is then the
    maintainer's call, as on any forge. Comments are another matter: anyone
    can add one after that choice, so only those whose author is trusted now
    (``forge.permission`` in TRUSTED_PERMISSIONS, asked once per author) are
    kept, each under its author's name; review summaries and inline comments
    are not the ticket's. Known gap: the body as it is now is snapshotted, so an
    untrusted author's edit between the label and the snapshot (at most a
    watch interval) is taken as vouched for; the Forge protocol has no edit
    times to tell.

    ``issue``: the issue when the caller has read it already. Raises ForgeError
    (ForgeNotFound for an issue that does not exist).
    """
    issue = issue or forge.issue(number)
    trust = trust or TrustCache(forge)
    kept: list[Comment] = []
    left_out = 0
    comments = forge.comments(number)
    for comment in comments:
        if comment.kind != "conversation":
            continue
        if trust.trusted(comment.author):
            kept.append(comment)
        else:
            left_out += 1
    text = issue.body.strip() or "(the issue has no description)"
    if kept:
        blocks = "\n\n".join(_comment_block(c) for c in kept)
        text += (
            "\n\n---\n\nComments by people with write access to the repository, "
            f"oldest first:\n\n{blocks}"
        )
    authors = dict.fromkeys([issue.author or vouched_by, *(c.author for c in kept)])
    # Only a trusted person's words say what the work waits for: a dependency on
    # another issue holds a workflow back, which an outsider must not be able to do.
    declared = [issue.body] if issue.author and trust.trusted(issue.author) else []
    depends_on = depends_on_issues("\n".join([*declared, *(c.body for c in kept)]))
    return TicketSnapshot(
        title=issue.title,
        text=text,
        authors=tuple(authors),
        hash=_hash(issue.title, text),
        issue_number=number,
        source=f"{repository}#{number}",
        vouched_by=vouched_by,
        vouched_hash=_hash(issue.title, issue.body),
        left_out=left_out,
        comment_ids=tuple(c.key for c in comments),
        depends_on=tuple(depends_on),
    )


def _hash(title: str, text: str) -> str:
    return hashlib.sha256(f"{title}\n{text}".encode()).hexdigest()[:16]


def resnapshot(forge: Forge, ctx: WorkflowContext) -> TicketSnapshot | None:
    """The issue a workflow was started from (``state["ticket_source"]``), snapshotted
    again now: its hash differs from ``state["acceptance_hash"]`` when the issue
    was edited or a trusted person commented since. None for a workflow that was
    not started from an issue.

    The voucher vouched for the title and body as they were: an edit since is
    taken only when the issue's author is trusted (on GitHub only the author and
    collaborators edit an issue), else TriggerRefused says a trusted person must
    label or import it again, and no edited word of an untrusted author reaches
    a prompt. Raises ForgeError.
    """
    source = ctx.state.get("ticket_source")
    if not source:
        return None
    ref = parse_issue_ref(str(source))
    repository = str(ctx.state.get("forge_repository") or ref.repository)
    trust = TrustCache(forge)
    issue = forge.issue(ref.number)
    by = str(ctx.state.get("triggered_by") or "")
    fresh = snapshot_ticket(forge, ref.number, repository, vouched_by=by, issue=issue, trust=trust)
    if fresh.vouched_hash != ctx.state.get("ticket_vouched_hash") and not trust.trusted(
        issue.author
    ):
        raise TriggerRefused(
            f"{fresh.source} was edited since {by} vouched for it, and its author "
            f"{issue.author or '(unknown)'} has no write access: a trusted person must "
            "label it again (or `phasegate import` it) for the edit to count"
        )
    return fresh


# -- naming issues ------------------------------------------------------------------


@dataclass(frozen=True)
class IssueRef:
    """``OWNER/REPO#N``, or ``#N`` / ``N`` (``repository`` None: the cartridge's)."""

    repository: str | None
    number: int


def parse_issue_ref(text: str) -> IssueRef:
    """Read ``OWNER/REPO#N``, ``#N`` or ``N``. Raises TriggerRefused when it is none."""
    found = _ISSUE_REF.match(text.strip())
    if found is None:
        raise TriggerRefused(f"{text!r} is not an issue: give OWNER/REPO#N, #N or N")
    return IssueRef(found.group("repo"), int(found.group("n")))
