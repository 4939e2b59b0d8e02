"""The fake Gitea's model: users and their tokens, repositories, issues and pulls, reviews.

Plain data kept under one lock by ``Gitea`` (gitea_state.py), numbered as
Gitea numbers it: ``id`` is global per kind, an issue's ``index`` (its
``number``) counts per repository and a pull request takes the next one of
the same series (issue 1 and pull 2 never share a number). A pull request is
an issue with ``pull`` set, as in Gitea's tables. Access is Gitea's modes
(``MODES``): none, read, write, admin, owner.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from support.github_git import BareRepo

__all__ = [
    "MODES",
    "Comment",
    "Event",
    "GiteaError",
    "Issue",
    "Label",
    "Protection",
    "Pull",
    "Repo",
    "Review",
    "ReviewComment",
    "Status",
    "User",
    "iso",
]

#: Gitea's access modes by name, weakest first.
MODES = {"none": 0, "read": 1, "write": 2, "admin": 3, "owner": 4}

#: Where Gitea's error JSON points (``setting.API.SwaggerURL``).
SWAGGER = "/api/swagger"


class GiteaError(Exception):
    """An answer Gitea gives instead of doing the thing: ``status`` and its
    JSON body, ``{"message": ..., "url": ...}`` (``ctx.APIError``) or, for a
    404, ``{"errors": [...], "message": ..., "url": ...}`` (``APIErrorNotFound``)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        errors: list[str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message
        self.errors = errors
        self.headers = dict(headers or {})

    def body(self, url: str) -> dict[str, Any]:
        shaped: dict[str, Any] = {"message": self.message, "url": url + SWAGGER}
        if self.errors is not None:
            shaped["errors"] = list(self.errors)
        return shaped


def not_found(*errors: str) -> GiteaError:
    """Gitea's ``APIErrorNotFound``: 404 ``The target couldn't be found.``"""
    return GiteaError(404, "The target couldn't be found.", errors=list(errors))


def iso(when: datetime | None) -> str | None:
    """Gitea's timestamps: RFC 3339, seconds, ``Z`` for UTC (Go's time.Time)."""
    if when is None:
        return None
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class User:
    """A person or a bot account; ``tokens`` are its access tokens."""

    id: int
    login: str
    full_name: str
    email: str
    created: datetime
    is_admin: bool = False
    tokens: list[str] = field(default_factory=list)


@dataclass
class Label:
    id: int
    name: str
    color: str  # six hex digits, no '#', as Gitea answers
    description: str = ""
    exclusive: bool = False


@dataclass
class Comment:
    """A comment in an issue's (or pull request's) conversation."""

    id: int
    body: str
    user: User
    created_at: datetime
    updated_at: datetime


@dataclass
class Event:
    """One entry of an issue's timeline that is not a comment: a label added
    (``label``, ``added``) or removed, a close, a reopen, a merge."""

    id: int
    type: str  # label, close, reopen, merge_pull, review
    user: User
    created_at: datetime
    label: Label | None = None
    added: bool = True
    body: str = ""


@dataclass
class ReviewComment:
    """A line comment of a review: ``position`` counts new-file lines of ``path``."""

    id: int
    review_id: int
    body: str
    user: User
    path: str
    position: int
    old_position: int
    commit_id: str
    diff_hunk: str
    created_at: datetime


@dataclass
class Review:
    id: int
    user: User
    state: str  # APPROVED, REQUEST_CHANGES, COMMENT, PENDING
    body: str
    commit_id: str
    submitted_at: datetime
    comments: list[ReviewComment] = field(default_factory=list)
    official: bool = False
    stale: bool = False
    dismissed: bool = False


@dataclass
class Pull:
    """What makes an issue a pull request: its branches and how it ended."""

    head: str
    base: str
    merged: bool = False
    merged_at: datetime | None = None
    merged_by: User | None = None
    merge_commit_sha: str | None = None
    #: The head and the merge base when merged (the head branch may go afterwards).
    merged_head: str | None = None
    merged_base: str | None = None
    reviews: list[Review] = field(default_factory=list)


@dataclass
class Issue:
    id: int
    number: int
    title: str
    body: str
    user: User
    created_at: datetime
    updated_at: datetime
    state: str = "open"  # open, closed
    labels: list[int] = field(default_factory=list)  # label ids, in the order set
    closed_at: datetime | None = None
    comments: list[Comment] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    pull: Pull | None = None

    @property
    def draft(self) -> bool:
        """Gitea's work-in-progress prefixes make a pull request a draft."""
        return self.pull is not None and self.title.upper().startswith(("WIP:", "[WIP]"))


@dataclass
class Status:
    id: int
    sha: str
    state: str  # pending, success, error, failure, warning, skipped
    context: str
    creator: User
    created_at: datetime
    target_url: str = ""
    description: str = ""


@dataclass
class Protection:
    """A branch protection rule: ``rule_name`` is a branch name or a glob."""

    rule_name: str
    created_at: datetime
    updated_at: datetime
    enable_push: bool = False
    enable_status_check: bool = False
    status_check_contexts: list[str] = field(default_factory=list)
    required_approvals: int = 0
    block_on_rejected_reviews: bool = False
    block_admin_merge_override: bool = False
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Repo:
    """A repository: its bare git repository, its collaborators by user id
    (mode name), and what it holds."""

    id: int
    owner: User
    name: str
    bare: BareRepo
    created_at: datetime
    default_branch: str = "main"
    private: bool = True
    collaborators: dict[int, str] = field(default_factory=dict)
    issues: dict[int, Issue] = field(default_factory=dict)
    labels: dict[int, Label] = field(default_factory=dict)
    statuses: list[Status] = field(default_factory=list)
    protections: list[Protection] = field(default_factory=list)

    @property
    def full_name(self) -> str:
        return f"{self.owner.login}/{self.name}"

    def next_index(self) -> int:
        return max(self.issues, default=0) + 1

    def mode(self, user: User | None) -> str:
        """``user``'s access mode here (``none`` for nobody)."""
        if user is None:
            return "none"
        if user.id == self.owner.id:
            return "owner"
        if user.is_admin:
            return "admin"
        return self.collaborators.get(user.id, "none")

    def can(self, user: User | None, mode: str) -> bool:
        return MODES[self.mode(user)] >= MODES[mode]

    def label_named(self, name: str) -> Label | None:
        return next((lb for lb in self.labels.values() if lb.name == name), None)

    def protection(self, branch: str) -> Protection | None:
        """The first rule matching ``branch``: an exact name first, then a glob."""
        exact = [p for p in self.protections if p.rule_name == branch]
        globbed = [p for p in self.protections if fnmatch.fnmatchcase(branch, p.rule_name)]
        return (exact or globbed)[0] if exact or globbed else None
