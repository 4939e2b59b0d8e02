"""Forge webhooks: a delivery verified by its forge's scheme, and the workflows it wakes.

A forge tells ``phasegate serve`` that something happened (a comment, a review,
a check that finished, a label) instead of waiting to be polled
(docs/webhooks.md). Each delivery is:

1. verified by the forge's own scheme against the secret in the environment
   variable ``forge.webhook_secret_env`` names: GitHub's ``X-Hub-Signature-256``
   (an HMAC-SHA256 of the body, ``sha256=<hex>``), GitLab's ``X-Gitlab-Token``
   (the secret itself), Gitea's and Forgejo's ``X-Gitea-Signature`` /
   ``X-Forgejo-Signature`` (the HMAC's hex). No secret set, no signature, or a
   wrong one: refused (401), nothing changes;
2. recorded by its body's SHA-256: the same signed body again is a replay,
   refused (403) whatever delivery id its headers claim (a header is not
   signed). Deliveries are kept KEEP_S;
3. read for what it concerns: the issue and pull request numbers and branches
   of the cartridge's repository. The waiting workflows among them are made due
   now and the workers told (``Store.wake``): they look at the forge at once,
   as a poll would have later. A trusted label on an issue starts its workflow
   (the same ``Watcher`` as ``phasegate watch``, so the same trust rules), and a
   trusted person's ``/phasegate`` command in a new comment is applied at once
   (``commands.listen``, as the watcher's next look would).

A delivery carries no instruction: it only makes phasegate look sooner, and
what it finds is judged as a poll's finding is (who wrote it, their permission).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from phasegate.core.contract import PhasegateError
from phasegate.forge.base import ForgeError, Issue, Labelled, TrustCache
from phasegate.forge.gitlab.numbers import pull_number
from phasegate.integrations import commands
from phasegate.integrations.triggers import Started, Watcher
from phasegate.phases.forge_feedback import command_of
from phasegate.runtime.engine import Engine

__all__ = [
    "FORGES",
    "KEEP_S",
    "MAX_BODY_BYTES",
    "Concerns",
    "Received",
    "WebhookRefused",
    "concerns",
    "receive",
    "verify",
]

log = logging.getLogger(__name__)

#: The forges whose deliveries are understood, each at ``/webhooks/<forge>``.
FORGES = ("github", "gitlab", "gitea")
#: Seconds a delivery's digest is kept to refuse its replay (30 days).
KEEP_S = 30 * 24 * 3600.0
#: The largest body taken (GitHub caps a payload at 25 MB; phasegate reads a few fields).
MAX_BODY_BYTES = 5 * 1024 * 1024

#: Per forge: the headers naming the event, and those naming the delivery, the
#: first found wins. Forgejo sends Gitea's headers and its own today; its own
#: alone must do too.
_EVENT_HEADERS = {
    "github": (("x-github-event",), ("x-github-delivery",)),
    "gitlab": (("x-gitlab-event",), ("x-gitlab-event-uuid",)),
    "gitea": (("x-gitea-event", "x-forgejo-event"), ("x-gitea-delivery", "x-forgejo-delivery")),
}


class WebhookRefused(PhasegateError):
    """A delivery that changes nothing: ``status`` is the HTTP answer (400 unreadable,
    401 unsigned or wrongly signed, 403 replayed or webhooks off, 404 another
    forge's, 413 too large), the message says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Concerns:
    """What a delivery is about: ``repository`` (owner/name, as the forge spells
    it), the issue and pull request ``numbers``, the ``branches``, the ``label``
    put on an issue (None unless the event is a label added), whether it is a
    new comment that reads as a ``/phasegate`` ``command``, and the ``labelled``
    issue as the delivery shows it (who labelled it: the sender). Gitea says an
    issue's labels changed, not which was added: ``carried`` holds the labels it
    carries then, and who put one there is asked of the forge."""

    repository: str
    numbers: frozenset[int] = frozenset()
    branches: frozenset[str] = frozenset()
    label: str | None = None
    command: bool = False
    labelled: Labelled | None = None
    carried: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Received:
    """What a delivery did: ``event``, the workflows it ``woke``, the workflows a
    trusted label ``started``, those a trusted person's command ``commanded``;
    ``ignored`` says why it did nothing, when it did not."""

    event: str
    woke: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    commanded: list[str] = field(default_factory=list)
    ignored: str | None = None


def _header(headers: Mapping[str, str], *names: str) -> str | None:
    """The first of ``names`` (lower case) that ``headers`` carry, non-empty."""
    lowered = {k.lower(): v for k, v in headers.items()}
    return next((lowered[n] for n in names if lowered.get(n)), None)


def verify(forge: str, headers: Mapping[str, str], body: bytes, secret: str) -> None:
    """Raise WebhookRefused (401) unless ``body`` carries ``forge``'s proof of
    ``secret``: GitHub's HMAC-SHA256 in ``X-Hub-Signature-256``, GitLab's token in
    ``X-Gitlab-Token``, Gitea's (or Forgejo's) HMAC hex in ``X-Gitea-Signature``
    (``X-Forgejo-Signature``). Comparisons take constant time."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    if forge == "github":
        given, expected = _header(headers, "x-hub-signature-256"), f"sha256={digest}"
    elif forge == "gitlab":
        given, expected = _header(headers, "x-gitlab-token"), secret
    else:
        given = _header(headers, "x-gitea-signature", "x-forgejo-signature")
        expected = digest
    if not given:
        raise WebhookRefused(401, f"the delivery carries no {forge} signature")
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise WebhookRefused(401, f"the delivery's {forge} signature does not match the secret")


def _numbers(*values: Any) -> frozenset[int]:
    return frozenset(int(v) for v in values if isinstance(v, int) and not isinstance(v, bool))


def concerns(forge: str, event: str, payload: Mapping[str, Any]) -> Concerns:
    """What a ``forge`` delivery of ``event`` with ``payload`` (its parsed JSON) is
    about. GitHub's and Gitea's events: issues, issue_comment, pull_request and its
    reviews and review comments, check_run, check_suite, status; GitLab's: Issue,
    Note, Merge Request and Pipeline hooks. Anything else concerns only its
    repository. Raises WebhookRefused (400) when the payload names no repository."""
    if forge == "gitlab":
        return _gitlab(event, payload)
    repo = payload.get("repository") or {}
    repository = repo.get("full_name") if isinstance(repo, Mapping) else None
    if not isinstance(repository, str) or not repository:
        raise WebhookRefused(400, "the delivery names no repository (repository.full_name)")
    issue = payload.get("issue") or {}
    pull = payload.get("pull_request") or {}
    numbers = _numbers(issue.get("number"), pull.get("number"), payload.get("number"))
    branches = {str(b) for b in ((pull.get("head") or {}).get("ref"),) if b}
    for key in ("check_run", "check_suite"):
        run = payload.get(key) or {}
        suite = run.get("check_suite") or run
        numbers |= _numbers(*(p.get("number") for p in run.get("pull_requests") or ()))
        if suite.get("head_branch"):
            branches.add(str(suite["head_branch"]))
    branches.update(str(b["name"]) for b in payload.get("branches") or () if b.get("name"))
    label, labelled = None, None
    if event == "issues" and payload.get("action") == "labeled":
        label = str((payload.get("label") or {}).get("name") or "") or None
        labelled = _labelled(issue, payload.get("sender") or {})
    carried: frozenset[str] = frozenset()
    if event == "issues" and payload.get("action") == "label_updated":
        # Gitea's issue_label event: the sender changed the labels, which one is
        # not said; the watcher asks the forge who put the trigger label there.
        carried = frozenset(str(x["name"]) for x in issue.get("labels") or () if x.get("name"))
    said = (payload.get("comment") or {}).get("body") if event == "issue_comment" else None
    command = payload.get("action") == "created" and _commands(said)
    return Concerns(repository, numbers, frozenset(branches), label, command, labelled, carried)


def _labelled(issue: Mapping[str, Any], sender: Mapping[str, Any]) -> Labelled | None:
    """The issue of a GitHub or Gitea ``issues`` delivery, labelled by its sender."""
    try:
        shown = Issue(
            int(issue["number"]),
            str(issue.get("title") or ""),
            str(issue.get("body") or ""),
            str(issue.get("state") or "open"),
            author=str((issue.get("user") or {}).get("login") or ""),
            labels=tuple(str(x["name"]) for x in issue.get("labels") or () if x.get("name")),
            pull_request=bool(issue.get("pull_request")),
        )
    except (KeyError, TypeError, ValueError):
        return None
    at = datetime.now(UTC)
    return Labelled(shown, str(sender.get("login") or ""), at)


def _gitlab(event: str, payload: Mapping[str, Any]) -> Concerns:
    project = payload.get("project") or {}
    repository = project.get("path_with_namespace")
    if not isinstance(repository, str) or not repository:
        raise WebhookRefused(400, "the delivery names no project (project.path_with_namespace)")
    attributes = payload.get("object_attributes") or {}
    merge_request = payload.get("merge_request") or {}
    issue = payload.get("issue") or {}
    # a merge request's iid counts apart from the issues': phasegate numbers it
    # pull_number(iid) (forge.gitlab.numbers)
    numbers = _numbers(issue.get("iid"), *_merge_requests(merge_request.get("iid")))
    branches = {str(b) for b in (merge_request.get("source_branch"),) if b}
    if event == "Issue Hook":
        numbers |= _numbers(attributes.get("iid"))
    if event == "Merge Request Hook":
        numbers |= _numbers(*_merge_requests(attributes.get("iid")))
    if event in ("Merge Request Hook", "Pipeline Hook") and attributes.get("source_branch"):
        branches.add(str(attributes["source_branch"]))
    if event == "Pipeline Hook" and attributes.get("ref"):
        branches.add(str(attributes["ref"]))
    label = None
    if event == "Issue Hook":
        change = (payload.get("changes") or {}).get("labels") or {}
        before = {x.get("title") for x in change.get("previous") or ()}
        added = [
            x.get("title") for x in change.get("current") or () if x.get("title") not in before
        ]
        label = str(added[0]) if added else None
    said = attributes.get("note") if event == "Note Hook" else None
    return Concerns(repository, numbers, frozenset(branches), label, _commands(said))


def _merge_requests(iid: Any) -> tuple[Any, ...]:
    """phasegate's number for GitLab's merge request ``iid`` (none when it is no int)."""
    if isinstance(iid, int) and not isinstance(iid, bool):
        return (pull_number(iid),)
    return ()


def _commands(text: Any) -> bool:
    """Whether a comment's ``text`` reads as a ``/phasegate`` command."""
    return isinstance(text, str) and command_of(text) is not None


def receive(
    engine: Engine,
    forge: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    max_ticket_bytes: int,
    environ: Mapping[str, str] | None = None,
    reported: set[tuple[int, str]] | None = None,
) -> Received:
    """Take one delivery for ``engine``'s repository at ``/webhooks/<forge>``:
    verify it, refuse a replay, wake the workflows it concerns, start a workflow
    for a trusted label (its ticket at most ``max_ticket_bytes``). ``reported``:
    the labels already reported ignored, kept by the receiver across deliveries
    so each is reported once, as by one watcher. Raises WebhookRefused (nothing
    changed; see its status) and StoreUnavailable."""
    settings = engine.cartridge.forge
    if forge not in FORGES or forge != settings.kind:
        raise WebhookRefused(404, f"this phasegate serves a {settings.kind} forge, not {forge}")
    if len(body) > MAX_BODY_BYTES:
        raise WebhookRefused(413, f"the delivery is over {MAX_BODY_BYTES} bytes")
    secret = (os.environ if environ is None else environ).get(settings.webhook_secret_env)
    if not secret:
        raise WebhookRefused(
            403, f"webhooks are off: set {settings.webhook_secret_env} to the webhook's secret"
        )
    verify(forge, headers, body, secret)
    event_headers, delivery_headers = _EVENT_HEADERS[forge]
    event = _header(headers, *event_headers) or ""
    if not event:
        raise WebhookRefused(400, f"the delivery has no {' or '.join(event_headers)} header")
    try:
        payload = json.loads(body)
    except ValueError:
        raise WebhookRefused(400, "the delivery's body is not JSON") from None
    if not isinstance(payload, dict):
        raise WebhookRefused(400, "the delivery's body is not a JSON object")
    if event in ("ping", "System Hook"):
        return Received(event, ignored="a ping: the webhook reaches phasegate")
    about = concerns(forge, event, payload)
    if (engine.repository or "").lower() != about.repository.lower():
        return Received(event, ignored=f"{about.repository} is not {engine.repository}")
    delivery = _header(headers, *delivery_headers)
    digest = hashlib.sha256(body).hexdigest()
    fresh = engine.store.record_delivery(
        digest,
        forge=forge,
        delivery=delivery,
        event=event,
        repository=engine.repository or about.repository,
        keep_s=KEEP_S,
    )
    if not fresh:
        raise WebhookRefused(
            403, "this body was delivered before (a replay), whatever its delivery id says"
        )
    woke = engine.store.wake(engine.repository or about.repository, about.numbers, about.branches)
    labelled = about.label == settings.trigger_label or (
        about.label is None and settings.trigger_label in about.carried
    )
    started = _started(engine, about, max_ticket_bytes, reported) if labelled else []
    commanded = _commanded(engine, about) if about.command else []
    return Received(event, woke=woke, started=started, commanded=commanded)


def _commanded(engine: Engine, about: Concerns) -> list[str]:
    """Apply a trusted person's ``/phasegate`` command at once, as the watcher's
    next look would (``commands.listen``); the workflows it moved. A forge that
    fails leaves the command to that next look."""
    trust = TrustCache(engine.forge)
    try:
        done = commands.listen(
            engine, about.repository, trust, engine.shutdown.is_set, numbers=about.numbers
        )
    except ForgeError as exc:
        log.warning(
            "the command in %s's comment waits for the next look: %s", about.repository, exc
        )
        return []
    return [c.workflow_id for c in done if c.refused is None]


def _started(
    engine: Engine,
    about: Concerns,
    max_ticket_bytes: int,
    reported: set[tuple[int, str]] | None,
) -> list[str]:
    """Start the workflow a trusted label asks for, as ``phasegate watch`` would
    (``Watcher.consider``: the same rules), from the issue the delivery shows;
    a delivery that shows none has the watcher look at every labelled issue."""
    watcher = Watcher(
        engine, about.repository, max_ticket_bytes=max_ticket_bytes, reported=reported
    )
    if about.labelled is None:
        return [r.workflow_id for r in watcher.watch_once() if isinstance(r, Started)]
    found = watcher.consider(about.labelled, TrustCache(engine.forge))
    return [found.workflow_id] if isinstance(found, Started) else []
