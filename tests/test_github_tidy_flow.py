"""Whole workflows tidying after themselves on GitHub (the fake behind Prism, real
git): a merged branch deleted, a cancelled workflow's pull request closed, a
rejected verification saying why, and what trusted people command in comments."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from test_github_lifecycle import team_repo

from phasegate import operations
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
