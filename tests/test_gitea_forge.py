"""GiteaForge's calls one by one on the fake Gitea: the repository read from the
origin remote, a base_url that would send the token in the clear refused, status
labels replacing each other, a pull request found by its own head only, statuses
read as checks, the protection rule that applies to a branch, and a duplicate
label another worker made."""

from __future__ import annotations

import email.utils
from pathlib import Path

import httpx
import pytest

from phasegate.config.cartridge import load_cartridge
from phasegate.config.forge import ForgeSettings
from phasegate.forge.base import ForgeError
from phasegate.forge.gitea.auth import GiteaAuth, instance_url, repository_from_origin
from phasegate.forge.gitea.forge import GiteaForge
from phasegate.forge.retries import ForgeRetry, watching
from phasegate.git.workspace import Workspace

from conftest import git, make_repo
from gitea_forge_kit import REPO, GiteaLab, gitea, team_repo

__all__ = ["gitea"]


def forge_of(lab: GiteaLab, repo: Path) -> GiteaForge:
    auth = GiteaAuth(lab.bot_token, "the token in GITEA_TOKEN")
    settings = load_cartridge(repo).forge
    return GiteaForge(REPO, auth, repo, Workspace(), settings, retry_backoff_s=0.01)


@pytest.mark.parametrize(
    ("origin", "base_url", "found"),
    [
        ("https://git.example.com/octo/widgets.git", "https://git.example.com", "octo/widgets"),
        ("https://example.com/gitea/octo/w.x", "https://example.com/gitea/", "octo/w.x"),
        ("ssh://git@git.example.com:2222/octo/w.git", "https://git.example.com", "octo/w"),
        ("git@git.example.com:octo/widgets.git", "https://git.example.com/api/v1", "octo/widgets"),
        ("https://elsewhere.org/octo/widgets.git", "https://git.example.com", None),
        ("/srv/git/octo/widgets.git", "https://git.example.com", None),
    ],
)  # fmt: skip
def test_the_repository_is_read_from_origin_on_the_instances_host_only(
    tmp_path: Path, origin: str, base_url: str, found: str | None
) -> None:
    repo = make_repo(tmp_path / "repo")
    git(repo, "remote", "add", "origin", origin)
    if found is None:
        with pytest.raises(ForgeError, match="forge"):
            repository_from_origin(repo, base_url)
    else:
        assert repository_from_origin(repo, base_url) == found


def test_a_base_url_that_would_send_the_token_in_the_clear_is_refused() -> None:
    assert instance_url("https://git.example.com/api/v1/") == "https://git.example.com"
    assert instance_url("http://127.0.0.1:3000") == "http://127.0.0.1:3000"
    for bad in ("http://git.example.com", "https://me:pw@git.example.com", "ftp://x"):
        with pytest.raises(ForgeError, match="forge.base_url"):
            instance_url(bad)


def test_status_labels_replace_each_other_and_leave_other_labels_alone(
    gitea: GiteaLab, tmp_path: Path
) -> None:
    repo, _ = team_repo(gitea, tmp_path)
    forge = forge_of(gitea, repo)
    number = forge.create_issue("t", "b", "phasegate:workflow:w1")
    gitea.label("maya", number, "bug")
    forge.set_status_label(number, "phasegate:planning")
    forge.set_status_label(number, "phasegate:waiting")
    assert gitea.labels(number) == {"bug", "phasegate:waiting"}
    # Another worker's forge, which has not seen the label made: it finds it.
    other = forge_of(gitea, repo)
    gitea.server.create_label(gitea.server.repo(REPO), "phasegate:done", "00ff00")
    other.set_status_label(number, "phasegate:done")
    forge.set_status_label(number, None)
    assert gitea.labels(number) == {"bug"}
    names = [lb.name for lb in gitea.server.repo(REPO).labels.values()]
    assert sorted(names) == sorted(set(names))  # no label made twice
    with pytest.raises(ForgeError, match="no status label"):
        forge.set_status_label(number, "bug")
    assert forge.issue(number).body == "b"  # the marker is bookkeeping, not the text


