"""What the Gitea tests share: the fake Gitea served (``support.gitea_server``, every
API exchange held to Gitea's own description), a team's repository on it with a
recording build agent (``team_repo``), and its people acting through the API.

The lab's repository is ``octo/widgets``: ``phasegate-bot`` (whose token is
GITEA_TOKEN) administers it, as Gitea requires of whoever asks other people's
permissions; maya may write, olga administers, rex reads, stranger is nobody.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from phasegate.config.forge import ForgeSettings
from phasegate.forge.gitea.auth import GiteaAuth
from phasegate.forge.gitea.forge import GiteaForge
from phasegate.git.workspace import Workspace

from conftest import ANSWERS_BUT_BUILD, git, make_repo, recording_build, scripted_cartridge
from support.gitea_model import Issue
from support.gitea_server import GiteaServer

__all__ = [
    "BOT",
    "REPO",
    "GiteaLab",
    "conformance_kit",
    "gitea",
    "move_base",
    "own_status",
    "served_lab",
    "team_repo",
]

REPO = "octo/widgets"
BOT = "phasegate-bot"
#: Each person's permission on REPO (octo owns it).
PEOPLE = {BOT: "admin", "maya": "write", "olga": "admin", "rex": "read"}


@dataclass
class GiteaLab:
    """A served fake Gitea (``server``) and the people of ``REPO``."""

    server: GiteaServer
    repository: str = REPO
    clients: dict[str, httpx.Client] = field(default_factory=dict)

    @property
    def bot_token(self) -> str:
        return self.token(BOT)

    def token(self, login: str) -> str:
        return self.server.users[login].tokens[0]

    def cartridge(self, extra: str = "") -> str:
        """A ``[forge]`` table for this lab (poll_s short unless ``extra`` sets it)."""
        poll = "" if re.search(r"^poll_s\s*=", extra, re.MULTILINE) else "poll_s = 0.2\n"
        return (
            f'[forge]\nkind = "gitea"\nrepository = "{self.repository}"\n'
            f'base_url = "{self.server.url}"\n{poll}{extra}'
        )

    def client(self, login: str) -> httpx.Client:
        """An API client acting as ``login`` (``Authorization: token …``)."""
        if login not in self.clients:
            self.clients[login] = httpx.Client(
                base_url=f"{self.server.url}/api/v1/repos/{self.repository}",
                headers={"Authorization": f"token {self.token(login)}"},
                timeout=30,
            )
        return self.clients[login]

    def act(self, login: str, method: str, path: str, **body: Any) -> Any:
        """``login`` calls ``method path`` (under the repository) with JSON ``body``;
        Gitea's answer, which must be a success."""
        response = self.client(login).request(method, path, json=body or None)
        assert response.status_code < 300, (response.status_code, response.text)
        return response.json() if response.content else None

    # -- what people do --------------------------------------------------------------

    def open_issue(self, login: str, title: str, body: str) -> int:
        return int(self.act(login, "POST", "/issues", title=title, body=body)["number"])

    def comment(self, login: str, number: int, body: str) -> int:
        """``login`` comments through the API; one with no access to the repository
        through the fake's own hand (on a public Gitea repository anyone signed in
        may comment, and the fake's API lets only readers)."""
        if login not in PEOPLE and login != "octo":
            return self.server.comment(self.repository, login, number, body).id
        return int(self.act(login, "POST", f"/issues/{number}/comments", body=body)["id"])

    def label(self, login: str, number: int, name: str) -> None:
        """``login`` puts ``name`` on issue ``number`` (the fake's own hand: on Gitea
        only writers may, and the test needs others' labels too)."""
        self.server.label(self.repository, login, number, name)

    def unlabel(self, login: str, number: int, name: str) -> None:
        label = self.server.repo(self.repository).label_named(name)
        assert label is not None
        self.act(login, "DELETE", f"/issues/{number}/labels/{label.id}")

    def status(self, sha: str, context: str, state: str, description: str = "") -> None:
        """CI (olga's token) reports ``state`` of ``context`` on commit ``sha``."""
        self.act(
            "olga", "POST", f"/statuses/{sha}", state=state, context=context,
            description=description, target_url=f"https://ci.example/{context}",
        )  # fmt: skip

    def review(
        self, login: str, number: int, event: str, body: str, lines: list[tuple[str, int, str]]
    ) -> None:
        comments = [{"path": p, "new_position": n, "body": b} for p, n, b in lines]
        self.act(login, "POST", f"/pulls/{number}/reviews", event=event, body=body,
                 comments=comments)  # fmt: skip

    def protect(self, branch: str, contexts: list[str]) -> None:
        """A rule for ``branch`` requiring ``contexts``; olga alone may push to it."""
        self.act(
            "olga", "POST", "/branch_protections", rule_name=branch,
            enable_status_check=True, status_check_contexts=contexts,
            enable_push=True, enable_push_whitelist=True, push_whitelist_usernames=["olga"],
        )  # fmt: skip

    # -- what the fake holds -----------------------------------------------------------

    def issue(self, number: int) -> Issue:
        return self.server.repo(self.repository).issues[number]

    def labels(self, number: int) -> set[str]:
        repo = self.server.repo(self.repository)
        return {repo.labels[i].name for i in self.issue(number).labels}

    def counts(self) -> dict[str, int]:
        issues = self.server.repo(self.repository).issues.values()
        return {
            "issues": sum(1 for i in issues if i.pull is None),
            "pulls": sum(1 for i in issues if i.pull is not None),
            "merges": sum(1 for i in issues if i.pull is not None and i.pull.merged),
        }

    def posts(self, suffix: str) -> list[Any]:
        """The POSTs answered whose path ends with ``suffix`` (faults included)."""
        return [r for r in self.server.requests if r.method == "POST" and r.path.endswith(suffix)]

    def head_sha(self, number: int) -> str | None:
        repo = self.server.repo(self.repository)
        return self.server.head_sha(repo, self.issue(number))


