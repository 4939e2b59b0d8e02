"""Fewer git calls (issue 12, item 6): a demo lifecycle's count stays bounded, and
what phasegate now reads from git's own files (``phasegate._gitfs``) instead of
asking git is what git would say, read afresh each time it changes."""

from __future__ import annotations

import collections
import subprocess
from pathlib import Path

import pytest

from phasegate import _gitfs
from phasegate._git import git, list_refs, recording
from phasegate.cartridge import load_cartridge
from phasegate.demo import DEMO_TICKET, DEMO_TITLE, make_sample_project
from phasegate.engine import Engine
from phasegate.guard import snapshot
from phasegate.store import open_store
from phasegate.workspace import Workspace

from conftest import git as sh_git
from conftest import make_repo

#: One demo lifecycle made 258 git calls before issue 12 (60 of them the ref
#: ledger's and the worktree lock's own); 47 now. The issue's target is 35: the
#: rest are reads outside these modules (a read-only role's status before and
#: after its run, agents/service.py: 12; the self-heal's one status per step,
#: healing.py: 6).
MAX_DEMO_CALLS = 47


def _git_refs(cwd: Path) -> dict[str, str]:
    out = sh_git(cwd, "for-each-ref", "--format=%(refname)%00%(objectname)%00%(symref)")
    refs = {}
    for line in out.splitlines():
        name, sha, symref = line.split("\0")
        refs[name] = f"ref: {symref}" if symref else sha
    return refs


def test_a_demo_lifecycle_stays_within_its_git_call_budget_with_no_ledger_calls(
    tmp_path: Path,
) -> None:
    repo = make_sample_project(tmp_path / "calc")
    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    try:
        engine = Engine(repo, cartridge, store)
        with recording() as calls:
            row = engine.advance(engine.start(DEMO_TITLE, DEMO_TICKET))
    finally:
        store.close()
    assert row["status"] == "completed"
    by = collections.Counter(c.subcommand for c in calls)
    assert len(calls) <= MAX_DEMO_CALLS, by
    # the ledger and the guard list refs from the files; repair prunes only what is stale
    assert [c for c in calls if c.bookkeeping] == []
    assert by["for-each-ref"] == 0 and by["symbolic-ref"] == 0
    assert [
        c.args for c in calls if c.args[:2] in (("worktree", "prune"), ("worktree", "list"))
    ] == []


