"""The fake Gitea test rig: a served fake with its people, clients and real git.

``served(tmp)`` yields a ``Lab``: a ``GiteaServer`` holding ``alice/app``
(alice its owner, dev a write collaborator, guest read, stranger nobody,
``phasegate-bot`` a bot account with write), httpx clients that authenticate
as each (``Authorization: token T``), and ``push_branch`` that clones over
HTTP with a token and pushes, as a person would. Every API exchange goes
through Gitea's official description (gitea_description.py) unless
``checked=False``: one that breaks it is answered as an error and fails the
test when the lab closes.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from support.gitea_server import GiteaServer
from support.github_git import git_env, push_change

__all__ = ["BOT", "REPO", "Lab", "ok", "served"]

REPO = "alice/app"
BOT = "phasegate-bot"


class Lab:
    """A served fake Gitea with alice (owner), dev (write), guest (read), the bot (write)."""

    def __init__(self, gitea: GiteaServer, work: Path) -> None:
        self.gitea, self.work = gitea, work
        self.clients: list[httpx.Client] = []
        for name in ("alice", "dev", "guest", "stranger", BOT):
            gitea.add_user(name)
        self.repo = gitea.create_repo(REPO)
        gitea.add_collaborator(REPO, "dev", "write")
        gitea.add_collaborator(REPO, "guest", "read")
        gitea.add_collaborator(REPO, BOT, "write")

    def token(self, name: str) -> str:
        return self.gitea.users[name].tokens[0]

    def client(self, name: str) -> httpx.Client:
        return self.opened({"Authorization": f"token {self.token(name)}"})

    def opened(self, headers: dict[str, str]) -> httpx.Client:
        client = httpx.Client(base_url=f"{self.gitea.url}/api/v1", headers=headers, timeout=30)
        self.clients.append(client)
        return client

    def refused(self) -> list[str]:
        """What broke the description since last asked (a test's own wrong
        requests), forgotten: the lab fails on leaving for any left."""
        with self.gitea.lock:
            found, self.gitea.violations[:] = list(self.gitea.violations), []
        return found

    def git(self, *args: str, cwd: Path | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            ["git", *args], cwd=cwd or self.work, env=git_env(), capture_output=True,
            text=True, check=False,
        )  # fmt: skip
        if check:
            assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip() if proc.returncode == 0 else proc.stderr

    def push_branch(self, name: str, branch: str, files: dict[str, str]) -> str:
        """Clone as ``name`` over HTTP, commit ``files`` on ``branch``, push; its SHA."""
        checkout = self.work / f"{name}-{branch.replace('/', '-')}"
        clone_url = self.gitea.clone_url(REPO, self.token(name))
        return push_change(self.git, clone_url, checkout, branch, files)


@contextlib.contextmanager
def served(tmp_path: Path, *, checked: bool = True) -> Iterator[Lab]:
    """A started fake Gitea under ``tmp_path`` and its people; closed after.
    ``checked``: every API exchange is held to Gitea's description, and the
    lab fails on leaving when one broke it."""
    with GiteaServer(tmp_path / "gitea") as gitea:
        if checked:
            from support.gitea_description import Description

            gitea.check = Description.load().check
        made = Lab(gitea, tmp_path)
        try:
            yield made
        finally:
            for client in made.clients:
                client.close()
        assert not gitea.violations, "\n".join(gitea.violations)


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json() if response.content else None
