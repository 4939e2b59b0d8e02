"""The fake Gitea's reviews, commit statuses, branch protection and merges.

``Merging`` is mixed into ``Gitea`` (gitea_state.py): a review with line
comments (each at a new-file position of the pull request's diff, its hunk
cut by git), a commit status and the combined state of a commit, a branch
protection rule, and the merge itself with real git on the bare repository,
refused as Gitea's ``MergePullRequest`` refuses: 405 with Gitea's message
while protection (required status contexts, approvals, requested changes)
holds it, 409 when the head moved from ``head_commit_id`` or git conflicts.
"""

from __future__ import annotations

import fnmatch
import threading
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from support.gitea_guard import install
from support.gitea_hooks import review_payload, status_payload
from support.gitea_model import (
    Event,
    GiteaError,
    Issue,
    Protection,
    Repo,
    Review,
    ReviewComment,
    Status,
    User,
    not_found,
)
from support.github_git import GitError, Identity

if TYPE_CHECKING:
    from support.gitea_json import Shapes

__all__ = ["REVIEW_EVENTS", "STATUS_STATES", "Merging"]

STATUS_STATES = ("pending", "success", "error", "failure", "warning", "skipped")
#: Worst first: the combined state is the worst of each context's newest status.
_WORST = ("error", "failure", "pending", "warning", "success", "skipped")
REVIEW_EVENTS = ("APPROVED", "REQUEST_CHANGES", "COMMENT", "PENDING")


