"""GitHubForge's faults, caused on the fake GitHub behind Prism: rate limits waited
out within their bound, 5xx retried without creating anything twice, a failed
push pushed again, 401/403/404 named."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from phasegate.forge import ForgeAuth, ForgeAuthError, ForgeNotFound, ForgeUnavailable, GitHubForge
from phasegate.git.workspace import Workspace

from conftest import GitHubLab
from github_forge_kit import REPO, branch_with_change, forge, forge_for, local, posts, settings

__all__ = ["forge", "local"]  # fixtures, used by name


def test_a_429_with_retry_after_is_waited_out_and_makes_one_pull_request(
    github: GitHubLab, forge: GitHubForge, local: Path
) -> None:
    branch_with_change(local, "feature")
    forge.publish_branch("feature")
    github.server.fail("POST", r"/pulls$", 429, times=1, headers={"Retry-After": "1"})
    number = forge.create_pull_request("feature", "main", "t", "b")
    assert forge.find_pull_request("feature") == number
    assert github.server.counts(REPO)["pulls"] == 1
    assert [r.status for r in posts(github, "/pulls")] == [429, 201]


def test_a_primary_rate_limit_waits_until_x_ratelimit_reset(
    github: GitHubLab, forge: GitHubForge
) -> None:
    number = forge.create_issue("t", "b", "phasegate:workflow:w1")
    reset = str(int(time.time()) + 1)
    github.server.fail(
        "GET",
        rf"/issues/{number}$",
        403,
        headers={"x-ratelimit-remaining": "0", "x-ratelimit-reset": reset},
        body={"message": "API rate limit exceeded for user ID 1."},
    )
    started = time.monotonic()
    assert forge.issue(number).title == "t"
    assert time.monotonic() - started < 5  # waited for the reset, not githubkit's minute
    gets = [r.status for r in github.server.requests if r.path.endswith(f"/issues/{number}")]
    assert gets == [403, 200]


def test_a_rate_limit_longer_than_the_bound_is_forge_unavailable(
    github: GitHubLab, local: Path, forge: GitHubForge
) -> None:
    patient = forge_for(github, local, max_rate_limit_wait_s=5)
    github.server.fail(
        "GET",
        r"/issues/1$",
        403,
        times=1,
        headers={"Retry-After": "60"},
        body={"message": "secondary rate limit"},
    )
    with pytest.raises(ForgeUnavailable, match="rate limit"):
        patient.issue(1)


def test_three_500s_are_forge_unavailable_and_create_nothing_twice(
    github: GitHubLab, local: Path, forge: GitHubForge
) -> None:
    bounded = forge_for(github, local, max_retries=2)
    github.server.fail("POST", r"/issues$", 500, times=3)
    with pytest.raises(ForgeUnavailable, match="500"):
        bounded.create_issue("t", "b", "phasegate:workflow:w1")
    assert github.server.counts(REPO)["issues"] == 0
    assert bounded.create_issue("t", "b", "phasegate:workflow:w1") == 1  # resume goes on
    github.server.fail("GET", r"/issues/1$", 502, times=2)
    assert bounded.issue(1).title == "t"  # two 502s are within max_retries


def test_a_push_github_fails_with_500_once_is_pushed_on_the_next_try(
    github: GitHubLab, forge: GitHubForge, local: Path
) -> None:
    sha = branch_with_change(local, "feature")
    github.server.fail("POST", r"git-receive-pack$", 500, times=1)
    forge.publish_branch("feature")
    assert github.server.repo(REPO).git.git("rev-parse", "refs/heads/feature").strip() == sha
    statuses = [r.status for r in github.server.requests if r.path.endswith("git-receive-pack")]
    assert statuses[0] == 500 and statuses[-1] == 200


def test_401_is_an_auth_error_naming_the_token_variable(
    github: GitHubLab, local: Path, forge: GitHubForge
) -> None:
    wrong = GitHubForge(
        REPO,
        ForgeAuth.from_token("ghp_WRONG0123456789abcdefWRONG", "PHASEGATE_GH"),
        local,
        Workspace(),
        settings(github.api_url, token_env="PHASEGATE_GH"),
    )
    with pytest.raises(ForgeAuthError, match="PHASEGATE_GH") as raised:
        wrong.issue(1)
    assert "401" in str(raised.value) and "ghp_WRONG" not in str(raised.value)


def test_403_is_an_auth_error_naming_the_permission(github: GitHubLab, forge: GitHubForge) -> None:
    github.server.fail(
        "POST",
        r"/issues$",
        403,
        body={"message": "Resource not accessible by integration"},
        headers={"x-accepted-github-permissions": "issues=write"},
    )
    with pytest.raises(ForgeAuthError, match="issues=write") as raised:
        forge.create_issue("t", "b", "m")
    assert "Resource not accessible" in str(raised.value)


def test_404_is_not_found_naming_the_repository(
    github: GitHubLab, local: Path, forge: GitHubForge
) -> None:
    missing = GitHubForge(
        "octo/gone",
        ForgeAuth.from_token(github.bot.token, "GITHUB_TOKEN"),
        local,
        Workspace(),
        settings(github.api_url),
    )
    with pytest.raises(ForgeNotFound, match="octo/gone"):
        missing.publish_branch("main")
    with pytest.raises(ForgeNotFound, match="octo/gone"):
        missing.create_issue("t", "b", "m")
