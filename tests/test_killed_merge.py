"""A merge into a person's checkout killed or stopped midway (found by the kill torture,
seed 731747: "cannot merge into main: changes.txt in the way", no merge on main).

``git merge`` writes the merged files, then the index, then MERGE_HEAD, then moves
the ref. A SIGKILL between any two of those, or a ref lock another process holds at
the end, leaves the checkout changed with HEAD where it was. The merge is journaled
(an intent file) before git runs, so the next merge tells what git left from the
person's edits, puts back the first and keeps the second.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from phasegate.git.merge import _MergeIntent
from phasegate.git.workspace import DirtyCheckout, Workspace

from conftest import git, make_repo

MESSAGE = "Merge feature (phasegate workflow abc)"


def feature_repo(tmp_path: Path) -> tuple[Path, Workspace]:
    """``main`` checked out in ``repo`` (the person's checkout); ``feature`` adds
    changes.txt and changes b.txt."""
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n", "b.txt": "b\n"})
    ws = Workspace()
    ws.create_branch(repo, "feature", "main")
    tree = ws.ensure_worktree(repo, "feature", tmp_path / "wt")
    (tree / "changes.txt").write_text("the agent's change\n")
    (tree / "b.txt").write_text("b, changed\n")
    ws.commit_all(tree, "feature")
    return repo, ws


def persons_edits(repo: Path) -> None:
    """Edits of the person's that no merge may lose: one unstaged, one untracked."""
    (repo / "a.txt").write_text("a, the person's edit\n")
    (repo / "notes.txt").write_text("the person's notes\n")


def assert_merged_and_edits_kept(repo: Path, merged: str) -> None:
    assert git(repo, "log", "-1", "--format=%s", merged) == MESSAGE
    assert git(repo, "rev-parse", "main") == merged
    assert git(repo, "rev-list", "--count", "--merges", "main") == "1"
    assert (repo / "changes.txt").read_text() == "the agent's change\n"
    assert (repo / "b.txt").read_text() == "b, changed\n"
    assert (repo / "a.txt").read_text() == "a, the person's edit\n"
    assert (repo / "notes.txt").read_text() == "the person's notes\n"
    assert git(repo, "status", "--porcelain") == "M a.txt\n?? notes.txt"
    assert git(repo, "diff", "--cached", "--name-only") == ""  # a.txt's edit unstaged
    assert not _MergeIntent(repo / ".git", "main").path.exists()


def hold_ref_lock(repo: Path) -> subprocess.Popen[str]:
    """A live process holding ``refs/heads/main.lock`` as git does (O_EXCL): git's
    update of main fails on it, after the merged files and MERGE_HEAD are written."""
    lock = repo / ".git" / "refs" / "heads" / "main.lock"
    code = (
        "import os, sys, time\n"
        f"fd = os.open({str(lock)!r}, os.O_CREAT | os.O_EXCL | os.O_WRONLY)\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def release(holder: subprocess.Popen[str], repo: Path) -> None:
    holder.kill()
    holder.wait(timeout=10)
    if holder.stdout is not None:
        holder.stdout.close()
    (repo / ".git" / "refs" / "heads" / "main.lock").unlink(missing_ok=True)


def test_a_merge_sigkilled_while_its_ref_update_waits_is_undone_and_redone(
    tmp_path: Path,
) -> None:
    repo, ws = feature_repo(tmp_path)
    persons_edits(repo)
    holder = hold_ref_lock(repo)
    code = (
        "import sys\nfrom pathlib import Path\nfrom phasegate.git.workspace import Workspace\n"
        "Workspace().merge_into_base(Path(sys.argv[1]), 'main', 'feature', sys.argv[2])\n"
    )
    merging = subprocess.Popen(
        [sys.executable, "-c", code, str(repo), MESSAGE],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not (repo / ".git" / "MERGE_HEAD").exists():
            assert merging.poll() is None, "the merge ended before git had begun it"
            assert time.monotonic() < deadline, "git never began the merge"
            time.sleep(0.005)
        os.killpg(merging.pid, signal.SIGKILL)
        merging.wait(timeout=10)
    finally:
        release(holder, repo)
    # What the kill left: the merge begun, its files in the checkout, main unmoved.
    assert (repo / "changes.txt").exists() or (repo / ".git" / "MERGE_HEAD").exists()
    assert git(repo, "rev-list", "--count", "--merges", "main") == "0"
    assert _MergeIntent(repo / ".git", "main").path.exists()

    merged = ws.merge_into_base(repo, "main", "feature", MESSAGE)
    assert_merged_and_edits_kept(repo, merged)


@pytest.mark.parametrize("left", ["files", "files and index"])
def test_what_a_merge_killed_before_its_merge_head_wrote_is_put_back(
    tmp_path: Path, left: str
) -> None:
    repo, ws = feature_repo(tmp_path)
    head, feature = git(repo, "rev-parse", "main"), git(repo, "rev-parse", "feature")
    _MergeIntent(repo / ".git", "main").write(head, feature)
    # What git had written when the kill came: the merged files (an untracked new
    # file, a changed one), and the index too, or not yet.
    (repo / "changes.txt").write_text("the agent's change\n")
    (repo / "b.txt").write_text("b, changed\n")
    if left == "files and index":
        git(repo, "add", "changes.txt", "b.txt")
    persons_edits(repo)
    with pytest.raises(subprocess.CalledProcessError):  # what every merge met before
        git(repo, "merge", "--no-ff", "-m", MESSAGE, "feature")

    merged = ws.merge_into_base(repo, "main", "feature", MESSAGE)
    assert_merged_and_edits_kept(repo, merged)


def test_a_persons_edit_of_a_path_the_killed_merge_changes_is_kept_and_refused(
    tmp_path: Path,
) -> None:
    repo, ws = feature_repo(tmp_path)
    head, feature = git(repo, "rev-parse", "main"), git(repo, "rev-parse", "feature")
    _MergeIntent(repo / ".git", "main").write(head, feature)
    (repo / "changes.txt").write_text("the agent's change\n")  # the killed merge's
    (repo / "b.txt").write_text("b, as the person wants it\n")  # the person's own
    with pytest.raises(DirtyCheckout, match="b.txt"):
        ws.merge_into_base(repo, "main", "feature", MESSAGE)
    assert (repo / "b.txt").read_text() == "b, as the person wants it\n"
    assert not (repo / "changes.txt").exists()
    assert git(repo, "rev-list", "--count", "--merges", "main") == "0"


def test_a_merge_stopped_by_a_ref_lock_held_a_moment_lands_once(tmp_path: Path) -> None:
    # Before: git's second try met its own MERGE_HEAD ("You have not concluded your
    # merge") and the merge failed as GitError with the checkout changed.
    repo, ws = feature_repo(tmp_path)
    persons_edits(repo)
    holder = hold_ref_lock(repo)
    threading.Timer(0.3, release, (holder, repo)).start()
    merged = ws.merge_into_base(repo, "main", "feature", MESSAGE)
    assert_merged_and_edits_kept(repo, merged)


def test_a_merge_of_the_persons_own_begun_after_a_killed_one_is_theirs(
    tmp_path: Path,
) -> None:
    repo, ws = feature_repo(tmp_path)
    head = git(repo, "rev-parse", "main")
    git(repo, "branch", "other", "main")
    git(repo, "checkout", "-q", "other")
    (repo / "c.txt").write_text("c\n")
    git(repo, "add", "c.txt")
    git(repo, "commit", "-qm", "other work")
    git(repo, "checkout", "-q", "main")
    _MergeIntent(repo / ".git", "main").write(head, git(repo, "rev-parse", "feature"))
    git(repo, "merge", "--no-ff", "--no-commit", "-m", "my own merge", "other")
    with pytest.raises(DirtyCheckout, match="a merge of your own"):
        ws.merge_into_base(repo, "main", "feature", MESSAGE)
    assert (repo / ".git" / "MERGE_HEAD").read_text().strip() == git(repo, "rev-parse", "other")


def test_a_persons_edit_in_the_merges_way_is_refused_before_git_touches_the_checkout(
    tmp_path: Path,
) -> None:
    # git refuses such a merge itself, but only after stashing the edits and resetting
    # the checkout: a kill there left the person's edits in no file (a trial's find).
    repo, ws = feature_repo(tmp_path)
    persons_edits(repo)
    (repo / "b.txt").write_text("b, mine\n")
    (repo / "changes.txt").write_text("the agent's change\n")  # the same as the branch's
    with pytest.raises(DirtyCheckout, match="b.txt, changes.txt"):
        ws.merge_into_base(repo, "main", "feature", MESSAGE)
    assert (repo / "b.txt").read_text() == "b, mine\n"
    assert (repo / "changes.txt").read_text() == "the agent's change\n"
    assert (repo / "a.txt").read_text() == "a, the person's edit\n"
    assert not _MergeIntent(repo / ".git", "main").path.exists()  # git never ran


def test_a_killed_merge_that_deleted_a_file_is_put_back(tmp_path: Path) -> None:
    repo, ws = feature_repo(tmp_path)
    tree = tmp_path / "wt"
    git(tree, "rm", "-q", "a.txt")
    git(tree, "commit", "-qm", "drop a.txt")
    head, feature = git(repo, "rev-parse", "main"), git(repo, "rev-parse", "feature")
    _MergeIntent(repo / ".git", "main").write(head, feature)
    for name, text in {"changes.txt": "the agent's change\n", "b.txt": "b, changed\n"}.items():
        (repo / name).write_text(text)
    git(repo, "add", "changes.txt", "b.txt")
    git(repo, "rm", "-q", "a.txt")  # what git had done of the merge when killed
    merged = ws.merge_into_base(repo, "main", "feature", MESSAGE)
    assert git(repo, "rev-list", "--count", "--merges", "main") == "1"
    assert git(repo, "status", "--porcelain") == "" and not (repo / "a.txt").exists()
    assert git(repo, "rev-parse", "main") == merged


@pytest.mark.parametrize("garbage", [b"", b"one line\n", b"\xff\xfe\x00", b"a" * 40 + b"\nzz\n"])
def test_a_garbage_intent_file_is_no_intent(tmp_path: Path, garbage: bytes) -> None:
    repo, ws = feature_repo(tmp_path)
    persons_edits(repo)
    intent = _MergeIntent(repo / ".git", "main")
    intent.path.parent.mkdir(parents=True, exist_ok=True)
    intent.path.write_bytes(garbage)
    assert intent.read() is None
    assert_merged_and_edits_kept(repo, ws.merge_into_base(repo, "main", "feature", MESSAGE))


def test_a_stale_intent_never_aborts_a_merge_the_person_began_since(tmp_path: Path) -> None:
    repo, ws = feature_repo(tmp_path)
    _MergeIntent(repo / ".git", "main").write("a" * 40, "b" * 40)  # HEAD moved on since
    git(repo, "branch", "other", "main")
    git(repo, "checkout", "-q", "other")
    (repo / "c.txt").write_text("c\n")
    git(repo, "add", "c.txt")
    git(repo, "commit", "-qm", "other work")
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "--no-ff", "--no-commit", "-m", "my own merge", "other")
    with pytest.raises(DirtyCheckout, match="a merge of your own"):
        ws.merge_into_base(repo, "main", "feature", MESSAGE)
    assert (repo / ".git" / "MERGE_HEAD").exists() and (repo / "c.txt").exists()


def test_bases_whose_names_differ_only_in_a_slash_keep_intents_of_their_own(
    tmp_path: Path,
) -> None:
    common = tmp_path / "common"
    assert _MergeIntent(common, "release/1.0").path != _MergeIntent(common, "release-1.0").path


def test_a_lock_of_a_killed_git_still_dying_at_the_repair_is_removed_before_the_next_try(
    tmp_path: Path,
) -> None:
    repo, ws = feature_repo(tmp_path)
    persons_edits(repo)
    # What a SIGKILLed merge leaves while its git is still on its way out: HEAD.lock, and
    # a git process in the repository, so the repair before the merge must leave the lock.
    (repo / ".git" / "HEAD.lock").write_text("")
    dying = subprocess.Popen(["git", "cat-file", "--batch"], cwd=repo, stdin=subprocess.PIPE)
    ended = threading.Timer(0.1, dying.kill)
    ended.start()
    try:
        merged = ws.merge_into_base(repo, "main", "feature", MESSAGE)
    finally:
        ended.cancel()
        dying.kill()
        dying.wait()
        assert dying.stdin is not None
        dying.stdin.close()
    assert_merged_and_edits_kept(repo, merged)
    assert not (repo / ".git" / "HEAD.lock").exists()
