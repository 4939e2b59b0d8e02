"""Trusted triggers: a workflow started from a forge issue.

Two ways in, one rule: only people with write, maintain or admin permission on
the repository (``TRUSTED_PERMISSIONS``) start a workflow or put words in its
ticket.

- **watch**: ``Watcher.watch_once`` looks at the open issues carrying the
  cartridge's ``forge.trigger_label``; one labelled by a trusted person, with
  no workflow yet, is snapshotted and started. A label by anyone else is
  ``Ignored`` and logged, once per issue and labeller.
- **import**: ``start_from_issue`` does the same for one issue by hand (the
  person at the terminal holds the token and vouches), whatever its labels.

Either way a ``priority:<high|normal|low|integer>`` label on the issue sets the
workflow's priority (``core.priority``; docs/queues.md).

The same look reads what trusted people command on the issues and pull
requests of workflows that wait for a person (``/phasegate resume``,
``cancel``, ``verify ...``): ``integrations.commands``.

The ticket is a ``TicketSnapshot`` taken at that moment (``forge.tickets.snapshot_ticket``):
the issue's title and body and the conversation comments of trusted authors,
each with its author. Text by anyone else never reaches it, so it never
reaches a prompt. The snapshot's hash is the acceptance hash
(``state["acceptance_hash"]``, read by ``acceptance_verification.acceptance_hash``):
a new snapshot of an edited issue verifies again (docs/contracts/lifecycle.md:
acceptance_verification).

At most one workflow per issue: ``Store.create_workflow(issue=...)`` looks the
issue up and inserts in one writing transaction and raises IssueTaken, so two
watchers (or a watcher and an import) racing start one workflow between them.
Across stores (a second checkout, another machine) the forge says it: an issue
carrying a status label (``phasegate:…``, ``phasegate:cancelled`` included) has
or had a workflow somewhere, and the watcher passes over it until a person
removes that label.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from phasegate.core.dependencies import DependencyCycle
from phasegate.core.priority import DEFAULT_PRIORITY, priority_from_labels
from phasegate.forge.base import (
    STATUS_LABEL_PREFIX,
    TRUSTED_PERMISSIONS,
    ForgeError,
    ForgeUnavailable,
    Issue,
    Labelled,
    TrustCache,
    access_names,
)
from phasegate.forge.github.auth import repository_from_origin
from phasegate.forge.tickets import (
    IssueRef,
    TicketSnapshot,
    TriggerRefused,
    parse_issue_ref,
    resnapshot,
    snapshot_ticket,
)
from phasegate.integrations.commands import Commanded, listen
from phasegate.runtime.engine import Engine
from phasegate.store import StoreUnavailable
from phasegate.store.workflows import IssueTaken

__all__ = [
    "Commanded",
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
    ``Engine.start``, DependencyCycle when its ``Depends on #N`` lines close a
    cycle (nothing recorded). A ``Depends on #N`` line of a trusted author
    (``TicketSnapshot.depends_on``) holds the workflow ``blocked`` until issue N's
    workflow completed (docs/epics.md).
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
        state={**snapshot.state(trigger), "issue_labels": list(issue.labels)},
        # a trusted person's ``priority:high`` label, like ``phasegate run --priority``
        priority=priority_from_labels(issue.labels) or DEFAULT_PRIORITY,
        after_issues=[(repository, n) for n in snapshot.depends_on],
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
    poll repeats no warning; a new labeller of the same issue is new. Watchers
    given one ``reported`` set (a webhook's, one per delivery) keep it together. An issue
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
        reported: set[tuple[int, str]] | None = None,
    ) -> None:
        self.engine = engine
        self.repository = repository
        self.label = label or engine.cartridge.forge.trigger_label
        self.max_ticket_bytes = max_ticket_bytes
        # shared by the watchers of one ``serve``, one per delivery: each reports once
        self.reported: set[tuple[int, str]] = set() if reported is None else reported

    def watch_once(self) -> list[Started | Ignored | Commanded]:
        """One look at the labelled issues; returns what it started and what it
        ignored for the first time (an issue with a workflow in this store is passed
        over in silence; one with a status label but none here is Ignored: another
        store's). Then one look at the commands on the workflows waiting for a
        person (``commands.listen``): what each did. Permissions are asked afresh
        each pass (once per login).

        Raises ForgeError (ForgeUnavailable: try again later), CartridgeError.
        """
        engine = self.engine
        trust = TrustCache(engine.forge)
        results: list[Started | Ignored | Commanded] = []
        for labelled in engine.forge.labelled_issues(self.label):
            if engine.shutdown.is_set():
                break
            found = self.consider(labelled, trust)
            if found is not None:
                results.append(found)
        results += listen(engine, self.repository, trust, engine.shutdown.is_set)
        return results

    def consider(self, labelled: Labelled, trust: TrustCache) -> Started | Ignored | None:
        """Start the workflow ``labelled`` asks for, if its labeller is trusted and
        the issue has none: Started; Ignored the first time it is refused; None when
        there is nothing to say (its workflow exists, a pull request, a repeat).
        What ``watch_once`` does for each labelled issue, and a webhook for the one
        label it reports. Raises ForgeError, CartridgeError."""
        store = self.engine.store
        number, by = labelled.issue.number, labelled.by
        if store.workflow_for_issue(self.repository, number) is not None:
            return None
        if labelled.issue.pull_request:
            return None
        status = status_label_of(labelled.issue, self.label)
        if status is not None:
            reason = (
                f"it carries the status label {status!r}: a workflow runs or ran for it "
                "from another store; remove the label to start a new one"
            )
            return self._ignore(number, by, reason, seen_as=status)
        permission = trust.permission(by)
        if permission not in TRUSTED_PERMISSIONS:
            names = access_names(self.engine.cartridge.forge.kind)
            reason = (
                f"labelled {self.label!r} by {by or 'someone unknown'}, "
                f"{names.whose(permission)}: only {names.trusted} starts a workflow"
            )
            return self._ignore(number, by, reason)
        try:
            workflow_id, snapshot = start_from_issue(
                self.engine,
                self.repository,
                number,
                by=by,
                trigger="label",
                max_ticket_bytes=self.max_ticket_bytes,
                issue=labelled.issue,
                trust=trust,
            )
        except IssueTaken:
            return None  # another watcher started it between our look and our insert
        except (TriggerRefused, DependencyCycle) as exc:
            return self._ignore(number, by, str(exc))
        log.info(
            "%s#%d: workflow %s started (labelled by %s; comments by %d others left out)",
            self.repository,
            number,
            workflow_id,
            by,
            snapshot.left_out,
        )
        return Started(number, workflow_id, by, snapshot)

    def _ignore(
        self, number: int, by: str, reason: str, *, seen_as: str | None = None
    ) -> Ignored | None:
        """Ignored, logged, the first time ``number`` is refused for this reason;
        None after (``seen_as``: what makes it the same report again, default the
        labeller)."""
        key = (number, seen_as or by)
        if key in self.reported:
            return None
        self.reported.add(key)
        log.warning("%s#%d ignored: %s", self.repository, number, reason)
        return Ignored(number, by, reason)


def watch_forever(
    watcher: Watcher,
    stop: threading.Event,
    interval_s: float | Callable[[], float],
    report: Callable[[Started | Ignored | Commanded], None],
    unavailable: Callable[[ForgeUnavailable | StoreUnavailable], None],
) -> None:
    """``watcher.watch_once()`` every ``interval_s`` seconds (or as many as it
    answers before each wait: ``ForgePace.wait_s``, slower while webhooks arrive)
    until ``stop`` is set; each result goes to ``report``. A forge or store that
    is unavailable for now (ForgeUnavailable, StoreUnavailable: nothing was
    half-written) goes to ``unavailable`` and is tried again next time; any other error
    (ForgeAuthError, ForgeNotFound, CartridgeError) ends the loop: it needs a
    person."""
    while not stop.is_set():
        try:
            for result in watcher.watch_once():
                report(result)
        except (ForgeUnavailable, StoreUnavailable) as exc:
            unavailable(exc)
        stop.wait(interval_s() if callable(interval_s) else interval_s)


def repository_of(
    configured: str | None, root: Path, base_url: str | None = None, kind: str = "github"
) -> str:
    """The forge repository (``owner/name``; GitLab: ``group/…/name``):
    ``forge.repository`` when set, else read from the ``origin`` remote of the
    repository at ``root`` (an https or ssh URL of the forge ``kind``'s shape:
    ``github_auth.repository_from_origin``, GitLab's and Gitea's own). Raises TriggerRefused
    when neither names one."""
    if configured:
        return configured
    try:
        if kind == "gitlab":
            from phasegate.forge.gitlab.auth import repository_from_origin as gitlab_origin

            return gitlab_origin(root, base_url)
        if kind == "gitea" and base_url is not None:
            from phasegate.forge.gitea.auth import repository_from_origin as gitea_origin

            return gitea_origin(root, base_url)
        return repository_from_origin(root, base_url)
    except ForgeError as exc:
        raise TriggerRefused(str(exc)) from exc
