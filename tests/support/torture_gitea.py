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
    check_merge_line,
    check_token,
    first_verdict,
)
from support.torture_lab import FORGE_DIR, Violation

if TYPE_CHECKING:
    from support.torture_lab import Lab

__all__ = ["BOT", "OWNER", "REPOSITORY", "GiteaRig", "GiteaTrialForge", "check_gitea"]

REPOSITORY = "octo/widgets"
OWNER = "octo"
BOT = "phasegate-bot"


class GiteaRig:
    """The Gitea forge's rig: Gitea's description, loaded once, checks every trial's
    exchanges; nothing else is shared between trials."""

    name = "gitea"

    def __init__(self) -> None:
        from support.gitea_description import Description

        #: The changing requests an uninterrupted run made (``run_uninterrupted`` sets
        #: it): the trials spread their kill moments over what is left of that.
        self.changes_per_run = 0
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
    held_paths = CHANGES_ONLY  # a fetch changes nothing: no kill is spent on it
    server: GiteaServer

    def __init__(self, server: GiteaServer, bot: User) -> None:
        super().__init__(server)
        self.bot = bot

    def seed(self, repo: Path) -> None:
        """``octo/widgets`` made from the local repository ``repo``; the bot an admin."""
        self.server.create_repo(REPOSITORY, from_path=repo)
        self.server.add_collaborator(REPOSITORY, BOT, "admin")

    def cartridge(self) -> str:
        """The ``[forge]`` table: the fake Gitea, polled every 0.2 s."""
        return (
            f'[forge]\nkind = "gitea"\nrepository = "{REPOSITORY}"\n'
            f'base_url = "{self.server.url}"\npoll_s = 0.2\n'
        )

    @property
    def env(self) -> dict[str, str]:
        """What a phasegate process of the trial needs beyond its environment."""
        return {"GITEA_TOKEN": self.bot.tokens[0]}

    @property
    def bare(self) -> Path:
        """The bare repository behind ``octo/widgets``: where the merge lands."""
        return self.server.repo(REPOSITORY).bare.path

    def check(self, lab: Lab, workflow_id: str) -> list[Violation]:
        return check_gitea(lab, self, workflow_id)


# -- the invariants ---------------------------------------------------------------------


def check_gitea(lab: Lab, forge: GiteaTrialForge, workflow_id: str) -> list[Violation]:
    """Every Gitea invariant of the module docstring, on the settled trial."""
    found: list[Violation] = []

    def expect(ok: bool, kind: str, detail: str) -> None:
        if not ok:
            found.append(Violation(kind, detail))

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
    expect(
        len(issues) == 1 and len(ours) == 1,
        "issues",
        f"{len(issues)} issues on {REPOSITORY}, {len(ours)} with the workflow's marker",
    )
    heads = [(p.pull.head, p.pull.base) for p in pulls if p.pull is not None]
    expect(
        heads == [(branch, "main")],
        "pull_requests",
        f"pull requests by head and base: {heads}; {branch} into main",
    )
    merged = [p.number for p in pulls if p.pull is not None and p.pull.merged]
    expect(
        len(merge_events) == 1 and len(merged) == 1,
        "merges",
        f"{len(merge_events)} merges done, pull requests merged: {merged}",
    )
    found += check_merge_line(lab, forge.bare)
    twice = {key: n for key, n in markers.items() if n > 1}
    expect(not twice, "duplicate_comment", f"(issue, marker) posted more than once: {twice}")
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
    first = first_verdict(lab, workflow_id)
    if closed and (first is None or closed[0].created_at.replace(microsecond=0) < first):
        found.append(
            Violation("issue_closed", f"closed at {closed[0].created_at}; first verdict {first}")
        )
    status = sorted(
        n for n in (names.get(i, "?") for i in issue.labels) if n.startswith("phasegate:")
    )
    if status != ["phasegate:done"]:
        found.append(Violation("labels", f"the issue's status labels: {status}"))
    return found
