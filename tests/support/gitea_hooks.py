"""The fake Gitea's webhooks: what happens in a repository, delivered as Gitea delivers it.

A repository's hooks (``add`` from a test) each get a POST per event they
subscribe to, signed and named as Gitea's ``services/webhook/deliver.go``
does: ``X-Gitea-Event`` (``issues``, ``issue_comment``, ``pull_request``,
``pull_request_approved``, ``pull_request_rejected``, ``pull_request_comment``,
``status``), ``X-Gitea-Event-Type`` (the finer kind: ``issue_label``,
``pull_request_review_approved``…), ``X-Gitea-Delivery`` (a UUID per
delivery) and ``X-Gitea-Signature``, the hex HMAC-SHA256 of the body with the
hook's secret (empty without one); the same under ``X-Gogs-*`` and
``X-GitHub-*`` (``X-Hub-Signature-256: sha256=…``, ``X-Hub-Signature:
sha1=…``) as Gitea sends them, and under ``X-Forgejo-*`` as Forgejo does.
The body is Gitea's payload JSON (``modules/structs/hook.go``): ``action``,
``number``, ``issue`` or ``pull_request``, ``comment``, ``review``,
``repository`` and ``sender``.

A label change is Gitea's ``issue_label`` event: ``X-Gitea-Event: issues``,
``action: label_updated`` (``label_cleared`` when none is left), the issue
with all its labels and the sender; which label was added is not said, the
issue's timeline says it (``GET .../issues/{index}/timeline``).

The model announces under its lock (``Gitea.announce``); the payload is
rendered then and sent by fake_hooks.py's ``Deliveries``, from a thread of
its own. Each delivery is kept (``delivered``) with the status its receiver
answered.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from support.fake_hooks import Deliveries
from support.gitea_model import Comment, Issue, Repo, Review, Status, User, iso

if TYPE_CHECKING:
    from support.gitea_json import Shapes
    from support.gitea_server import GiteaServer

__all__ = [
    "CHOSEN",
    "EVENTS",
    "Delivered",
    "GiteaHooks",
    "Hook",
    "comment_payload",
    "issue_payload",
    "review_payload",
    "status_payload",
]

#: The hook event kinds a hook subscribes with (Gitea's ``HookEventType``s
#: this fake sends), each with the ``X-Gitea-Event`` it is delivered under.
EVENTS = {
    "issues": "issues",
    "issue_label": "issues",
    "issue_comment": "issue_comment",
    "pull_request": "pull_request",
    "pull_request_label": "pull_request",
    "pull_request_comment": "issue_comment",
    "pull_request_review_approved": "pull_request_approved",
    "pull_request_review_rejected": "pull_request_rejected",
    "pull_request_review_comment": "pull_request_comment",
    "status": "status",
}
#: What a hook made through the API subscribes to (``CreateHookOption.events``,
#: as Gitea groups them) → the kinds delivered for it.
CHOSEN = {
    "issues": ("issues", "issue_label"),
    "issue_comment": ("issue_comment", "pull_request_comment"),
    "pull_request": ("pull_request", "pull_request_label"),
    "pull_request_review": (
        "pull_request_review_approved", "pull_request_review_rejected",
        "pull_request_review_comment",
    ),
    "status": ("status",),
}  # fmt: skip


@dataclass
class Hook:
    id: int
    repo_id: int
    url: str
    secret: str
    events: frozenset[str]  # kinds, EVENTS' keys
    chosen: tuple[str, ...] = ()  # as asked through the API (CHOSEN's keys)


@dataclass
class Delivered:
    """One delivery: what was sent and the receiver's answer (None: none came)."""

    hook: Hook
    kind: str
    event: str
    headers: dict[str, str]
    body: bytes
    status: int | None = None
    answer: str = ""
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def payload(self) -> Any:
        return json.loads(self.body)


def signature(secret: str, body: bytes, digest: Any = hashlib.sha256) -> str:
    """Gitea's ``X-Gitea-Signature``: the hex HMAC-SHA256 of ``body`` with the
    hook's secret; empty when the hook has none, as Gitea leaves it."""
    return hmac.new(secret.encode(), body, digest).hexdigest() if secret else ""


def headers_for(kind: str, event: str, delivery: str, secret: str, body: bytes) -> dict[str, str]:
    """Every header Gitea (and Forgejo) put on a delivery of ``kind``."""
    signed, sha1 = signature(secret, body), signature(secret, body, hashlib.sha1)
    headers = {"Content-Type": "application/json", "User-Agent": "Go-http-client/1.1"}
    for prefix in ("X-Gitea", "X-Gogs", "X-Forgejo"):
        headers.update({
            f"{prefix}-Event": event, f"{prefix}-Event-Type": kind,
            f"{prefix}-Delivery": delivery, f"{prefix}-Signature": signed,
        })  # fmt: skip
    headers.update({
        "X-GitHub-Event": event, "X-GitHub-Event-Type": kind, "X-GitHub-Delivery": delivery,
        "X-Hub-Signature": f"sha1={sha1}" if sha1 else "",
        "X-Hub-Signature-256": f"sha256={signed}" if signed else "",
    })  # fmt: skip
    return headers


