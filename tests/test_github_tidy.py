"""GitHubForge tidying after itself, against the fake GitHub behind Prism: closing
a pull request, deleting a merged branch, making a status label two workers race
to make."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from phasegate.forge import ForgeUnavailable, GitHubForge
from phasegate.forge.github.faults import GitHubRefused

from conftest import GitHubLab, git
from github_forge_kit import REPO, branch_with_change, forge, forge_for, local, posts

__all__ = ["forge", "local"]  # the fixtures, used by name


def deletes(github: GitHubLab) -> list[int]:
    """The status of each DELETE of a git ref the fake answered."""
    return [
        r.status for r in github.server.requests if r.method == "DELETE" and "/git/refs/" in r.path
    ]


def test_closing_a_pull_request_twice_closes_it_once_and_a_merged_one_is_left_alone(
    github: GitHubLab, forge: GitHubForge, local: Path
) -> None:
    branch_with_change(local, "phasegate/w1-a")
    branch_with_change(local, "phasegate/w2-b", "x = 3\n")
    for branch in ("phasegate/w1-a", "phasegate/w2-b"):
        forge.publish_branch(branch)
    closing = forge.create_pull_request("phasegate/w1-a", "main", "a", "body")
    merged = forge.create_pull_request("phasegate/w2-b", "main", "b", "body")
    forge.merge_pull_request(merged, "Merge b")

    forge.close_pull_request(closing)
    forge.close_pull_request(closing)  # a retry after a lost answer: nothing more
    forge.close_pull_request(merged)
    assert forge.pull_request(closing).state == "closed"
    assert forge.pull_request(merged).state == "merged"
    patches = [r for r in github.server.requests if r.method == "PATCH" and "/pulls/" in r.path]
    assert [r.body for r in patches] == [{"state": "closed"}]
    closed = [e for e in github.server.pull(REPO, closing).events if e.event == "closed"]
    assert [e.actor.login for e in closed] == ["phasegate-bot"]


def test_a_500_while_closing_is_retried_and_one_past_the_retries_is_forge_unavailable(
    github: GitHubLab, forge: GitHubForge, local: Path
) -> None:
    branch_with_change(local, "phasegate/w1-a")
    forge.publish_branch("phasegate/w1-a")
    number = forge.create_pull_request("phasegate/w1-a", "main", "a", "body")
    github.server.fail("PATCH", rf"/pulls/{number}$", 500, times=1)
    forge.close_pull_request(number)
    assert forge.pull_request(number).state == "closed"

    branch_with_change(local, "phasegate/w2-b", "x = 3\n")
    forge.publish_branch("phasegate/w2-b")
    second = forge.create_pull_request("phasegate/w2-b", "main", "b", "body")
    github.server.fail("PATCH", rf"/pulls/{second}$", 500, times=4)  # max_retries is 3
    with pytest.raises(ForgeUnavailable):
        forge.close_pull_request(second)
    assert forge.pull_request(second).state == "open"


def test_deleting_a_branch_with_slashes_is_idempotent_and_never_deletes_a_protected_one(
    github: GitHubLab, forge: GitHubForge, local: Path
) -> None:
    branch_with_change(local, "phasegate/w1-a")
    forge.publish_branch("phasegate/w1-a")
    bare = github.server.repo(REPO).git
    assert bare.branch_sha("phasegate/w1-a") is not None

    forge.delete_branch("phasegate/w1-a")
    assert bare.branch_sha("phasegate/w1-a") is None
    forge.delete_branch("phasegate/w1-a")  # gone already: GitHub's 422, no error
    assert deletes(github) == [204, 422]

    with pytest.raises(GitHubRefused, match="default branch") as refused:
        forge.delete_branch("main")
    assert refused.value.status == 422
    git(local, "branch", "-q", "release", "main")
    forge.publish_branch("release")
    github.server.protect(REPO, "release", ["ci/tests"])
    with pytest.raises(GitHubRefused, match="protected"):
        forge.delete_branch("release")
    assert bare.branch_sha("main") is not None and bare.branch_sha("release") is not None


def test_two_workers_racing_to_make_a_status_label_both_succeed_without_a_warning(
    github: GitHubLab, forge: GitHubForge, local: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    other = forge_for(github, local)
    first = forge.create_issue("one", "b", "phasegate:workflow:aaaaaaa1")
    second = other.create_issue("two", "b", "phasegate:workflow:aaaaaaa2")
    # Each worker lists the repository's labels once; the other makes one after.
    other.set_status_label(second, "phasegate:planning")
    forge.set_status_label(first, "phasegate:waiting")
    other.set_status_label(second, "phasegate:waiting")  # GitHub: already_exists

    assert [x.name for x in github.server.issue(REPO, second).labels] == ["phasegate:waiting"]
    made = [r.status for r in posts(github, "/labels") if r.path.endswith("/repos/octo/app/labels")]
    assert made == [201, 201, 422]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]

    github.server.fail("POST", r"/repos/octo/app/labels$", 422, times=1)
    with pytest.raises(GitHubRefused):  # a 422 that is not already_exists is a refusal
        forge_for(github, local).set_status_label(first, "phasegate:merging")
