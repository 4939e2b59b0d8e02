"""Pull requests of the fake GitHub: opening, git's view, merging with real git, reviews.

``PullRequests`` is the part of ``GitHub`` (github_state.py) that pull
requests need; it works on the same records and lock.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from support.github_git import GitError, PullFacts
from support.github_json import Json, Shapes
from support.github_model import (
    CLOSING_KEYWORDS,
    MERGE_METHODS,
    REVIEW_STATES,
    Event,
    GitHubError,
    Issue,
    Pull,
    Repo,
    Review,
    ReviewComment,
    User,
    invalid,
)

__all__ = ["PullRequests"]


class PullRequests:
    """Pull requests, merges and reviews (mixed into ``GitHub``)."""

    if TYPE_CHECKING:
        lock: threading.RLock
        mergeable_unknown_reads: int

        def _id(self) -> int: ...
        def announce(
            self, r: Repo, event: str, sender: User, render: Callable[[Shapes], Json]
        ) -> None: ...
        def _at(self, at: datetime | None) -> datetime: ...
        def _number(self, repo: Repo) -> int: ...
        def repo(self, full_name: str) -> Repo: ...
        def user(self, login: str) -> User: ...
        def pull(self, repo: str | Repo, number: int) -> Issue: ...
        def edit_issue(self, repo: str, number: int, by: str, **kw: object) -> Issue: ...
        def _set_state(
            self, repo: Repo, issue: Issue, state: str, by: User, now: datetime, reason: str | None
        ) -> None: ...

    # -- pull requests ---------------------------------------------------------------------
    def open_pull(
        self,
        repo: str,
        head: str,
        base: str,
        title: str,
        body: str | None,
        by: str,
        *,
        draft: bool = False,
        maintainer_can_modify: bool = False,
        at: datetime | None = None,
    ) -> Issue:
        """``by`` opens a pull request of branch ``head`` (``owner:branch`` too)
        into ``base``. GitHubError 422 when a branch is missing, nothing is
        between them, or an open pull request of ``head`` into ``base`` exists."""
        with self.lock:
            r, user, now = self.repo(repo), self.user(by), self._at(at)
            if ":" in head:
                owner, head = head.split(":", 1)
                if owner.lower() != r.owner.login.lower():
                    raise invalid("PullRequest", "head", "invalid")  # no forks here
            head_sha, base_sha = r.git.branch_sha(head), r.git.branch_sha(base)
            if head_sha is None:
                raise invalid("PullRequest", "head", "invalid")
            if base_sha is None:
                raise invalid("PullRequest", "base", "invalid")
            for other in r.issues.values():
                p = other.pull
                if p and other.state == "open" and p.head == head and p.base == base:
                    message = f"A pull request already exists for {r.owner.login}:{head}."
                    raise invalid("PullRequest", "head", "custom", message)
            if r.git.facts(base, head).commits == 0:
                raise invalid(
                    "PullRequest", "base", "custom", f"No commits between {base} and {head}"
                )
            pull = Pull(self._id(), head, base, head_sha, base_sha, draft, maintainer_can_modify)
            issue = Issue(self._id(), self._number(r), title, body, user, now, now, pull=pull)
            r.issues[issue.number] = issue
            return issue

    def pull_facts(self, repo: Repo, issue: Issue) -> PullFacts:
        """Git's view of pull request ``issue`` now (frozen once closed); moves
        ``head_sha``/``base_sha`` along with the branches while open."""
        pull = issue.pull
        assert pull is not None
        if pull.frozen is not None:
            return pull.frozen
        facts = repo.git.facts(pull.base, pull.head)
        pull.head_sha = facts.head_sha or pull.head_sha
        pull.base_sha = facts.base_sha or pull.base_sha
        if pull.seen != (facts.base_sha, facts.head_sha):
            pull.seen = (facts.base_sha, facts.head_sha)
            pull.unknown_reads = self.mergeable_unknown_reads
        return facts

    def shown_facts(self, repo: Repo, issue: Issue) -> PullFacts:
        """``pull_facts`` as a read over the API sees them: ``mergeable`` None for
        the first ``mergeable_unknown_reads`` reads after a change."""
        facts = self.pull_facts(repo, issue)
        pull = issue.pull
        assert pull is not None
        if pull.frozen is None and pull.unknown_reads > 0:
            pull.unknown_reads -= 1
            return dataclasses.replace(facts, mergeable=None)
        return facts

    def edit_pull(
        self,
        repo: str,
        number: int,
        by: str,
        *,
        title: str | None = None,
        body: str | None = None,
        state: str | None = None,
        base: str | None = None,
    ) -> Issue:
        """``by`` edits pull request ``number`` (closing it leaves it unmerged)."""
        with self.lock:
            issue = self.pull(repo, number)
            if base is not None:
                if self.repo(repo).git.branch_sha(base) is None:
                    raise invalid("PullRequest", "base", "invalid")
                issue.pull.base = base  # type: ignore[union-attr]
            was = issue.state
            edited = self.edit_issue(repo, number, by, title=title, body=body, state=state)
            if was == "open" and edited.state == "closed":
                self._closed(self.repo(repo), edited, self.user(by))
            return edited

    def _closed(self, r: Repo, issue: Issue, by: User) -> None:
        """Announce that pull request ``issue`` closed (merged or not)."""
        number = issue.number
        self.announce(
            r,
            "pull_request",
            by,
            lambda s: {
                "action": "closed",
                "number": number,
                "pull_request": s.pull(r, issue, self.pull_facts(r, issue)),
            },
        )

    def merge(
        self,
        repo: str,
        number: int,
        by: str,
        *,
        method: str = "merge",
        sha: str | None = None,
        commit_title: str | None = None,
        commit_message: str | None = None,
        at: datetime | None = None,
    ) -> str:
        """``by`` merges pull request ``number`` with real git; the merge commit SHA.

        GitHubError 405 when it is closed, already merged, a draft, conflicts or a
        required status check of its protected base has not passed on its head, 409 when
        ``sha`` is not the head any more, 422 for an unknown method."""
        with self.lock:
            r, user, now = self.repo(repo), self.user(by), self._at(at)
            issue = self.pull(r, number)
            pull = issue.pull
            assert pull is not None
            if method not in MERGE_METHODS:
                raise invalid("PullRequest", "merge_method", "invalid")
            if issue.state != "open" or pull.merged_at is not None:
                raise GitHubError(405, "Pull Request is not mergeable")
            if pull.draft:
                raise GitHubError(405, "Pull Request is still a draft")
            facts = self.pull_facts(r, issue)
            if sha is not None and sha != facts.head_sha:
                raise GitHubError(409, "Head branch was modified. Review and try the merge again.")
            if not facts.mergeable or facts.head_sha is None:
                raise GitHubError(405, "Pull Request is not mergeable")
            # A protected base takes only a head whose required checks passed.
            passed = r.passed(facts.head_sha)
            for name in r.protection.get(pull.base, ()):
                if name not in passed:
                    raise GitHubError(405, f'Required status check "{name}" is expected.')
            if method == "merge":
                title = (
                    commit_title or f"Merge pull request #{number} from {r.owner.login}/{pull.head}"
                )
                message = issue.title if commit_message is None else commit_message
            else:
                title = commit_title or f"{issue.title} (#{number})"
                message = commit_message or ""
            try:
                merged = r.git.merge(
                    pull.base, facts.head_sha, method, title, message, user.identity
                )
            except GitError as err:
                raise GitHubError(405, "Pull Request is not mergeable") from err
            pull.frozen = facts
            pull.merged_at, pull.merged_by, pull.merge_commit_sha = now, user, merged
            issue.events.append(Event(self._id(), "merged", user, now, commit_id=merged))
            self._set_state(r, issue, "closed", user, now, None)
            issue.updated_at = now
            r.merges += 1
            r.pushed_at = now
            if pull.base == r.default_branch:
                self._close_linked(r, issue, user, now, merged)
            self._closed(r, issue, user)
            return merged

    def merge_by_hand(self, repo: str, number: int, by: str, method: str = "merge") -> str:
        """A person merges pull request ``number`` on GitHub's page; the merge SHA."""
        return self.merge(repo, number, by, method=method)

    def close_pull(self, repo: str, number: int, by: str) -> None:
        """A person closes pull request ``number`` without merging it."""
        self.edit_pull(repo, number, by, state="closed")

    def _close_linked(self, repo: Repo, pr: Issue, by: User, now: datetime, sha: str) -> None:
        # Merging into the default branch closes what the body's closing keywords
        # name: phasegate must never rely on it (its issue closes after verification).
        for match in CLOSING_KEYWORDS.finditer(pr.body or ""):
            target = repo.issues.get(int(match.group(1)))
            if target is not None and target.pull is None and target.state == "open":
                self._set_state(repo, target, "closed", by, now, "completed")
                target.events[-1].commit_id = sha
                target.updated_at = now

    def review(
        self,
        repo: str,
        number: int,
        by: str,
        state: str,
        body: str = "",
        *,
        comments: Iterable[tuple[str, int, str]] = (),
        commit_id: str | None = None,
        at: datetime | None = None,
    ) -> Review:
        """``by`` submits a review of pull request ``number``: ``state`` one of
        APPROVED, CHANGES_REQUESTED, COMMENTED; ``comments`` are inline
        ``(path, line, body)`` on the head's version of the file, each given the
        real diff hunk. ValueError when a line is not in the pull request's diff."""
        if state not in REVIEW_STATES:
            raise ValueError(f"state must be one of {REVIEW_STATES}")
        with self.lock:
            r, user, now = self.repo(repo), self.user(by), self._at(at)
            issue = self.pull(r, number)
            pull = issue.pull
            assert pull is not None
            facts = self.pull_facts(r, issue)
            head = commit_id or facts.head_sha or pull.head_sha
            base = r.git.git("merge-base", facts.base_sha or pull.base_sha, head).strip()
            done = Review(self._id(), user, state, body, head, now)
            for path, line, text in comments:
                hunk = r.git.diff_hunk(base, head, path, line)
                if hunk is None:
                    raise ValueError(f"{path}:{line} is not in the diff of #{number}")
                pull.review_comments.append(
                    ReviewComment(self._id(), done.id, user, text, path, line, hunk, head, now)
                )
            pull.reviews.append(done)
            issue.updated_at = now
            self.announce(
                r,
                "pull_request_review",
                user,
                lambda s: {
                    "action": "submitted",
                    "review": s.review(r, issue, done),
                    "pull_request": s.pull(r, issue, self.pull_facts(r, issue)),
                },
            )
            return done
