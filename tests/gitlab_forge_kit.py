"""What the GitLab tests share: the fake GitLab with phasegate's bot, the forge on it,
a local clone, a team's project with a recording build agent, and the check that
every request the forge sent is one python-gitlab's managers describe.

The ``gitlab`` fixture serves ``support.gitlab_lab``'s Lab (alice Owner, dev
Developer, guest Guest, stranger nobody) plus ``phasegate-bot`` (Developer),
whose token is GITLAB_TOKEN; after the test every REST request recorded must
pass ``support.gitlab_models`` (the test fails otherwise).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from phasegate.config.forge import ForgeSettings
from phasegate.forge.gitlab.auth import GitLabAuth
from phasegate.forge.gitlab.forge import GitLabForge
from phasegate.forge.gitlab.numbers import is_merge_request, mr_iid
from phasegate.git.workspace import Workspace

from conftest import (
    ANSWERS_BUT_BUILD,
    branch_with_change,
    git,
    make_repo,
    recording_build,
    scripted_cartridge,
)
from support.gitlab_lab import PROJECT, Lab, served
from support.gitlab_model import ACCESS
from support.gitlab_models import all_problems

__all__ = [
    "BOT",
    "PROJECT",
    "TEAM",
    "gitlab",
    "forge_for",
    "gl_forge",
    "gl_local",
    "settings",
    "team_project",
]

BOT = "phasegate-bot"
TEAM = "acme/widgets"


@pytest.fixture
def gitlab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    """A fresh fake GitLab with phasegate's bot (Developer on acme/app); every REST
    request it answered is judged by python-gitlab's managers afterwards."""
    with served(tmp_path) as lab:
        lab.gl.add_user(BOT)
        lab.gl.add_member(PROJECT, BOT, "developer")
        monkeypatch.setenv("GITLAB_TOKEN", lab.token(BOT))
        yield lab
        with lab.gl.lock:
            recorded = list(lab.gl.requests)
        wrong = all_problems(recorded)
        if wrong:
            pytest.fail("requests python-gitlab's managers do not describe:\n" + "\n".join(wrong))


def settings(lab: Lab, repository: str = PROJECT, **given: object) -> ForgeSettings:
    return ForgeSettings(
        kind="gitlab",
        repository=repository,
        base_url=lab.gl.url,
        **given,  # type: ignore[arg-type]
    )


def forge_for(
    lab: Lab, local: Path, token: str | None = None, repository: str = PROJECT, **given: object
) -> GitLabForge:
    """phasegate's forge on the lab, as its bot (whose token must appear in no argv,
    config, URL, log or text sent)."""
    auth = GitLabAuth(token or lab.token(BOT), "the token in GITLAB_TOKEN")
    return GitLabForge(
        repository, auth, local, Workspace(), settings(lab, repository, **given),
        retry_backoff_s=0.01,
    )  # fmt: skip


@pytest.fixture
def gl_local(gitlab: Lab, tmp_path: Path) -> Path:
    """A clone of acme/app, its origin the project's URL without credentials."""
    checkout = tmp_path / "checkout"
    gitlab.git(
        "clone", "--quiet", gitlab.gl.clone_url(PROJECT, gitlab.token("alice")), str(checkout)
    )
    git(checkout, "remote", "set-url", "origin", gitlab.gl.clone_url(PROJECT))
    git(checkout, "config", "user.name", "Dev")
    git(checkout, "config", "user.email", "dev@example.com")
    (checkout / "app.py").write_text("x = 1\n")
    git(checkout, "add", "-A")
    git(checkout, "commit", "-qm", "app")
    git(checkout, "push", "-q", str(gitlab.gl.project(PROJECT).bare.path), "main")
    return checkout


@pytest.fixture
def gl_forge(gitlab: Lab, gl_local: Path) -> GitLabForge:
    return forge_for(gitlab, gl_local)


def cartridge_forge(lab: Lab, extra: str = "") -> str:
    """A ``[forge]`` table for the team's project on the lab (poll_s short, unless
    ``extra`` sets it)."""
    poll = "" if re.search(r"^poll_s\s*=", extra, re.MULTILINE) else "poll_s = 0.2\n"
    return (
        f'[forge]\nkind = "gitlab"\nrepository = "{TEAM}"\nbase_url = "{lab.gl.url}"\n{poll}{extra}'
    )


