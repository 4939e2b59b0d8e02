"""The local forge: issues, comments and pull requests in the store, merges with real git.

The embedded default: no service to run. Branches live in the repository itself,
so publishing a branch is a no-op, and a merge is ``git merge --no-ff`` into
the base branch; one that conflicts (the base moved since the sync) is refused
as not mergeable, nothing merged. Every title, body, comment and merge message is redacted of
``secrets`` (raw or encoded, ``phasegate.core.redaction``) before it is stored or
committed: what an agent wrote reaches them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from phasegate.core.redaction import redact, secrets_in_environment
from phasegate.forge.base import (
    Check,
    CheckState,
    Comment,
    ForgeError,
    ForgeNotFound,
    ForgeNotMergeable,
    Issue,
    Labelled,
    PullRequest,
)
from phasegate.git.command import run_git
from phasegate.git.errors import MergeConflict
from phasegate.git.guard import CONFIG_FILE_VARIABLES, included_configs, user_configs
from phasegate.git.workspace import Workspace
from phasegate.store import Store
from phasegate.store import tables as t

__all__ = ["LocalForge"]


class LocalForge:
    """The local forge of ``repo``. ``secrets`` (default: the environment's secret values;
    the engine passes ``cartridge_secrets``) are redacted from what it records."""

    def __init__(
        self,
        store: Store,
        repo: Path,
        workspace: Workspace,
        secrets: Sequence[str] | None = None,
    ) -> None:
        self.store = store
        self.repo = repo
        self.key = str(repo.resolve())
        self.workspace = workspace
        self.secrets = list(secrets_in_environment(os.environ) if secrets is None else secrets)

    def _clean(self, text: str) -> str:
        return redact(text, self.secrets)

    # -- issues -----------------------------------------------------------------

    def create_issue(self, title: str, body: str, marker: str) -> int:
        return self.store.forge_insert(
            t.forge_issues,
            self.key,
            title=self._clean(title),
            body=self._clean(body),
            state="open",
            marker=marker,
        )

    def find_issue(self, marker: str) -> int | None:
        rows = self.store.forge_rows(t.forge_issues, self.key, marker=marker)
        return rows[0]["number"] if rows else None

    def issue(self, number: int) -> Issue:
        rows = self.store.forge_rows(t.forge_issues, self.key, number=number)
        if not rows:
            raise ForgeError(f"no issue #{number} in {self.key}")
        r = rows[0]
        return Issue(r["number"], r["title"], r["body"], r["state"])

    def close_issue(self, number: int) -> None:
        self.issue(number)
        self.store.forge_update(
            t.forge_issues, self.key, number, state="closed", closed_at=self.store.clock.now()
        )

    def link_sub_issue(self, parent: int, child: int) -> None:
        self.issue(parent)
        self.issue(child)
        self.store.forge_update(t.forge_issues, self.key, child, parent=parent)

    def parent_issue(self, child: int) -> int | None:
        rows = self.store.forge_rows(t.forge_issues, self.key, number=child)
        if not rows:
            raise ForgeError(f"no issue #{child} in {self.key}")
        found = rows[0].get("parent")
        return int(found) if found is not None else None

    def set_status_label(self, number: int, label: str | None) -> None:
        """Status labels are GitHub's way of showing a phase: the local forge's
        people read ``phasegate status`` instead."""
        self.issue(number)

    def labelled_issues(self, label: str) -> list[Labelled]:
        return []  # no one labels local issues: tickets come from `phasegate run`

    def permission(self, login: str) -> str:
        return "admin"  # the local forge's only person is the one at the terminal

    def issues(self) -> list[Issue]:
        return [
            Issue(r["number"], r["title"], r["body"], r["state"])
            for r in self.store.forge_rows(t.forge_issues, self.key)
        ]

    # -- comments ---------------------------------------------------------------

    def comment(self, issue_number: int, body: str, marker: str) -> int:
        return self.store.forge_add_comment(self.key, issue_number, self._clean(body), marker)

    def find_comment(self, issue_number: int, marker: str) -> int | None:
        rows = self.store.forge_rows(
            t.forge_comments, self.key, issue_number=issue_number, marker=marker
        )
        return rows[0]["id"] if rows else None

    def comments(self, number: int, since: datetime | None = None) -> list[Comment]:
        return []  # the local forge's comments are phasegate's own; people use the CLI

    def comment_rows(self, issue_number: int | None = None) -> list[dict[str, object]]:
        """The stored comments (phasegate's own), of one issue or all."""
        where = {} if issue_number is None else {"issue_number": issue_number}
        return self.store.forge_rows(t.forge_comments, self.key, **where)

    # -- pull requests ----------------------------------------------------------

    def branch_ref(self, branch: str) -> str:
        """``branch`` itself when the repository has it; else ``origin``'s, fetched
        with plain git into ``refs/remotes/origin/<branch>`` (a clone elsewhere may
        have pushed it). Raises ForgeNotFound when neither has it."""
        if self.workspace.branch_exists(self.repo, branch):
            return branch
        if self._may_have_origin() and (
            run_git(["remote", "get-url", "origin"], self.repo).returncode == 0
        ):
            tracking = f"refs/remotes/origin/{branch}"
            fetch = ["fetch", "-q", "origin", f"+refs/heads/{branch}:{tracking}"]
            if run_git(fetch, self.repo).returncode == 0:
                return tracking
        raise ForgeNotFound(f"no branch {branch} in {self.repo} nor on its origin remote")

    def _may_have_origin(self) -> bool:
        """Whether ``origin`` may be a remote here; False only when no config file git
        reads (the repository's, the global and system ones, what they include)
        says ``remote`` or ``include`` at all, no ``GIT_CONFIG_*`` passes settings
        and git's old ``remotes/``/``branches/`` files have none: then there is
        none, and saying so costs no git (as the guard finds a
        hooks path)."""
        if any(k.startswith("GIT_CONFIG_") and k not in CONFIG_FILE_VARIABLES for k in os.environ):
            return True
        common = self.workspace.common_dir(self.repo)
        if (common / "remotes" / "origin").exists() or (common / "branches" / "origin").exists():
            return True
        for config in included_configs(
            [common / "config", common / "config.worktree", *user_configs()]
        ):
            try:
                text = config.read_bytes().lower()
            except OSError:
                continue  # absent (most are): no remote there
            if b"remote" in text or b"include" in text:
                return True
        return False

    def publish_branch(self, branch: str) -> None:
        if not self.workspace.branch_exists(self.repo, branch):
            raise ForgeError(f"branch {branch} does not exist in {self.repo}")

    def create_pull_request(self, head: str, base: str, title: str, body: str) -> int:
        return self.store.forge_insert(
            t.forge_pull_requests,
            self.key,
            head=head,
            base=base,
            title=self._clean(title),
            body=self._clean(body),
            state="open",
        )

    def find_pull_request(self, head: str) -> int | None:
        rows = self.store.forge_rows(t.forge_pull_requests, self.key, head=head)
        return rows[-1]["number"] if rows else None

    def pull_request(self, number: int) -> PullRequest:
        rows = self.store.forge_rows(t.forge_pull_requests, self.key, number=number)
        if not rows:
            raise ForgeError(f"no pull request #{number} in {self.key}")
        r = rows[0]
        return PullRequest(
            r["number"], r["head"], r["base"], r["title"], r["body"], r["state"], r["merge_sha"]
        )

    def pull_requests(self) -> list[PullRequest]:
        return [
            self.pull_request(r["number"])
            for r in self.store.forge_rows(t.forge_pull_requests, self.key)
        ]

    def checks(self, sha: str) -> list[Check]:
        return []  # no CI: the local forge's checks are landing_areas.checks

    def required_checks(self, branch: str, *, fresh: bool = False) -> list[str]:
        return []  # nothing protects a local branch but the merge gate

    def set_commit_status(self, sha: str, state: CheckState, description: str) -> None:
        return None  # no CI to tell

    def update_pull_request(self, number: int, body: str) -> None:
        self.pull_request(number)
        self.store.forge_update(t.forge_pull_requests, self.key, number, body=self._clean(body))

    def close_pull_request(self, number: int) -> None:
        if self.pull_request(number).state == "open":
            self.store.forge_update(t.forge_pull_requests, self.key, number, state="closed")

    def delete_branch(self, branch: str) -> None:
        """The local forge's branches are the repository's: cleanup deletes them
        with git, so there is nothing more to delete here."""

    def merge_pull_request(self, number: int, message: str, head: str | None = None) -> str:
        pr = self.pull_request(number)
        if pr.state == "merged" and pr.merge_sha:
            return pr.merge_sha
        if pr.state != "open":
            raise ForgeError(f"pull request #{number} is {pr.state}")
        if head is not None and self.workspace.rev(self.repo, pr.head) != head:
            raise ForgeNotMergeable(f"{pr.head} moved since {head[:12]} was checked")
        try:
            sha = self.workspace.merge_into_base(self.repo, pr.base, pr.head, self._clean(message))
        except MergeConflict as exc:
            # The base moved since the branch was synced (a sibling merged first): refused
            # as GitHub refuses it, so the merge phase syncs again and forks the conflict.
            raise ForgeNotMergeable(f"{pr.head} conflicts with {pr.base}: {exc}") from exc
        self._record_merge(number, sha)
        return sha

    def find_merge(self, number: int) -> str | None:
        pr = self.pull_request(number)
        if pr.merge_sha:
            return pr.merge_sha
        if not self.workspace.branch_exists(self.repo, pr.head):
            return None
        sha = self.workspace.find_merge_commit(
            self.repo, pr.base, self.workspace.rev(self.repo, pr.head)
        )
        if sha:
            self._record_merge(number, sha)
        return sha

    def _record_merge(self, number: int, sha: str) -> None:
        self.store.forge_update(
            t.forge_pull_requests,
            self.key,
            number,
            state="merged",
            merge_sha=sha,
            merged_at=self.store.clock.now(),
        )
