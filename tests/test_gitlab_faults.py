"""GitLabForge's faults, caused on the fake GitLab: rate limits waited out within
their bound, 5xx retried without creating anything twice, a timed-out create
found again instead of repeated, a failed push pushed again, 401/404 named, and
each wait reported as a ForgeRetry."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from phasegate.forge.base import ForgeAuthError, ForgeNotFound, ForgeUnavailable
from phasegate.forge.gitlab.forge import GitLabForge
from phasegate.forge.retries import ForgeRetry, watching

from conftest import git
from gitlab_forge_kit import PROJECT, branch_with_change, forge_for, gitlab, gl_forge, gl_local
from support.gitlab_lab import Lab

__all__ = ["gitlab", "gl_forge", "gl_local"]  # fixtures, used by name


def statuses(lab: Lab, method: str, suffix: str) -> list[int]:
    return [r.status for r in lab.gl.requests if r.method == method and r.path.endswith(suffix)]


def test_a_429_with_retry_after_is_waited_out_and_makes_one_merge_request(
    gitlab: Lab, gl_forge: GitLabForge, gl_local: Path
) -> None:
    branch_with_change(gl_local, "feature")
    gl_forge.publish_branch("feature")
    gitlab.gl.fail("POST", r"/merge_requests$", 429, times=1, headers={"Retry-After": "1"})
    seen: list[ForgeRetry] = []
    started = time.monotonic()
    with watching(seen.append):
        number = gl_forge.create_pull_request("feature", "main", "t", "b")
    assert time.monotonic() - started >= 1
    assert gl_forge.find_pull_request("feature") == number
    assert len(gitlab.gl.project(PROJECT).merge_requests) == 1
    assert statuses(gitlab, "POST", "/merge_requests") == [429, 201]
    assert [(r.status, r.wait_s, r.why, r.attempt) for r in seen] == [(429, 1.0, "rate_limit", 2)]


def test_a_rate_limit_longer_than_the_bound_is_forge_unavailable_with_its_wait(
    gitlab: Lab, gl_local: Path, gl_forge: GitLabForge
) -> None:
    patient = forge_for(gitlab, gl_local, max_rate_limit_wait_s=5)
    gitlab.gl.fail("GET", r"/issues/1$", 429, times=1, headers={"Retry-After": "60"})
    with pytest.raises(ForgeUnavailable, match="rate limit") as limited:
        patient.issue(1)
    assert limited.value.retry_after_s == 60


def test_500s_create_nothing_twice_and_a_get_is_retried_within_its_bound(
    gitlab: Lab, gl_local: Path, gl_forge: GitLabForge
) -> None:
    bounded = forge_for(gitlab, gl_local, max_retries=2)
    gitlab.gl.fail("POST", r"/issues$", 500, times=3)
    seen: list[ForgeRetry] = []
    with watching(seen.append), pytest.raises(ForgeUnavailable, match="500"):
        bounded.create_issue("t", "b", "phasegate:workflow:w1")
    assert gitlab.gl.project(PROJECT).issues == {}
    # each 500 was looked up (GET issues) before the POST was tried again
    assert [r.why for r in seen] == ["transient", "transient"]
    assert statuses(gitlab, "POST", "/issues") == [500, 500, 500]
    assert bounded.create_issue("t", "b", "phasegate:workflow:w1") == 1  # resume goes on
    gitlab.gl.fail("GET", r"/issues/1$", 502, times=2)
    assert bounded.issue(1).title == "t"  # two 502s are within max_retries
    gitlab.gl.fail("GET", r"/issues/1$", 503, times=3)
    with pytest.raises(ForgeUnavailable, match="503"):
        bounded.issue(1)


def test_a_create_that_timed_out_is_found_again_not_repeated(
    gitlab: Lab, gl_local: Path, gl_forge: GitLabForge
) -> None:
    hasty = forge_for(gitlab, gl_local, timeout_s=0.5)
    gitlab.gl.delay("POST", r"/issues$", 1.5)
    with pytest.raises(ForgeUnavailable, match="in time") as late:
        hasty.create_issue("t", "b", "phasegate:workflow:w1")
    assert late.value.retry_after_s == 1.0  # twice forge.timeout_s: the journal looks then
    time.sleep(1.5)
    # what the journal does on resume: look for it by its marker before creating again
    assert hasty.find_issue("phasegate:workflow:w1") == 1
    assert len(gitlab.gl.project(PROJECT).issues) == 1
    gitlab.gl.delay("POST", r"/issues/1/notes$", 1.5)
    with pytest.raises(ForgeUnavailable):
        hasty.comment(1, "the plan", "phasegate:w1:plan")
    time.sleep(1.5)
    assert hasty.find_comment(1, "phasegate:w1:plan") is not None
    assert len(gitlab.gl.project(PROJECT).issues[1].notes) == 1


def test_a_merge_answered_500_is_merged_once_and_a_failed_push_is_pushed_again(
    gitlab: Lab, gl_forge: GitLabForge, gl_local: Path
) -> None:
    gitlab.gl.project(PROJECT).merge_level = 30
    head = branch_with_change(gl_local, "feature")
    gitlab.gl.fail("POST", r"git-receive-pack", 500, times=1)
    gl_forge.publish_branch("feature")
    assert gitlab.gl.project(PROJECT).bare.branch_sha("feature") == head
    number = gl_forge.create_pull_request("feature", "main", "t", "b")
    gitlab.gl.fail("PUT", r"/merge$", 502, times=2)
    sha = gl_forge.merge_pull_request(number, "Merge it", head)
    assert statuses(gitlab, "PUT", "/merge") == [502, 502, 200]
    assert gitlab.gl.project(PROJECT).bare.branch_sha("main") == sha
    assert git(gl_local, "cat-file", "-t", sha) == "commit"


def test_a_wrong_token_and_a_missing_project_are_named(gitlab: Lab, gl_local: Path) -> None:
    wrong = forge_for(gitlab, gl_local, token="glpat-wrong")
    with pytest.raises(ForgeAuthError, match="GITLAB_TOKEN") as refused:
        wrong.issue(1)
    assert "glpat-wrong" not in str(refused.value)
    missing = forge_for(gitlab, gl_local, repository="acme/nothing")
    with pytest.raises(ForgeNotFound, match="acme/nothing"):
        missing.find_issue("x")
    outsider = forge_for(gitlab, gl_local, token=gitlab.token("stranger"))
    with pytest.raises(ForgeNotFound, match="forge.repository"):
        outsider.issue(1)
