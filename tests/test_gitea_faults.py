"""GiteaForge's faults, caused on the fake Gitea: 5xx retried without creating
anything twice, a 429 with Retry-After waited out (a log line and a forge_retry
event), a create or merge whose answer timed out found on resume, never
repeated; 401, 403 and 404 named."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from phasegate.config.cartridge import load_cartridge
from phasegate.core import decisions
from phasegate.forge.base import ForgeAuthError, ForgeNotFound, ForgeUnavailable
from phasegate.forge.gitea.auth import GiteaAuth
from phasegate.forge.gitea.forge import GiteaForge
from phasegate.git.workspace import Workspace
from phasegate.runtime.engine import Engine
from phasegate.store import Store

from gitea_forge_kit import REPO, GiteaLab, gitea, team_repo

__all__ = ["gitea"]

Build = Callable[..., tuple[Engine, Store]]
PATH = "/repos/octo/widgets"


def quick_forge(lab: GiteaLab, repo: Path, token: str | None = None) -> GiteaForge:
    """The cartridge's Gitea forge with a 10 ms first backoff between tries."""
    settings = load_cartridge(repo).forge
    auth = GiteaAuth(token or lab.bot_token, "the token in GITEA_TOKEN")
    return GiteaForge(REPO, auth, repo, Workspace(), settings, retry_backoff_s=0.01)


def events(store: Store, workflow_id: str, kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in store.events(workflow_id, types=(kind,))]


def bot_comments(lab: GiteaLab, number: int) -> list[str]:
    return [c.body for c in lab.issue(number).comments if c.user.login == "phasegate-bot"]


