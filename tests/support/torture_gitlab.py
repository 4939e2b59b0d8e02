"""The kill-torture harness on the GitLab forge: a trial's fake GitLab, the
kill aimed at a request in flight, and the invariants read on GitLab.

``GitLabRig`` is the GitLab forge's rig (``support.torture_forge.ForgeRig``).
``GitLabRig.forge_for(root)`` starts that trial's fake GitLab
(``support.gitlab_server``) in this process -- it survives every kill of the
worker, as GitLab does -- with ``acme/widgets`` owned by a person and the bot
phasegate acts as a Maintainer (GitLab protects main for Maintainers: the bot
merges), and a ``[forge]`` table of kind ``gitlab`` pointing at it. The worker
gets the bot's token in ``GITLAB_TOKEN`` only (``GitLabTrialForge.env``).

The ``gitlab_request`` aim: after a random moment, the next request of each
method that changes GitLab (POST, PATCH, PUT, DELETE: REST, or a git push;
not a git fetch, which POSTs too but changes nothing: ``CHANGES_ONLY``) is held
``HOLD_S`` seconds by the fake before it is handled (``torture_forge.FakeForge``,
the fake's own ``delay``); the kill lands as soon as one is held. GitLab then
does what the dead client asked, and the journal must find it instead of
asking again.

The fake is watched as it changes (``TrialGitLab``): every close, reopen and
merge it really did, in order, with its moment. The invariants checked on the
fake (``check_gitlab``; ``Violation`` kinds in brackets): exactly one issue,
holding the workflow's marker [``issues``]; one merge request, whose source is
the workflow's branch and whose target is main [``pull_requests``]; one merge
done, one merge request merged, one merge commit on the bare repository's main
and nothing else on its first-parent line [``merges``]; no hidden note marker
twice on the issue or the merge request [``duplicate_comment``]; the issue
closed once, after the merge and no earlier than a verifier answered
[``issue_closed``], with ``phasegate:done`` as its only status label
[``labels``]; the bot's token in no store file, log, git config or text sent
to GitLab [``token``]; no request python-gitlab's managers do not describe
(``support.gitlab_models``: GitLab ships no schema to judge by) [``schema``].
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from support.gitlab_model import Issue, MergeRequest, Project, User
from support.gitlab_models import all_problems
from support.gitlab_server import GitLabServer
from support.torture_forge import (
    CHANGES_ONLY,
    MARKER,
    FakeForge,
    FakeRig,
    Findings,
    check_issues,
    check_merge_line,
    check_status_labels,
    check_token,
    check_twice,
    check_verdict_first,
)
from support.torture_lab import FORGE_DIR, Violation

if TYPE_CHECKING:
    from support.torture_lab import Lab

__all__ = [
    "BOT",
    "OWNER",
    "PROJECT",
    "GitLabRig",
    "GitLabTrialForge",
    "TrialGitLab",
    "check_gitlab",
]

PROJECT = "acme/widgets"
OWNER = "maintainer"
BOT = "phasegate-bot"


@dataclass(frozen=True)
class Change:
    """One change the fake really made: ``what`` (close, reopen, merge) to the
    issue or merge request ``iid`` of ``kind`` (Issue, MergeRequest), ``at``."""

    what: str
    kind: str
    iid: int
    at: datetime


class TrialGitLab(GitLabServer):
    """The fake GitLab, every close, reopen and merge it does kept in ``changes``
    (a request asking again for what is already so changes nothing)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.changes: list[Change] = []

    def edit(
        self, project: Project, item: Issue | MergeRequest, actor: User, fields: dict[str, Any]
    ) -> None:
        before = item.state
        super().edit(project, item, actor, fields)
        if item.state != before and item.state in ("closed", "opened"):
            what = "close" if item.state == "closed" else "reopen"
            self._changed(what, item)

    def merge(
        self, project: Project, mr: MergeRequest, actor: User, fields: dict[str, Any]
    ) -> None:
        super().merge(project, mr, actor, fields)  # raises when it merged nothing
        self._changed("merge", mr)

    def _changed(self, what: str, item: Issue | MergeRequest) -> None:
        kind = "Issue" if isinstance(item, Issue) else "MergeRequest"
        with self.lock:
            self.changes.append(Change(what, kind, item.iid, self.clock()))


