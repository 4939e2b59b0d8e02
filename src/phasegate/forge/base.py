"""The Forge seam: issues, comments, pull requests, labels, CI checks and merges.

Every create call has a ``find`` twin: the side-effect journal looks for an
existing result before it repeats a call (docs/contracts/lifecycle.md:
journaled side effects), so the lookups must be exact: by marker for issues and
comments, by head branch for pull requests.

Four forges implement it: ``LocalForge`` (the store and the repository itself),
``GitHubForge`` (githubkit), ``GitLabForge`` (python-gitlab) and ``GiteaForge``
(Gitea's and Forgejo's REST API); tests/test_forge_conformance.py holds them to
the same behaviour. What only a team's forge has — people with
permissions, their comments, CI — the local forge answers empty: its people
speak through the CLI, its checks are ``landing_areas.checks``.

Errors: every call raises ``ForgeError`` or a subclass. ``ForgeUnavailable``
(5xx, timeouts, rate limits past their bound) is transient: the engine pauses
the workflow with reason ``forge_unavailable``, and the worker resumes it after
a backoff (``phasegate.runtime.outage``) or a person does. A forge reports each
wait before another try of a call (``phasegate.forge.retries``). The
others (``ForgeAuthError``, ``ForgeNotFound``) need a person and say what to fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

from phasegate.core.contract import PhasegateError
from phasegate.core.report import MR_NUMBERS, shown_number

__all__ = [
    "MR_NUMBERS",
    "AccessNames",
    "access_names",
    "OWN_CHECK",
    "OWN_PASSED",
    "OWN_WAITING",
    "OWN_PENDING",
    "PERMISSIONS",
    "STATUS_LABEL_PREFIX",
    "TRUSTED_PERMISSIONS",
    "TrustCache",
    "shown_number",
    "status_label",
    "Check",
    "CheckState",
    "Comment",
    "Forge",
    "ForgeAuthError",
    "ForgeError",
    "ForgeNotFound",
    "ForgeNotMergeable",
    "ForgeUnavailable",
    "Issue",
    "Labelled",
    "PullRequest",
    "SubIssues",
]

#: A person's permission on a repository, weakest first (GitHub's names).
PERMISSIONS = ("none", "read", "triage", "write", "maintain", "admin")
#: Whose label starts a workflow and whose words reach a prompt.
TRUSTED_PERMISSIONS = frozenset({"write", "maintain", "admin"})
#: GitLab's roles by the permission its forge reads each as (Planner reads as Guest).
_GITLAB_ROLES = {
    "admin": "Owner", "maintain": "Maintainer", "write": "Developer", "triage": "Reporter",
    "read": "Guest",
}  # fmt: skip


@dataclass(frozen=True)
class AccessNames:
    """How a forge names people's access in what phasegate says: GitHub's and
    Gitea's permissions (``'read'``), or GitLab's roles (``Guest``)."""

    roles: dict[str, str] | None = None

    def whose(self, permission: str) -> str:
        """``whose permission is 'read'``, ``whose role is Guest``, ``who is no member``."""
        if self.roles is None:
            return f"whose permission is {permission!r}"
        if permission not in self.roles:
            return "who is no member"
        return f"whose role is {self.roles[permission]}"

    @property
    def trusted(self) -> str:
        """Whose label, words and commands count: ``write, maintain or admin``."""
        if self.roles is None:
            return "write, maintain or admin"
        return "Developer, Maintainer or Owner"


def access_names(kind: str) -> AccessNames:
    """How forge ``kind`` (``forge.kind``) names people's access."""
    return AccessNames(_GITLAB_ROLES) if kind == "gitlab" else AccessNames()


#: Status labels are this prefix and the workflow's status group:
#: ``phasegate:planning`` … ``phasegate:needs-you``.
STATUS_LABEL_PREFIX = "phasegate:"
#: The name of phasegate's own commit status on each head it pushes: a team can
#: make it a required check (docs/github.md: branch protection).
OWN_CHECK = "phasegate"
#: Its description on a head phasegate pushed, until the head is reviewed and checked.
OWN_PENDING = "not yet reviewed and checked by phasegate"
#: Its description once the head is: it may merge as far as phasegate is concerned.
OWN_PASSED = "reviewed and checked by phasegate"
#: Its description while the head waits for required checks it learnt of late.
OWN_WAITING = "waiting for the branch's required checks"