def until(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_500s_and_a_429_with_retry_after_make_one_issue_pull_request_and_comment_each(
    gitea: GiteaLab, tmp_path: Path, engine_for: Build, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="phasegate.forge.retries")
    repo, _ = team_repo(gitea, tmp_path, auto_merge=False)
    engine, store = engine_for(repo, forge=quick_forge(gitea, repo))
    server = gitea.server
    server.fail("POST", rf"{PATH}/issues$", 500, times=1)
    server.fail("POST", rf"{PATH}/pulls$", 429, times=1, headers={"Retry-After": "1"})
    server.fail("POST", rf"{PATH}/issues/\d+/comments$", 502, times=2)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "waiting", row["error"]
    assert gitea.counts() == {"issues": 1, "pulls": 1, "merges": 0}
    said = bot_comments(gitea, row["issue_number"])
    assert len([s for s in said if "**Plan (round 1)**" in s]) == 1
    assert len([s for s in said if "Progress report" in s]) == 1
    assert [r.status for r in gitea.posts("/pulls")] == [429, 201]
    # Every wait is a log line and an event of the workflow, as GitHub's are.
    retries = events(store, workflow_id, "forge_retry")
    limited = [r for r in retries if r["why"] == "rate_limit"]
    assert limited == [
        {
            "call": f"POST /api/v1{PATH}/pulls",
            "status": 429,
            "wait_s": 1.0,
            "attempt": 2,
            "why": "rate_limit",
        }
    ]
    assert {(r["call"], r["status"]) for r in retries if r["why"] == "transient"} >= {
        (f"POST /api/v1{PATH}/issues", 500),
        (f"POST /api/v1{PATH}/issues/1/comments", 502),
    }
    assert "forge retry: POST /api/v1/repos/octo/widgets/pulls answered 429" in caplog.text


def test_more_500s_than_the_retries_pause_and_a_resume_creates_nothing_twice(
    gitea: GiteaLab, tmp_path: Path, engine_for: Build
) -> None:
    repo, _ = team_repo(gitea, tmp_path, auto_merge=False, forge_extra='required_checks = ["ci"]\n')
    engine, store = engine_for(repo, forge=quick_forge(gitea, repo))
    # More 500s than forge.max_retries (3) allows one call: the workflow pauses.
    gitea.server.fail("POST", rf"{PATH}/issues/\d+/comments$", 500, times=4)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "paused" and row["error"].startswith("forge_unavailable:"), row
    before = gitea.counts()

    gitea.server.faults.clear()
    engine.decide(workflow_id, decisions.resume)
    row = engine.advance(workflow_id)
    assert row["current_phase"] in ("pr_review", "report"), row["error"]
    assert gitea.counts()["issues"] == before["issues"] == 1
    assert gitea.counts()["pulls"] <= 1 and len(gitea.posts("/pulls")) == gitea.counts()["pulls"]
    said = bot_comments(gitea, row["issue_number"])
    assert len([s for s in said if "**Plan (round 1)**" in s]) == 1


def test_an_issue_a_comment_and_a_merge_whose_answers_timed_out_are_made_once(
    gitea: GiteaLab, tmp_path: Path, engine_for: Build
) -> None:
    extra = "timeout_s = 1\nauto_resume_s = 0.05\n"
    repo, _ = team_repo(gitea, tmp_path, auto_merge=True, forge_extra=extra)
    engine, store = engine_for(repo, forge=quick_forge(gitea, repo))
    server = gitea.server
    server.delay("POST", rf"{PATH}/issues$", 2.0)  # made after the client gave up
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "paused", row
    assert row["error"].startswith("forge_unavailable: preparation: Gitea did not answer")
    # Its resume looks no sooner than twice the timeout: by then Gitea has made it.
    assert "resumed by itself in 2 s" in row["error"]
    until(lambda: gitea.counts()["issues"] == 1)

    # The plan's comment: posted after the client gave up, found on resume.
    server.delay("POST", rf"{PATH}/issues/\d+/comments$", 2.0)
    engine.decide(workflow_id, decisions.resume)
    row = engine.advance(workflow_id)
    assert row["status"] == "paused" and "did not answer" in row["error"], row
    until(lambda: len(bot_comments(gitea, 1)) == 1)

    server.delay("POST", rf"{PATH}/pulls/\d+/merge$", 2.0)  # merged after the client gave up
    engine.decide(workflow_id, decisions.resume)
    row = engine.advance(workflow_id)
    assert row["status"] == "completed", row["error"]
    assert gitea.counts() == {"issues": 1, "pulls": 1, "merges": 1}
    assert len(gitea.posts(f"{PATH}/issues")) == 1
    plans = [s for s in bot_comments(gitea, 1) if "**Plan (round 1)**" in s]
    assert len(plans) == 1
    # A merge that timed out is asked again (Gitea merges a pull request once): one landed.
    assert [r.status for r in gitea.posts("/merge")].count(200) == 1
    created = [m for m in store.milestones(workflow_id) if m.kind == "issue_created"]
    assert [m.status for m in created] == ["completed"] and "found" in created[0].summary
    assert row["merge_sha"] == server.repo(REPO).bare.branch_sha("main")


def test_401_403_and_404_are_named(gitea: GiteaLab, tmp_path: Path) -> None:
    repo, _ = team_repo(gitea, tmp_path)
    with pytest.raises(ForgeAuthError, match=r"the token in GITEA_TOKEN \(401"):
        quick_forge(gitea, repo, token="not-a-token-at-all").issue(1)
    # Gitea tells others' permissions only to an administrator of the repository.
    maya = quick_forge(gitea, repo, token=gitea.token("maya"))
    assert maya.permission("maya") == "write"  # her own, she may ask
    with pytest.raises(ForgeAuthError, match="administrator of octo/widgets"):
        maya.permission("olga")
    forge = quick_forge(gitea, repo)
    assert [forge.permission(x) for x in ("olga", "maya", "rex", "stranger", "octo")] == [
        "admin",
        "write",
        "read",
        "none",
        "admin",
    ]
    assert forge.permission("nobody-at-all") == "none"
    with pytest.raises(ForgeNotFound, match="no repository octo/gone"):
        GiteaForge(
            "octo/gone",
            GiteaAuth(gitea.bot_token, "the token in GITEA_TOKEN"),
            repo,
            Workspace(),
            load_cartridge(repo).forge,
        ).get("/repos/octo/gone")


def test_a_rate_limit_longer_than_the_bound_is_forge_unavailable_with_its_wait(
    gitea: GiteaLab, tmp_path: Path
) -> None:
    repo, _ = team_repo(gitea, tmp_path, forge_extra="max_rate_limit_wait_s = 5\n")
    forge = quick_forge(gitea, repo)
    number = forge.create_issue("t", "b", "phasegate:workflow:w1")
    gitea.server.fail("GET", rf"{PATH}/issues/{number}$", 429, headers={"Retry-After": "60"})
    with pytest.raises(ForgeUnavailable, match="rate limit") as raised:
        forge.issue(number)
    assert raised.value.retry_after_s == 60.0
    gitea.server.fail("GET", rf"{PATH}/issues/{number}$", 503, times=2)
    assert forge.issue(number).title == "t"  # two 503s are within max_retries
    assert forge.find_issue("phasegate:workflow:w1") == number
