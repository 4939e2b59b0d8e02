"""The fake Gitea's state and what people and phasegate do to it, in Python.

``Gitea`` holds users, tokens and repositories (gitea_model.py) under one
lock and does what Gitea does when asked: open and edit issues and pull
requests, label them (each change a timeline event naming who made it),
comment, review with line comments, post commit statuses, protect branches
and merge on the bare repository with real git, refusing what Gitea refuses
with its status and message. The REST routes (gitea_routes.py) call these;
tests call them too, as the people around.
"""

from __future__ import annotations

import itertools
import secrets
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from support.gitea_hooks import comment_payload, issue_payload
from support.gitea_merging import STATUS_STATES, Merging
from support.gitea_model import (
    Comment,
    Event,
    GiteaError,
    Issue,
    Label,
    Pull,
    Repo,
    User,
    not_found,
)
from support.github_git import BareRepo, Identity

if TYPE_CHECKING:
    from support.gitea_json import Shapes

__all__ = ["STATUS_STATES", "Gitea", "utc_now"]


def utc_now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


class Gitea(Merging):
    """Every user, token and repository of one fake Gitea, under ``lock``."""

    def __init__(self, root: Path, clock: Callable[[], datetime] = utc_now) -> None:
        self.root = root
        self.clock = clock
        self.lock = threading.RLock()
        self.users: dict[str, User] = {}
        self.repos: dict[str, Repo] = {}  # by lower-case full name
        self.tokens: dict[str, User] = {}
        self._ids: dict[str, itertools.count[int]] = {}

    def announce(self, repo: Repo, kind: str, render: Callable[[Shapes], dict[str, Any]]) -> None:
        """Told of each hook event: ``kind`` (Gitea's event type, e.g.
        ``issue_label``) and its payload's maker (``render(shapes)``); the
        server delivers it, the bare model drops it."""

    def next_id(self, kind: str) -> int:
        return next(self._ids.setdefault(kind, itertools.count(1)))

    # -- people -----------------------------------------------------------------------------
    def add_user(self, login: str, full_name: str | None = None, *, admin: bool = False) -> User:
        """A user with one access token (``user.tokens[0]``)."""
        with self.lock:
            if login in self.users:
                raise ValueError(f"user {login} exists")
            user = User(
                self.next_id("user"), login, full_name or login.title(),
                f"{login}@example.com", self.clock(), is_admin=admin,
            )  # fmt: skip
            self.users[login] = user
            self.add_token(user)
            return user

    def add_token(self, user: User) -> str:
        """A new access token for ``user`` (forty hex digits, as Gitea's)."""
        with self.lock:
            token = secrets.token_hex(20)
            user.tokens.append(token)
            self.tokens[token] = user
            return token

    def revoke(self, token: str) -> None:
        with self.lock:
            self.tokens.pop(token).tokens.remove(token)

    def token_user(self, token: str | None) -> User | None:
        return self.tokens.get(token or "")

    def user(self, login: str) -> User:
        found = self.users.get(login) or next(
            (u for u in self.users.values() if u.login.lower() == login.lower()), None
        )
        if found is None:
            raise not_found(f"user redirect does not exist [name: {login.lower()}]")
        return found

    # -- repositories --------------------------------------------------------------------------
    def create_repo(
        self,
        full_name: str,
        *,
        from_path: Path | None = None,
        default_branch: str = "main",
        private: bool = True,
    ) -> Repo:
        """A repository ``owner/name``; its bare repository is seeded from
        ``from_path`` or gets a first commit."""
        owner_login, _, name = full_name.partition("/")
        with self.lock:
            owner = self.users[owner_login]
            author = Identity(owner.full_name, owner.email)
            bare = BareRepo.made(
                self.root / f"{full_name}.git", default_branch, from_path, name, author
            )
            repo = Repo(
                self.next_id("repo"), owner, name, bare, self.clock(), default_branch, private
            )
            self.repos[full_name.lower()] = repo
            return repo

    def add_collaborator(self, full_name: str, login: str, mode: str = "write") -> None:
        with self.lock:
            self.repo(full_name).collaborators[self.users[login].id] = mode

    def repo(self, full_name: str) -> Repo:
        with self.lock:
            found = self.repos.get(full_name.lower())
            if found is None:
                raise not_found()
            return found

    def visible(self, owner: str, name: str, actor: User | None, mode: str = "read") -> Repo:
        """The repository as ``actor`` may see it: a private one is 404 to
        whoever cannot read it, as on Gitea; too weak an access 403."""
        repo = self.repos.get(f"{owner}/{name}".lower())
        if repo is None or (repo.private and not repo.can(actor, "read")):
            raise not_found()
        if mode == "read" and not repo.private and actor is not None:
            return repo  # anyone signed in reads a public repository, opens issues, comments
        if not repo.can(actor, mode):
            raise GiteaError(
                403,
                "user should be an owner or a collaborator with admin write of a repository"
                if mode == "admin"
                else "user should have a permission to write to a repo",
            )
        return repo

    # -- issues --------------------------------------------------------------------------------
    def open_issue(
        self,
        full_name: str,
        login: str,
        title: str,
        body: str = "",
        labels: list[int] | None = None,
    ) -> Issue:
        """An issue filed by ``login`` (labels by id, set by the author)."""
        with self.lock:
            repo, user = self.repo(full_name), self.users[login]
            for lid in labels or ():
                if lid not in repo.labels:  # refused before anything is filed
                    raise GiteaError(422, f"label does not exist [label_id: {lid}]")
            now = self.clock()
            issue = Issue(self.next_id("issue"), repo.next_index(), title, body, user, now, now)
            repo.issues[issue.number] = issue
            self.announce_issue(repo, issue, user, "issues", "opened")
            if labels:
                self.set_labels(repo, issue, user, list(issue.labels) + labels)
            return issue

    def issue(self, repo: Repo, number: int) -> Issue:
        found = repo.issues.get(number)
        if found is None:
            raise not_found(f"issue does not exist [id: 0, repo_id: {repo.id}, index: {number}]")
        return found

    def set_labels(self, repo: Repo, issue: Issue, actor: User, ids: list[int]) -> None:
        """Make ``ids`` the issue's labels; each one added or removed is a
        timeline event by ``actor`` and one ``issue_label`` hook event."""
        wanted: list[int] = []
        for lid in ids:
            if lid not in repo.labels:
                raise GiteaError(422, f"label does not exist [label_id: {lid}]")
            if lid not in wanted:
                wanted.append(lid)
        added = [lid for lid in wanted if lid not in issue.labels]
        removed = [lid for lid in issue.labels if lid not in wanted]
        if not added and not removed:
            return
        now = self.clock()
        for lid, on in [(lid, False) for lid in removed] + [(lid, True) for lid in added]:
            issue.events.append(
                Event(self.next_id("comment"), "label", actor, now, repo.labels[lid], on,
                      "1" if on else "")
            )  # fmt: skip
        issue.labels = wanted
        issue.updated_at = now
        action = "label_updated" if wanted else "label_cleared"
        kind = "pull_request_label" if issue.pull else "issue_label"
        self.announce_issue(repo, issue, actor, kind, action)

    def label_names(self, repo: Repo, given: list[Any]) -> list[int]:
        """Labels as ``IssueLabelsOption`` names them: ids or names; unknown names are dropped."""
        ids: list[int] = []
        for item in given:
            if isinstance(item, int) and not isinstance(item, bool):
                ids.append(item)
            elif isinstance(item, str):
                found = repo.label_named(item)
                if item.isdigit() and found is None:
                    ids.append(int(item))
                elif found is not None:
                    ids.append(found.id)
        return ids

    def create_label(
        self, repo: Repo, name: str, color: str, description: str = "", exclusive: bool = False
    ) -> Label:
        color = color.lstrip("#").lower()
        if len(color) == 3:
            color = "".join(c * 2 for c in color)
        if len(color) != 6 or any(c not in "0123456789abcdef" for c in color):
            raise GiteaError(422, "Color: invalid color")
        label = Label(self.next_id("label"), name, color, description, exclusive)
        repo.labels[label.id] = label
        return label

    def label(self, full_name: str, login: str, number: int, name: str) -> None:
        """``login`` puts label ``name`` on issue ``number`` (made if missing)."""
        with self.lock:
            repo = self.repo(full_name)
            label = repo.label_named(name) or self.create_label(repo, name, "ededed")
            issue = self.issue(repo, number)
            self.set_labels(repo, issue, self.users[login], [*issue.labels, label.id])

    def set_state(self, repo: Repo, issue: Issue, actor: User, state: str) -> None:
        if state not in ("open", "closed"):
            raise GiteaError(422, f"unknown state: {state}")
        if state == issue.state:
            return
        if issue.pull is not None and issue.pull.merged and state == "open":
            raise GiteaError(409, "cannot reopen a merged pull request")
        now = self.clock()
        issue.state, issue.updated_at = state, now
        issue.closed_at = now if state == "closed" else None
        kind = "close" if state == "closed" else "reopen"
        issue.events.append(Event(self.next_id("comment"), kind, actor, now))
        hook = "pull_request" if issue.pull else "issues"
        self.announce_issue(repo, issue, actor, hook, "closed" if state == "closed" else "reopened")

    def edit(self, repo: Repo, issue: Issue, actor: User, fields: dict[str, Any]) -> None:
        """What ``PATCH`` on an issue or pull request does with ``fields``."""
        changed = False
        for name in ("title", "body"):
            if fields.get(name) is not None and getattr(issue, name) != fields[name]:
                setattr(issue, name, str(fields[name]))
                changed = True
        if issue.pull is not None and fields.get("base"):
            if repo.bare.branch_sha(str(fields["base"])) is None:
                raise not_found()
            issue.pull.base = str(fields["base"])
        if issue.pull is not None and fields.get("labels") is not None:
            self.set_labels(repo, issue, actor, [int(x) for x in fields["labels"]])
        if changed:
            issue.updated_at = self.clock()
            hook = "pull_request" if issue.pull else "issues"
            self.announce_issue(repo, issue, actor, hook, "edited")
        if fields.get("state"):
            self.set_state(repo, issue, actor, str(fields["state"]))

    def announce_issue(self, repo: Repo, issue: Issue, actor: User, kind: str, action: str) -> None:
        self.announce(repo, kind, lambda s: issue_payload(s, repo, issue, actor, action))

    # -- comments ------------------------------------------------------------------------------
    def comment(self, full_name: str, login: str, number: int, body: str) -> Comment:
        """``login`` comments ``body`` on issue (or pull request) ``number``."""
        with self.lock:
            repo = self.repo(full_name)
            return self.add_comment(repo, self.issue(repo, number), self.users[login], body)

    def add_comment(self, repo: Repo, issue: Issue, author: User, body: str) -> Comment:
        now = self.clock()
        comment = Comment(self.next_id("comment"), body, author, now, now)
        issue.comments.append(comment)
        issue.updated_at = now
        kind = "pull_request_comment" if issue.pull else "issue_comment"
        self.announce(repo, kind, lambda s: comment_payload(s, repo, issue, comment, "created"))
        return comment

    # -- pull requests -------------------------------------------------------------------------
    def open_pull(
        self,
        full_name: str,
        login: str,
        head: str,
        base: str,
        title: str,
        body: str = "",
        labels: list[int] | None = None,
    ) -> Issue:
        """A pull request of branch ``head`` into ``base`` by ``login``; refused
        as Gitea refuses (404 a missing branch, 409 one already open, 422 no change)."""
        with self.lock:
            repo, user = self.repo(full_name), self.users[login]
            head_sha, base_sha = repo.bare.branch_sha(head), repo.bare.branch_sha(base)
            if head_sha is None or base_sha is None:
                raise not_found()
            for other in repo.issues.values():
                pr = other.pull
                if pr and other.state == "open" and (pr.head, pr.base) == (head, base):
                    raise GiteaError(
                        409,
                        f"pull request already exists for these targets [id: {other.id}, "
                        f"issue_id: {other.id}, head_repo_id: {repo.id}, base_repo_id: "
                        f"{repo.id}, head_branch: {head}, base_branch: {base}]",
                    )
            ahead = repo.bare.git("rev-list", "--count", f"{base_sha}..{head_sha}").strip()
            if head == base or ahead == "0":
                raise GiteaError(
                    422, "Invalid PullRequest: There are no changes between the head and the base"
                )
            now = self.clock()
            issue = Issue(
                self.next_id("issue"), repo.next_index(), title, body, user, now, now,
                pull=Pull(head, base),
            )  # fmt: skip
            repo.issues[issue.number] = issue
            self.announce_issue(repo, issue, user, "pull_request", "opened")
            if labels:
                self.set_labels(repo, issue, user, labels)
            return issue

    def pull(self, repo: Repo, number: int) -> Issue:
        found = repo.issues.get(number)
        if found is None or found.pull is None:
            raise not_found(
                f"pull request does not exist [id: 0, issue_id: 0, head_repo_id: 0, "
                f"base_repo_id: {repo.id}, head_branch: , base_branch: ]"
            )
        return found

    def head_sha(self, repo: Repo, issue: Issue) -> str | None:
        assert issue.pull is not None
        if issue.pull.merged:
            return issue.pull.merged_head
        return repo.bare.branch_sha(issue.pull.head)

    def merge_base(self, repo: Repo, issue: Issue) -> str | None:
        assert issue.pull is not None
        if issue.pull.merged:
            return issue.pull.merged_base
        head, base = self.head_sha(repo, issue), repo.bare.branch_sha(issue.pull.base)
        if head is None or base is None:
            return base
        return repo.bare.git("merge-base", base, head).strip() or base

    def mergeable(self, repo: Repo, issue: Issue) -> bool:
        """Whether git merges the head into the base cleanly (Gitea's ``mergeable``:
        no conflict; protection is not asked here, as on Gitea)."""
        assert issue.pull is not None
        if issue.pull.merged or issue.state != "open":
            return False
        head, base = self.head_sha(repo, issue), repo.bare.branch_sha(issue.pull.base)
        return (
            head is not None and base is not None and repo.bare.merge_tree(base, head) is not None
        )
