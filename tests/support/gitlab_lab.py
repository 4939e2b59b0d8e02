"""The fake GitLab test rig: a served fake with its people, clients and real git.

``served(tmp)`` yields a ``Lab``: a ``GitLabServer`` holding ``acme/app``
(alice Owner, dev Developer, guest Guest, stranger nobody), httpx clients
that authenticate as each, and ``push_branch`` that clones over HTTP with a
token and pushes, as a person would.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from support.github_git import git_env, push_change
from support.gitlab_server import GitLabServer

__all__ = ["PROJECT", "Lab", "ok", "served"]

PROJECT = "acme/app"


class Lab:
    """A served fake GitLab with alice (Owner), dev (Developer), guest (Guest)."""

    def __init__(self, gl: GitLabServer, work: Path) -> None:
        self.gl, self.work = gl, work
        self.clients: list[httpx.Client] = []
        for name in ("alice", "dev", "guest", "stranger"):
            gl.add_user(name)
        self.project = gl.create_project(PROJECT, "alice")
        gl.add_member(PROJECT, "dev", "developer")
        gl.add_member(PROJECT, "guest", "guest")

    def token(self, name: str) -> str:
        return self.gl.users[name].tokens[0]

    def client(self, name: str, *, bearer: bool = False) -> httpx.Client:
        token = self.token(name)
        headers = {"Authorization": f"Bearer {token}"} if bearer else {"PRIVATE-TOKEN": token}
        return self.opened(headers)

    def opened(self, headers: dict[str, str]) -> httpx.Client:
        client = httpx.Client(base_url=f"{self.gl.url}/api/v4", headers=headers, timeout=30)
        self.clients.append(client)
        return client

    def git(self, *args: str, cwd: Path | None = None) -> str:
        proc = subprocess.run(
            ["git", *args], cwd=cwd or self.work, env=git_env(), capture_output=True,
            text=True, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    def push_branch(self, name: str, branch: str, files: dict[str, str]) -> str:
        """Clone as ``name`` over HTTP, commit ``files`` on ``branch``, push; its SHA."""
        checkout = self.work / f"{name}-{branch}"
        clone_url = self.gl.clone_url(PROJECT, self.token(name))
        return push_change(self.git, clone_url, checkout, branch, files)


@contextlib.contextmanager
def served(tmp_path: Path) -> Iterator[Lab]:
    """A started fake GitLab under ``tmp_path`` and its people; closed after."""
    with GitLabServer(tmp_path / "gl") as gl:
        made = Lab(gl, tmp_path)
        try:
            yield made
        finally:
            for client in made.clients:
                client.close()


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json() if response.content else None
