"""What the forge conformance suite asks of each forge's rig: phasegate's forge on a
fresh repository, and the people who act on that repository.

A ``Kit`` holds the forge as phasegate's bot and the checkout it works in, and
what people do there: file an issue, comment, label, review a line, report a
check, protect a branch. A forge without people (the local one) leaves those
unset, and the suite runs on it only what needs none of them. ``KITS`` names
each rig's fixture-level builder; a new forge adds one builder here and the whole
suite runs on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from phasegate.forge.base import Forge
from phasegate.forge.local import LocalForge
from phasegate.git.workspace import Workspace
from phasegate.store import open_store

from conftest import branch_with_change, make_repo
from gitea_forge_kit import conformance_kit as gitea_kit
from github_forge_kit import REPO, forge_for
from gitlab_forge_kit import conformance_kit as gitlab_kit

__all__ = ["KITS", "Kit", "branch_with_change", "kits_with"]


@dataclass
class Kit:
    """A forge under test and what people do on it (each ``None`` where it has none).

    ``open_issue(title, body, by) -> number``; ``say(number, body, by)``;
    ``label(number, label, by)``; ``review_line(pr, path, line, body, by)``;
    ``report(sha, context, state)`` with state success, failure or pending;
    ``protect(branch, contexts)`` requires those checks before a merge into it (on
    GitLab: pipelines must succeed, the statuses being the pipeline's jobs);
    ``fail(method, path_regex, status, times)`` answers the next ``times`` matching
    requests with ``status``, unhandled; ``paths`` holds the regexes of the
    forge's ``create_issue`` and ``comment`` requests.
    """

    name: str
    forge: Forge
    checkout: Path
    maintainer: str | None = None
    reader: str | None = None
    open_issue: Callable[[str, str, str], int] | None = None
    say: Callable[[int, str, str], None] | None = None
    label: Callable[[int, str, str], None] | None = None
    review_line: Callable[[int, str, int, str, str], None] | None = None
    report: Callable[[str, str, str], None] | None = None
    protect: Callable[[str, list[str]], None] | None = None
    fail: Callable[[str, str, int, int], None] | None = None
    paths: dict[str, str] | None = None
    #: The forge's branches are phasegate's repository's (no head of its own to report).
    shares_repository: bool = False


def _checkout(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "checkout", {"README.md": "# app\n", "app.py": "x = 1\n"})


def local_kit(request: pytest.FixtureRequest, tmp_path: Path) -> Kit:
    checkout = _checkout(tmp_path)
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    request.addfinalizer(store.close)
    forge = LocalForge(store, checkout, Workspace(), secrets=[])
    return Kit("local", forge, checkout, shares_repository=True)


def github_kit(request: pytest.FixtureRequest, tmp_path: Path) -> Kit:
    lab = request.getfixturevalue("github")
    checkout = _checkout(tmp_path)
    gh = lab.server
    gh.create_repo("octo", "app", from_path=checkout)
    for login, permission in (("phasegate-bot", "write"), ("maya", "maintain"), ("rex", "read")):
        gh.grant(REPO, login, permission)
    gh.add_user("ci-bot")
    gh.grant(REPO, "ci-bot", "write")
    return Kit(
        "github",
        forge_for(lab, checkout),
        checkout,
        maintainer="maya",
        reader="rex",
        open_issue=lambda title, body, by: gh.open_issue(REPO, title, body, by).number,
        say=lambda number, body, by: gh.comment(REPO, number, body, by),
        label=lambda number, label, by: gh.label(REPO, number, label, by=by),
        review_line=lambda pr, path, line, body, by: gh.review(
            REPO, pr, by, "COMMENTED", comments=[(path, line, body)]
        ),
        report=lambda sha, context, state: gh.status(REPO, sha, context, state, "ci-bot"),
        protect=lambda branch, contexts: gh.protect(REPO, branch, contexts),
        fail=lambda method, path, status, times: gh.fail(method, path, status, times=times),
        paths={
            "issue": rf"/repos/{REPO}/issues$",
            "comment": rf"/repos/{REPO}/issues/\d+/comments$",
        },
    )


#: Each forge's rig, by the name the suite's ids show.
KITS: dict[str, Callable[[pytest.FixtureRequest, Path], Kit]] = {
    "local": local_kit,
    "github": github_kit,
    "gitlab": gitlab_kit,
    "gitea": gitea_kit,
}

#: What each rig's people can do (the Kit fields it sets).
_CAN = {
    "local": set(),
    "github": {"people", "labels", "ci", "faults"},
    "gitlab": {"people", "labels", "ci", "faults"},
    "gitea": {"people", "labels", "ci", "faults"},
}


def kits_with(*needs: str) -> list[str]:
    """The rigs that can do all of ``needs`` (people, labels, ci, faults): the suite's
    params, so a test a forge cannot take is not generated for it (never skipped)."""
    return [name for name in KITS if set(needs) <= _CAN[name]]
