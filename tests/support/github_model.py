"""The fake GitHub's objects: users, repositories, issues, pull requests, reviews, CI.

Plain mutable records (``eq=False``: identity is what matters) that
``GitHub`` (github_state.py) keeps and github_json.py renders in GitHub's
shapes; ``GitHubError`` is a refusal with GitHub's status and message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from support.github_git import BareRepo, Identity, PullFacts

__all__ = [
    "App",
    "CheckRun",
    "CommitStatus",
    "Event",
    "GitHubError",
    "Issue",
    "IssueComment",
    "Label",
    "Pull",
    "Repo",
    "Review",
    "ReviewComment",
    "User",
    "invalid",
    "not_found",
    "utc_now",
]

REVIEW_STATES = ("APPROVED", "CHANGES_REQUESTED", "COMMENTED")
CHECK_STATUSES = ("queued", "in_progress", "completed")
CHECK_CONCLUSIONS = (
    "success",
    "failure",
    "neutral",
    "cancelled",
    "skipped",
    "timed_out",
    "action_required",
)
STATUS_STATES = ("error", "failure", "pending", "success")
MERGE_METHODS = ("merge", "squash", "rebase")
# GitHub's closing keywords (docs: "Linking a pull request to an issue").
CLOSING_KEYWORDS = re.compile(
    r"\b(?:close[sd]?|fix(?:e[sd])?|resolve[sd]?):?\s+#(\d+)\b", re.IGNORECASE
)


class GitHubError(Exception):
    """A call GitHub would refuse: ``status`` (401, 403, 404, 405, 409, 422, …),
    GitHub's ``message``, its validation ``errors`` and extra response ``headers``."""

    def __init__(
        self,
        status: int,
        message: str,
        errors: list[dict[str, str] | str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message
        self.errors = errors
        self.headers = headers or {}


def not_found() -> GitHubError:
    return GitHubError(404, "Not Found")


def invalid(resource: str, field_name: str, code: str, message: str | None = None) -> GitHubError:
    error = {"resource": resource, "field": field_name, "code": code}
    if message:
        error["message"] = message
    return GitHubError(422, "Validation Failed", [error])


@dataclass(eq=False)
class User:
    id: int
    login: str
    type: str = "User"  # User | Bot | Organization
    token: str | None = None  # the personal token a test authenticates with

    @property
    def identity(self) -> Identity:
        return Identity(self.login, f"{self.id}+{self.login}@users.noreply.github.com")


@dataclass(eq=False)
class Label:
    id: int
    name: str
    color: str = "ededed"
    description: str | None = None


@dataclass(eq=False)
class Event:
    """An issue event: ``labeled``/``unlabeled`` (with ``label``), ``closed``,
    ``reopened``, ``merged`` (with ``commit_id``)."""

    id: int
    event: str
    actor: User
    created_at: datetime
    label: Label | None = None
    commit_id: str | None = None


@dataclass(eq=False)
class IssueComment:
    id: int
    user: User
    body: str
    created_at: datetime
    updated_at: datetime


@dataclass(eq=False)
class Review:
    id: int
    user: User
    state: str  # APPROVED | CHANGES_REQUESTED | COMMENTED
    body: str
    commit_id: str | None
    submitted_at: datetime


@dataclass(eq=False)
class ReviewComment:
    id: int
    review_id: int
    user: User
    body: str
    path: str
    line: int
    diff_hunk: str
    commit_id: str
    created_at: datetime


@dataclass(eq=False)
class Pull:
    """What a pull request has beyond its issue. ``head_sha`` is the head's
    last known SHA (frozen once closed); ``facts`` too, once closed."""

    id: int
    head: str
    base: str
    head_sha: str
    base_sha: str
    draft: bool = False
    maintainer_can_modify: bool = False
    merged_at: datetime | None = None
    merged_by: User | None = None
    merge_commit_sha: str | None = None
    frozen: PullFacts | None = None
    seen: tuple[str | None, str | None] = (None, None)  # (base, head) mergeable was worked out for
    unknown_reads: int = 0  # reads left that say mergeable null
    reviews: list[Review] = field(default_factory=list)
    review_comments: list[ReviewComment] = field(default_factory=list)


@dataclass(eq=False)
class Issue:
    """An issue, or a pull request's conversation when ``pull`` is set."""

    id: int
    number: int
    title: str
    body: str | None
    user: User
    created_at: datetime
    updated_at: datetime
    state: str = "open"
    state_reason: str | None = None
    closed_at: datetime | None = None
    closed_by: User | None = None
    labels: list[Label] = field(default_factory=list)
    comments: list[IssueComment] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    pull: Pull | None = None
    parent: int | None = None  # the number of the issue this is a sub-issue of


@dataclass(eq=False)
class CheckRun:
    id: int
    head_sha: str
    name: str
    status: str
    conclusion: str | None
    started_at: datetime | None
    completed_at: datetime | None
    title: str | None = None
    summary: str | None = None
    text: str | None = None
    details_url: str | None = None


@dataclass(eq=False)
class CommitStatus:
    id: int
    sha: str
    context: str
    state: str
    description: str | None
    target_url: str | None
    creator: User
    created_at: datetime


@dataclass(eq=False)
class App:
    """A GitHub App installed on ``owner``'s repositories (``repos`` None: all)."""

    id: int
    slug: str
    public_key_pem: str
    installation_id: int
    owner: User
    bot: User
    repos: frozenset[str] | None
    created_at: datetime


@dataclass(eq=False)
class Repo:
    id: int
    owner: User
    name: str
    git: BareRepo
    created_at: datetime
    default_branch: str = "main"
    private: bool = False
    description: str | None = None
    pushed_at: datetime | None = None
    issues: dict[int, Issue] = field(default_factory=dict)
    labels: dict[str, Label] = field(default_factory=dict)  # lower-case name → label
    collaborators: dict[str, str] = field(default_factory=dict)  # login → permission
    check_runs: list[CheckRun] = field(default_factory=list)
    statuses: list[CommitStatus] = field(default_factory=list)
    #: Protected branches: each one's required status checks (check run or status names).
    protection: dict[str, tuple[str, ...]] = field(default_factory=dict)
    merges: int = 0

    @property
    def full_name(self) -> str:
        return f"{self.owner.login}/{self.name}"

    def passed(self, sha: str) -> set[str]:
        """The checks that passed on commit ``sha``: the check runs whose latest run
        concluded success, neutral or skipped, and the statuses whose latest is success."""
        runs = {c.name: c for c in sorted(self.check_runs, key=lambda c: c.id) if c.head_sha == sha}
        said = {s.context: s for s in sorted(self.statuses, key=lambda s: s.id) if s.sha == sha}
        good = {n for n, c in runs.items() if c.conclusion in ("success", "neutral", "skipped")}
        return good | {n for n, s in said.items() if s.state == "success"}

    def counts(self) -> dict[str, int]:
        """How many issues, pulls, comments (conversation, on both), reviews and merges."""
        issues = list(self.issues.values())
        return {
            "issues": sum(1 for i in issues if i.pull is None),
            "pulls": sum(1 for i in issues if i.pull is not None),
            "comments": sum(len(i.comments) for i in issues),
            "reviews": sum(len(i.pull.reviews) for i in issues if i.pull),
            "merges": self.merges,
        }


def utc_now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)