class GiteaHooks(Deliveries[Hook, Delivered]):
    """The hooks of every repository of ``server`` and what was delivered to them."""

    def __init__(self, server: GiteaServer) -> None:
        super().__init__("fake-gitea-hooks")
        self.server = server

    def add(
        self, full_name: str, url: str, secret: str, events: tuple[str, ...] = tuple(EVENTS)
    ) -> Hook:
        """A hook of repository ``full_name`` for ``events`` (EVENTS' kinds)."""
        with self.server.lock:
            repo = self.server.repo(full_name)
            hook = Hook(self.next_id(), repo.id, url, secret, frozenset(events))
            self.hooks.append(hook)
            return hook

    def create(self, repo: Repo, url: str, secret: str, chosen: list[str]) -> Hook:
        """A hook made through ``POST /repos/{owner}/{repo}/hooks``."""
        unknown = [e for e in chosen if e not in CHOSEN]
        if unknown:
            raise ValueError(f"unknown hook events: {unknown}")
        kinds = frozenset(k for e in chosen for k in CHOSEN[e])
        hook = Hook(self.next_id(), repo.id, url, secret, kinds, tuple(chosen))
        self.hooks.append(hook)
        return hook

    def announce(self, repo: Repo, kind: str, payload: dict[str, Any]) -> None:
        """Queue ``payload`` for each of ``repo``'s hooks that wants ``kind``."""
        body = json.dumps(payload, indent=2).encode()  # Gitea indents its payloads
        for hook in self.hooks:
            if hook.repo_id != repo.id or kind not in hook.events:
                continue
            headers = headers_for(kind, EVENTS[kind], str(uuid.uuid4()), hook.secret, body)
            self.send(Delivered(hook, kind, EVENTS[kind], headers, body))


# -- payloads (Gitea's webhook JSON) -----------------------------------------------------------


def issue_payload(
    shapes: Shapes, repo: Repo, issue: Issue, actor: User, action: str
) -> dict[str, Any]:
    """An ``IssuePayload`` or, for a pull request, a ``PullRequestPayload``."""
    base = {
        "action": action, "number": issue.number,
        "repository": shapes.repository(repo), "sender": shapes.user(actor),
        "commit_id": "",
    }  # fmt: skip
    if issue.pull is not None:
        return {
            **base, "pull_request": shapes.pull(repo, issue),
            "requested_reviewer": None, "review": None,
        }  # fmt: skip
    return {**base, "issue": shapes.issue(repo, issue)}


def comment_payload(
    shapes: Shapes, repo: Repo, issue: Issue, comment: Comment, action: str
) -> dict[str, Any]:
    """An ``IssueCommentPayload``: the comment, its issue, and ``is_pull``."""
    payload = {
        "action": action, "issue": shapes.issue(repo, issue),
        "comment": shapes.comment(repo, issue, comment),
        "repository": shapes.repository(repo), "sender": shapes.user(comment.user),
        "is_pull": issue.pull is not None,
    }  # fmt: skip
    if issue.pull is not None:
        payload["pull_request"] = shapes.pull(repo, issue)
    return payload


def review_payload(
    shapes: Shapes, repo: Repo, issue: Issue, review: Review, kind: str
) -> dict[str, Any]:
    """A ``PullRequestPayload`` with ``action: reviewed`` and its ``review``
    (``type`` the hook kind, ``content`` the review's body)."""
    return {
        "action": "reviewed", "number": issue.number,
        "pull_request": shapes.pull(repo, issue),
        "requested_reviewer": None,
        "repository": shapes.repository(repo), "sender": shapes.user(review.user),
        "commit_id": review.commit_id,
        "review": {"type": kind, "content": review.body},
    }  # fmt: skip


def status_payload(shapes: Shapes, repo: Repo, status: Status) -> dict[str, Any]:
    """A ``CommitStatusPayload``."""
    return {
        "commit": {"id": status.sha, "url": f"{shapes.url}/{repo.full_name}/commit/{status.sha}"},
        "context": status.context, "created_at": iso(status.created_at),
        "description": status.description, "id": status.id,
        "repository": shapes.repository(repo), "sender": shapes.user(status.creator),
        "sha": status.sha, "state": status.state, "target_url": status.target_url,
        "updated_at": iso(status.created_at),
    }  # fmt: skip
