"""The kill-torture harness on the GitHub forge: a trial's fake GitHub,
the kill aimed at a request in flight, and the invariants read on GitHub.

``GitHubRig`` is the GitHub forge's rig (``support.torture_forge.ForgeRig``);
it holds one Prism (``support.prism``) for a run of
trials: starting it and compiling GitHub's schemas costs seconds, so each
trial's fake only switches its upstream. ``GitHubRig.forge_for(root)`` starts
that trial's ``GitHubServer`` in this process -- it survives every kill of the
worker, as GitHub does -- with ``octo/widgets``, the bot phasegate acts as
(write), and a ``[forge]`` table pointing at Prism. The worker gets the bot's
token in ``GITHUB_TOKEN`` only (``GitHubTrialForge.env``).

The ``github_request`` aim: after a random moment, the next request of each
method that could change GitHub (POST, PATCH, PUT, DELETE: REST through Prism,
or git over HTTP, whose fetches POST too) is held ``HOLD_S`` seconds by the
fake before it is handled (``torture_forge.FakeForge``); the kill lands as
soon as one is held. GitHub then does what the dead client asked, and the
journal must find it instead of asking again.

The invariants checked on the fake (``check_github``; ``Violation`` kinds in
brackets): exactly one issue, holding the workflow's marker [``issues``]; one
pull request, whose head is the workflow's branch [``pull_requests``]; one
merge by the API, one merge commit on the bare repository's main and nothing
else on its first-parent line [``merges``]; no hidden comment marker twice on
the issue or the pull request [``duplicate_comment``]; the issue closed once,
after the merge and no earlier than a verifier answered [``issue_closed``],
with ``phasegate:done`` as its only status label [``labels``]; the bot's token
in no store file, log, git config or text sent to GitHub [``token``]; nothing
GitHub's schema refuses, in either direction, as Prism judged it [``schema``].
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from support.github_model import Issue, User
from support.github_server import GitHubServer, Recorded
from support.prism import PrismProxy
from support.torture_forge import (
    CHANGING,
    HOLD_S,
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
    "CHANGING",
    "HOLD_S",
    "REPOSITORY",
    "GitHubRig",
    "GitHubTrialForge",
    "check_github",
]

REPOSITORY = "octo/widgets"
BOT = "phasegate-bot"


class GitHubRig(FakeRig):
    """One Prism for many trials: ``rig.forge_for(root)`` per trial (one at a
    time: the one Prism follows the latest trial's fake). ``prism``: a running
    ``PrismProxy`` to use (a test session's); without one, ``with GitHubRig() as
    rig:`` starts and stops its own, raising ``PrismError`` when Prism or
    GitHub's description is not installed (``.ci/run`` installs both)."""

    name = "github"

    def __init__(self, prism: PrismProxy | None = None) -> None:
        super().__init__()
        self._own = prism is None
        # a trial's fake replaces the upstream before any request is made
        self.prism = prism or PrismProxy("http://127.0.0.1:9")

    def __enter__(self) -> GitHubRig:
        if self._own:
            self.prism.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._own:
            self.prism.__exit__(*exc)

    def forge_for(self, root: Path) -> GitHubTrialForge:
        """A started fake GitHub for the trial in ``root`` (its data under
        ``root/FORGE_DIR``), Prism in front of it and its violations forgotten."""
        server = GitHubServer(root=root / FORGE_DIR)
        server.start()
        self.prism.upstream_url = server.url
        self.prism.reset()
        return GitHubTrialForge(server, server.add_user(BOT), self.prism)


class GitHubTrialForge(FakeForge):
    """One trial's fake GitHub (``server``), the ``bot`` phasegate acts as, and
    the ``prism`` its REST traffic passes through."""

    name = "github"
    repository = REPOSITORY
    token_env = "GITHUB_TOKEN"
    server: GitHubServer
    bot: User

    def __init__(self, server: GitHubServer, bot: User, prism: PrismProxy) -> None:
        super().__init__(server, bot)
        self.prism = prism

    def seed(self, repo: Path) -> None:
        """``octo/widgets`` made from the local repository ``repo``; the bot may write."""
        self.server.create_repo(*REPOSITORY.split("/"), from_path=repo)
        self.server.grant(REPOSITORY, BOT, "write")

    @property
    def base_url(self) -> str:
        """GitHub through Prism."""
        return self.prism.url

    def token(self) -> str:
        assert self.bot.token is not None
        return self.bot.token

    @property
    def bare(self) -> Path:
        """The bare repository behind ``octo/widgets``: where the merge lands."""
        return self.server.bare_path(REPOSITORY)

    def check(self, lab: Lab, workflow_id: str) -> list[Violation]:
        return check_github(lab, self, workflow_id)


# -- the invariants ---------------------------------------------------------------------


def check_github(lab: Lab, forge: GitHubTrialForge, workflow_id: str) -> list[Violation]:
    """Every GitHub invariant of the module docstring, on the settled trial."""
    found = Findings()
    gh = forge.server
    with gh.lock:
        repo = gh.repo(REPOSITORY)
        issues = [i for i in repo.issues.values() if i.pull is None]
        pulls = [i for i in repo.issues.values() if i.pull is not None]
        merges = repo.merges
        markers = Counter(
            (i.number, m)
            for i in repo.issues.values()
            for c in i.comments
            for m in set(MARKER.findall(c.body))
        )
        requests = list(gh.requests)
    branch = lab.row(workflow_id)["branch_name"]
    ours = [i for i in issues if f"phasegate:workflow:{workflow_id}" in (i.body or "")]
    found += check_issues(len(issues), len(ours), REPOSITORY)
    heads = [p.pull.head for p in pulls if p.pull is not None]
    found.expect(heads == [branch], "pull_requests", f"pull requests by head: {heads}; {branch}")
    merged = [p.number for p in pulls if p.pull is not None and p.pull.merged_at]
    found.expect(merges == 1 and len(merged) == 1, "merges", f"{merges} merges by API, {merged}")
    found += check_merge_line(lab, forge.bare)
    found += check_twice(markers, "(issue, marker) posted")
    if len(ours) == 1:
        found += _check_closed(lab, ours[0], requests, workflow_id)
    token = forge.env["GITHUB_TOKEN"]
    found += check_token(lab, token, forge.bare, ((r.method, r.path, r.body) for r in requests))
    found += [Violation("schema", str(v)[:300]) for v in forge.prism.violations(warnings=False)]
    return found


def _check_closed(
    lab: Lab, issue: Issue, requests: list[Recorded], workflow_id: str
) -> list[Violation]:
    """Closed once, after the merge, no earlier than a verifier's answer; done."""
    found: list[Violation] = []
    closed = [e for e in issue.events if e.event == "closed"]
    state = issue.state
    if state != "closed" or len(closed) != 1:
        found.append(Violation("issue_closed", f"{state}, closed {len(closed)} time(s)"))
    number = issue.number
    order = [
        ("merge" if r.path.endswith("/merge") else "close")
        for r in requests
        if r.status == 200
        and (
            (r.method == "PUT" and r.path.endswith("/merge"))
            or (
                r.method == "PATCH"
                and r.path == f"/repos/{REPOSITORY}/issues/{number}"
                and isinstance(r.body, dict)
                and r.body.get("state") == "closed"
            )
        )
    ]
    if "close" in order and ("merge" not in order or order.index("close") < order.index("merge")):
        found.append(Violation("issue_closed", f"closed before the merge: {order}"))
    found += check_verdict_first(lab, workflow_id, closed[0].created_at if closed else None)
    found += check_status_labels(x.name for x in issue.labels)
    return found
