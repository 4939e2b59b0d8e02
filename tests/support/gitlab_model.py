"""The fake GitLab's model: users and their tokens, projects, members, issues, merge requests.

Plain data kept under one lock by ``GitLab`` (gitlab_state.py); what GitLab
numbers, this numbers the same way: ``id`` is global per kind, ``iid`` counts
per project and per kind (issue 1 and merge request 1 live side by side), note
ids are global. Access levels are GitLab's numbers (``ACCESS``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from support.github_git import BareRepo

__all__ = [
    "ACCESS",
    "CommitStatus",
    "GitLabError",
    "Issue",
    "Label",
    "LabelEvent",
    "MergeRequest",
    "Note",
    "Pipeline",
    "Project",
    "User",
    "iso",
]

#: GitLab's access levels by role name.
ACCESS = {
    "guest": 10,
    "planner": 15,
    "reporter": 20,
    "developer": 30,
    "maintainer": 40,
    "owner": 50,
}


class GitLabError(Exception):
    """An answer GitLab gives instead of doing the thing: ``status`` and its
    JSON body, ``{"message": ...}`` (a string, or a dict of field errors) or,
    for a parameter Grape refused, ``{"error": ...}``."""

    def __init__(
        self,
        status: int,
        message: Any,
        *,
        key: str = "message",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.body = {key: message}
        self.headers = dict(headers or {})


def iso(when: datetime | None) -> str | None:
    """GitLab's timestamps: UTC, milliseconds, ``Z``."""
    if when is None:
        return None
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


@dataclass
class User:
    """A person or a project's bot; ``tokens`` are its personal (or project) access tokens."""

    id: int
    username: str
    name: str
    email: str
    created_at: datetime
    bot: bool = False
    tokens: list[str] = field(default_factory=list)

    def basic(self, url: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "username": self.username,
            "name": self.name,
            "state": "active",
            "locked": False,
            "avatar_url": f"{url}/uploads/-/system/user/avatar/{self.id}/avatar.png",
            "web_url": f"{url}/{self.username}",
        }


@dataclass
class Label:
    id: int
    name: str
    color: str
    description: str | None = None


@dataclass
class LabelEvent:
    """A label added to or removed from an issue or a merge request, by whom
    (GitLab's resource label event)."""

    id: int
    user: User
    created_at: datetime
    label: Label
    action: str  # add | remove


@dataclass
class Note:
    """A comment on an issue or a merge request; ``position`` makes it a diff
    (line) note, ``discussion_id`` groups it with its replies."""

    id: int
    body: str
    author: User
    created_at: datetime
    noteable_type: str  # Issue or MergeRequest
    noteable_id: int
    noteable_iid: int
    discussion_id: str
    system: bool = False
    position: dict[str, Any] | None = None


@dataclass
class Issue:
    id: int
    iid: int
    title: str
    description: str
    author: User
    created_at: datetime
    updated_at: datetime
    state: str = "opened"
    labels: list[str] = field(default_factory=list)
    closed_at: datetime | None = None
    closed_by: User | None = None
    notes: list[Note] = field(default_factory=list)
    label_events: list[LabelEvent] = field(default_factory=list)


@dataclass
class MergeRequest:
    id: int
    iid: int
    title: str
    description: str
    source_branch: str
    target_branch: str
    author: User
    created_at: datetime
    updated_at: datetime
    state: str = "opened"  # opened, closed, merged, locked
    labels: list[str] = field(default_factory=list)
    draft: bool = False
    merged_at: datetime | None = None
    merged_by: User | None = None
    closed_at: datetime | None = None
    closed_by: User | None = None
    merge_commit_sha: str | None = None
    squash_commit_sha: str | None = None
    squash: bool = False
    should_remove_source_branch: bool | None = None
    #: The head and base SHAs at merge time (the branches may go afterwards).
    merged_sha: str | None = None
    notes: list[Note] = field(default_factory=list)
    label_events: list[LabelEvent] = field(default_factory=list)


@dataclass
class CommitStatus:
    """One external status (a job of the sha's external pipeline, as on GitLab)."""

    id: int
    sha: str
    ref: str
    status: str  # pending running success failed canceled skipped
    name: str
    author: User
    created_at: datetime
    pipeline_id: int
    target_url: str | None = None
    description: str | None = None
    allow_failure: bool = False
    started_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass
class Pipeline:
    """A pipeline of one sha and ref; its ``status`` follows its jobs (statuses)."""

    id: int
    iid: int
    sha: str
    ref: str
    source: str
    created_at: datetime
    updated_at: datetime
    user: User
    jobs: list[CommitStatus] = field(default_factory=list)
    #: Set by a test to force a status whatever the jobs say (a CI pipeline).
    forced: str | None = None

    @property
    def status(self) -> str:
        if self.forced:
            return self.forced
        states = [j.status for j in self.jobs if not (j.allow_failure and j.status == "failed")]
        if not states:
            return "success" if self.jobs else "created"
        for state in ("failed", "running", "pending", "created", "canceled"):
            if state in states:
                return state
        return "success" if all(s in ("success", "skipped") for s in states) else states[-1]


@dataclass
class Project:
    """A project: its repository (a bare one), members by user id, and what it holds."""

    id: int
    namespace: str
    path: str
    owner: User
    bare: BareRepo
    created_at: datetime
    default_branch: str = "main"
    visibility: str = "private"
    only_allow_merge_if_pipeline_succeeds: bool = False
    #: Who may merge into (and push to) the default branch: GitLab protects it
    #: for Maintainers by default.
    merge_level: int = ACCESS["maintainer"]
    members: dict[int, int] = field(default_factory=dict)
    issues: dict[int, Issue] = field(default_factory=dict)
    merge_requests: dict[int, MergeRequest] = field(default_factory=dict)
    labels: dict[str, Label] = field(default_factory=dict)
    statuses: list[CommitStatus] = field(default_factory=list)
    pipelines: list[Pipeline] = field(default_factory=list)
    hooks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def full_path(self) -> str:
        return f"{self.namespace}/{self.path}"

    def next_iid(self, kind: dict[int, Any]) -> int:
        return max(kind, default=0) + 1

    def level(self, user: User) -> int:
        """``user``'s access level here (0: none)."""
        return self.members.get(user.id, 0)

    def head_pipeline(self, sha: str | None) -> Pipeline | None:
        """The newest pipeline of ``sha`` (GitLab's ``head_pipeline`` of a merge request)."""
        found = [p for p in self.pipelines if sha and p.sha == sha]
        return found[-1] if found else None
