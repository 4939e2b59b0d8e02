"""What the GitHub tests share: a local checkout, the forge on the lab as its bot
(through Prism: conftest's ``github``), a branch with a change, the POSTs seen, and
a team's repository on the lab with a recording build agent (``team_repo``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasegate.config.forge import ForgeSettings
from phasegate.forge import ForgeAuth, GitHubForge
from phasegate.git.workspace import Workspace

from conftest import (
    ANSWERS_BUT_BUILD,
    GitHubLab,
    branch_with_change,
    github_repo,
    make_repo,
    recording_build,
    scripted_cartridge,
)
from support.github_server import Recorded

__all__ = [
    "REPO",
    "branch_with_change",
    "forge",
    "forge_for",
    "local",
    "posts",
    "settings",
    "team_repo",
]

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


def posts(github: GitHubLab, suffix: str) -> list[Recorded]:
    return [r for r in github.server.requests if r.method == "POST" and r.path.endswith(suffix)]


def team_repo(
    lab: GitHubLab, tmp_path: Path, roles: dict[str, str] | None = None, **cartridge: object
) -> tuple[Path, Path]:
    """octo/widgets on the lab, with a build agent that records each prompt in
    ``prompts/`` and writes feature.txt (``roles``: other role tables); returns
    (local repo, prompts dir)."""
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    build = recording_build(prompts)
    extra = str(cartridge.pop("forge_extra", ""))
    overrides = {"build": build, **(roles or {})}
    text = scripted_cartridge(role_overrides=overrides, **cartridge)  # type: ignore[arg-type]
    repo = github_repo(
        lab,
        tmp_path / "repo",
        text,
        {
            "README.md": "# widgets\n",
            ".gitignore": ".phasegate/\n",
            "answers.toml": ANSWERS_BUT_BUILD,
        },
        forge_extra=extra,
    )
    return repo, prompts
