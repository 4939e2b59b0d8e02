"""What the GitHubForge tests share: a local checkout, the forge on the lab as its
bot (through Prism: conftest's ``github``), a branch with a change, the POSTs seen."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasegate.config.forge import ForgeSettings
from phasegate.forge import ForgeAuth, GitHubForge
from phasegate.git.workspace import Workspace

from conftest import GitHubLab, git, make_repo
from support.github_server import Recorded

__all__ = ["REPO", "branch_with_change", "forge", "forge_for", "local", "posts", "settings"]

REPO = "octo/app"


@pytest.fixture
def local(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "checkout", {"README.md": "# app\n", "app.py": "x = 1\n"})


def settings(api_url: str, **given: object) -> ForgeSettings:
    return ForgeSettings(kind="github", repository=REPO, base_url=api_url, **given)  # type: ignore[arg-type]


def forge_for(
    github: GitHubLab, local: Path, token: str | None = None, **given: object
) -> GitHubForge:
    """phasegate's forge on the lab, as its bot (whose token is the sentinel: it must
    appear in no argv, config, URL, log or text sent)."""
    return GitHubForge(
        REPO,
        ForgeAuth.from_token(token or github.bot.token, "GITHUB_TOKEN"),
        local,
        Workspace(),
        settings(github.api_url, **given),
        retry_backoff_s=0.01,
    )


@pytest.fixture
def forge(github: GitHubLab, local: Path) -> GitHubForge:
    github.server.create_repo("octo", "app", from_path=local)
    for login, permission in (("phasegate-bot", "write"), ("maya", "maintain"), ("rex", "read")):
        github.server.grant(REPO, login, permission)
    github.server.add_user("stranger")
    return forge_for(github, local)


def branch_with_change(local: Path, branch: str, text: str = "x = 2\n") -> str:
    git(local, "checkout", "-q", "-b", branch)
    (local / "app.py").write_text(text)
    git(local, "commit", "-qam", f"change on {branch}")
    sha = git(local, "rev-parse", "HEAD")
    git(local, "checkout", "-q", "main")
    return sha


def posts(github: GitHubLab, suffix: str) -> list[Recorded]:
    return [r for r in github.server.requests if r.method == "POST" and r.path.endswith(suffix)]
