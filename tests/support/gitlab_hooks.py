"""The fake GitLab's webhooks: what happens in a project, delivered as GitLab delivers it.

A project's hooks (``add`` from a test) each get a POST per event they
subscribe to, with GitLab's headers: ``X-Gitlab-Event`` (``Issue Hook``,
``Note Hook``, ``Merge Request Hook``, ``Pipeline Hook``), ``X-Gitlab-Token``
(the hook's secret token, sent as it is: GitLab signs nothing),
``X-Gitlab-Event-UUID`` (one per event), ``X-Gitlab-Webhook-UUID`` (one per
hook), ``X-Gitlab-Instance`` and a ``GitLab/19.5.0`` user agent. The body is
GitLab's webhook JSON: ``object_kind``, ``event_type``, ``user``,
``project``, ``object_attributes`` (with ``action`` for issues and merge
requests), and for a note the ``issue`` or ``merge_request`` it is on.

The model announces under its lock (``GitLab.announce``); the payload is
rendered then and sent by fake_hooks.py's ``Deliveries``, from a thread of
its own. Each delivery is kept (``delivered``) with the status its receiver
answered.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from support.fake_hooks import Deliveries
from support.gitlab_model import Issue, MergeRequest, Note, Pipeline, Project, User, iso

if TYPE_CHECKING:
    from support.gitlab_server import GitLabServer

__all__ = ["EVENTS", "Delivered", "GitLabHooks", "Hook"]

#: Each hook event GitLab names, by the flag a hook subscribes with.
EVENTS = {
    "issues_events": "Issue Hook",
    "note_events": "Note Hook",
    "merge_requests_events": "Merge Request Hook",
    "pipeline_events": "Pipeline Hook",
}


@dataclass
class Hook:
    id: int
    project_id: int
    url: str
    token: str
    events: frozenset[str]  # X-Gitlab-Event names
    uuid: str = field(default_factory=lambda: str(uuid.uuid4()))


@dataclass
class Delivered:
    """One delivery: what was sent and the receiver's answer (None: none came)."""

    hook: Hook
    event: str
    headers: dict[str, str]
    body: bytes
    status: int | None = None
    answer: str = ""
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def payload(self) -> Any:
        return json.loads(self.body)


class GitLabHooks(Deliveries[Hook, Delivered]):
    """The hooks of every project of ``server`` and what was delivered to them."""

    def __init__(self, server: GitLabServer) -> None:
        super().__init__("fake-gitlab-hooks")
        self.server = server

    def add(
        self, ref: str | int, url: str, token: str, events: tuple[str, ...] = tuple(EVENTS)
    ) -> Hook:
        """A hook of project ``ref`` for ``events`` (``note_events`` and the like)."""
        with self.server.lock:
            project = self.server.project(ref)
            hook = Hook(
                self.next_id(), project.id, url, token, frozenset(EVENTS[e] for e in events)
            )
            self.hooks.append(hook)
            return hook

    def announce(self, project: Project, event: str, payload: dict[str, Any]) -> None:
        """Queue ``payload`` for each of ``project``'s hooks that wants ``event``."""
        event_uuid = str(uuid.uuid4())
        body = json.dumps(payload).encode()
        for hook in self.hooks:
            if hook.project_id != project.id or event not in hook.events:
                continue
            headers = {
                "Content-Type": "application/json",
                "User-Agent": "GitLab/19.5.0",
                "X-Gitlab-Event": event,
                "X-Gitlab-Token": hook.token,
                "X-Gitlab-Event-UUID": event_uuid,
                "X-Gitlab-Webhook-UUID": hook.uuid,
                "X-Gitlab-Instance": self.server.url,
            }
            self.send(Delivered(hook, event, headers, body))


# -- payloads (GitLab's webhook JSON) ---------------------------------------------------------


def hook_user(user: User, url: str) -> dict[str, Any]:
    return {
        "id": user.id, "name": user.name, "username": user.username,
        "avatar_url": f"{url}/uploads/-/system/user/avatar/{user.id}/avatar.png",
        "email": "[REDACTED]",
    }  # fmt: skip


def hook_project(project: Project, url: str) -> dict[str, Any]:
    web = f"{url}/{project.full_path}"
    return {
        "id": project.id, "name": project.path, "description": None, "web_url": web,
        "avatar_url": None, "git_ssh_url": f"git@127.0.0.1:{project.full_path}.git",
        "git_http_url": f"{web}.git", "namespace": project.namespace, "visibility_level": 0,
        "path_with_namespace": project.full_path, "default_branch": project.default_branch,
        "homepage": web, "url": f"{web}.git", "ssh_url": f"git@127.0.0.1:{project.full_path}.git",
        "http_url": f"{web}.git",
    }  # fmt: skip


def _labels(project: Project, names: list[str]) -> list[dict[str, Any]]:
    return [
        {"id": project.labels[n].id, "title": n, "color": project.labels[n].color,
         "project_id": project.id, "type": "ProjectLabel"}
        for n in names if n in project.labels
    ]  # fmt: skip


