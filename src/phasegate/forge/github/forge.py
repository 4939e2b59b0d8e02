"""The GitHub forge: the lifecycle's forge calls on a team's GitHub repository,
through githubkit.

How each effect is found again (docs/contracts/lifecycle.md: journaled side
effects), so a crash never duplicates it:

- an issue: the hidden marker ``<!-- phasegate:... -->`` its body ends with
  (``find_issue`` scans the repository's issues, state all, newest first, by
  phasegate's own login when it is known);
- a comment: the same marker in its body;
- a pull request: its head branch (``head=OWNER:BRANCH``, state all, the newest);
- a merge: the pull request's ``merged`` state and merge SHA;
- a branch: pushing again is harmless (forced: phasegate owns its branches).

A POST that creates one of them and gets a 5xx is looked up before it is tried
again, never repeated blind; one that timed out is ForgeUnavailable at once, for
the journal to look up on resume (``GitHubAPI._create``). Every other call is
retried by githubkit within ``forge.max_retries`` and ``forge.max_rate_limit_wait_s``
(``github_faults``). What GitHub answers is read as JSON (``GitHubAPI._list``).

Nothing phasegate sends closes an issue by itself: a closing keyword (``Closes
#3``, ``fixes owner/repo#3``) in a pull request's body or a merge's message
becomes ``Implements``, so merging leaves the issue open until verification.
Every title, body, comment and merge message is redacted of ``secrets`` and of
the forge's own tokens.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime
from typing import Any
from urllib.parse import quote

from phasegate.forge.base import (
    PERMISSIONS,
    STATUS_LABEL_PREFIX,
    Comment,
    ForgeError,
    ForgeNotFound,
    ForgeNotMergeable,
    ForgeUnavailable,
    Issue,
    Labelled,
    PullRequest,
)
from phasegate.forge.github.api import (
    CHECK_OUTPUT_BYTES,
    PAGE,
    fit,
    labels_of,
    login_of,
    marker_comment,
    neutralize_closing,
    timestamp,
)
from phasegate.forge.github.checks import GitHubChecks
from phasegate.forge.github.faults import GitHubRefused

__all__ = [
    "CHECK_OUTPUT_BYTES",
    "GitHubForge",
    "GitHubNotMergeable",
    "marker_comment",
    "neutralize_closing",
]

log = logging.getLogger(__name__)

#: The colour of the status labels phasegate creates.
STATUS_LABEL_COLOR = "5319e7"

_OWN_MARKER = re.compile(r"<!--\s*phasegate:")
_TRAILING_MARKER = re.compile(r"\s*<!-- phasegate:[^>]*-->\s*$")


class GitHubNotMergeable(GitHubRefused, ForgeNotMergeable):
    """GitHub's 405 on merging an open pull request: ForgeNotMergeable (merge syncs
    the base again, a conflict forks its resolution), with GitHub's status and message."""