def team_project(
    lab: Lab,
    tmp_path: Path,
    roles: dict[str, str] | None = None,
    *,
    forge_extra: str = "",
    files: dict[str, str] | None = None,
    **cartridge: object,
) -> tuple[Path, Path]:
    """acme/widgets on the lab, seeded from a local repository whose cartridge has
    every role scripted but build (``recording_build``: prompts kept in
    ``prompts/``) and ``roles`` overriding; the bot and dev are Developers, guest a
    Guest, and Developers may merge into main. Returns (local repo, prompts dir)."""
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    overrides = {"build": recording_build(prompts), **(roles or {})}
    text = scripted_cartridge(role_overrides=overrides, **cartridge)  # type: ignore[arg-type]
    repo = make_repo(
        tmp_path / "repo",
        {
            "README.md": "# widgets\n",
            ".gitignore": ".phasegate/\n",
            "answers.toml": ANSWERS_BUT_BUILD,
            **(files or {}),
            "phasegate.toml": text + "\n" + cartridge_forge(lab, forge_extra),
        },
    )
    git(repo, "remote", "add", "origin", f"{lab.gl.url}/{TEAM}.git")
    project = lab.gl.create_project(TEAM, "alice", from_path=repo)
    project.merge_level = ACCESS["developer"]
    for name, role in ((BOT, "developer"), ("dev", "developer"), ("guest", "guest")):
        lab.gl.add_member(TEAM, name, role)
    return repo, prompts


CONFORMANCE = "acme/conformance"


def conformance_kit(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """The forge conformance suite's rig for GitLab (``forge_conformance_kit.KITS``):
    phasegate's bot (a Developer whom main's protection lets merge) on a fresh
    project, dev (Developer) its maintainer, guest (Guest) its reader. Every
    request is judged by python-gitlab's managers once the test ends. Its
    protection is the project's "pipelines must succeed": a status reported is a
    job of the commit's external pipeline, so a failed one holds the merge."""
    from forge_conformance_kit import Kit  # the suite's own rig: imported where it runs

    stack = contextlib.ExitStack()
    lab = stack.enter_context(served(tmp_path / "lab"))
    request.addfinalizer(stack.close)
    request.addfinalizer(lambda: _judged(lab))
    gl = lab.gl
    checkout = make_repo(tmp_path / "checkout", {"README.md": "# app\n", "app.py": "x = 1\n"})
    project = gl.create_project(CONFORMANCE, "alice", from_path=checkout)
    project.merge_level = ACCESS["developer"]
    gl.add_user(BOT)
    for name, role in ((BOT, "developer"), ("dev", "developer"), ("guest", "guest")):
        gl.add_member(CONFORMANCE, name, role)

    def noteable(number: int) -> Any:
        if is_merge_request(number):
            return project.merge_requests[mr_iid(number)]
        return project.issues[number]

    return Kit(
        "gitlab",
        forge_for(lab, checkout, repository=CONFORMANCE),
        checkout,
        maintainer="dev",
        reader="guest",
        open_issue=lambda title, body, by: gl.open_issue(CONFORMANCE, by, title, body).iid,
        say=lambda number, body, by: gl.comment(noteable(number), gl.users[by], body),
        label=lambda number, label, by: gl.label(CONFORMANCE, number, label, by),
        review_line=lambda pr, path, line, body, by: gl.line_comment(
            CONFORMANCE, mr_iid(pr), by, path, line, body
        ),
        report=lambda sha, context, state: gl.post_status(
            project, gl.users["dev"], sha, {"failure": "failed"}.get(state, state), name=context
        ),
        protect=lambda branch, contexts: setattr(
            project, "only_allow_merge_if_pipeline_succeeds", True
        ),
        fail=lambda method, path, status, times: gl.fail(method, path, status, times=times),
        paths={"issue": r"/projects/\d+/issues$", "comment": r"/projects/\d+/issues/\d+/notes$"},
    )


def _judged(lab: Lab) -> None:
    with lab.gl.lock:
        wrong = all_problems(list(lab.gl.requests))
    if wrong:
        pytest.fail("requests python-gitlab's managers do not describe:\n" + "\n".join(wrong))


__all__ += ["CONFORMANCE", "branch_with_change", "cartridge_forge", "conformance_kit"]
