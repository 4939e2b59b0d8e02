"""Git state a kill leaves is repaired, never trusted, never a dead end.

Each fault is caused with real git: a ``git commit -a`` or ``git branch -D``
SIGKILLed while it holds its lock (a hook that sleeps keeps git inside the
locked window), a ``git worktree add`` killed midway, a worktree left locked
"initializing" with its directory gone, a checkout without its index. Then
phasegate must clear it (only when no live process holds it) and a workflow
must resume and complete.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from phasegate.core import decisions
from phasegate.git.files import registrations
from phasegate.git.workspace import Workspace

from conftest import git, make_repo

HOOK_SLEEP_S = 30  # a hook that sleeps far longer than any test waits


def kill_inside(args: list[str], cwd: Path, hook: str, lock: Path, hooks: Path) -> None:
    """Run ``git args`` with a ``hook`` that sleeps, SIGKILL its process group once
    ``lock`` exists (git holds it while the hook runs); the lock is left behind."""
    hooks.mkdir(parents=True, exist_ok=True)
    script = hooks / hook
    script.write_text(f'#!/bin/sh\n[ "$1" = committed ] && exit 0\nsleep {HOOK_SLEEP_S}\n')
    script.chmod(0o755)
    proc = subprocess.Popen(
        ["git", "-c", f"core.hooksPath={hooks}", *args],
        cwd=cwd,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while not lock.exists():
        assert proc.poll() is None, f"git {args} ended before taking {lock}"
        assert time.monotonic() < deadline, f"git {args} never took {lock}"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert lock.exists(), "the kill was meant to leave the lock behind"


def worktree_gitdir(worktree: Path) -> Path:
    return Path((worktree / ".git").read_text().removeprefix("gitdir:").strip())


def locked_worktrees(repo: Path) -> list[str]:
    porcelain = git(repo, "worktree", "list", "--porcelain")
    return [line for line in porcelain.splitlines() if line.startswith("locked")]


def hold_open(path: Path) -> subprocess.Popen[str]:
    """A live process that creates ``path`` as git does (O_EXCL) and keeps it open."""
    code = (
        "import os, sys, time\n"
        f"fd = os.open({str(path)!r}, os.O_CREAT | os.O_EXCL | os.O_WRONLY)\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


# -- the repository ---------------------------------------------------------------------


def test_an_index_lock_left_by_a_killed_commit_is_removed_and_commit_works(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo")
    (repo / "README.md").write_text("changed\n")
    lock = repo / ".git" / "index.lock"
    kill_inside(["commit", "-a", "-m", "x"], repo, "pre-commit", lock, tmp_path / "hooks")
    assert subprocess.run(["git", "commit", "-qam", "x"], cwd=repo).returncode != 0

    notes = Workspace().repair(repo)

    assert not lock.exists()
    assert any("index.lock" in n for n in notes)
    git(repo, "commit", "-qam", "after the repair")
    assert git(repo, "log", "-1", "--format=%s") == "after the repair"


def test_a_packed_refs_lock_left_by_a_killed_branch_delete_no_longer_blocks_branch_delete(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo")
    git(repo, "branch", "doomed")
    git(repo, "pack-refs", "--all")
    lock = repo / ".git" / "packed-refs.lock"
    kill_inside(["branch", "-D", "doomed"], repo, "reference-transaction", lock, tmp_path / "hooks")
    assert subprocess.run(["git", "branch", "-D", "doomed"], cwd=repo).returncode != 0

    Workspace().repair(repo)

    assert not lock.exists()
    git(repo, "branch", "-D", "doomed")
    assert git(repo, "branch", "--list", "doomed") == ""


@pytest.mark.parametrize("name", ["index.lock", "HEAD.lock", "config.lock", "packed-refs.lock"])
def test_a_lock_a_live_process_holds_is_not_removed(tmp_path: Path, name: str) -> None:
    repo = make_repo(tmp_path / "repo")
    lock = repo / ".git" / name
    holder = hold_open(lock)
    try:
        Workspace().repair(repo)
        assert lock.exists(), "a held lock was removed"
    finally:
        holder.kill()
        holder.communicate()
    Workspace().repair(repo)
    assert not lock.exists(), "once its holder died the lock is stale"


def test_a_closed_lock_while_a_git_runs_in_the_repository_is_kept(tmp_path: Path) -> None:
    # git closes a ref's lock before renaming it into place: then only a live git in
    # the repository says it is someone's.
    repo = make_repo(tmp_path / "repo")
    git(repo, "branch", "topic")
    lock = repo / ".git" / "refs" / "heads" / "topic.lock"
    running = subprocess.Popen(
        ["git", "cat-file", "--batch"], cwd=repo, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        lock.write_text("")
        Workspace().repair(repo)
        assert lock.exists(), "a fresh lock beside a live git was removed"
    finally:
        running.communicate(b"")
    Workspace().repair(repo)
    assert not lock.exists(), "with no git running, the lock is stale"


def test_a_persons_commit_waiting_for_its_editor_keeps_its_index_lock(tmp_path: Path) -> None:
    # git commit keeps index.lock closed while the editor is open, for as long as the
    # person types: however old, the lock is theirs while their git runs.
    repo = make_repo(tmp_path / "repo")
    (repo / "README.md").write_text("# edited\n")
    marker = tmp_path / "editor-started"
    editor = f"touch {marker}; sleep 5; echo 'my message' >"
    commit = subprocess.Popen(
        ["git", "-c", "user.name=p", "-c", "user.email=p@l", "commit", "-q", "-a"],
        cwd=repo,
        env={**os.environ, "GIT_EDITOR": editor},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lock = repo / ".git" / "index.lock"
    deadline = time.monotonic() + 10
    while not (marker.exists() and lock.exists()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lock.exists(), "git commit did not take index.lock"
    os.utime(lock, (time.time() - 600, time.time() - 600))  # an old lock, as after a long edit
    Workspace().repair(repo)
    assert lock.exists(), "the person's live commit lost its index.lock"
    _, err = commit.communicate(timeout=30)
    assert commit.returncode == 0, err
    assert git(repo, "log", "-1", "--format=%s") == "my message"


def test_a_ref_lock_of_a_dead_process_in_a_branch_directory_is_removed(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    git(repo, "branch", "feature/x")
    lock = repo / ".git" / "refs" / "heads" / "feature" / "x.lock"
    lock.write_text("")
    os.utime(lock, (time.time() - 60, time.time() - 60))
    Workspace().repair(repo)
    assert not lock.exists()
    git(repo, "branch", "-D", "feature/x")


# -- worktrees ------------------------------------------------------------------------------


def test_a_missing_but_locked_worktree_is_rebuilt_by_ensure_worktree(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    git(repo, "branch", "b1")
    ws, path = Workspace(), (tmp_path / "wt").resolve()
    ws.ensure_worktree(repo, "b1", path)
    # What a `git worktree add` killed midway leaves, once its directory is cleared.
    git(repo, "worktree", "lock", "--reason", "initializing", str(path))
    shutil.rmtree(path)
    add = subprocess.run(["git", "worktree", "add", str(path), "b1"], cwd=repo, capture_output=True)
    assert b"missing but locked" in add.stderr

    ws.ensure_worktree(repo, "b1", path)

    assert ws.is_healthy(path, "b1")
    assert locked_worktrees(repo) == []


def test_a_person_s_own_locked_worktree_is_left_locked(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    theirs = (tmp_path / "theirs").resolve()
    git(repo, "worktree", "add", "-q", "-b", "usb", str(theirs))
    git(repo, "worktree", "lock", "--reason", "on a usb stick", str(theirs))
    Workspace().repair(repo)
    assert locked_worktrees(repo) == ["locked on a usb stick"]


@pytest.mark.parametrize("fault", ["no .git file", "no index", "no HEAD", "files missing"])
def test_a_half_made_worktree_is_unhealthy_and_ensure_worktree_makes_it_whole(
    tmp_path: Path, fault: str
) -> None:
    repo = make_repo(tmp_path / "repo", {f"f{i}.txt": f"{i}\n" for i in range(20)})
    git(repo, "branch", "b1")
    ws, path = Workspace(), (tmp_path / "wt").resolve()
    ws.ensure_worktree(repo, "b1", path)
    assert ws.is_healthy(path, "b1")
    gitdir = worktree_gitdir(path)
    if fault == "no .git file":
        (path / ".git").unlink()
    elif fault == "no index":
        (gitdir / "index").unlink()
    elif fault == "no HEAD":
        (gitdir / "HEAD").unlink()
    else:
        for i in range(10):
            (path / f"f{i}.txt").unlink()

    assert not ws.is_healthy(path, "b1"), fault
    ws.ensure_worktree(repo, "b1", path)

    assert ws.is_healthy(path, "b1"), ws.checkout_problem(path, "b1")
    assert sorted(p.name for p in path.glob("f*.txt")) == sorted(f"f{i}.txt" for i in range(20))


def test_a_worktree_add_killed_midway_is_repaired(tmp_path: Path) -> None:
    files = {f"d{i // 100}/f{i}.txt": "x" * 2000 + "\n" for i in range(3000)}
    repo = make_repo(tmp_path / "repo", files)
    git(repo, "branch", "big")
    path = (tmp_path / "wt").resolve()
    proc = subprocess.Popen(
        ["git", "worktree", "add", str(path), "big"],
        cwd=repo,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while not (path / "d0").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL, "the add finished before the kill"
    ws = Workspace()
    assert not ws.is_healthy(path, "big"), "the kill was meant to land inside the checkout"
    assert locked_worktrees(repo) == ["locked initializing"]

    ws.ensure_worktree(repo, "big", path)

    assert ws.is_healthy(path, "big"), ws.checkout_problem(path, "big")
    assert len(list(path.glob("d*/f*.txt"))) == 3000
    assert locked_worktrees(repo) == []


def test_remove_worktree_removes_a_locked_half_made_worktree(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    ws, path = Workspace(), (tmp_path / "scratch").resolve()
    git(repo, "worktree", "add", "-q", "--detach", str(path), "HEAD")
    git(repo, "worktree", "lock", "--reason", "initializing", str(path))
    (worktree_gitdir(path) / "index").unlink()
    ws.remove_worktree(repo, path)
    assert not path.exists()
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


# -- whole workflows -------------------------------------------------------------------------


def _run_partway(happy_repo: Path, engine_for, steps: int):
    engine, store = engine_for(happy_repo)
    workflow_id = engine.start("t", "ticket")
    row = engine.advance(workflow_id, max_steps=steps)
    assert row["status"] not in ("completed", "failed"), row
    return engine, store, workflow_id, Path(row["worktree_path"])


def _finish(engine, workflow_id: str) -> dict:
    row = engine.advance(workflow_id)
    if row["status"] == "paused":  # a pause names its reason; resume continues
        engine.decide(workflow_id, decisions.resume)
        row = engine.advance(workflow_id)
    return row


def test_a_workflow_resumes_and_completes_after_a_kill_inside_git_commit(
    happy_repo: Path, engine_for, tmp_path: Path
) -> None:
    engine, store, workflow_id, worktree = _run_partway(happy_repo, engine_for, 2)
    (worktree / "README.md").write_text("a dead attempt's edit\n")
    lock = worktree_gitdir(worktree) / "index.lock"
    kill_inside(["commit", "-a", "-m", "x"], worktree, "pre-commit", lock, tmp_path / "hooks")

    row = engine.advance(workflow_id)

    assert (row["current_phase"], row["status"]) == ("completed", "completed"), row["error"]
    assert git(happy_repo, "show", "main:feature.txt") == "the feature"
    types = [e["type"] for e in store.events(workflow_id)]
    assert "git_repaired" in types
    assert not lock.exists()


def test_a_workflow_completes_and_branch_delete_works_after_a_kill_inside_branch_deletion(
    happy_repo: Path, engine_for, tmp_path: Path
) -> None:
    engine, _, workflow_id, _ = _run_partway(happy_repo, engine_for, 2)
    git(happy_repo, "branch", "someones")
    git(happy_repo, "pack-refs", "--all")
    lock = happy_repo / ".git" / "packed-refs.lock"
    kill_inside(
        ["branch", "-D", "someones"], happy_repo, "reference-transaction", lock, tmp_path / "h"
    )

    row = engine.advance(workflow_id)

    assert (row["current_phase"], row["status"]) == ("completed", "completed"), row["error"]
    assert git(happy_repo, "branch", "--list", row["branch_name"]) == "", "cleanup ran"
    git(happy_repo, "branch", "-D", "someones")
    assert git(happy_repo, "status", "--porcelain") == ""


@pytest.mark.parametrize("fault", ["missing but locked", "no index"])
def test_a_workflow_resumes_and_completes_over_a_broken_worktree(
    happy_repo: Path, engine_for, fault: str
) -> None:
    engine, _, workflow_id, worktree = _run_partway(happy_repo, engine_for, 2)
    if fault == "missing but locked":
        git(happy_repo, "worktree", "lock", "--reason", "initializing", str(worktree))
        shutil.rmtree(worktree)
    else:
        (worktree_gitdir(worktree) / "index").unlink()

    row = _finish(engine, workflow_id)

    assert (row["current_phase"], row["status"]) == ("completed", "completed"), row["error"]
    assert git(happy_repo, "show", "main:feature.txt") == "the feature"
    assert git(happy_repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_a_merge_into_a_checkout_where_a_persons_commit_is_open_pauses_and_resume_lands_both(
    happy_repo: Path, engine_for, tmp_path: Path
) -> None:
    # The person's main checkout has an edit and their `git commit -a` waits in its
    # editor holding index.lock: git's merge then says only "stash failed". That is
    # contention, never a failed merge, and their commit must survive.
    engine, store = engine_for(happy_repo)
    workflow_id = engine.start("Add the feature file", "Add feature.txt.")
    (happy_repo / "README.md").write_text("# the person's edit\n")
    go = tmp_path / "go"
    commit = subprocess.Popen(
        ["git", "-c", "user.name=p", "-c", "user.email=p@l", "commit", "-q", "-a"],
        cwd=happy_repo,
        env={**os.environ, "GIT_EDITOR": f"while [ ! -f {go} ]; do sleep 0.05; done; echo mine >"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 10
        while not (happy_repo / ".git" / "index.lock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        row = engine.advance(workflow_id)
        assert (row["current_phase"], row["status"]) == ("merge", "paused"), row["error"]
        assert "index.lock is held" in row["error"]
        assert not [m for m in store.milestones(workflow_id) if m.kind == "merge_failed"]
    finally:
        go.write_text("")
        _, err = commit.communicate(timeout=30)
    assert commit.returncode == 0, err

    engine.decide(workflow_id, decisions.resume)
    row = engine.advance(workflow_id)
    assert (row["current_phase"], row["status"]) == ("completed", "completed"), row["error"]
    log = git(happy_repo, "log", "--format=%s", "main")
    assert "mine" in log.splitlines() and log.count("Merge #") == 1
    assert git(happy_repo, "show", "main:feature.txt") == "the feature"


def test_a_merge_a_killed_phasegate_left_begun_in_the_persons_checkout_is_redone(
    tmp_path: Path,
) -> None:
    # Found by the kill torture (sandboxed, in CI): a kill inside `git merge` left
    # MERGE_HEAD in the person's checkout, and every later merge failed with
    # "You have not concluded your merge".
    from phasegate.git.workspace import DirtyCheckout

    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n"})
    ws = Workspace()
    ws.create_branch(repo, "feature", "main")
    tree = ws.ensure_worktree(repo, "feature", tmp_path / "wt")
    (tree / "b.txt").write_text("b\n")
    ws.commit_all(tree, "feature")
    message = "Merge feature (phasegate workflow abc)"
    # what a kill between git's MERGE_HEAD and its commit leaves
    git(repo, "merge", "--no-ff", "--no-commit", "-m", message, "feature")
    assert ws.merge_in_progress(repo)
    merged = ws.merge_into_base(repo, "main", "feature", message)
    assert git(repo, "log", "-1", "--format=%s", merged) == message
    assert not ws.merge_in_progress(repo)
    # a merge of the person's own is theirs: refused, touching nothing
    git(repo, "branch", "other", "HEAD~1")
    git(repo, "checkout", "-q", "other")
    (repo / "c.txt").write_text("c\n")
    git(repo, "add", "c.txt")
    git(repo, "commit", "-qm", "other work")
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "--no-ff", "--no-commit", "-m", "my own merge", "other")
    ws.create_branch(repo, "second", "main")
    with pytest.raises(DirtyCheckout, match="a merge of your own is in progress"):
        ws.merge_into_base(repo, "main", "second", "Merge second")
    assert ws.merge_in_progress(repo)


def test_lock_files_survive_worktrees_removed_while_they_are_listed(tmp_path: Path) -> None:
    # Found by the 2 x 8 x 120 run: another worker's worktree went away between the
    # listing of .git/worktrees and the look inside it (FileNotFoundError, a failed
    # preparation). Worktree directories are made and removed as fast as can be.
    from phasegate.git.repair import lock_files

    repo = make_repo(tmp_path / "repo")
    admin = repo / ".git" / "worktrees"
    admin.mkdir()
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            entry = admin / f"wt-{i % 8}"
            entry.mkdir(exist_ok=True)
            (entry / "index.lock").write_text("")
            shutil.rmtree(entry, ignore_errors=True)
            i += 1

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        for _ in range(3000):
            assert all(p.name.endswith(".lock") for p in lock_files(repo / ".git"))
    finally:
        stop.set()
        churner.join()


def test_reading_the_registrations_while_git_removes_the_last_worktree_finds_none(
    tmp_path: Path,
) -> None:
    common = tmp_path / ".git"
    admin_root = common / "worktrees"
    common.mkdir()
    stop = threading.Event()

    def add_and_remove() -> None:
        # What `git worktree remove` of the last linked worktree does: it removes
        # the registration, then the emptied `worktrees/` directory with it.
        while not stop.is_set():
            (admin_root / "wt").mkdir(parents=True, exist_ok=True)
            shutil.rmtree(admin_root, ignore_errors=True)

    churn = threading.Thread(target=add_and_remove)
    churn.start()
    try:
        seen = [len(registrations(common)) for _ in range(20_000)]
    finally:
        stop.set()
        churn.join()
    assert set(seen) <= {0, 1}