@contextlib.contextmanager
def served_lab(tmp_path: Path) -> Iterator[GiteaLab]:
    """A started fake Gitea holding the lab's people (no repository yet), every API
    exchange held to Gitea's description: leaving fails on any violation."""
    from support.gitea_description import Description

    with GiteaServer(tmp_path / "fake-gitea") as server:
        server.check = Description.load().check
        for login in ("octo", *PEOPLE, "stranger"):
            server.add_user(login)
        lab = GiteaLab(server)
        try:
            yield lab
        finally:
            for client in lab.clients.values():
                client.close()
        assert not server.violations, "\n".join(server.violations)


@pytest.fixture
def gitea(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[GiteaLab]:
    """A fresh fake Gitea per test (``served_lab``); GITEA_TOKEN is the bot's token."""
    with served_lab(tmp_path) as lab:
        monkeypatch.setenv("GITEA_TOKEN", lab.bot_token)
        yield lab


def conformance_kit(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """The forge conformance suite's rig for Gitea (``forge_conformance_kit.KITS``):
    phasegate's bot (an administrator, as Gitea requires of whoever asks others'
    permissions) on a fresh octo/widgets, maya (write) its maintainer, rex (read)
    its reader, olga reporting statuses and protecting branches. Every exchange is
    held to Gitea's description."""
    from forge_conformance_kit import Kit  # the suite's own rig: imported where it runs

    stack = contextlib.ExitStack()
    lab = stack.enter_context(served_lab(tmp_path / "lab"))
    request.addfinalizer(stack.close)
    checkout = make_repo(tmp_path / "checkout", {"README.md": "# app\n", "app.py": "x = 1\n"})
    server = lab.server
    server.create_repo(REPO, from_path=checkout)
    for login, mode in PEOPLE.items():
        server.add_collaborator(REPO, login, mode)
    settings = ForgeSettings(kind="gitea", repository=REPO, base_url=server.url)
    auth = GiteaAuth(lab.bot_token, "the token in GITEA_TOKEN")
    forge = GiteaForge(REPO, auth, checkout, Workspace(), settings, retry_backoff_s=0.01)
    return Kit(
        "gitea",
        forge,
        checkout,
        maintainer="maya",
        reader="rex",
        open_issue=lambda title, body, by: lab.open_issue(by, title, body),
        say=lambda number, body, by: lab.comment(by, number, body),
        label=lambda number, label, by: lab.label(by, number, label),
        review_line=lambda pr, path, line, body, by: lab.review(
            by, pr, "COMMENT", "", [(path, line, body)]
        ),
        report=lambda sha, context, state: lab.status(sha, context, state),
        protect=lambda branch, contexts: lab.protect(branch, contexts),
        fail=lambda method, path, status, times: server.fail(method, path, status, times=times),
        paths={
            "issue": rf"/repos/{REPO}/issues$",
            "comment": rf"/repos/{REPO}/issues/\d+/comments$",
        },
    )


def team_repo(
    lab: GiteaLab, tmp_path: Path, roles: dict[str, str] | None = None, **cartridge: object
) -> tuple[Path, Path]:
    """octo/widgets on the lab, seeded from a local repository holding a cartridge
    whose build agent records each prompt in ``prompts/`` and writes feature.txt
    (``roles``: other role tables; ``forge_extra``: more [forge] keys); returns
    (local repo, prompts dir)."""
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    extra = str(cartridge.pop("forge_extra", ""))
    overrides = {"build": recording_build(prompts), **(roles or {})}
    text = scripted_cartridge(role_overrides=overrides, **cartridge)  # type: ignore[arg-type]
    files = {
        "README.md": "# widgets\n",
        ".gitignore": ".phasegate/\n",
        "answers.toml": ANSWERS_BUT_BUILD,
        "phasegate.toml": text + "\n" + lab.cartridge(extra),
    }
    repo = make_repo(tmp_path / "repo", files)
    lab.server.create_repo(lab.repository, from_path=repo)
    for login, mode in PEOPLE.items():
        lab.server.add_collaborator(lab.repository, login, mode)
    return repo, prompts


def move_base(lab: GiteaLab, tmp_path: Path, path: str = "elsewhere.txt") -> str:
    """Another change lands on the fake's main (olga's push over HTTP); its SHA."""
    clone = tmp_path / f"elsewhere-{path.replace('/', '-')}"
    url = lab.server.clone_url(lab.repository, lab.token("olga"), "olga")
    git(tmp_path, "clone", "-q", url, str(clone))
    (clone / path).write_text("landed meanwhile\n")
    git(clone, "add", path)
    git(clone, "-c", "user.name=Olga", "-c", "user.email=olga@example.com", "commit", "-qm", "x")
    git(clone, "push", "-q", "origin", "HEAD:main")
    return git(clone, "rev-parse", "HEAD")


def own_status(lab: GiteaLab, sha: str) -> str | None:
    """phasegate's own commit status on ``sha`` (its latest state), or None."""
    posted = [s for s in lab.server.repo(lab.repository).statuses if s.sha == sha]
    mine = [s.state for s in sorted(posted, key=lambda s: s.id) if s.context == "phasegate"]
    return mine[-1] if mine else None
