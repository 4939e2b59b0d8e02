"""Whole workflows tidying after themselves on GitHub (the fake behind Prism, real
git): a merged branch deleted, a cancelled workflow's pull request closed, a
rejected verification saying why, and what trusted people command in comments."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from test_github_lifecycle import team_repo

from phasegate import operations
from phasegate.core.contract import ContractViolation
from phasegate.phases import cleanup
from phasegate.runtime.engine import Engine
from phasegate.store import Store

from conftest import GitHubLab, git

Build = Callable[..., tuple[Engine, Store]]


def cleanup_row(store: Store, workflow_id: str) -> dict[str, object]:
    (row,) = [m for m in store.milestones(workflow_id) if m.kind == "cleanup"]
    return {"status": row.status, **row.data}


def test_a_merged_branch_is_deleted_on_github_and_a_failed_deletion_is_retried_not_failed(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    repo, _ = team_repo(github, tmp_path, auto_merge=True)
    engine, store = engine_for(repo)
    gh, name = github.server, github.repository
    bare = gh.repo(name).git
    first = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(first)
    assert row["status"] == "completed", row["error"]
    assert bare.branch_sha(row["branch_name"]) is None  # gone on GitHub
    assert bare.branch_sha("main") == row["merge_sha"]  # the base stays
    assert cleanup_row(store, first)["forge_branch_deleted"] is True

    # GitHub fails the deletion past the retries: the merge stands, cleanup waits.
    gh.fail("DELETE", r"/git/refs/", 500, times=4)
    second = engine.start("Add another feature", "Write feature.txt too")
    row = engine.advance(second)
    assert row["status"] == "completed", row["error"]
    branch = row["branch_name"]
    assert bare.branch_sha(branch) is not None
    failed = cleanup_row(store, second)
    assert failed["status"] == "failed" and failed["forge_branch_deleted"] is False
    assert "on the forge" in str(failed["reason"]) and "500" in str(failed["reason"])
    assert git(repo, "branch", "--list", branch) == ""  # the local steps were done

    (outcome,) = operations.cleanup(engine, second, by="olga")
    assert outcome["cleanup"] == "completed", outcome
    assert bare.branch_sha(branch) is None
    assert cleanup_row(store, second)["attempts"] == 2


def test_with_delete_merged_branches_off_the_branch_stays_on_github(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    repo, _ = team_repo(
        github, tmp_path, auto_merge=True, forge_extra="delete_merged_branches = false\n"
    )
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "completed", row["error"]
    assert github.server.repo(github.repository).git.branch_sha(row["branch_name"]) is not None
    assert cleanup_row(store, workflow_id)["forge_branch_deleted"] is None
    assert not [r for r in github.server.requests if r.method == "DELETE" and "/git/" in r.path]


def pull_patches(github: GitHubLab, number: int) -> list[int]:
    """The status of each PATCH of pull request ``number`` the fake answered."""
    return [
        r.status
        for r in github.server.requests
        if r.method == "PATCH" and r.path.endswith(f"/pulls/{number}")
    ]


def test_cancel_closes_phasegates_own_pull_request_once_and_keeps_the_issue_open(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    repo, _ = team_repo(github, tmp_path, auto_merge=False)
    engine, store = engine_for(repo)
    gh, name = github.server, github.repository
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "waiting", row["error"]
    pr = row["pr_number"]
    ctx = store.load_context(workflow_id)
    assert cleanup.own_pull_request(ctx) == pr
    # A pull request the journal does not hold is a person's: never closed.
    assert cleanup.own_pull_request(dataclasses.replace(ctx, pr_number=pr + 1)) is None

    row = operations.cancel(engine, workflow_id, by="olga")
    assert row["status"] == "cancelled" and row["error"] == "cancelled by olga"
    assert gh.pull(name, pr).state == "closed" and not gh.pull(name, pr).pull.merged_at
    closed = [e for e in gh.pull(name, pr).events if e.event == "closed"]
    assert [e.actor.login for e in closed] == ["phasegate-bot"]
    assert gh.issue(name, row["issue_number"]).state == "open"
    assert {x.name for x in gh.issue(name, row["issue_number"]).labels} == {"phasegate:cancelled"}
    assert gh.repo(name).git.branch_sha(row["branch_name"]) is not None  # kept
    (made,) = [m for m in store.milestones(workflow_id) if m.kind == "pr_closed"]
    assert made.status == "completed"
    with pytest.raises(ContractViolation):
        operations.cancel(engine, workflow_id, by="olga")
    assert pull_patches(github, pr) == [200]
    assert operations.actions(store.load_context(workflow_id)) == ()


def test_a_close_killed_before_the_cancel_committed_is_found_done_when_cancel_is_asked_again(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    repo, _ = team_repo(github, tmp_path, auto_merge=False)
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    pr = engine.advance(workflow_id)["pr_number"]
    # The first half of a cancel whose process then died: closed, not cancelled.
    ctx = store.load_context(workflow_id)
    assert cleanup.close_pull_request(ctx, engine.deps_for(ctx).effects, "wait") is None
    assert store.workflow_row(workflow_id)["status"] == "waiting"
    assert github.server.pull(github.repository, pr).state == "closed"

    row = operations.cancel(engine, workflow_id, by="olga")
    assert row["status"] == "cancelled"
    assert pull_patches(github, pr) == [200]  # the journal had it: not asked again


def test_a_forge_failing_the_close_does_not_stop_the_cancel_and_the_close_is_retried(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    repo, _ = team_repo(github, tmp_path, auto_merge=False)
    engine, store = engine_for(repo)
    gh, name = github.server, github.repository
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    pr = engine.advance(workflow_id)["pr_number"]
    gh.fail("PATCH", rf"/pulls/{pr}$", 500, times=4)  # past forge.max_retries (3)

    row = operations.cancel(engine, workflow_id, by="olga")
    assert row["status"] == "cancelled"
    assert gh.pull(name, pr).state == "open"
    (left,) = [m for m in store.milestones(workflow_id) if m.kind == "pr_closed"]
    assert left.status == "failed" and "500" in left.summary
    assert operations.actions(store.load_context(workflow_id)) == ("cleanup",)

    (outcome,) = operations.cleanup(engine, by="olga")  # what a worker's pass does too
    assert (outcome["id"], outcome["cleanup"], outcome["retried"]) == (
        workflow_id,
        "completed",
        True,
    )
    assert gh.pull(name, pr).state == "closed"
    assert operations.cleanup(engine, by="olga") == []
    assert store.workflow_row(workflow_id)["status"] == "cancelled"