class GitLabRig(FakeRig):
    """The GitLab forge's rig: nothing is shared between trials (no proxy), so
    trials may even run side by side."""

    name = "gitlab"

    def forge_for(self, root: Path) -> GitLabTrialForge:
        """A started fake GitLab for the trial in ``root`` (its data under
        ``root/FORGE_DIR``), with the project's owner and the bot."""
        server = TrialGitLab(root / FORGE_DIR)
        server.start()
        server.add_user(OWNER)
        return GitLabTrialForge(server, server.add_user(BOT))


class GitLabTrialForge(FakeForge):
    """One trial's fake GitLab (``server``) and the ``bot`` phasegate acts as."""

    name = "gitlab"
    repository = PROJECT
    token_env = "GITLAB_TOKEN"
    held_paths = CHANGES_ONLY  # a fetch changes nothing: no kill is spent on it
    server: TrialGitLab
    bot: User

    def seed(self, repo: Path) -> None:
        """``acme/widgets`` made from the local repository ``repo``; the bot a Maintainer."""
        self.server.create_project(PROJECT, OWNER, from_path=repo)
        self.server.add_member(PROJECT, BOT, "maintainer")

    def token(self) -> str:
        return str(self.bot.tokens[0])

    @property
    def bare(self) -> Path:
        """The bare repository behind ``acme/widgets``: where the merge lands."""
        return self.server.project(PROJECT).bare.path

    def check(self, lab: Lab, workflow_id: str) -> list[Violation]:
        return check_gitlab(lab, self, workflow_id)


# -- the invariants ---------------------------------------------------------------------


def check_gitlab(lab: Lab, forge: GitLabTrialForge, workflow_id: str) -> list[Violation]:
    """Every GitLab invariant of the module docstring, on the settled trial."""
    found = Findings()
    gl = forge.server
    with gl.lock:
        project = gl.project(PROJECT)
        issues = list(project.issues.values())
        mrs = list(project.merge_requests.values())
        notes = [n for i in issues for n in i.notes] + [n for mr in mrs for n in mr.notes]
        markers = Counter(
            (note.noteable_type, note.noteable_iid, m)
            for note in notes
            for m in set(MARKER.findall(note.body))
        )
        changes = list(gl.changes)
        requests = list(gl.requests)
    branch = lab.row(workflow_id)["branch_name"]
    ours = [i for i in issues if f"phasegate:workflow:{workflow_id}" in i.description]
    found += check_issues(len(issues), len(ours), PROJECT)
    sources = [(mr.source_branch, mr.target_branch) for mr in mrs]
    found.expect(
        sources == [(branch, "main")],
        "pull_requests",
        f"merge requests by source and target: {sources}; {branch} into main",
    )
    merges = [c.iid for c in changes if c.what == "merge"]
    merged = [mr.iid for mr in mrs if mr.state == "merged"]
    found.expect(
        len(merges) == 1 and len(merged) == 1,
        "merges",
        f"merges done: {merges}; merge requests merged: {merged}",
    )
    found += check_merge_line(lab, forge.bare)
    found += check_twice(markers, "(item, iid, marker) noted")
    if ours:  # the first issue of the workflow: the one phasegate closes
        found += _check_closed(lab, ours[0], changes, workflow_id)
    sent = ((r.method, r.path, r.body) for r in requests)
    found += check_token(lab, forge.env["GITLAB_TOKEN"], forge.bare, sent)
    found += [Violation("schema", p[:300]) for p in all_problems(requests)]
    return found


def _check_closed(
    lab: Lab, issue: Issue, changes: list[Change], workflow_id: str
) -> list[Violation]:
    """Closed once, after the merge, no earlier than a verifier's answer; done."""
    found: list[Violation] = []
    mine = [c for c in changes if c.kind == "Issue" and c.iid == issue.iid]
    closed = [c for c in mine if c.what == "close"]
    if issue.state != "closed" or len(closed) != 1:
        said = [c.what for c in mine]
        found.append(Violation("issue_closed", f"{issue.state}, closed and reopened: {said}"))
    order = [c.what for c in changes if c.what == "merge" or c in closed]
    if "close" in order and ("merge" not in order or order.index("close") < order.index("merge")):
        found.append(Violation("issue_closed", f"closed before the merge: {order}"))
    closed_at = closed[0].at if closed else None
    found += check_verdict_first(lab, workflow_id, closed_at, to_the_second=True)
    found += check_status_labels(issue.labels)
    return found
