"""Transient is not a conflict.

``support.flaky_git.FlakyGit`` puts a ``git`` first on PATH that
fails a seeded fraction of calls with git's own lock-contention message and
exit 128, before the real git runs. Lock contention must be retried, then
pause with its reason; never read as an answer nor as a merge conflict.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from phasegate.core import decisions
from phasegate.git.command import TRANSIENT_ATTEMPTS, GitError, GitTransient, git, run_git
from phasegate.git.workspace import Workspace

from conftest import HAPPY_ANSWERS, make_repo, scripted_cartridge
from conftest import git as sh_git
from support.flaky_git import FlakyGit

# The build agent: writes a file named for its worktree (the workflow's id), so
# every workflow's change is its own and touches a file no other one touches.
BUILD = (
    "import pathlib; p = pathlib.Path.cwd(); "
    "(p / (p.name + '.txt')).write_text('built ' + p.name + chr(10)); print('wrote it')"
)


def distinct_builds_repo(path: Path) -> Path:
    """A repository whose workflows each add their own file, merged unattended."""
    repo = make_repo(path, {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    command = json.dumps(f"{sys.executable} -c {json.dumps(BUILD)}")
    build = f'runner = "command"\ncommand = {command}\ntimeout = 60\n'
    (repo / "phasegate.toml").write_text(scripted_cartridge(role_overrides={"build": build}))
    sh_git(repo, "add", "-A")
    sh_git(repo, "commit", "-q", "-m", "cartridge")
    return repo


def test_the_wrapper_fails_its_seeded_fraction_and_otherwise_runs_the_real_git(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo")
    flaky = FlakyGit(tmp_path / "flaky", fraction=0.5, seed=3)

    codes = [
        subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, env=flaky.env()
        ).returncode
        for _ in range(40)
    ]
    assert set(codes) == {0, 128}
    assert flaky.calls == 40 and flaky.failures == codes.count(128)
    assert 8 <= flaky.failures <= 32


def test_lock_contention_is_retried_until_git_answers(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    flaky = FlakyGit(tmp_path / "flaky", fraction=0.3, seed=1)
    with flaky.on_path():
        heads = [git(["rev-parse", "HEAD"], repo) for _ in range(20)]
    assert len(set(heads)) == 1 and len(heads[0]) == 40
    assert flaky.failures > 0, "the wrapper was meant to fail some calls"
    assert flaky.calls == 20 + flaky.failures


def test_persistent_lock_contention_raises_git_transient_with_git_s_message(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo")
    flaky = FlakyGit(tmp_path / "flaky", fraction=1.0)
    with flaky.on_path(), pytest.raises(GitTransient, match="index.lock': File exists"):
        run_git(["status"], repo)
    assert flaky.calls == TRANSIENT_ATTEMPTS


def test_an_exit_code_read_as_an_answer_is_neither_retried_nor_transient(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    flaky = FlakyGit(tmp_path / "flaky", fraction=0.0)
    with flaky.on_path():
        missing = run_git(["rev-parse", "--verify", "-q", "refs/heads/nope"], repo)
        ancestor = run_git(["merge-base", "--is-ancestor", "HEAD", "HEAD"], repo)
    assert (missing.returncode, ancestor.returncode) == (1, 0)
    assert flaky.calls == 2


def test_a_ref_that_cannot_be_locked_for_a_lasting_reason_fails_at_once(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    sh_git(repo, "branch", "phasegate")  # in the way of every phasegate/<name>
    flaky = FlakyGit(tmp_path / "flaky", fraction=0.0)
    with flaky.on_path(), pytest.raises(GitError, match="cannot lock ref") as caught:
        git(["branch", "phasegate/x", "main"], repo)
    assert not isinstance(caught.value, GitTransient)
    # once: the ref ledger reads the common dir and the refs from git's files
    assert flaky.calls == 1


def _conflicting(tmp_path: Path) -> tuple[Workspace, Path]:
    repo = make_repo(tmp_path / "repo", {"a.txt": "base\n"})
    ws = Workspace()
    ws.create_branch(repo, "topic", "main")
    worktree = ws.ensure_worktree(repo, "topic", tmp_path / "wt")
    (worktree / "a.txt").write_text("topic\n")
    ws.commit_all(worktree, "topic edit")
    (repo / "a.txt").write_text("main\n")
    sh_git(repo, "commit", "-qam", "main edit")
    return ws, worktree


def test_a_real_conflict_still_reads_as_a_conflict(tmp_path: Path) -> None:
    ws, worktree = _conflicting(tmp_path)
    assert ws.sync_base(worktree, "main") is False
    assert sh_git(worktree, "status", "--porcelain") == "", "the conflicted merge was aborted"
    assert ws.start_base_merge(worktree, "main") == ["a.txt"]


def test_a_sync_failing_on_a_lock_raises_transient_never_reads_as_a_conflict(
    tmp_path: Path,
) -> None:
    ws, worktree = _conflicting(tmp_path)
    flaky = FlakyGit(tmp_path / "flaky", fraction=1.0)
    with flaky.on_path(), pytest.raises(GitTransient):
        ws.sync_base(worktree, "main")


def test_a_merge_failing_without_conflicts_is_a_git_error_not_a_conflict(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    ws = Workspace()
    ws.create_branch(repo, "topic", "main")
    worktree = ws.ensure_worktree(repo, "topic", tmp_path / "wt")
    with pytest.raises(Exception, match="merge no-such-branch failed") as caught:
        ws.sync_base(worktree, "no-such-branch")
    assert not isinstance(caught.value, GitTransient)


# -- whole workflows ------------------------------------------------------------------------

WORKFLOWS = 5


def test_workflows_on_a_git_failing_one_call_in_five_complete_or_pause_never_revert(
    engine_for, tmp_path: Path
) -> None:
    repo = distinct_builds_repo(tmp_path / "repo")
    engine, store = engine_for(repo)
    flaky = FlakyGit(tmp_path / "flaky", fraction=0.2, seed=11)
    outcomes = []
    for n in range(WORKFLOWS):
        with flaky.on_path():
            workflow_id = engine.start(f"feature {n}", "ticket")
            row = engine.advance(workflow_id)
        assert row["status"] in ("completed", "paused"), (n, row["status"], row["error"])
        if row["status"] == "paused":
            assert row["error"], "a pause names its reason"
            outcomes.append(("paused", row["error"]))
            flaky.fraction = 0.0  # git healthy again: resume completes it
            engine.decide(workflow_id, decisions.resume)
            row = engine.advance(workflow_id)
            flaky.fraction = 0.2
        else:
            outcomes.append(("completed", ""))
        assert (row["current_phase"], row["status"]) == ("completed", "completed"), row["error"]
        milestones = store.milestones(workflow_id)
        assert not [m for m in milestones if m.kind == "merge_failed"], milestones
        assert not [e for e in store.events(workflow_id) if "revert" in e["type"]]
        assert store.workflow_row(workflow_id)["merge_sha"]
    assert flaky.failures >= 20, f"too few injected failures to prove anything: {flaky.failures}"
    merges = sh_git(repo, "rev-list", "--merges", "main").split()
    assert len(merges) == WORKFLOWS, outcomes
    built = [name for name in sh_git(repo, "ls-tree", "--name-only", "main").split()]
    assert len([n for n in built if n.endswith(".txt")]) == WORKFLOWS


def test_a_base_sync_failing_on_a_lock_pauses_the_merge_and_resume_completes_it(
    engine_for, tmp_path: Path
) -> None:
    repo = distinct_builds_repo(tmp_path / "repo")
    engine, store = engine_for(repo)
    workflow_id = engine.start("feature", "ticket")
    while store.workflow_row(workflow_id)["current_phase"] != "merge":
        row = engine.advance(workflow_id, max_steps=1)
        assert row["status"] not in ("completed", "failed", "paused"), row
    flaky = FlakyGit(tmp_path / "flaky", fraction=1.0, commands=("merge",))

    with flaky.on_path():
        row = engine.advance(workflow_id)

    assert (row["current_phase"], row["status"]) == ("merge", "paused"), row["error"]
    assert "syncing main failed" in row["error"] and "index.lock" in row["error"]
    assert flaky.failures == TRANSIENT_ATTEMPTS, "the sync's merge, retried within bounds"
    assert not [m for m in store.milestones(workflow_id) if m.kind == "merge_failed"]
    flaky.fraction = 0.0
    with flaky.on_path():
        engine.decide(workflow_id, decisions.resume)
        row = engine.advance(workflow_id)
    assert (row["current_phase"], row["status"]) == ("completed", "completed"), row["error"]


def test_a_worktree_add_racing_another_prune_is_contention_not_a_failure() -> None:
    # Two workers on one repository: one's `worktree prune` removes the empty
    # .git/worktrees while the other's `worktree add` is between creating it and its entry.
    from phasegate.git.command import is_transient

    raced = subprocess.CompletedProcess(
        ["git", "worktree", "add"],
        128,
        "",
        "Preparing worktree (detached HEAD 849631d)\nfatal: could not create directory of "
        "'.git/worktrees/b85d543b-verify': No such file or directory\n",
    )
    assert is_transient(raced)
    missing = subprocess.CompletedProcess(["git"], 128, "", "fatal: not a git repository\n")
    assert not is_transient(missing)