def issue_attributes(project: Project, issue: Issue, url: str) -> dict[str, Any]:
    return {
        "id": issue.id, "iid": issue.iid, "title": issue.title, "description": issue.description,
        "state": issue.state, "author_id": issue.author.id, "project_id": project.id,
        "created_at": iso(issue.created_at), "updated_at": iso(issue.updated_at),
        "closed_at": iso(issue.closed_at), "labels": _labels(project, issue.labels),
        "url": f"{url}/{project.full_path}/-/issues/{issue.iid}",
    }  # fmt: skip


def merge_request_attributes(
    project: Project, mr: MergeRequest, head: str | None, url: str
) -> dict[str, Any]:
    return {
        "id": mr.id, "iid": mr.iid, "title": mr.title, "description": mr.description,
        "state": mr.state, "source_branch": mr.source_branch, "target_branch": mr.target_branch,
        "source_project_id": project.id, "target_project_id": project.id,
        "author_id": mr.author.id, "draft": mr.draft,
        "created_at": iso(mr.created_at), "updated_at": iso(mr.updated_at),
        "merge_commit_sha": mr.merge_commit_sha, "labels": _labels(project, mr.labels),
        "last_commit": {"id": head} if head else None,
        "url": f"{url}/{project.full_path}/-/merge_requests/{mr.iid}",
    }  # fmt: skip


def item_payload(
    project: Project,
    item: Issue | MergeRequest,
    actor: User,
    action: str,
    head: str | None,
    url: str,
    labels_before: list[str] | None = None,
) -> tuple[str, dict[str, Any]]:
    """An ``Issue Hook`` or ``Merge Request Hook`` payload for ``action``
    (open, update, close, reopen, merge); ``changes.labels`` (previous and
    current) when the labels were ``labels_before`` and are no longer, as GitLab
    says a label added or removed."""
    kind = "issue" if isinstance(item, Issue) else "merge_request"
    attributes = (
        issue_attributes(project, item, url)
        if isinstance(item, Issue)
        else merge_request_attributes(project, item, head, url)
    )
    payload = {
        "object_kind": kind, "event_type": kind, "user": hook_user(actor, url),
        "project": hook_project(project, url),
        "object_attributes": {**attributes, "action": action},
        "labels": _labels(project, item.labels), "changes": {},
    }  # fmt: skip
    if labels_before is not None and labels_before != item.labels:
        payload["changes"] = {"labels": {
            "previous": _labels(project, labels_before), "current": _labels(project, item.labels),
        }}  # fmt: skip
    return ("Issue Hook" if kind == "issue" else "Merge Request Hook"), payload


def note_payload(
    project: Project, item: Issue | MergeRequest, note: Note, head: str | None, url: str
) -> dict[str, Any]:
    """A ``Note Hook`` payload: the note and the issue or merge request it is on."""
    sigil = "issues" if isinstance(item, Issue) else "merge_requests"
    payload: dict[str, Any] = {
        "object_kind": "note", "event_type": "note", "user": hook_user(note.author, url),
        "project_id": project.id, "project": hook_project(project, url),
        "object_attributes": {
            "id": note.id, "note": note.body, "noteable_type": note.noteable_type,
            "author_id": note.author.id, "created_at": iso(note.created_at),
            "updated_at": iso(note.created_at), "project_id": project.id, "system": note.system,
            "noteable_id": note.noteable_id, "discussion_id": note.discussion_id,
            "type": "DiffNote" if note.position else None, "position": note.position,
            "url": f"{url}/{project.full_path}/-/{sigil}/{item.iid}#note_{note.id}",
            "action": "create",
        },
    }  # fmt: skip
    if isinstance(item, Issue):
        payload["issue"] = issue_attributes(project, item, url)
    else:
        payload["merge_request"] = merge_request_attributes(project, item, head, url)
    return payload


def pipeline_payload(project: Project, pipeline: Pipeline, url: str) -> dict[str, Any]:
    """A ``Pipeline Hook`` payload; its jobs are the commit statuses (``builds``)."""
    return {
        "object_kind": "pipeline", "user": hook_user(pipeline.user, url),
        "project": hook_project(project, url),
        "object_attributes": {
            "id": pipeline.id, "iid": pipeline.iid, "ref": pipeline.ref, "tag": False,
            "sha": pipeline.sha, "status": pipeline.status, "detailed_status": pipeline.status,
            "source": pipeline.source, "created_at": iso(pipeline.created_at),
            "finished_at": iso(pipeline.updated_at)
            if pipeline.status in ("success", "failed", "canceled") else None,
            "url": f"{url}/{project.full_path}/-/pipelines/{pipeline.id}",
        },
        "merge_request": None,
        "builds": [
            {"id": j.id, "stage": "external", "name": j.name, "status": j.status,
             "created_at": iso(j.created_at), "allow_failure": j.allow_failure}
            for j in pipeline.jobs
        ],
    }  # fmt: skip
