"""Trusted triggers: a workflow started from a forge issue (issue 11, item 4).

Two ways in, one rule: only people with write, maintain or admin permission on
the repository (``TRUSTED_PERMISSIONS``) start a workflow or put words in its
ticket.

- **watch**: ``Watcher.watch_once`` looks at the open issues carrying the
  cartridge's ``forge.trigger_label``; one labelled by a trusted person, with
  no workflow yet, is snapshotted and started. A label by anyone else is
  ``Ignored`` and logged, once per issue and labeller.
- **import**: ``start_from_issue`` does the same for one issue by hand (the
  person at the terminal holds the token and vouches), whatever its labels.

The ticket is a ``TicketSnapshot`` taken at that moment (``snapshot_ticket``):
the issue's title and body and the conversation comments of trusted authors,
each with its author. Text by anyone else never reaches it, so it never
reaches a prompt. The snapshot's hash is spec 000's acceptance hash
(``state["acceptance_hash"]``, read by ``acceptance_verification.acceptance_hash``):
a new snapshot of an edited issue verifies again.

At most one workflow per issue: ``Store.create_workflow(issue=...)`` looks the
issue up and inserts in one writing transaction and raises IssueTaken, so two
watchers (or a watcher and an import) racing start one workflow between them.
Across stores (a second checkout, another machine) the forge says it: an issue
carrying a status label (``phasegate:…``, ``phasegate:cancelled`` included) has
or had a workflow somewhere, and the watcher passes over it until a person
removes that label.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from phasegate.core.contract import PhasegateError, WorkflowContext
from phasegate.core.state import WorkflowState
from phasegate.forge.base import (
    STATUS_LABEL_PREFIX,
    TRUSTED_PERMISSIONS,
    Comment,
    Forge,
    ForgeError,
    ForgeUnavailable,
    Issue,
    TrustCache,
)
from phasegate.forge.github.auth import repository_from_origin
from phasegate.store import StoreUnavailable
from phasegate.store.workflows import IssueTaken

if TYPE_CHECKING:  # the engine imports the phases, which may read a snapshot again
    from phasegate.runtime.engine import Engine

__all__ = [
    "Ignored",
    "IssueRef",
    "Started",
    "TicketSnapshot",
    "TriggerRefused",
    "TrustCache",
    "Watcher",
    "filed_by_phasegate",
    "parse_issue_ref",
    "repository_of",
    "resnapshot",
    "snapshot_ticket",
    "start_from_issue",
    "watch_forever",
]

log = logging.getLogger(__name__)

#: The marker phasegate's journal puts on an issue it filed (journal.SideEffects):
#: such an issue belongs to the workflow that filed it.
_FILED_MARKER = re.compile(r"phasegate:workflow:([0-9a-f]{8})\b")
#: ``owner/name`` as GitHub spells it (forge.repository's rule, cartridge_forge).
_OWNER_NAME = r"[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}?"
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


def status_label_of(issue: Issue, trigger_label: str) -> str | None:
    """The ``phasegate:`` status label ``issue`` carries (some store runs or ran a
    workflow for it), else None; the trigger label itself is not one."""
    return next(
        (x for x in issue.labels if x.startswith(STATUS_LABEL_PREFIX) and x != trigger_label),
        None,
    )


def filed_by_phasegate(issue: Issue) -> str | None:
    """The id of the workflow that filed ``issue`` (its hidden marker), else None."""
    found = _FILED_MARKER.search(issue.body)
    return found.group(1) if found else None


# -- starting -----------------------------------------------------------------------


def start_from_issue(
    engine: Engine,
    repository: str,
    number: int,
    *,
    by: str,
    trigger: Literal["label", "import"],
    max_ticket_bytes: int,
    issue: Issue | None = None,
    trust: TrustCache | None = None,
    auto_merge: bool | None = None,
    profile: str | None = None,
) -> tuple[str, TicketSnapshot]:
    """Snapshot issue ``number`` and start its workflow through ``Engine.start``
    (the one path ``phasegate run`` takes); returns (workflow id, snapshot).

    ``by``: the trusted person who vouches (the caller checked). Raises
    IssueTaken when the issue has a workflow already (also when another process
    started it a moment ago), TriggerRefused for a pull request (GitHub numbers
    them among the issues), a closed issue, one phasegate filed itself, one
    carrying a status label (another checkout's workflow), or a
    ticket over ``max_ticket_bytes`` (UTF-8), ForgeError, CartridgeError from
    ``Engine.start``.
    """
    taken = engine.store.workflow_for_issue(repository, number)
    if taken is not None:
        raise IssueTaken(repository, number, taken)
    issue = issue or engine.forge.issue(number)
    where = f"{repository}#{number}"
    if issue.pull_request:
        raise TriggerRefused(f"#{number} is a pull request: only an issue starts a workflow")
    if issue.state != "open":
        raise TriggerRefused(f"{where} is {issue.state}: only an open issue starts a workflow")
    filer = filed_by_phasegate(issue)
    if filer is not None:
        raise TriggerRefused(f"{where} was filed by phasegate for workflow {filer}")
    status = status_label_of(issue, engine.cartridge.forge.trigger_label)
    if status is not None:
        raise TriggerRefused(
            f"{where} carries the status label {status!r}: a workflow runs or ran for it "
            "from another checkout; remove the label to start a new one"
        )
    snapshot = snapshot_ticket(
        engine.forge, number, repository, vouched_by=by, issue=issue, trust=trust
    )
    size = len(snapshot.text.encode("utf-8", "surrogateescape"))
    if size > max_ticket_bytes:
        raise TriggerRefused(
            f"{where}: its ticket (body and trusted comments) is {size} bytes, over "
            f"{max_ticket_bytes}: every prompt and the store carry it whole"
        )
    workflow_id = engine.start(
        snapshot.title or f"{where}",
        snapshot.text,
        auto_merge=auto_merge,
        profile=profile,
        issue=(repository, number),
        state=snapshot.state(trigger),
    )
    return workflow_id, snapshot


# -- watching -----------------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    """A workflow started for a labelled issue."""

    issue_number: int
    workflow_id: str
    labelled_by: str
    snapshot: TicketSnapshot

    def as_dict(self) -> dict[str, Any]:
        return {
            "event": "started",
            "issue": self.issue_number,
            "workflow_id": self.workflow_id,
            "labelled_by": self.labelled_by,
            "authors": list(self.snapshot.authors),
            "comments_left_out": self.snapshot.left_out,
            "acceptance_hash": self.snapshot.hash,
        }


@dataclass(frozen=True)
class Ignored:
    """A labelled issue that starts nothing, and why."""

    issue_number: int
    labelled_by: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "event": "ignored",
            "issue": self.issue_number,
            "labelled_by": self.labelled_by,
            "reason": self.reason,
        }


class Watcher:
    """Starts a workflow for each open issue a trusted person labelled with
    ``label`` (default: the cartridge's ``forge.trigger_label``) on ``repository``
    (``owner/name``), through ``engine`` (its forge, store and cartridge).

    Keeps, for its lifetime, which (issue, labeller) it reported Ignored, so a
    poll repeats no warning; a new labeller of the same issue is new. An issue
    carrying a status label (another store runs or ran a workflow for it) is
    reported once per label.
    """

    def __init__(
        self,
        engine: Engine,
        repository: str,
        *,
        max_ticket_bytes: int,
        label: str | None = None,
    ) -> None:
        self.engine = engine
        self.repository = repository
        self.label = label or engine.cartridge.forge.trigger_label
        self.max_ticket_bytes = max_ticket_bytes
        self.reported: set[tuple[int, str]] = set()

    def watch_once(self) -> list[Started | Ignored]:
        """One look at the labelled issues; returns what it started and what it
        ignored for the first time (an issue with a workflow in this store is passed
        over in silence; one with a status label but none here is Ignored: another
        store's). Permissions are asked afresh each pass (once per login).

        Raises ForgeError (ForgeUnavailable: try again later), CartridgeError.
        """
        engine, store = self.engine, self.engine.store
        trust = TrustCache(engine.forge)
        results: list[Started | Ignored] = []
        for labelled in engine.forge.labelled_issues(self.label):
            if engine.shutdown.is_set():
                break
            number, by = labelled.issue.number, labelled.by
            if store.workflow_for_issue(self.repository, number) is not None:
                continue
            if labelled.issue.pull_request:
                continue
            status = status_label_of(labelled.issue, self.label)
            if status is not None:
                reason = (
                    f"it carries the status label {status!r}: a workflow runs or ran for it "
                    "from another store; remove the label to start a new one"
                )
                self._ignore(results, number, by, reason, seen_as=status)
                continue
            permission = trust.permission(by)
            if permission not in TRUSTED_PERMISSIONS:
                reason = (
                    f"labelled {self.label!r} by {by or 'someone unknown'}, whose permission "
                    f"is {permission!r}: only write, maintain or admin starts a workflow"
                )
                self._ignore(results, number, by, reason)
                continue
            try:
                workflow_id, snapshot = start_from_issue(
                    engine,
                    self.repository,
                    number,
                    by=by,
                    trigger="label",
                    max_ticket_bytes=self.max_ticket_bytes,
                    issue=labelled.issue,
                    trust=trust,
                )
            except IssueTaken:
                continue  # another watcher started it between our look and our insert
            except TriggerRefused as exc:
                self._ignore(results, number, by, str(exc))
                continue
            log.info(
                "%s#%d: workflow %s started (labelled by %s; comments by %d others left out)",
                self.repository,
                number,
                workflow_id,
                by,
                snapshot.left_out,
            )
            results.append(Started(number, workflow_id, by, snapshot))
        return results

    def _ignore(
        self,
        results: list[Started | Ignored],
        number: int,
        by: str,
        reason: str,
        *,
        seen_as: str | None = None,
    ) -> None:
        # seen_as: what makes it the same report again (default: the labeller)
        key = (number, seen_as or by)
        if key in self.reported:
            return
        self.reported.add(key)
        log.warning("%s#%d ignored: %s", self.repository, number, reason)
        results.append(Ignored(number, by, reason))


def watch_forever(
    watcher: Watcher,
    stop: threading.Event,
    interval_s: float,
    report: Callable[[Started | Ignored], None],
    unavailable: Callable[[ForgeUnavailable | StoreUnavailable], None],
) -> None:
    """``watcher.watch_once()`` every ``interval_s`` seconds until ``stop`` is set;
    each result goes to ``report``. A forge or store that is unavailable for now
    (ForgeUnavailable, StoreUnavailable: nothing was half-written) goes to
    ``unavailable`` and is tried again next time; any other error
    (ForgeAuthError, ForgeNotFound, CartridgeError) ends the loop: it needs a
    person."""
    while not stop.is_set():
        try:
            for result in watcher.watch_once():
                report(result)
        except (ForgeUnavailable, StoreUnavailable) as exc:
            unavailable(exc)
        stop.wait(interval_s)


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


def repository_of(configured: str | None, root: Path, base_url: str | None = None) -> str:
    """The forge repository (``owner/name``): ``forge.repository`` when set, else
    read from the ``origin`` remote of the repository at ``root`` (an https or
    ssh URL of GitHub's shape: ``github_auth.repository_from_origin``). Raises
    TriggerRefused when neither names one."""
    if configured:
        return configured
    try:
        return repository_from_origin(root, base_url)
    except ForgeError as exc:
        raise TriggerRefused(str(exc)) from exc
