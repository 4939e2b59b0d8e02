"""The commands on a GitLab forge: ``phasegate doctor`` asks GitLab once for the
token's role, ``phasegate watch --once`` and ``phasegate import GROUP/…/NAME#N``
take the project's issues, as on GitHub. The fake GitLab, real git."""

from __future__ import annotations

import json
import os
from pathlib import Path

from phasegate.tools.doctor import Diagnosis, diagnose

from conftest import phasegate_cli
from gitlab_forge_kit import BOT, TEAM, gitlab, team_project
from support.gitlab_lab import Lab

__all__ = ["gitlab"]  # a fixture, used by name


def doctor_with(repo: Path, token: str, **kwargs: object) -> Diagnosis:
    which = lambda name: f"/usr/bin/{name}"  # noqa: E731
    return diagnose(repo, which=which, environ={"GITLAB_TOKEN": token}, **kwargs)  # type: ignore[arg-type]


def forge_missing(found: Diagnosis) -> list[str]:
    return [m for m in found.missing if m.startswith("forge")]


def test_doctor_says_whose_token_and_its_role_and_offline_asks_nothing(
    gitlab: Lab, tmp_path: Path
) -> None:
    repo, _ = team_project(gitlab, tmp_path)
    found = doctor_with(repo, gitlab.token(BOT))
    assert (found.forge["kind"], found.forge["repository"], found.forge["access"]) == (
        "gitlab", TEAM, "push",
    )  # fmt: skip
    assert found.forge["credentials"] == "the token in GITLAB_TOKEN"
    assert forge_missing(found) == []
    guest = doctor_with(repo, gitlab.token("guest"))
    assert guest.forge["access"] == "read"
    assert forge_missing(guest) == [
        f"forge: the token in GITLAB_TOKEN has access level 10 on {TEAM}: phasegate needs "
        "Developer (30) or higher to push, open merge requests and post statuses"
    ]
    [refused] = forge_missing(doctor_with(repo, "glpat-revoked"))
    assert "GITLAB_TOKEN" in refused and "401" in refused and "glpat-revoked" not in refused
    [unseen] = forge_missing(doctor_with(repo, gitlab.token("stranger")))
    assert TEAM in unseen and "forge.repository" in unseen
    asked = len(gitlab.gl.requests)
    offline = doctor_with(repo, gitlab.token(BOT), offline=True)
    assert offline.forge["access"] == "unknown" and len(gitlab.gl.requests) == asked
    [unset] = forge_missing(doctor_with(repo, ""))
    assert "GITLAB_TOKEN is not set" in unset


def test_watch_and_import_take_the_projects_issues(gitlab: Lab, tmp_path: Path) -> None:
    repo, _ = team_project(gitlab, tmp_path)
    gl = gitlab.gl
    env = {"PATH": os.environ["PATH"], "GITLAB_TOKEN": gitlab.token(BOT)}
    labelled = gl.open_issue(TEAM, "dev", "Add it", "Write feature.txt.")
    gl.label(TEAM, labelled.iid, "phasegate", by="dev")
    other = gl.open_issue(TEAM, "alice", "Another", "Write other.txt.")
    watched = phasegate_cli("watch", "--once", "--json", "--repo", str(repo), env=env)
    assert watched.returncode == 0, watched.stderr
    assert '"labelled_by": "dev"' in watched.stdout, watched.stdout
    again = phasegate_cli("watch", "--once", "--json", "--repo", str(repo), env=env)
    assert again.returncode == 0, again.stderr
    assert [json.loads(line) for line in again.stdout.splitlines()] == [
        {"event": "nothing", "repository": TEAM, "label": "phasegate"}
    ]  # nothing to do is said in JSON too, not with silence
    imported = phasegate_cli(
        "import", f"{TEAM}#{other.iid}", "--no-advance", "--repo", str(repo), env=env
    )
    assert imported.returncode == 0, imported.stderr
    foreign = phasegate_cli("import", "acme/else#1", "--no-advance", "--repo", str(repo), env=env)
    assert foreign.returncode == 2 and "acme/else#1" in foreign.stderr