class GitHubForge(GitHubChecks):
    """The Forge protocol (``phasegate.forge.base``) on the GitHub repository
    ``repository`` (owner/name), for the local clone ``repo``.

    ``auth`` (``github_auth.forge_auth``) signs the calls; ``settings`` is the
    cartridge's ``[forge]`` (base_url, timeout_s, merge_method, the retry bounds);
    ``secrets`` are redacted from everything sent. ``retry_backoff_s`` is the first
    wait after a transient failure (doubled per try, 8 s at most).

    Every method raises ForgeError or a subclass (``github_faults``):
    ForgeUnavailable, ForgeAuthError (naming the token variable or the permission),
    ForgeNotFound (naming the repository), GitHubRefused.
    """

    # -- issues -------------------------------------------------------------------

    def create_issue(self, title: str, body: str, marker: str) -> int:
        text = fit(self._clean(body), f"\n\n{marker_comment(marker)}")
        return self._create(
            f"issue {marker}",
            lambda rest: rest.issues.create(
                self.owner, self.name, title=self._clean(title), body=text
            ).json()["number"],
            lambda: self.find_issue(marker),
        )

    def find_issue(self, marker: str) -> int | None:
        """The issue whose body holds ``marker``'s hidden comment: every issue of the
        repository is read (state all, newest first), only phasegate's own when its
        login is known (an App's bot; a token's is not asked for)."""
        hidden = marker_comment(marker)
        login = self.auth.login()
        issues = self._list(
            lambda rest: rest.issues.list_for_repo,
            self.owner,
            self.name,
            state="all",
            sort="created",
            direction="desc",
            **({"creator": login} if login else {}),
        )
        for issue in issues:
            if not issue.get("pull_request") and hidden in (issue.get("body") or ""):
                return int(issue["number"])
        return None

    def issue(self, number: int) -> Issue:
        found = self._get(lambda rest: rest.issues.get(self.owner, self.name, number))
        self._is_pull[number] = bool(found.get("pull_request"))
        return self._issue(found)

    def _issue(self, found: dict[str, Any]) -> Issue:
        # phasegate's own marker is bookkeeping: the issue's text is what came before it
        body = _TRAILING_MARKER.sub("", found.get("body") or "")
        return Issue(
            int(found["number"]),
            found["title"],
            body,
            found["state"],
            author=login_of(found.get("user")),
            labels=labels_of(found.get("labels") or ()),
            pull_request=bool(found.get("pull_request")),
        )

    def link_sub_issue(self, parent: int, child: int) -> None:
        """File issue ``child`` under issue ``parent`` as its sub-issue (GitHub names the
        child by its id, not its number)."""
        child_id = int(self._get(lambda rest: rest.issues.get(self.owner, self.name, child))["id"])
        self._api(
            lambda rest: rest.issues.add_sub_issue(
                self.owner, self.name, parent, sub_issue_id=child_id
            )
        )

    def parent_issue(self, child: int) -> int | None:
        """The issue ``child`` is a sub-issue of (GitHub answers 404 for none), else None."""
        try:
            found = self._get(lambda rest: rest.issues.get_parent(self.owner, self.name, child))
        except ForgeNotFound:
            return None
        return int(found["number"])

    def close_issue(self, number: int) -> None:
        self._api(
            lambda rest: rest.issues.update(
                self.owner, self.name, number, state="closed", state_reason="completed"
            )
        )

    def set_status_label(self, number: int, label: str | None) -> None:
        """Add ``label`` (one call, which answers with the issue's labels), then
        remove every other status label it finds there: two calls a change."""
        if label is not None and not label.startswith(STATUS_LABEL_PREFIX):
            raise ForgeError(
                f"{label!r} is no status label (they start with {STATUS_LABEL_PREFIX})"
            )
        if label is None:
            current = self.issue(number).labels
        else:
            # Adding answers with every label the issue now has: no read before it.
            self._ensure_label(label)
            added = self._get(
                lambda rest: rest.issues.add_labels(self.owner, self.name, number, labels=[label])
            )
            current = labels_of(added)
        for stale in current:
            if stale.startswith(STATUS_LABEL_PREFIX) and stale != label:
                self._remove_label(number, stale)

    def _remove_label(self, number: int, name: str) -> None:
        try:
            self._api(lambda rest: rest.issues.remove_label(self.owner, self.name, number, name))
        except ForgeNotFound:
            log.info("label %s was already gone from #%s", name, number)

    def _ensure_label(self, name: str) -> None:
        if self._repo_labels is None:
            found = self._list(lambda rest: rest.issues.list_labels_for_repo, self.owner, self.name)
            self._repo_labels = {x["name"] for x in found}
        if name in self._repo_labels:
            return
        try:
            self._api(
                lambda rest: rest.issues.create_label(
                    self.owner,
                    self.name,
                    name=name,
                    color=STATUS_LABEL_COLOR,
                    description="phasegate's workflow status",
                )
            )
        except GitHubRefused as exc:
            # another worker made it between our list and our create: it exists,
            # which is all that was wanted (any other 422 is a real refusal)
            if exc.status != 422 or "already_exists" not in exc.github_message:
                raise
            log.debug("label %s was made meanwhile by another worker", name)
        self._repo_labels.add(name)

    def labelled_issues(self, label: str) -> list[Labelled]:
        issues = self._list(
            lambda rest: rest.issues.list_for_repo,
            self.owner,
            self.name,
            state="open",
            labels=label,
        )
        found = []
        for item in issues:
            issue = self._issue(item)
            if issue.pull_request:
                continue
            by = self._labelled_by(item["number"], label)
            if by is None:
                log.warning(
                    "#%s carries %s but no labeled event says who added it", item["number"], label
                )
                continue
            found.append(Labelled(issue, by[0], by[1]))
        return found

    def _labelled_by(self, number: int, label: str) -> tuple[str, datetime] | None:
        events = self._list(lambda rest: rest.issues.list_events, self.owner, self.name, number)
        last = None
        for event in events:
            named = (event.get("label") or {}).get("name")
            if event.get("event") == "labeled" and named == label:
                last = (login_of(event.get("actor")), timestamp(event["created_at"]))
        return last

    def permission(self, login: str) -> str:
        try:
            found = self._get(
                lambda rest: rest.repos.get_collaborator_permission_level(
                    self.owner, self.name, login
                )
            )
        except ForgeNotFound:
            return "none"  # no such user, or not one GitHub will say anything about
        # role_name says maintain and triage; permission folds them into write and read
        for said in (found.get("role_name"), found.get("permission")):
            if said in PERMISSIONS:
                return str(said)
        return "none"

    # -- comments -----------------------------------------------------------------

    def comment(self, issue_number: int, body: str, marker: str) -> int:
        hidden = marker_comment(marker)
        # the marker goes last whatever the caller put where: cutting a long body
        # must never cut it off
        text = fit(self._clean(body).replace(hidden, "").rstrip(), f"\n\n{hidden}")
        return self._create(
            f"comment {marker}",
            lambda rest: rest.issues.create_comment(
                self.owner, self.name, issue_number, body=text
            ).json()["id"],
            lambda: self.find_comment(issue_number, marker),
        )

    def find_comment(self, issue_number: int, marker: str) -> int | None:
        hidden = marker_comment(marker)
        for found in self._issue_comments(issue_number, None):
            if hidden in (found.get("body") or ""):
                return int(found["id"])
        return None

    def _issue_comments(self, number: int, since: datetime | None) -> list[dict[str, Any]]:
        return self._list(
            lambda rest: rest.issues.list_comments,
            self.owner,
            self.name,
            number,
            **({"since": since} if since is not None else {}),
        )

    def _pull(self, number: int) -> bool:
        if number not in self._is_pull:
            self.issue(number)
        return self._is_pull[number]

    def comments(self, number: int, since: datetime | None = None) -> list[Comment]:
        """Conversation comments; for a pull request also its submitted reviews (those
        with a verdict or a text: a bare COMMENTED review only holds inline comments)
        and inline comments (path, line in the new file, else the original line, diff
        hunk). Anything holding a ``<!-- phasegate:`` marker is phasegate's own and
        left out; ``since`` is exclusive."""
        said = [
            Comment(
                c["id"], login_of(c.get("user")), c.get("body") or "", timestamp(c["created_at"])
            )
            for c in self._issue_comments(number, since)
        ]
        if self._pull(number):
            said += self._reviews(number) + self._inline(number, since)
        return sorted(
            (
                c
                for c in said
                if not _OWN_MARKER.search(c.body) and (since is None or c.created_at > since)
            ),
            key=lambda c: (c.created_at, c.id),
        )

    def _reviews(self, number: int) -> list[Comment]:
        reviews = self._list(lambda rest: rest.pulls.list_reviews, self.owner, self.name, number)
        said = []
        for review in reviews:
            state = str(review.get("state", "")).lower()
            body = review.get("body") or ""
            # a pending review is not sent yet; a bare "commented" one only holds inline comments
            if (
                state == "pending"
                or not review.get("submitted_at")
                or (state == "commented" and not body)
            ):
                continue
            said.append(
                Comment(
                    review["id"],
                    login_of(review.get("user")),
                    body,
                    timestamp(review["submitted_at"]),
                    kind="review",
                    review_state=state,
                )
            )
        return said

    def _inline(self, number: int, since: datetime | None) -> list[Comment]:
        found = self._list(
            lambda rest: rest.pulls.list_review_comments,
            self.owner,
            self.name,
            number,
            **({"since": since} if since is not None else {}),
        )
        return [
            Comment(
                c["id"],
                login_of(c.get("user")),
                c.get("body") or "",
                timestamp(c["created_at"]),
                kind="inline",
                path=c.get("path"),
                line=c.get("line") or c.get("original_line"),
                diff_hunk=c.get("diff_hunk"),
            )
            for c in found
        ]

    # -- branches, pull requests, CI ------------------------------------------------

    def publish_branch(self, branch: str) -> None:
        if not self.workspace.branch_exists(self.repo, branch):
            raise ForgeError(f"branch {branch} does not exist in {self.repo}")
        self.git_remote().push(branch)

    def create_pull_request(self, head: str, base: str, title: str, body: str) -> int:
        try:
            return self._create(
                f"pull request for {head}",
                lambda rest: rest.pulls.create(
                    self.owner,
                    self.name,
                    title=self._pr_text(title),
                    head=head,
                    base=base,
                    body=self._pr_text(body),
                ).json()["number"],
                lambda: self.find_pull_request(head),
            )
        except GitHubRefused as exc:
            # 422 "A pull request already exists for owner:head": another try made it
            found = self.find_pull_request(head) if exc.status == 422 else None
            if found is None:
                raise
            return found

    def find_pull_request(self, head: str) -> int | None:
        found = self._get(
            lambda rest: rest.pulls.list(
                self.owner,
                self.name,
                head=f"{self.owner}:{head}",
                state="all",
                sort="created",
                direction="desc",
                per_page=PAGE,
            )
        )
        # the filter is GitHub's; the check is ours (a server that ignored it would
        # hand back another branch's pull request)
        numbers = [int(pr["number"]) for pr in found if pr["head"]["ref"] == head]
        return max(numbers) if numbers else None

    def pull_request(self, number: int) -> PullRequest:
        pr = self._get(lambda rest: rest.pulls.get(self.owner, self.name, number))
        self._is_pull[number] = True
        merged = bool(pr.get("merged")) or bool(pr.get("merged_at"))
        return PullRequest(
            int(pr["number"]),
            pr["head"]["ref"],
            pr["base"]["ref"],
            pr["title"],
            pr.get("body") or "",
            "merged" if merged else pr["state"],
            pr.get("merge_commit_sha") if merged else None,
            head_sha=pr["head"]["sha"],
            merged_by=login_of(pr.get("merged_by")) or None,
        )

    def update_pull_request(self, number: int, body: str) -> None:
        self._api(
            lambda rest: rest.pulls.update(self.owner, self.name, number, body=self._pr_text(body))
        )

    def close_pull_request(self, number: int) -> None:
        """Close pull request ``number`` unmerged (``PATCH .../pulls/N`` state closed);
        one already closed or merged is left alone, so a retry after a lost answer
        changes nothing."""
        if self.pull_request(number).state != "open":
            return
        self._api(lambda rest: rest.pulls.update(self.owner, self.name, number, state="closed"))

    def delete_branch(self, branch: str) -> None:
        """Delete GitHub's ``branch`` (``DELETE .../git/refs/heads/<branch>``, its
        slashes sent as ``%2F``). GitHub's 422 "Reference does not exist" means
        gone already (an earlier try, or the repository deletes merged heads
        itself): no error. Raises GitHubRefused for another 422 (a protected
        branch), ForgeUnavailable, ForgeAuthError."""
        ref = quote(f"heads/{branch}", safe="")
        try:
            self._api(lambda rest: rest.git.delete_ref(self.owner, self.name, ref))
        except GitHubRefused as exc:
            if exc.status != 422 or "does not exist" not in exc.github_message:
                raise
            log.info("branch %s was already gone from %s", branch, self.repository)

    def merge_pull_request(self, number: int, message: str, head: str | None = None) -> str:
        """Merge with ``forge.merge_method`` at ``head`` (default: the head phasegate
        reads now; GitHub refuses with 409 if it moved since); ``message``'s first
        line is the commit title. A pull request already merged (by an earlier try,
        or a person) answers its merge SHA. GitHub's 405 on a pull request still
        open is GitHubNotMergeable (a ForgeNotMergeable: it conflicts with the base,
        or a rule of GitHub's holds it), a 409 GitHubRefused with its status; a
        closed one is ForgeError. The base is fetched afterwards
        (``refs/phasegate/forge/<base>``) so that the merge commit is local."""
        pr = self.pull_request(number)
        if pr.state == "merged" and pr.merge_sha:
            self._fetch_base(pr.base, pr.merge_sha)
            return pr.merge_sha
        if pr.state != "open":
            raise ForgeError(f"pull request #{number} on {self.repository} is closed unmerged")
        title, _, text = self._pr_text(message).partition("\n")
        # sha: GitHub merges only the head phasegate checked (409 if it moved)
        said = {
            "sha": head or pr.head_sha,
            "commit_title": title.strip(),
            "commit_message": text.strip(),
        }
        body = {k: v for k, v in said.items() if v}
        try:
            sha = self._get(
                lambda rest: rest.pulls.merge(
                    self.owner, self.name, number, merge_method=self.settings.merge_method, **body
                )
            )["sha"]
        except (GitHubRefused, ForgeUnavailable) as exc:
            # an earlier try (or a person) may have merged it: then that merge is the answer
            again = self.pull_request(number)
            if again.state != "merged" or not again.merge_sha:
                if again.state != "open":
                    raise ForgeError(
                        f"pull request #{number} on {self.repository} was closed unmerged"
                    ) from exc
                if isinstance(exc, GitHubRefused):  # 405 not mergeable, 409 head moved
                    refused = GitHubNotMergeable if exc.status == 405 else GitHubRefused
                    raise refused(
                        f"GitHub would not merge pull request #{number} on {self.repository} "
                        f"({exc.status}): {exc.github_message}",
                        exc.status,
                        exc.github_message,
                    ) from exc
                raise
            sha = again.merge_sha
        self._fetch_base(pr.base, sha, always=True)
        return str(sha)
