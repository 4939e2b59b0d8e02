"""GitLab's merge requests: open, find by source branch, read, update, close, merge, branches.

phasegate's number for merge request ``!N`` is ``numbers.pull_number(N)``
(issues and merge requests count apart on GitLab). A merge request is found
again by its source branch (state all, the newest), so a crash never opens a
second one; a merge by the merge request's ``merged`` state and its merge (or
squash) commit. A merge goes through GitLab's API at the exact head phasegate
checked (``sha``): GitLab answers 409 when the head moved, 406 when the target
conflicts and 405 while a rule of its own holds it (a draft, a pipeline that
must succeed first); 405 and 406 are ``GitLabNotMergeable``.
"""

from __future__ import annotations

import logging
from typing import Any

from gitlab import utils

from phasegate.forge.base import (
    ForgeAuthError,
    ForgeError,
    ForgeNotFound,
    ForgeNotMergeable,
    ForgeUnavailable,
    PullRequest,
)
from phasegate.forge.gitlab.checks import GitLabChecks
from phasegate.forge.gitlab.faults import GitLabRefused
from phasegate.forge.gitlab.numbers import mr_iid, pull_number
from phasegate.forge.texts import login_of

__all__ = ["GitLabMerges", "GitLabNotMergeable"]

log = logging.getLogger(__name__)

_STATES = {"opened": "open", "merged": "merged", "closed": "closed", "locked": "closed"}


class GitLabNotMergeable(GitLabRefused, ForgeNotMergeable):
    """GitLab's 405 or 406 on merging an open merge request: ForgeNotMergeable
    (merge syncs the target again, a conflict forks its resolution), with
    GitLab's status and message."""