def test_a_pull_request_is_found_by_its_own_head_and_statuses_read_as_checks(
    gitea: GiteaLab, tmp_path: Path
) -> None:
    repo, _ = team_repo(gitea, tmp_path)
    forge = forge_of(gitea, repo)
    for branch in ("phasegate/a", "phasegate/ab"):
        git(repo, "checkout", "-q", "-b", branch)
        (repo / f"{branch[-2:].strip('/')}.txt").write_text("x\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", branch)
        git(repo, "checkout", "-q", "main")
        forge.publish_branch(branch)
    assert forge.find_pull_request("phasegate/a") is None
    first = forge.create_pull_request("phasegate/a", "main", "A", "Fixes #1")
    second = forge.create_pull_request("phasegate/ab", "main", "AB", "b")
    assert forge.find_pull_request("phasegate/a") == first != second
    assert forge.create_pull_request("phasegate/a", "main", "A", "again") == first  # 409
    pr = forge.pull_request(first)
    assert (pr.head, pr.base, pr.state) == ("phasegate/a", "main", "open")
    assert pr.body.startswith("Implements #1")  # no closing keyword reaches Gitea
    sha = str(pr.head_sha)
    for context, state in (("lint", "warning"), ("docs", "skipped"), ("ci", "pending")):
        gitea.status(sha, context, state, f"{context} said {state}")
    gitea.status(sha, "ci", "error", "boom")
    found = {c.name: (c.state, c.output) for c in forge.checks(sha)}
    assert found == {
        "lint": ("failure", "lint said warning"),
        "docs": ("success", "docs said skipped"),
        "ci": ("failure", "boom"),
    }
    forge.close_pull_request(second)
    forge.close_pull_request(second)  # closed already: left alone
    assert forge.pull_request(second).state == "closed"


def test_the_protection_rule_that_applies_gives_the_required_contexts(
    gitea: GiteaLab, tmp_path: Path
) -> None:
    repo, _ = team_repo(gitea, tmp_path)
    forge = forge_of(gitea, repo)
    assert forge.required_checks("main") == []
    gitea.protect("release/*", ["ci/tests", "ci/*", "phasegate"])
    gitea.protect("main", ["build"])
    assert forge.required_checks("main") == []  # kept for a while
    assert forge.required_checks("main", fresh=True) == ["build"]
    assert forge.required_checks("release/1.0") == ["ci/tests", "phasegate"]  # a glob left out
    assert forge.required_checks("release/1.0/x") == []  # * stays in one segment
    maya = GiteaForge(
        REPO, GiteaAuth(gitea.token("maya"), "the token in GITEA_TOKEN"), repo, Workspace(),
        load_cartridge(repo).forge,
    )  # fmt: skip
    assert maya.required_checks("main") == []  # not an administrator: the rules are hidden


def test_a_get_gitea_answered_with_an_etag_is_asked_again_conditionally(tmp_path: Path) -> None:
    """The network replaced (httpx's MockTransport): Gitea gives an ETag on some
    answers, and a 304 to a GET naming it hands back the answer kept."""
    seen: list[str | None] = []
    body = {"number": 3, "title": "t", "body": "b", "state": "open", "labels": []}

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("if-none-match"))
        assert request.headers["authorization"] == "token s3cret-token-value"
        if request.headers.get("if-none-match") == '"v1"':
            return httpx.Response(304, headers={"ETag": '"v1"'})
        return httpx.Response(200, json=body, headers={"ETag": '"v1"'})

    repo = make_repo(tmp_path / "repo")
    settings = ForgeSettings(kind="gitea", repository=REPO, base_url="https://git.example.com")
    forge = GiteaForge(
        REPO, GiteaAuth("s3cret-token-value", "the token in GITEA_TOKEN"), repo, Workspace(),
        settings, transport=httpx.MockTransport(answer),
    )  # fmt: skip
    assert forge.issue(3).title == forge.issue(3).title == "t"
    assert seen == [None, '"v1"'] and forge.not_modified == 1


def test_a_429_whose_retry_after_is_a_date_is_waited_out(tmp_path: Path) -> None:
    """Retry-After as an HTTP date (a proxy in front of Gitea may send one)."""
    answers = iter(
        [
            httpx.Response(429, headers={"Retry-After": email.utils.formatdate(usegmt=True)}),
            httpx.Response(200, json={"number": 3, "title": "t", "state": "open"}),
        ]
    )
    repo = make_repo(tmp_path / "repo")
    settings = ForgeSettings(kind="gitea", repository=REPO, base_url="https://git.example.com")
    forge = GiteaForge(
        REPO, GiteaAuth("s3cret-token-value", "the token in GITEA_TOKEN"), repo, Workspace(),
        settings, transport=httpx.MockTransport(lambda _: next(answers)),
    )  # fmt: skip
    seen: list[ForgeRetry] = []
    with watching(seen.append):
        assert forge.issue(3).title == "t"
    [retry] = seen
    assert (retry.why, retry.status, retry.attempt) == ("rate_limit", 429, 2)
    assert retry.wait_s <= 1.0