_STATUS_LABELS = {
    "preparing": "planning",
    "planning": "planning",
    "developing": "developing",
    "pr_review": "reviewing",
    "reporting": "waiting",
    "waiting": "waiting",
    "merging": "merging",
    "verification_pending": "verifying",
    "completed": "done",
    "cancelled": "cancelled",
}


def status_label(status: str) -> str | None:
    """The issue's status label for a workflow ``status``: ``phasegate:planning``,
    ``…:developing``, ``…:reviewing``, ``…:waiting``, ``…:merging``, ``…:verifying``,
    ``…:done``; ``phasegate:needs-you`` for every status only a person moves on
    from (paused, failed, awaiting approval); ``phasegate:cancelled`` once cancelled.

    Any status label tells every watcher, whatever its store, that the issue has
    (or had) a workflow: it starts none for it until a person removes the label."""
    return STATUS_LABEL_PREFIX + _STATUS_LABELS.get(status, "needs-you")


class ForgeError(PhasegateError):
    """The forge refused or failed a call."""


class ForgeUnavailable(ForgeError):
    """The forge did not answer usefully within its bounds (5xx, timeouts, rate
    limits waited out too long): transient, the workflow pauses and resumes.
    ``retry_after_s``: how long the forge asked to be left alone (a rate limit's
    wait), None when it did not say."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ForgeAuthError(ForgeError):
    """The forge refused the credentials (401) or the permission (403): the message
    names the token variable or the permission that is missing."""


class ForgeNotFound(ForgeError):
    """The repository, issue, pull request or branch does not exist, or the token
    cannot see it."""


class ForgeNotMergeable(ForgeError):
    """The forge would not merge an open pull request (GitHub's 405 "not
    mergeable"): most often its base moved since the branch was synced and now
    conflicts. merge syncs the base again: a conflict forks the conflict
    resolution (docs/contracts/lifecycle.md: merge), a clean merge is tried again, and a refusal
    for a reason of the forge's own (branch protection, a draft) pauses."""


@dataclass(frozen=True)
class Issue:
    number: int
    title: str
    body: str
    state: str  # open | closed
    author: str = ""
    labels: tuple[str, ...] = ()
    #: GitHub lists pull requests among the issues: this one is a pull request.
    pull_request: bool = False


@dataclass(frozen=True)
class PullRequest:
    number: int
    head: str
    base: str
    title: str
    body: str
    state: str  # open | merged | closed
    merge_sha: str | None
    head_sha: str | None = None
    merged_by: str | None = None


@dataclass(frozen=True)
class Comment:
    """What a person wrote on an issue or a pull request.

    ``kind``: ``conversation`` (an issue or PR comment), ``review`` (a review's
    summary, with ``review_state``) or ``inline`` (a review comment on a line:
    ``path``, ``line`` in the new file, ``diff_hunk``). ``created_at`` is aware (UTC).
    """

    id: int
    author: str
    body: str
    created_at: datetime
    kind: Literal["conversation", "review", "inline"] = "conversation"
    review_state: str | None = None  # approved | changes_requested | commented
    path: str | None = None
    line: int | None = None
    diff_hunk: str | None = None

    @property
    def key(self) -> str:
        """``kind:id``: what tells comments apart (GitHub numbers issue comments,
        reviews and review comments each in a sequence of its own)."""
        return f"{self.kind}:{self.id}"


#: What a CI check says of a commit (``Check.state``).
CheckState = Literal["pending", "success", "failure"]


@dataclass(frozen=True)
class Check:
    """One CI check of a commit: a check run or a commit status.

    ``state``: ``pending`` (queued, in progress, or expected), ``success``
    (success, neutral, skipped) or ``failure`` (anything else that concluded).
    ``output`` is what the check said (title, summary, text), capped by the forge.
    """

    name: str
    state: CheckState
    output: str = ""
    url: str | None = None


@dataclass(frozen=True)
class Labelled:
    """An open issue carrying a label, and who put the label on it, when."""

    issue: Issue
    by: str
    at: datetime
    extra: dict[str, str] = field(default_factory=dict)


class Forge(Protocol):
    # -- issues -------------------------------------------------------------------
    def create_issue(self, title: str, body: str, marker: str) -> int: ...
    def find_issue(self, marker: str) -> int | None: ...
    def issue(self, number: int) -> Issue: ...
    def close_issue(self, number: int) -> None: ...

    def set_status_label(self, number: int, label: str | None) -> None:
        """Give issue ``number`` the one status label ``label`` (it starts with
        STATUS_LABEL_PREFIX), removing any other status label; None removes them all.
        Labels that are not status labels are left alone."""
        ...

    def labelled_issues(self, label: str) -> list[Labelled]:
        """Open issues carrying ``label``, each with who labelled it last."""
        ...

    def permission(self, login: str) -> str:
        """``login``'s permission on the repository, one of PERMISSIONS."""
        ...

    # -- comments -----------------------------------------------------------------
    def comment(self, issue_number: int, body: str, marker: str) -> int: ...
    def find_comment(self, issue_number: int, marker: str) -> int | None: ...

    def comments(self, number: int, since: datetime | None = None) -> list[Comment]:
        """What people wrote on issue or pull request ``number`` (conversation
        comments; for a pull request also review summaries and inline review
        comments), oldest first, created after ``since`` when given. phasegate's own
        comments (with a ``phasegate:`` marker) are left out."""
        ...

    # -- branches, pull requests, CI ------------------------------------------------
    def branch_ref(self, branch: str) -> str:
        """A local ref holding the forge's current ``branch``: what a workflow
        branches from, syncs with and is verified against.

        The local forge's branches are the repository's, so it is ``branch`` itself; one
        the repository lacks may survive on its ``origin`` remote (a clone elsewhere
        pushed it), fetched into ``refs/remotes/origin/<branch>``. GitHub's is fetched
        with the forge's credentials into ``refs/phasegate/forge/<branch>``, and that
        ref is returned. Raises ForgeNotFound when the forge has no such branch.
        """
        ...

    def publish_branch(self, branch: str) -> None:
        """Make ``branch`` visible to the forge (a push); a no-op where they share the repo."""
        ...

    def create_pull_request(self, head: str, base: str, title: str, body: str) -> int: ...
    def find_pull_request(self, head: str) -> int | None: ...
    def pull_request(self, number: int) -> PullRequest: ...
    def update_pull_request(self, number: int, body: str) -> None: ...

    def close_pull_request(self, number: int) -> None:
        """Close pull request ``number`` unmerged. Idempotent: one already closed or
        merged is left as it is. Whose pull request it is, the caller judges."""
        ...

    def delete_branch(self, branch: str) -> None:
        """Delete ``branch`` on the forge. Idempotent: a branch already gone is no
        error. A no-op where the forge's branches are the repository's own (the local
        forge: cleanup deletes those with git)."""
        ...

    def checks(self, sha: str) -> list[Check]:
        """The CI checks of commit ``sha`` (check runs and commit statuses); [] where
        the forge has no CI."""
        ...

    def required_checks(self, branch: str, *, fresh: bool = False) -> list[str]:
        """The checks ``branch``'s protection requires on a head before it merges
        into it, sorted; [] where the forge protects nothing (the local forge).
        ``fresh``: asked of the forge now, not from what it answered a while ago."""
        ...

    def set_commit_status(self, sha: str, state: CheckState, description: str) -> None:
        """Post phasegate's own status (named OWN_CHECK) on commit ``sha``; a no-op
        where the forge has no CI."""
        ...

    def merge_pull_request(self, number: int, message: str, head: str | None = None) -> str:
        """Merge the pull request; return the merge commit SHA. With ``head``, only
        while the pull request's head is that commit (the forge refuses otherwise)."""
        ...

    def find_merge(self, number: int) -> str | None:
        """The merge SHA if the pull request was merged (even if the forge has not recorded it)."""
        ...


@runtime_checkable
class SubIssues(Protocol):
    """A forge that files an issue under another as its sub-issue (the local forge,
    GitHub): an epic's pieces under their parent (docs/epics.md). A forge without it
    links them by the ``Part of #N`` line of their bodies only."""

    def link_sub_issue(self, parent: int, child: int) -> None:
        """Make issue ``child`` a sub-issue of issue ``parent``."""
        ...

    def parent_issue(self, child: int) -> int | None:
        """The number of the issue ``child`` is a sub-issue of, else None."""
        ...


class TrustCache:
    """People's permissions on the repository, each asked of the forge once: one
    is kept per snapshot or watch pass, since a permission can change."""

    def __init__(self, forge: Forge) -> None:
        self.forge = forge
        self.known: dict[str, str] = {}

    def permission(self, login: str) -> str:
        if login not in self.known:
            self.known[login] = self.forge.permission(login) if login else "none"
        return self.known[login]

    def trusted(self, login: str) -> bool:
        return self.permission(login) in TRUSTED_PERMISSIONS
