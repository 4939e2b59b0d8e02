"""The Gitea forge: the lifecycle's forge calls on a team's Gitea or Forgejo
repository, through its REST API v1.

How each effect is found again (docs/contracts/lifecycle.md: journaled side
effects), so a crash never duplicates it:

- an issue: the hidden marker ``<!-- phasegate:... -->`` its body ends with
  (``find_issue`` reads the repository's issues, state all);
- a comment: the same marker in its body;
- a pull request: its head branch (the newest pull request of the repository
  whose head is that branch);
- a merge: the pull request's ``merged`` state and merge commit SHA;
- a branch: pushing again is harmless (forced: phasegate owns its branches).

A POST that creates one of them and gets a 5xx is looked up before it is tried
again, never repeated blind; one that timed out is ForgeUnavailable at once, for
the journal to look up on resume (``GiteaAPI._create``). Every other call is
retried within ``forge.max_retries`` and ``forge.max_rate_limit_wait_s``.

Nothing phasegate sends closes an issue by itself: a closing keyword (``Closes
#3``) in a pull request's body or a merge's message becomes ``Implements``, so
merging leaves the issue open until verification. Every title, body, comment
and merge message is redacted of ``secrets`` and of the forge's token.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from phasegate.config.forge import ForgeSettings
from phasegate.forge.base import (
    PERMISSIONS,
    STATUS_LABEL_PREFIX,
    Comment,
    Forge,
    ForgeAuthError,
    ForgeError,
    ForgeNotFound,
    ForgeNotMergeable,
    ForgeUnavailable,
    Issue,
    Labelled,
    PullRequest,
)
from phasegate.forge.gitea.api import (
    GiteaForbidden,
    GiteaRefused,
    fit,
    labels_of,
    login_of,
    marker_comment,
    timestamp,
)
from phasegate.forge.gitea.auth import gitea_auth, repository_from_origin
from phasegate.forge.gitea.checks import GiteaChecks
from phasegate.git.workspace import Workspace

__all__ = ["STATUS_LABEL_COLOR", "GiteaForge", "GiteaNotMergeable", "open_gitea"]

log = logging.getLogger(__name__)

#: The colour of the status labels phasegate creates.
STATUS_LABEL_COLOR = "#5319e7"

_OWN_MARKER = re.compile(r"<!--\s*phasegate:")
_TRAILING_MARKER = re.compile(r"\s*<!-- phasegate:[^>]*-->\s*$")
#: Gitea's permission names as phasegate's (PERMISSIONS): a repository's owner administers it.
_PERMISSION = {"owner": "admin", "admin": "admin", "write": "write", "read": "read"}
#: A review's state as Comment.review_state; the others (pending, a request) say nothing yet.
_REVIEW_STATES = {
    "APPROVED": "approved",
    "REQUEST_CHANGES": "changes_requested",
    "COMMENT": "commented",
}


class GiteaNotMergeable(GiteaRefused, ForgeNotMergeable):
    """Gitea's 405 or 409 on merging an open pull request: ForgeNotMergeable (merge
    syncs the base again, a conflict forks its resolution), with Gitea's status and
    message."""


def open_gitea(
    settings: ForgeSettings,
    repo: Path,
    workspace: Workspace,
    secrets: Sequence[str],
    environ: Mapping[str, str] | None = None,
) -> Forge:
    """The GiteaForge ``settings`` name for the clone ``repo``: the token in
    ``forge.token_env``, the repository from ``forge.repository`` or else the origin
    remote on ``forge.base_url``'s host. Raises ForgeAuthError naming the token's
    variable, ForgeError naming forge.repository or forge.base_url."""
    assert settings.base_url is not None, "ForgeSettings requires base_url for gitea"
    auth = gitea_auth(settings, environ)
    repository = settings.repository or repository_from_origin(repo, settings.base_url)
    return GiteaForge(repository, auth, repo, workspace, settings, secrets)


class GiteaForge(GiteaChecks):
    """The Forge protocol (``phasegate.forge.base``) on the Gitea or Forgejo
    repository ``repository`` (owner/name) at ``settings.base_url``, for the local
    clone ``repo`` (arguments: ``GiteaAPI``).

    Every method raises ForgeError or a subclass (``gitea.api``): ForgeUnavailable,
    ForgeAuthError (naming the token variable), ForgeNotFound (naming the
    repository), GiteaRefused.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._labels: dict[str, int] | None = None
        self._is_pull: dict[int, bool] = {}

    # -- issues -------------------------------------------------------------------

    def create_issue(self, title: str, body: str, marker: str) -> int:
        text = fit(self._clean(body), f"\n\n{marker_comment(marker)}")
        data = {"title": self._clean(title), "body": text}
        return self._create(
            f"issue {marker}",
            lambda: int(self._post(f"{self.base}/issues", data)["number"]),
            lambda: self.find_issue(marker),
        )

    def _post(self, path: str, data: Any) -> Any:
        """A creating POST, made once (``_create`` decides about another)."""
        return self.json_of(self.call("POST", path, json=data, repeat=False))

    def find_issue(self, marker: str) -> int | None:
        """The newest issue whose body holds ``marker``'s hidden comment: every issue
        of the repository is read (state all; pull requests left out)."""
        hidden = marker_comment(marker)
        issues = self.pages(f"{self.base}/issues", state="all", type="issues")
        found = [
            int(issue["number"])
            for issue in issues
            if not issue.get("pull_request") and hidden in (issue.get("body") or "")
        ]
        return max(found) if found else None

    def issue(self, number: int) -> Issue:
        found = self.get(f"{self.base}/issues/{number}")
        self._is_pull[number] = bool(found.get("pull_request"))
        return self._issue(found)

    def _issue(self, found: dict[str, Any]) -> Issue:
        # phasegate's own marker is bookkeeping: the issue's text is what came before it
        body = _TRAILING_MARKER.sub("", found.get("body") or "")
        return Issue(
            int(found["number"]),
            str(found.get("title") or ""),
            body,
            str(found.get("state") or "open"),
            author=login_of(found.get("user")),
            labels=labels_of(found.get("labels") or ()),
            pull_request=bool(found.get("pull_request")),
        )

    def close_issue(self, number: int) -> None:
        self.call("PATCH", f"{self.base}/issues/{number}", json={"state": "closed"})

    def set_status_label(self, number: int, label: str | None) -> None:
        """Add ``label`` by its id (made first when the repository lacks it; the call
        answers with the issue's labels), then remove every other status label
        found there: two calls a change."""
        if label is not None and not label.startswith(STATUS_LABEL_PREFIX):
            raise ForgeError(
                f"{label!r} is no status label (they start with {STATUS_LABEL_PREFIX})"
            )
        if label is None:
            current = self.get(f"{self.base}/issues/{number}/labels") or []
        else:
            ident = self._label_id(label)
            added = self.call(
                "POST", f"{self.base}/issues/{number}/labels", json={"labels": [ident]}
            )
            current = self.json_of(added) or []
        for stale in current:
            name = str(stale.get("name") or "")
            if name.startswith(STATUS_LABEL_PREFIX) and name != label:
                self._remove_label(number, int(stale["id"]), name)

    def _remove_label(self, number: int, ident: int, name: str) -> None:
        try:
            self.call("DELETE", f"{self.base}/issues/{number}/labels/{ident}")
        except (ForgeNotFound, GiteaRefused) as exc:
            if isinstance(exc, GiteaRefused) and exc.status != 422:
                raise
            log.info("label %s was already gone from #%s", name, number)

    def _label_id(self, name: str) -> int:
        """The id of the repository's label ``name``, made when there is none. Gitea
        lets two labels share a name: the lowest id is the one, for every worker."""
        if self._labels is None or name not in self._labels:
            self._read_labels()
        labels = self._labels
        assert labels is not None
        if name not in labels:
            data = {
                "name": name,
                "color": STATUS_LABEL_COLOR,
                "description": "phasegate's workflow status",
            }
            try:
                made = self.json_of(self.call("POST", f"{self.base}/labels", json=data))
                labels[name] = int(made["id"])
            except GiteaRefused as exc:
                # 409: another worker made it between our list and our create
                if exc.status != 409:
                    raise
                labels = self._read_labels()
                if name not in labels:
                    raise
        return labels[name]

    def _read_labels(self) -> dict[str, int]:
        self._labels = {}
        for found in sorted(self.pages(f"{self.base}/labels"), key=lambda x: int(x["id"])):
            self._labels.setdefault(str(found["name"]), int(found["id"]))
        return self._labels

    def labelled_issues(self, label: str) -> list[Labelled]:
        issues = self.pages(f"{self.base}/issues", state="open", type="issues", labels=label)
        found = []
        for item in issues:
            issue = self._issue(item)
            if issue.pull_request or label not in issue.labels:
                continue  # a server that ignored a filter hands back more
            by = self._labelled_by(issue.number, label)
            if by is None:
                log.warning(
                    "#%s carries %s but no label event says who added it", issue.number, label
                )
                continue
            found.append(Labelled(issue, by[0], by[1]))
        return found

    def _labelled_by(self, number: int, label: str) -> tuple[str, datetime] | None:
        """Who last added ``label`` to issue ``number``, when: the issue timeline's
        newest ``label`` event for it whose body is ``1`` (Gitea's mark of an
        addition; a removal's body is empty)."""
        events = self.pages(f"{self.base}/issues/{number}/timeline")
        last = None
        for event in events:
            named = (event.get("label") or {}).get("name")
            if event.get("type") == "label" and named == label and event.get("body") == "1":
                last = (login_of(event.get("user")), timestamp(event["created_at"]))
        return last

    def permission(self, login: str) -> str:
        """``login``'s permission (``GET …/collaborators/{login}/permission``): owner
        and admin are admin, write and read themselves, anyone else none. Gitea
        answers it about others only to an administrator of the repository: a 403
        is ForgeAuthError saying so."""
        try:
            found = self.get(f"{self.base}/collaborators/{quote(login, safe='')}/permission")
        except ForgeNotFound:
            return "none"  # no such user
        except GiteaForbidden as exc:
            raise ForgeAuthError(
                f"{exc}: Gitea tells a user's permission only to an administrator of "
                f"{self.repository}; make the token's account one (docs/gitea.md: the token)"
            ) from exc
        said = _PERMISSION.get(str(found.get("permission") or "").lower(), "none")
        return said if said in PERMISSIONS else "none"

    # -- comments -----------------------------------------------------------------

    def comment(self, issue_number: int, body: str, marker: str) -> int:
        hidden = marker_comment(marker)
        # the marker goes last whatever the caller put where: cutting a long body
        # must never cut it off
        text = fit(self._clean(body).replace(hidden, "").rstrip(), f"\n\n{hidden}")
        return self._create(
            f"comment {marker}",
            lambda: int(
                self._post(f"{self.base}/issues/{issue_number}/comments", {"body": text})["id"]
            ),
            lambda: self.find_comment(issue_number, marker),
        )

    def find_comment(self, issue_number: int, marker: str) -> int | None:
        hidden = marker_comment(marker)
        for found in self._issue_comments(issue_number, None):
            if hidden in (found.get("body") or ""):
                return int(found["id"])
        return None

    def _issue_comments(self, number: int, since: datetime | None) -> list[dict[str, Any]]:
        params = {"since": since.isoformat()} if since is not None else {}
        # Gitea answers every comment at once here (no pages)
        found = self.get(f"{self.base}/issues/{number}/comments", **params)
        return list(found or [])

    def _pull(self, number: int) -> bool:
        if number not in self._is_pull:
            self.issue(number)
        return self._is_pull[number]

    def comments(self, number: int, since: datetime | None = None) -> list[Comment]:
        """Conversation comments; for a pull request also its submitted reviews (those
        with a verdict or a text: a bare COMMENT review only holds line comments) and
        each review's line comments (path, line in the new file, else the old one,
        diff hunk). Anything holding a ``<!-- phasegate:`` marker is phasegate's own
        and left out; ``since`` is exclusive."""
        said = [
            Comment(
                int(c["id"]),
                login_of(c.get("user")),
                c.get("body") or "",
                timestamp(c["created_at"]),
            )
            for c in self._issue_comments(number, since)
        ]
        if self._pull(number):
            said += self._reviews(number)
        return sorted(
            (
                c
                for c in said
                if not _OWN_MARKER.search(c.body) and (since is None or c.created_at > since)
            ),
            key=lambda c: (c.created_at, c.id),
        )

    def _reviews(self, number: int) -> list[Comment]:
        said = []
        for review in self.pages(f"{self.base}/pulls/{number}/reviews"):
            state = _REVIEW_STATES.get(str(review.get("state") or "").upper())
            if state is None or review.get("dismissed"):
                continue  # pending (not sent yet), a review request, or dismissed
            body = review.get("body") or ""
            author = login_of(review.get("user"))
            when = review.get("submitted_at") or review.get("updated_at")
            if when and (state != "commented" or body):
                said.append(
                    Comment(
                        int(review["id"]),
                        author,
                        body,
                        timestamp(when),
                        kind="review",
                        review_state=state,
                    )
                )
            if review.get("comments_count") == 0:
                continue
            lines = self.get(f"{self.base}/pulls/{number}/reviews/{review['id']}/comments")
            said += [
                Comment(
                    int(c["id"]),
                    login_of(c.get("user")) or author,
                    c.get("body") or "",
                    timestamp(c["created_at"]),
                    kind="inline",
                    path=c.get("path"),
                    line=c.get("position") or c.get("original_position") or None,
                    diff_hunk=c.get("diff_hunk"),
                )
                for c in lines or ()
            ]
        return said

    # -- branches, pull requests, CI ------------------------------------------------

    def publish_branch(self, branch: str) -> None:
        if not self.workspace.branch_exists(self.repo, branch):
            raise ForgeError(f"branch {branch} does not exist in {self.repo}")
        self.git_remote().push(branch)

    def create_pull_request(self, head: str, base: str, title: str, body: str) -> int:
        data = {
            "head": head,
            "base": base,
            "title": self._pr_text(title),
            "body": self._pr_text(body),
        }
        try:
            return self._create(
                f"pull request for {head}",
                lambda: int(self._post(f"{self.base}/pulls", data)["number"]),
                lambda: self.find_pull_request(head),
            )
        except GiteaRefused as exc:
            # 409 "pull request already exists for these targets": another try made it
            found = self.find_pull_request(head) if exc.status in (409, 422) else None
            if found is None:
                raise
            return found

    def find_pull_request(self, head: str) -> int | None:
        """The newest pull request of the repository whose head is the branch
        ``head`` of this repository (Gitea's list has no head filter: all are read)."""
        numbers = [
            int(pr["number"])
            for pr in self.pages(f"{self.base}/pulls", state="all")
            if (pr.get("head") or {}).get("ref") == head and self._ours(pr["head"])
        ]
        return max(numbers) if numbers else None

    def _ours(self, head: dict[str, Any]) -> bool:
        """Whether a pull request's head is in this repository (not a fork's branch
        of the same name)."""
        name = ((head.get("repo") or {}).get("full_name") or self.repository).lower()
        return name == self.repository.lower()

    def pull_request(self, number: int) -> PullRequest:
        pr = self.get(f"{self.base}/pulls/{number}")
        self._is_pull[number] = True
        merged = bool(pr.get("merged"))
        return PullRequest(
            int(pr["number"]),
            pr["head"]["ref"],
            pr["base"]["ref"],
            str(pr.get("title") or ""),
            pr.get("body") or "",
            "merged" if merged else str(pr.get("state") or "open"),
            pr.get("merge_commit_sha") if merged else None,
            head_sha=pr["head"].get("sha"),
            merged_by=login_of(pr.get("merged_by")) or None,
        )

    def update_pull_request(self, number: int, body: str) -> None:
        self.call("PATCH", f"{self.base}/pulls/{number}", json={"body": self._pr_text(body)})

    def close_pull_request(self, number: int) -> None:
        """Close pull request ``number`` unmerged (``PATCH …/pulls/N`` state closed);
        one already closed or merged is left alone, so a retry after a lost answer
        changes nothing."""
        if self.pull_request(number).state != "open":
            return
        self.call("PATCH", f"{self.base}/pulls/{number}", json={"state": "closed"})

    def delete_branch(self, branch: str) -> None:
        """Delete Gitea's ``branch`` (``DELETE …/branches/{branch}``). A 404 means gone
        already (an earlier try, or Gitea deleted it on merge): no error. Raises
        ForgeAuthError for a protected branch (403), ForgeUnavailable."""
        try:
            self.call("DELETE", f"{self.base}/branches/{quote(branch, safe='/')}")
        except ForgeNotFound:
            log.info("branch %s was already gone from %s", branch, self.repository)

    def merge_pull_request(self, number: int, message: str, head: str | None = None) -> str:
        """Merge with ``forge.merge_method`` (Gitea's ``Do``) at ``head`` (default: the
        head phasegate reads now) sent as ``head_commit_id``, so Gitea merges that
        exact commit or refuses; ``message``'s first line is the commit title. A
        pull request already merged (an earlier try, a person) answers its merge
        SHA. Gitea's 405 or 409 on one still open is GiteaNotMergeable (a
        ForgeNotMergeable: a conflict, a head that moved, a check or rule that
        holds it); a closed one is ForgeError. The base is fetched afterwards
        (``refs/phasegate/forge/<base>``) so that the merge commit is local."""
        pr = self.pull_request(number)
        if pr.state == "merged" and pr.merge_sha:
            self._fetch_base(pr.base, pr.merge_sha)
            return pr.merge_sha
        if pr.state != "open":
            raise ForgeError(f"pull request #{number} on {self.repository} is closed unmerged")
        title, _, text = self._pr_text(message).partition("\n")
        # The form's original names: every Gitea and Forgejo binds them (Gitea 1.27
        # takes its new snake_case names too, for backward compatibility these).
        data = {
            "Do": self.settings.merge_method,
            "MergeTitleField": title.strip(),
            "MergeMessageField": text.strip(),
            "head_commit_id": head or pr.head_sha,
        }
        try:
            self.call("POST", f"{self.base}/pulls/{number}/merge", json=data)
        except (GiteaRefused, ForgeUnavailable) as exc:
            # an earlier try (or a person) may have merged it: then that merge is the answer
            again = self.pull_request(number)
            if again.state == "merged" and again.merge_sha:
                self._fetch_base(again.base, again.merge_sha, always=True)
                return again.merge_sha
            if again.state != "open":
                raise ForgeError(
                    f"pull request #{number} on {self.repository} was closed unmerged"
                ) from exc
            if isinstance(exc, GiteaRefused) and exc.status in (405, 409):
                raise GiteaNotMergeable(
                    f"Gitea would not merge pull request #{number} on {self.repository} "
                    f"({exc.status}): {exc.gitea_message}",
                    exc.status,
                    exc.gitea_message,
                ) from exc
            raise
        merged = self.pull_request(number)
        if merged.state != "merged" or not merged.merge_sha:
            raise ForgeError(
                f"Gitea accepted the merge of pull request #{number} on {self.repository} "
                "but does not show it merged"
            )
        self._fetch_base(merged.base, merged.merge_sha, always=True)
        return merged.merge_sha
