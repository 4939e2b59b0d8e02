"""What a new user's trial on GitLab met, each on the fake GitLab: doctor names a
status once, whose token it would use when the repository is not found, and an
origin's own instance (scheme and port kept); a Guest's token fails a run naming
the role it lacks, and ``show`` names the issue it filed before failing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.summary import workflow_detail
from phasegate.tools.doctor import diagnose

from conftest import git, make_repo, scripted_cartridge
from gitlab_forge_kit import TEAM, gitlab, team_project
from support.gitlab_lab import Lab

__all__ = ["gitlab"]  # a fixture, used by name

Build = Callable[..., tuple[Engine, Store]]


def forge_missing(repo: Path, token: str, **kwargs: object) -> list[str]:
    which = lambda name: f"/usr/bin/{name}"  # noqa: E731
    found = diagnose(repo, which=which, environ={"GITLAB_TOKEN": token}, **kwargs)  # type: ignore[arg-type]
    return [m for m in found.missing if m.startswith("forge")]


def test_doctor_names_a_refusals_status_once(gitlab: Lab, tmp_path: Path) -> None:
    repo, _ = team_project(gitlab, tmp_path)
    [refused] = forge_missing(repo, "glpat-revoked")
    assert "(401 Unauthorized)" in refused and refused.count("401") == 1, refused
    [unseen] = forge_missing(repo, gitlab.token("stranger"))
    assert "(404 Project Not Found)" in unseen and unseen.count("404") == 1, unseen


@pytest.mark.parametrize(
    ("origin", "suggested"),
    [
        ("http://127.0.0.1:8128/acme/widgets.git", "http://127.0.0.1:8128"),
        ("https://gl.example.com:8443/acme/widgets.git", "https://gl.example.com:8443"),
        ("git@gl.example.com:acme/widgets.git", "https://gl.example.com"),
    ],
)
def test_doctor_offline_names_the_token_and_the_origins_own_instance(
    tmp_path: Path, origin: str, suggested: str
) -> None:
    text = scripted_cartridge() + '\n[forge]\nkind = "gitlab"\n'
    repo = make_repo(tmp_path / "repo", {"phasegate.toml": text, ".gitignore": ".phasegate/\n"})
    git(repo, "remote", "add", "origin", origin)
    which = lambda name: f"/usr/bin/{name}"  # noqa: E731
    found = diagnose(repo, which=which, environ={"GITLAB_TOKEN": "glpat-x"}, offline=True)
    assert found.forge["credentials"] == "the token in GITLAB_TOKEN"
    [hint] = [m for m in found.missing if "origin remote" in m]
    assert f'forge.base_url = "{suggested}"' in hint, hint


def test_a_guests_token_fails_the_run_naming_the_role_and_show_names_the_issue(
    gitlab: Lab, tmp_path: Path, engine_for: Build, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, _ = team_project(gitlab, tmp_path)
    monkeypatch.setenv("GITLAB_TOKEN", gitlab.token("guest"))
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "paused"  # a token with the role can resume it
    assert "Developer role" in row["error"] and "a Guest cannot fetch" in row["error"], row["error"]
    assert row["issue_number"] is None  # the phase stopped before it recorded one
    [issue] = gitlab.gl.project(TEAM).issues.values()
    assert workflow_detail(store, workflow_id)["workflow"]["issue_number"] == issue.iid
