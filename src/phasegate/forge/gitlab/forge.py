"""The GitLab forge: the lifecycle's forge calls on a team's GitLab project, through python-gitlab.

How each effect is found again (docs/contracts/lifecycle.md: journaled side
effects), so a crash never duplicates it:

- an issue: the hidden marker ``<!-- phasegate:... -->`` its description ends
  with (``find_issue`` reads the project's issues, newest first);
- a note (phasegate's comment): the same marker in its body;
- a merge request: its source branch (state all, the newest);
- a merge: the merge request's ``merged`` state and merge (or squash) commit;
- a branch: pushing again is harmless (forced: phasegate owns its branches).

A POST that creates one of them and gets a 5xx is looked up before it is tried
again, never repeated blind; one that timed out is ForgeUnavailable at once,
for the journal to look up on resume (``GitLabAPI._create``). Every other
request is retried within ``forge.max_retries`` and ``forge.max_rate_limit_wait_s``
(``faults``).

Issues and merge requests count apart on GitLab: phasegate's number of ``!N``
is ``MR_NUMBERS + N`` (``numbers``). Nothing phasegate sends closes an issue
by itself: GitLab's closing words (``Closes #3``, and ``Implements #3`` too)
in a merge request or a merge's message become ``Part of``. Every title,
description, note and message is redacted of ``secrets`` and of the token.

People: ``permission`` reads the project's members with inherited ones
(``members/all``): Developer (30) is GitHub's write, Maintainer maintain,
Owner admin, Reporter triage, Guest and Planner read; anyone else none.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from phasegate.config.forge import ForgeSettings
from phasegate.forge.base import (
    STATUS_LABEL_PREFIX,
    Comment,
    ForgeError,
    Issue,
    Labelled,
)
from phasegate.forge.gitlab.api import fit, labels_of
from phasegate.forge.gitlab.auth import gitlab_auth, repository_from_origin
from phasegate.forge.gitlab.faults import GitLabRefused
from phasegate.forge.gitlab.merges import GitLabMerges
from phasegate.forge.gitlab.numbers import is_merge_request, mr_iid
from phasegate.forge.texts import login_of, marker_comment, timestamp
from phasegate.git.workspace import Workspace

__all__ = ["STATUS_LABEL_COLOR", "GitLabForge", "open_gitlab", "permission_of"]

log = logging.getLogger(__name__)

#: The colour of the status labels phasegate creates.
STATUS_LABEL_COLOR = "#5319e7"

_OWN_MARKER = re.compile(r"<!--\s*phasegate:")
_TRAILING_MARKER = re.compile(r"\s*<!-- phasegate:[^>]*-->\s*$")
_ISSUE_STATES = {"opened": "open", "closed": "closed"}


def permission_of(access_level: int) -> str:
    """The permission (``base.PERMISSIONS``) of a GitLab access level: Developer
    and up are trusted as GitHub's write, maintain and admin are."""
    for level, name in ((50, "admin"), (40, "maintain"), (30, "write"), (20, "triage")):
        if access_level >= level:
            return name
    return "read" if access_level > 0 else "none"