class GitLabMerges(GitLabChecks):
    """The merge-request half of ``GitLabForge``."""

    def publish_branch(self, branch: str) -> None:
        if not self.workspace.branch_exists(self.repo, branch):
            raise ForgeError(f"branch {branch} does not exist in {self.repo}")
        self.git_remote().push(branch)

    def create_pull_request(self, head: str, base: str, title: str, body: str) -> int:
        """Open a merge request from ``head`` into ``base``; phasegate's number for it.
        GitLab's 409 (one is open for the branch already: an earlier try made it)
        answers that one."""
        fields = {
            "source_branch": head,
            "target_branch": base,
            "title": self._mr_text(title),
            "description": self._mr_text(body),
        }
        requests = self._project().mergerequests
        try:
            return self._create(
                f"merge request for {head}",
                lambda: pull_number(requests.create(fields).iid),
                lambda: self.find_pull_request(head),
            )
        except GitLabRefused as exc:
            found = self.find_pull_request(head) if exc.status == 409 else None
            if found is None:
                raise
            return found

    def find_pull_request(self, head: str) -> int | None:
        found = self._list(
            self._project().mergerequests,
            source_branch=head,
            state="all",
            order_by="created_at",
            sort="desc",
        )
        # the filter is GitLab's; the check is ours
        iids = [int(mr["iid"]) for mr in found if mr.get("source_branch") == head]
        return pull_number(max(iids)) if iids else None

    def _merge_request(self, number: int) -> dict[str, Any]:
        requests = self._project().mergerequests
        return self._call(lambda: requests.get(mr_iid(number)).attributes)

    def pull_request(self, number: int) -> PullRequest:
        """Merge request ``number`` (phasegate's number, or its plain ``!N``)."""
        return self._pull_of(self._merge_request(number))

    def _pull_of(self, mr: dict[str, Any]) -> PullRequest:
        state = _STATES.get(str(mr["state"]), "closed")
        merged = state == "merged"
        sha = mr.get("merge_commit_sha") or mr.get("squash_commit_sha")
        if merged and not sha:
            sha = mr.get("sha")  # a fast-forward merge: the head is what landed
        return PullRequest(
            pull_number(mr["iid"]),
            str(mr["source_branch"]),
            str(mr["target_branch"]),
            str(mr["title"]),
            mr.get("description") or "",
            state,
            str(sha) if merged and sha else None,
            head_sha=mr.get("sha"),
            merged_by=login_of(mr.get("merged_by") or mr.get("merge_user"), "username") or None,
        )

    def update_pull_request(self, number: int, body: str) -> None:
        requests = self._project().mergerequests
        text = self._mr_text(body)
        self._call(lambda: requests.update(mr_iid(number), {"description": text}))

    def close_pull_request(self, number: int) -> None:
        """Close merge request ``number`` unmerged; one already closed or merged is
        left alone, so a retry after a lost answer changes nothing."""
        if self.pull_request(number).state != "open":
            return
        requests = self._project().mergerequests
        self._call(lambda: requests.update(mr_iid(number), {"state_event": "close"}))

    def delete_branch(self, branch: str) -> None:
        """Delete GitLab's ``branch``; one already gone (404) is no error. Raises
        GitLabRefused for the default branch, ForgeAuthError for a protected one."""
        branches = self._project().branches
        try:
            self._call(lambda: branches.delete(branch))
        except ForgeNotFound:
            log.info("branch %s was already gone from %s", branch, self.repository)

    def merge_pull_request(self, number: int, message: str, head: str | None = None) -> str:
        """Merge at ``head`` (default: the head read now; GitLab answers 409 if it
        moved), squashed when ``forge.merge_method`` is squash (``rebase`` follows
        the project's own merge method); ``message`` is the commit's message. One
        already merged answers its merge SHA; a closed one is ForgeError. The target
        is fetched afterwards (``refs/phasegate/forge/<base>``) so that the merge
        commit is local. Raises GitLabNotMergeable (405, 406), GitLabRefused (409),
        ForgeAuthError (the token's user may not merge into the target)."""
        pr = self.pull_request(number)
        if pr.state == "merged" and pr.merge_sha:
            self._fetch_base(pr.base, pr.merge_sha)
            return pr.merge_sha
        if pr.state != "open":
            raise ForgeError(f"merge request !{mr_iid(number)} on {self.repository} is closed")
        squash = self.settings.merge_method == "squash"
        text = self._mr_text(message).strip()
        data: dict[str, Any] = {"sha": head or pr.head_sha, "squash": squash}
        if text:
            data["squash_commit_message" if squash else "merge_commit_message"] = text
        path = f"/projects/{utils.EncodedId(self.repository)}/merge_requests/{mr_iid(number)}/merge"
        gl = self._gl()
        try:
            answer = self._call(lambda: gl.http_put(path, post_data=data))
        except (GitLabRefused, ForgeUnavailable, ForgeAuthError) as exc:
            sha = self._merged_after(number, exc)
        else:
            merged = self._pull_of(answer).merge_sha if isinstance(answer, dict) else None
            sha = merged or self._merged_after(number, None)
        self._fetch_base(pr.base, sha, always=True)
        return sha

    def _merged_after(self, number: int, exc: ForgeError | None) -> str:
        """The merge SHA once GitLab refused or failed a merge (an earlier try, or a
        person, may have merged it); else the error that says why not."""
        again = self.pull_request(number)
        if again.state == "merged" and again.merge_sha:
            return again.merge_sha
        iid = mr_iid(number)
        if again.state != "open":
            raise ForgeError(f"merge request !{iid} on {self.repository} was closed unmerged")
        if isinstance(exc, GitLabRefused) and exc.status in (405, 406):
            raise GitLabNotMergeable(
                f"GitLab would not merge !{iid} on {self.repository} ({exc.status}): "
                f"{exc.gitlab_message}",
                exc.status,
                exc.gitlab_message,
            ) from exc
        if isinstance(exc, ForgeAuthError) and "(401" in str(exc):
            raise ForgeAuthError(
                f"GitLab would not let {self.auth.credentials} merge !{iid} into "
                f"{again.base} on {self.repository} (401): the branch is protected; give "
                "the token's user the role its protection allows to merge"
            ) from exc
        if exc is None:
            raise ForgeError(f"GitLab answered the merge of !{iid} without merging it")
        raise exc