class Merging:
    """Reviews, statuses, protection and merges of ``Gitea`` (its other half)."""

    lock: threading.RLock
    clock: Callable[[], datetime]
    users: dict[str, User]

    def next_id(self, kind: str) -> int:
        raise NotImplementedError

    def announce(self, repo: Repo, kind: str, render: Callable[[Shapes], dict[str, Any]]) -> None:
        raise NotImplementedError

    def repo(self, full_name: str) -> Repo:
        raise NotImplementedError

    def pull(self, repo: Repo, number: int) -> Issue:
        raise NotImplementedError

    def head_sha(self, repo: Repo, issue: Issue) -> str | None:
        raise NotImplementedError

    def merge_base(self, repo: Repo, issue: Issue) -> str | None:
        raise NotImplementedError

    def mergeable(self, repo: Repo, issue: Issue) -> bool:
        raise NotImplementedError

    def announce_issue(self, repo: Repo, issue: Issue, actor: User, kind: str, action: str) -> None:
        raise NotImplementedError

    # -- reviews -------------------------------------------------------------------------------
    def review(
        self,
        repo: Repo,
        issue: Issue,
        actor: User,
        event: str,
        body: str = "",
        comments: list[dict[str, Any]] | None = None,
        commit_id: str | None = None,
    ) -> Review:
        """A review of pull request ``issue`` (``APPROVED``, ``REQUEST_CHANGES``,
        ``COMMENT``), its line comments at new-file ``new_position`` of ``path``."""
        assert issue.pull is not None
        event = event or "PENDING"
        if event not in REVIEW_EVENTS:
            raise GiteaError(422, f"unknown review state: {event}")
        if event in ("APPROVED", "REQUEST_CHANGES") and actor.id == issue.user.id:
            verb = "approve" if event == "APPROVED" else "reject"
            raise GiteaError(422, f"{verb} your own pull is not allowed")
        if event == "REQUEST_CHANGES" and not body.strip() and not comments:
            raise GiteaError(422, "review event REQUEST_CHANGES requires a body or a comment")
        head = self.head_sha(repo, issue) or ""
        base = self.merge_base(repo, issue) or ""
        now = self.clock()
        review = Review(
            self.next_id("review"), actor, event, body, commit_id or head, now,
            official=repo.can(actor, "write"),
        )  # fmt: skip
        for given in comments or ():
            new = int(given.get("new_position") or 0)
            old = int(given.get("old_position") or 0)
            path = str(given.get("path") or "")
            hunk = repo.bare.diff_hunk(base, head, path, new) if new and base and head else None
            review.comments.append(
                ReviewComment(
                    self.next_id("comment"),
                    review.id,
                    str(given.get("body") or ""),
                    actor,
                    path,
                    new,
                    old,
                    review.commit_id,
                    hunk or "",
                    now,
                )  # fmt: skip
            )
        issue.pull.reviews.append(review)
        issue.updated_at = now
        issue.events.append(Event(self.next_id("comment"), "review", actor, now, body=body))
        if event != "PENDING":
            kind = {"APPROVED": "pull_request_review_approved",
                    "REQUEST_CHANGES": "pull_request_review_rejected"}.get(
                event, "pull_request_review_comment")  # fmt: skip
            self.announce(repo, kind, lambda s: review_payload(s, repo, issue, review, kind))
        return review

    def line_comment(
        self, full_name: str, number: int, login: str, path: str, line: int, body: str
    ) -> Review:
        """A person's review with one comment on new-file line ``line`` of ``path``."""
        with self.lock:
            repo = self.repo(full_name)
            return self.review(
                repo, self.pull(repo, number), self.users[login], "COMMENT", "",
                [{"path": path, "new_position": line, "body": body}],
            )  # fmt: skip

    # -- statuses and protection ---------------------------------------------------------------
    def post_status(
        self,
        repo: Repo,
        actor: User,
        sha: str,
        state: str,
        context: str = "default",
        target_url: str = "",
        description: str = "",
    ) -> Status:
        if state not in STATUS_STATES:
            raise GiteaError(422, f"invalid state: {state}")
        full = repo.bare.sha(sha)
        if full is None:
            raise GiteaError(422, f"object does not exist [id: {sha}, rel_path: ]")
        status = Status(
            self.next_id("status"), full, state, context or "default", actor, self.clock(),
            target_url or "", description or "",
        )  # fmt: skip
        repo.statuses.append(status)
        self.announce(repo, "status", lambda s: status_payload(s, repo, status))
        return status

    def latest_statuses(self, repo: Repo, sha: str) -> list[Status]:
        """The newest status of each context of ``sha``, newest first."""
        latest: dict[str, Status] = {}
        for status in repo.statuses:
            if status.sha == sha:
                latest[status.context] = status
        return sorted(latest.values(), key=lambda s: s.id, reverse=True)

    def combined_state(self, statuses: list[Status]) -> str:
        states = {s.state for s in statuses}
        return next((s for s in _WORST if s in states), "")

    def protect(self, repo: Repo, rule_name: str, options: dict[str, Any]) -> Protection:
        if any(p.rule_name == rule_name for p in repo.protections):
            raise GiteaError(403, "Branch protection already exist")
        now = self.clock()
        rule = Protection(
            rule_name, now, now,
            enable_push=bool(options.get("enable_push", False)),
            enable_status_check=bool(options.get("enable_status_check", False)),
            status_check_contexts=list(options.get("status_check_contexts") or []),
            required_approvals=int(options.get("required_approvals") or 0),
            block_on_rejected_reviews=bool(options.get("block_on_rejected_reviews", False)),
            block_admin_merge_override=bool(options.get("block_admin_merge_override", False)),
            options=dict(options),
        )  # fmt: skip
        repo.protections.append(rule)
        install(repo)  # pushes are held to it too
        return rule

    def blocked(self, repo: Repo, issue: Issue) -> str | None:
        """Why branch protection holds this pull request's merge (Gitea's
        ``CheckPullBranchProtections`` reasons, in its order), or None."""
        assert issue.pull is not None
        rule = repo.protection(issue.pull.base)
        if rule is None:
            return None
        head = self.head_sha(repo, issue) or ""
        if rule.enable_status_check:
            latest = self.latest_statuses(repo, head)
            for pattern in rule.status_check_contexts:
                matched = [s for s in latest if fnmatch.fnmatchcase(s.context, pattern)]
                if not matched or self.combined_state(matched) != "success":
                    return "Not all required status checks successful"
        reviews = self._latest_reviews(issue)
        if rule.required_approvals:
            approvals = sum(r.state == "APPROVED" and r.official for r in reviews)
            if approvals < rule.required_approvals:
                return "Does not have enough approvals"
        if rule.block_on_rejected_reviews and any(
            r.state == "REQUEST_CHANGES" and r.official for r in reviews
        ):
            return "There are requested changes"
        return None

    def _latest_reviews(self, issue: Issue) -> list[Review]:
        assert issue.pull is not None
        latest: dict[int, Review] = {}
        for review in issue.pull.reviews:
            if review.state in ("APPROVED", "REQUEST_CHANGES") and not review.dismissed:
                latest[review.user.id] = review
        return list(latest.values())

    # -- merging -------------------------------------------------------------------------------
    def merge(self, repo: Repo, issue: Issue, actor: User, form: dict[str, Any]) -> None:
        """``POST .../merge`` as Gitea's ``MergePullRequest`` does it: 404 once
        closed, 405 (with Gitea's message) when it may not be merged yet, 409 on
        a conflict or a head that moved from ``head_commit_id``; else a merge
        (``Do``: merge, squash, rebase, fast-forward-only) on the bare repository."""
        pull = issue.pull
        assert pull is not None
        form = {k.lower(): v for k, v in form.items()}  # Go binds JSON keys in any case
        if pull.merged:
            raise GiteaError(405, "")
        if issue.state != "open":
            raise not_found()
        if not repo.can(actor, "write"):
            raise GiteaError(405, "User not allowed to merge PR")
        if issue.draft:
            raise GiteaError(405, "Work in progress PRs cannot be merged")
        if not self.mergeable(repo, issue):
            raise GiteaError(405, "Please try again later")
        reason = self.blocked(repo, issue)
        rule = repo.protection(pull.base)
        force = bool(form.get("force_merge")) and repo.can(actor, "admin")
        if reason is not None and not (force and rule and not rule.block_admin_merge_override):
            raise GiteaError(405, f"not allowed to merge [reason: {reason}]")
        style = str(form.get("do") or "merge")
        if style not in ("merge", "squash", "rebase", "rebase-merge", "fast-forward-only"):
            raise GiteaError(
                405, f"{style} is not allowed an allowed merge style for this repository"
            )
        head = self.head_sha(repo, issue)
        assert head is not None
        if form.get("head_commit_id") and form["head_commit_id"] != head:
            raise GiteaError(409, "head out of date")
        base_sha = repo.bare.branch_sha(pull.base)
        assert base_sha is not None
        title = str(form.get("mergetitlefield") or "").strip()
        title = title or self._default_title(repo, issue, style)
        message = str(form.get("mergemessagefield") or "")
        try:
            if style == "fast-forward-only":
                if repo.bare.git("merge-base", base_sha, head).strip() != base_sha:
                    raise GiteaError(409, "merge push out of date")
                repo.bare.git("update-ref", f"refs/heads/{pull.base}", head, base_sha)
                new = head
            else:
                method = {"rebase-merge": "merge"}.get(style, style)
                new = repo.bare.merge(
                    pull.base, head, method, title, message.strip(),
                    Identity(actor.full_name, actor.email),
                )  # fmt: skip
        except GitError as failed:
            raise GiteaError(409, f"Merge: {failed}") from None
        now = self.clock()
        pull.merged, pull.merged_at, pull.merged_by = True, now, actor
        pull.merge_commit_sha, pull.merged_head, pull.merged_base = new, head, base_sha
        issue.state, issue.closed_at, issue.updated_at = "closed", now, now
        issue.events.append(Event(self.next_id("comment"), "merge_pull", actor, now))
        self.announce_issue(repo, issue, actor, "pull_request", "closed")
        if form.get("delete_branch_after_merge") and pull.head != repo.default_branch:
            still = any(
                o.pull and o.state == "open" and o.pull.head == pull.head
                for o in repo.issues.values()
            )
            if not still and repo.protection(pull.head) is None:
                repo.bare.git("update-ref", "-d", f"refs/heads/{pull.head}")

    def _default_title(self, repo: Repo, issue: Issue, style: str) -> str:
        assert issue.pull is not None
        if style == "squash":
            return f"{issue.title} (#{issue.number})"
        return (
            f"Merge pull request '{issue.title}' (#{issue.number}) from {issue.pull.head} "
            f"into {issue.pull.base}"
        )

    def delete_branch(self, repo: Repo, actor: User, branch: str) -> None:
        if not repo.can(actor, "write"):
            raise GiteaError(403, "user should have a permission to write to a repo")
        if repo.bare.branch_sha(branch) is None:
            raise not_found(f"branch does not exist [name: {branch}]")
        if branch == repo.default_branch:
            raise GiteaError(403, "can not delete default branch")
        if repo.protection(branch) is not None:
            raise GiteaError(403, "branch protected")
        repo.bare.git("update-ref", "-d", f"refs/heads/{branch}")