class GitLabForge(GitLabMerges):
    """The Forge protocol (``phasegate.forge.base``) on the GitLab project
    ``repository`` (``group/…/name``), for the local clone ``repo``.

    ``auth`` (``auth.gitlab_auth``) holds the token; ``settings`` is the
    cartridge's ``[forge]`` (base_url, timeout_s, merge_method, the retry
    bounds); ``secrets`` are redacted from everything sent.
    ``retry_backoff_s`` is the first wait after a transient failure (doubled
    per try, 8 s at most).

    Every method raises ForgeError or a subclass (``faults``):
    ForgeUnavailable, ForgeAuthError (naming the token variable), ForgeNotFound
    (naming the project), GitLabRefused.
    """

    # -- issues -------------------------------------------------------------------

    def create_issue(self, title: str, body: str, marker: str) -> int:
        text = fit(self._clean(body), f"\n\n{marker_comment(marker)}")
        fields = {"title": self._clean(title), "description": text}
        issues = self._project().issues
        return self._create(
            f"issue {marker}",
            lambda: int(issues.create(fields).iid),
            lambda: self.find_issue(marker),
        )

    def find_issue(self, marker: str) -> int | None:
        """The issue whose description holds ``marker``'s hidden comment: every issue
        of the project is read (state all, newest first)."""
        hidden = marker_comment(marker)
        issues = self._list(self._project().issues, order_by="created_at", sort="desc")
        for issue in issues:
            if hidden in (issue.get("description") or ""):
                return int(issue["iid"])
        return None

    def issue(self, number: int) -> Issue:
        """Issue ``number``, or the merge request a merge request's number names
        (``pull_request`` set)."""
        if is_merge_request(number):
            mr = self._merge_request(number)
            return self._issue(mr, number, pull_request=True)
        issues = self._project().issues
        return self._issue(self._call(lambda: issues.get(number).attributes), number)

    def _issue(self, found: dict[str, Any], number: int, *, pull_request: bool = False) -> Issue:
        # phasegate's own marker is bookkeeping: the issue's text is what came before it
        body = _TRAILING_MARKER.sub("", found.get("description") or "")
        return Issue(
            number,
            str(found["title"]),
            body,
            _ISSUE_STATES.get(str(found["state"]), "closed"),
            author=login_of(found.get("author"), "username"),
            labels=labels_of(found.get("labels") or ()),
            pull_request=pull_request,
        )

    def close_issue(self, number: int) -> None:
        issues = self._project().issues
        self._call(lambda: issues.update(number, {"state_event": "close"}))

    def set_status_label(self, number: int, label: str | None) -> None:
        """Add ``label`` (one call, which answers with the issue's labels), then
        remove every other status label it finds there in one more call."""
        if label is not None and not label.startswith(STATUS_LABEL_PREFIX):
            raise ForgeError(
                f"{label!r} is no status label (they start with {STATUS_LABEL_PREFIX})"
            )
        issues = self._project().issues
        if label is None:
            current = self.issue(number).labels
        else:
            self._ensure_label(label)
            added = self._call(lambda: issues.update(number, {"add_labels": label}))
            current = labels_of(added.get("labels") or ())
        stale = [x for x in current if x.startswith(STATUS_LABEL_PREFIX) and x != label]
        if stale:
            gone = ",".join(stale)
            self._call(lambda: issues.update(number, {"remove_labels": gone}))

    def _ensure_label(self, name: str) -> None:
        if getattr(self, "_labels", None) is None:
            self._labels = {x["name"] for x in self._list(self._project().labels)}
        if name in self._labels:
            return
        fields = {
            "name": name,
            "color": STATUS_LABEL_COLOR,
            "description": "phasegate's workflow status",
        }
        labels = self._project().labels
        try:
            self._call(lambda: labels.create(fields))
        except GitLabRefused as exc:
            # another worker made it between our list and our create
            if exc.status != 409:
                raise
            log.debug("label %s was made meanwhile by another worker", name)
        self._labels.add(name)

    def labelled_issues(self, label: str) -> list[Labelled]:
        """Open issues carrying ``label``, each with who added it last (the issue's
        resource label events); one whose events name nobody is left out."""
        issues = self._list(self._project().issues, state="opened", labels=label)
        found = []
        for item in issues:
            by = self._labelled_by(int(item["iid"]), label)
            if by is None:
                log.warning(
                    "#%s carries %s but no label event says who added it", item["iid"], label
                )
                continue
            found.append(Labelled(self._issue(item, int(item["iid"])), by[0], by[1]))
        return found

    def _labelled_by(self, iid: int, label: str) -> tuple[str, datetime] | None:
        events = self._list(self._project().issues.get(iid, lazy=True).resourcelabelevents)
        last = None
        for event in events:
            named = (event.get("label") or {}).get("name")
            if event.get("action") == "add" and named == label:
                last = (
                    login_of(event.get("user"), "username"),
                    timestamp(str(event["created_at"])),
                )
        return last

    def permission(self, login: str) -> str:
        """``login``'s permission from the project's members, inherited ones too."""
        if not login:
            return "none"
        members = self._list(self._project().members_all, query=login)
        for member in members:
            if str(member.get("username", "")).lower() == login.lower():
                if member.get("state", "active") != "active":
                    return "none"
                return permission_of(int(member.get("access_level") or 0))
        return "none"

    # -- comments -----------------------------------------------------------------

    def _noteable(self, number: int) -> Any:
        project = self._project()
        if is_merge_request(number):
            return project.mergerequests.get(mr_iid(number), lazy=True)
        return project.issues.get(number, lazy=True)

    def comment(self, issue_number: int, body: str, marker: str) -> int:
        hidden = marker_comment(marker)
        # the marker goes last whatever the caller put where: a cut never cuts it off
        text = fit(self._clean(body).replace(hidden, "").rstrip(), f"\n\n{hidden}")
        notes = self._noteable(issue_number).notes
        return self._create(
            f"note {marker}",
            lambda: int(notes.create({"body": text}).id),
            lambda: self.find_comment(issue_number, marker),
        )

    def find_comment(self, issue_number: int, marker: str) -> int | None:
        hidden = marker_comment(marker)
        for note in self._list(self._noteable(issue_number).notes, sort="asc"):
            if hidden in (note.get("body") or ""):
                return int(note["id"])
        return None

    def comments(self, number: int, since: datetime | None = None) -> list[Comment]:
        """People's notes on issue or merge request ``number``, oldest first: for a
        merge request its discussions, a diff note an ``inline`` comment with the
        new file's path and line (the old line when it is on a removed line).
        GitLab's system notes and phasegate's own (a ``<!-- phasegate:`` marker) are
        left out; ``since`` is exclusive."""
        noteable = self._noteable(number)
        if is_merge_request(number):
            notes = [n for d in self._list(noteable.discussions) for n in d.get("notes") or ()]
        else:
            notes = self._list(noteable.notes, sort="asc")
        said = [self._comment_of(n) for n in notes if not n.get("system")]
        return sorted(
            (
                c
                for c in said
                if not _OWN_MARKER.search(c.body) and (since is None or c.created_at > since)
            ),
            key=lambda c: (c.created_at, c.id),
        )

    def _comment_of(self, note: dict[str, Any]) -> Comment:
        author = login_of(note.get("author"), "username")
        when = timestamp(str(note["created_at"]))
        position = note.get("position") or {}
        if note.get("type") == "DiffNote" and position:
            line = position.get("new_line") or position.get("old_line")
            return Comment(
                int(note["id"]),
                author,
                note.get("body") or "",
                when,
                kind="inline",
                path=position.get("new_path") or position.get("old_path"),
                line=int(line) if line else None,
            )
        return Comment(int(note["id"]), author, note.get("body") or "", when)


def open_gitlab(
    settings: ForgeSettings,
    repo: Path,
    workspace: Workspace,
    secrets: Sequence[str],
    environ: Mapping[str, str] | None = None,
) -> GitLabForge:
    """The GitLabForge ``settings`` name: the project from ``forge.repository``, else
    the origin remote (on ``forge.base_url``'s host), the token from
    ``forge.token_env``. Raises ForgeAuthError naming the variable when it is
    unset, ForgeError naming forge.repository or forge.base_url when the project
    cannot be told. Nothing is sent to GitLab yet."""
    repository = settings.repository or repository_from_origin(repo, settings.base_url)
    auth = gitlab_auth(settings, environ)
    return GitLabForge(repository, auth, repo, workspace, settings, secrets)