def test_refs_read_from_the_files_equal_for_each_ref_in_the_main_checkout_and_a_worktree(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo")
    sh_git(repo, "branch", "packed")
    sh_git(repo, "-c", "user.name=p", "-c", "user.email=p@l", "tag", "-a", "-m", "t", "v1")
    sh_git(repo, "pack-refs", "--all")
    sh_git(repo, "branch", "-f", "packed", "HEAD")  # loose over packed, same value
    sh_git(repo, "branch", "loose")
    sh_git(repo, "update-ref", "refs/bisect/bad", "HEAD")  # the main checkout's own
    sh_git(repo, "symbolic-ref", "refs/remotes/origin/HEAD", "refs/heads/loose")
    sh_git(repo, "symbolic-ref", "refs/x/dangling", "refs/heads/nowhere")  # git leaves it out
    worktree = tmp_path / "wt"
    sh_git(repo, "worktree", "add", "-q", str(worktree), "loose")
    sh_git(worktree, "update-ref", "refs/worktree/mine", "HEAD")
    (worktree / "f").write_text("x\n")
    sh_git(worktree, "add", "f")
    sh_git(worktree, "-c", "user.name=p", "-c", "user.email=p@l", "commit", "-q", "-m", "f")

    for cwd in (repo, worktree):
        assert list_refs(cwd) == _git_refs(cwd)
    assert "refs/bisect/bad" in list_refs(repo) and "refs/bisect/bad" not in list_refs(worktree)
    assert "refs/worktree/mine" in list_refs(worktree)
    assert "refs/worktree/mine" not in list_refs(repo)


def test_a_ref_file_git_would_not_read_leaves_the_answer_to_git(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    (repo / ".git" / "refs" / "heads" / "broken").write_text("not a sha\n")
    assert _gitfs.read_refs(repo / ".git", repo / ".git") is None
    with recording() as calls:
        refs = list_refs(repo)
    assert [c.subcommand for c in calls] == ["for-each-ref"]
    assert "refs/heads/broken" not in refs and "refs/heads/main" in refs
    (repo / ".git" / "refs" / "heads" / "broken").unlink()
    (repo / ".git" / "refs" / "heads" / "link").symlink_to("main")  # an old-style symref
    assert _gitfs.read_refs(repo / ".git", repo / ".git") is None
    assert list_refs(repo) == _git_refs(repo)


def test_with_git_dir_in_the_environment_only_git_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo(tmp_path / "repo")
    monkeypatch.setenv("GIT_DIR", str(repo / ".git"))
    assert _gitfs.locate(repo) is None
    with recording() as calls:
        assert Workspace().rev(repo, "HEAD") == sh_git(repo, "rev-parse", "HEAD")
    assert [c.subcommand for c in calls] == ["rev-parse"]


def test_a_person_switching_branch_is_seen_by_the_next_read(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    ws = Workspace()
    main_tip = ws.rev(repo, "HEAD")
    assert snapshot(repo).branch == "refs/heads/main"
    sh_git(repo, "switch", "-q", "-c", "theirs")
    sh_git(
        repo,
        "-c",
        "user.name=p",
        "-c",
        "user.email=p@l",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "t",
    )
    assert snapshot(repo).branch == "refs/heads/theirs"
    assert ws.rev(repo, "HEAD") == sh_git(repo, "rev-parse", "HEAD") != main_tip
    assert ws.rev(repo, "main") == main_tip
    sh_git(repo, "checkout", "-q", "--detach")
    assert snapshot(repo).branch == ""


def test_a_merge_goes_where_the_base_is_checked_out_now_not_where_it_was(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n"})
    ws = Workspace()
    ws.create_branch(repo, "topic", "main")
    worktree = ws.ensure_worktree(repo, "topic", tmp_path / "wt")
    (worktree / "b.txt").write_text("b\n")
    ws.commit_all(worktree, "topic")
    sh_git(repo, "switch", "-q", "-c", "elsewhere")  # the person leaves main meanwhile
    elsewhere = ws.rev(repo, "elsewhere")

    merged = ws.merge_into_base(repo, "main", "topic", "Merge topic")

    assert ws.rev(repo, "main") == merged != elsewhere
    assert ws.rev(repo, "HEAD") == elsewhere  # their checkout untouched
    assert not (repo / "b.txt").exists()


def test_a_worktree_moved_to_another_branch_is_unhealthy_at_the_next_check(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n"})
    ws = Workspace()
    ws.create_branch(repo, "topic", "main")
    worktree = ws.ensure_worktree(repo, "topic", tmp_path / "wt")
    assert ws.checkout_problem(worktree, "topic") is None
    sh_git(worktree, "switch", "-q", "-c", "other")
    assert ws.checkout_problem(worktree, "topic") == "HEAD is not topic"
    sh_git(worktree, "switch", "-q", "topic")
    (worktree / "a.txt").unlink()
    assert ws.checkout_problem(worktree, "topic") == "tracked files missing: a.txt"


def test_a_removed_worktree_directory_is_pruned_and_a_healthy_repository_is_not(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo")
    ws = Workspace()
    ws.create_branch(repo, "topic", "main")
    worktree = ws.ensure_worktree(repo, "topic", tmp_path / "wt")
    with recording() as calls:
        ws.repair(repo)
    assert calls == []
    subprocess.run(["rm", "-rf", str(worktree)], check=True)
    with recording() as calls:
        ws.repair(repo)
    assert [c.args for c in calls] == [("worktree", "prune")]
    assert "wt" not in git(["worktree", "list"], repo)


def test_the_guard_asks_git_for_a_hooks_path_only_when_a_config_names_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo(tmp_path / "repo")
    (tmp_path / "global").write_text("[user]\n\tname = p\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "global"))
    monkeypatch.setenv("GIT_CONFIG_SYSTEM", "/dev/null")
    with recording() as calls:
        assert snapshot(repo) is not None
    assert calls == []
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "pre-commit").write_text("#!/bin/sh\n")
    sh_git(repo, "config", "core.hooksPath", str(hooks))
    with recording() as calls:
        snap = snapshot(repo)
    assert snap is not None and str(hooks) in snap.dirs
    assert str(hooks / "pre-commit") in snap.files
    assert [c.subcommand for c in calls] == ["config"]
