"""``phasegate doctor`` on a GitHub forge: one read-only lookup of the
repository (``GET /repos/{owner}/{repo}``) on the fake GitHub behind Prism says
whether the token is refused, the repository unseen, or push not allowed;
``--offline`` sends nothing; an App key tracked by git is a warning."""

from __future__ import annotations

import os
from pathlib import Path

from phasegate.tools.doctor import Diagnosis, diagnose

from conftest import GitHubLab, git, github_repo, make_repo, phasegate_cli, scripted_cartridge


def widgets(github: GitHubLab, tmp_path: Path, forge_extra: str = "") -> Path:
    return github_repo(
        github, tmp_path / "repo", scripted_cartridge(), {"answers.toml": ""}, forge_extra
    )


def github_repo_offline(tmp_path: Path) -> Path:
    """A repository whose cartridge points at a port where nothing listens."""
    text = scripted_cartridge() + (
        '\n[forge]\nkind = "github"\nrepository = "octo/widgets"\n'
        'base_url = "http://127.0.0.1:9/api"\n'
    )
    return make_repo(tmp_path / "repo", {"answers.toml": "", "phasegate.toml": text})


def doctor_with(repo: Path, token: str, **kwargs: object) -> Diagnosis:
    which = lambda name: f"/usr/bin/{name}"  # noqa: E731
    return diagnose(repo, which=which, environ={"GITHUB_TOKEN": token}, **kwargs)  # type: ignore[arg-type]


def forge_missing(found: Diagnosis) -> list[str]:
    return [m for m in found.missing if m.startswith("forge")]


def repo_gets(github: GitHubLab) -> list[int]:
    return [r.status for r in github.server.requests if r.path.endswith("/repos/octo/widgets")]


def test_doctor_says_a_writing_token_may_push(github: GitHubLab, tmp_path: Path) -> None:
    found = doctor_with(widgets(github, tmp_path), github.bot.token)
    assert found.forge["access"] == "push"
    assert forge_missing(found) == [] and repo_gets(github) == [200]


def test_doctor_names_the_variable_of_a_refused_token(github: GitHubLab, tmp_path: Path) -> None:
    found = doctor_with(widgets(github, tmp_path), "ghp_revoked0000")
    [problem] = forge_missing(found)
    assert "GITHUB_TOKEN" in problem and "401" in problem
    assert "ghp_revoked0000" not in problem


def test_doctor_names_a_repository_the_token_cannot_see(github: GitHubLab, tmp_path: Path) -> None:
    repo = widgets(github, tmp_path)
    cartridge = repo / "phasegate.toml"
    cartridge.write_text(cartridge.read_text().replace("octo/widgets", "octo/nothing"))
    [problem] = forge_missing(doctor_with(repo, github.bot.token))
    assert "octo/nothing" in problem and "GITHUB_TOKEN" in problem


def test_doctor_says_a_read_only_token_needs_contents_write(
    github: GitHubLab, tmp_path: Path
) -> None:
    found = doctor_with(widgets(github, tmp_path), github.people["rex"].token)  # rex reads
    assert found.forge["access"] == "read"
    assert forge_missing(found) == [
        "forge: the token in GITHUB_TOKEN can read but not push to octo/widgets: it needs "
        "Contents: write (and Issues, Pull requests: write)"
    ]


def test_doctor_warns_but_does_not_stop_when_github_is_unreachable(tmp_path: Path) -> None:
    repo = github_repo_offline(tmp_path)
    found = doctor_with(repo, "ghp_any")
    assert forge_missing(found) == []
    assert any("GitHub not reached" in w for w in found.warnings), found.warnings
    assert found.forge["access"] == "unknown"


def test_doctor_offline_sends_nothing_and_the_cli_exits_by_what_github_said(
    github: GitHubLab, tmp_path: Path
) -> None:
    repo = widgets(github, tmp_path)
    env = {"PATH": os.environ["PATH"], "GITHUB_TOKEN": github.people["rex"].token}
    refused = phasegate_cli("doctor", "--repo", str(repo), env=env)
    out = " ".join(refused.stdout.split())
    assert "may NOT push" in out and "Contents: write" in out
    asked = len(repo_gets(github))
    assert asked == 1
    offline = phasegate_cli("doctor", "--repo", str(repo), "--offline", "--json", env=env)
    assert '"access": "unknown"' in offline.stdout and "Contents: write" not in offline.stdout
    assert len(repo_gets(github)) == asked  # --offline asked GitHub nothing
    assert "--offline" in phasegate_cli("doctor", "--help", env=env).stdout


def test_doctor_warns_when_the_apps_private_key_is_tracked_by_git(tmp_path: Path) -> None:
    repo = github_repo_offline(tmp_path)
    cartridge = repo / "phasegate.toml"
    cartridge.write_text(cartridge.read_text() + 'app_id = 42\nprivate_key_file = "app.pem"\n')
    (repo / "app.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    tracked = "forge.private_key_file app.pem is tracked by git"
    found = doctor_with(repo, "", offline=True)
    assert not [w for w in found.warnings if tracked in w]
    git(repo, "add", "app.pem")
    found = doctor_with(repo, "", offline=True)
    assert [w for w in found.warnings if tracked in w]
