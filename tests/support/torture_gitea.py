"""The kill-torture harness on the Gitea (Forgejo) forge: a trial's fake Gitea,
the kill aimed at a request in flight, and the invariants read on Gitea.

``GiteaRig`` is the Gitea forge's rig (``support.torture_forge.ForgeRig``); it
loads Gitea's API description once (``support.gitea_description``) for all its
trials. ``GiteaRig.forge_for(root)`` starts that trial's fake Gitea
(``support.gitea_server``) in this process -- it survives every kill of the
worker, as Gitea does -- every API exchange held to that description, with
``octo/widgets`` owned by a person and the bot phasegate acts as an admin
collaborator (Gitea answers who may do what to admins only), and a
``[forge]`` table of kind ``gitea`` pointing at it. The worker gets the bot's
token in ``GITEA_TOKEN`` only (``GiteaTrialForge.env``).

The ``gitea_request`` aim: after a random moment, the next request of each
method that changes Gitea (POST, PATCH, PUT, DELETE: REST, or a git push;
not a git fetch, which POSTs too but changes nothing: ``CHANGES_ONLY``) is held
``HOLD_S`` seconds by the fake before it is handled (``torture_forge.FakeForge``,
the fake's own ``delay``); the kill lands as soon as one is held. Gitea then
does what the dead client asked, and the journal must find it instead of
asking again.

The invariants checked on the fake (``check_gitea``; ``Violation`` kinds in
brackets): exactly one issue, holding the workflow's marker [``issues``]; one
pull request, whose head is the workflow's branch and base main
[``pull_requests``]; one merge done (a ``merge_pull`` event), one pull request
merged, one merge commit on the bare repository's main and nothing else on its
first-parent line [``merges``]; no hidden comment marker twice on the issue or
the pull request [``duplicate_comment``]; the issue closed once (its ``close``
events), after the merge and no earlier than a verifier answered
[``issue_closed``], with ``phasegate:done`` as its only status label
[``labels``]; the bot's token in no store file, log, git config or text sent
to Gitea [``token``]; no exchange Gitea's description refuses [``schema``].
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from support.gitea_model import Event, Issue, User
from support.gitea_server import GiteaServer
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

__all__ = ["BOT", "OWNER", "REPOSITORY", "GiteaRig", "GiteaTrialForge", "check_gitea"]

REPOSITORY = "octo/widgets"
OWNER = "octo"
BOT = "phasegate-bot"


class GiteaRig(FakeRig):
    """The Gitea forge's rig: Gitea's description, loaded once, checks every trial's
    exchanges; nothing else is shared between trials."""

    name = "gitea"

    def __init__(self) -> None:
        from support.gitea_description import Description

        super().__init__()
        self.description: Any = Description.load()

    def forge_for(self, root: Path) -> GiteaTrialForge:
        """A started fake Gitea for the trial in ``root`` (its data under
        ``root/FORGE_DIR``), with the repository's owner and the bot."""
        server = GiteaServer(root / FORGE_DIR)
        server.check = self.description.check
        server.start()
        server.add_user(OWNER)
        return GiteaTrialForge(server, server.add_user(BOT))


class GiteaTrialForge(FakeForge):
    """One trial's fake Gitea (``server``) and the ``bot`` phasegate acts as."""

    name = "gitea"
    repository = REPOSITORY
    token_env = "GITEA_TOKEN"
    held_paths = CHANGES_ONLY  # a fetch changes nothing: no kill is spent on it
    server: GiteaServer
    bot: User

    def seed(self, repo: Path) -> None:
        """``octo/widgets`` made from the local repository ``repo``; the bot an admin."""
        self.server.create_repo(REPOSITORY, from_path=repo)
        self.server.add_collaborator(REPOSITORY, BOT, "admin")

    def token(self) -> str:
        return str(self.bot.tokens[0])

    @property
    def bare(self) -> Path:
        """The bare repository behind ``octo/widgets``: where the merge lands."""
        return self.server.repo(REPOSITORY).bare.path

    def check(self, lab: Lab, workflow_id: str) -> list[Violation]:
        return check_gitea(lab, self, workflow_id)


# -- the invariants ---------------------------------------------------------------------


def check_gitea(lab: Lab, forge: GiteaTrialForge, workflow_id: str) -> list[Violation]:
    """Every Gitea invariant of the module docstring, on the settled trial."""
    found = Findings()
    gt = forge.server
    with gt.lock:
        repo = gt.repo(REPOSITORY)
        issues = [i for i in repo.issues.values() if i.pull is None]
        pulls = [i for i in repo.issues.values() if i.pull is not None]
        markers = Counter(
            (i.number, m)
            for i in repo.issues.values()
            for c in i.comments
            for m in set(MARKER.findall(c.body))
        )
        merge_events = [e for p in pulls for e in p.events if e.type == "merge_pull"]
        names = {lid: label.name for lid, label in repo.labels.items()}
        requests = list(gt.requests)
        refused = list(gt.violations)
    branch = lab.row(workflow_id)["branch_name"]
    ours = [i for i in issues if f"phasegate:workflow:{workflow_id}" in i.body]
    found += check_issues(len(issues), len(ours), REPOSITORY)
    heads = [(p.pull.head, p.pull.base) for p in pulls if p.pull is not None]
    found.expect(
        heads == [(branch, "main")],
        "pull_requests",
        f"pull requests by head and base: {heads}; {branch} into main",
    )
    merged = [p.number for p in pulls if p.pull is not None and p.pull.merged]
    found.expect(
        len(merge_events) == 1 and len(merged) == 1,
        "merges",
        f"{len(merge_events)} merges done, pull requests merged: {merged}",
    )
    found += check_merge_line(lab, forge.bare)
    found += check_twice(markers, "(issue, marker) posted")
    if ours:  # the first issue of the workflow: the one phasegate closes
        found += _check_closed(lab, ours[0], merge_events, names, workflow_id)
    sent = ((r.method, r.path, r.body) for r in requests)
    found += check_token(lab, forge.env["GITEA_TOKEN"], forge.bare, sent)
    found += [Violation("schema", v[:300]) for v in refused]
    return found


def _check_closed(
    lab: Lab, issue: Issue, merges: list[Event], names: dict[int, str], workflow_id: str
) -> list[Violation]:
    """Closed once, after the merge, no earlier than a verifier's answer; done."""
    found: list[Violation] = []
    closed = [e for e in issue.events if e.type == "close"]
    if issue.state != "closed" or len(closed) != 1:
        said = [e.type for e in issue.events if e.type in ("close", "reopen")]
        found.append(Violation("issue_closed", f"{issue.state}, closed and reopened: {said}"))
    # Event ids count up across the fake (comments, events): they order what it did.
    if closed and (not merges or closed[0].id < merges[0].id):
        found.append(
            Violation("issue_closed", f"closed (event {closed[0].id}) before the merge: {merges}")
        )
    closed_at = closed[0].created_at if closed else None
    found += check_verdict_first(lab, workflow_id, closed_at, to_the_second=True)
    found += check_status_labels(names.get(i, "?") for i in issue.labels)
    return found
