"""Merges of one repository are serialized.

Two real ``phasegate worker`` processes on one repository, 24 workflows each
adding a file of its own: all are brought to wait, approved at once, and the
two workers merge them side by side. Every merge must land (the repository's
merge lock, ``Workspace.merge_lock``, lets one merge into the base at a time),
with no ``cannot lock ref`` anywhere.
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
from test_flaky_git import distinct_builds_repo

from phasegate.config.cartridge import load_cartridge
from phasegate.core import decisions
from phasegate.git.command import GitTransient, run_git
from phasegate.git.workspace import Workspace
from phasegate.runtime.engine import Engine, LeaseHeld
from phasegate.store import open_store

from conftest import git, make_repo

WORKFLOWS = 24
WAIT_S = 300.0
PHASEGATE = Path(sys.executable).parent / "phasegate"


def _worker(repo: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(PHASEGATE), "worker", "--repo", str(repo), "--poll", "0.2"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _wait_for(store, ids: list[str], done, what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        rows = [store.workflow_row(i) for i in ids]
        if all(done(r) for r in rows):
            return
        stuck = [r for r in rows if r["status"] in ("failed", "paused")]
        if stuck or time.monotonic() > deadline:
            tails = "\n".join(p.read_text(errors="replace")[-2000:] for p in logs)
            raise AssertionError(
                f"{what}: {[(r['id'], r['status'], r['error']) for r in stuck]}\n{tails}"
            )
        time.sleep(0.2)


def test_two_workers_merging_24_workflows_at_once_land_every_merge(tmp_path: Path) -> None:
    repo = distinct_builds_repo(tmp_path / "repo")
    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    engine = Engine(repo, cartridge, store)
    logs = [tmp_path / "worker-1.log", tmp_path / "worker-2.log"]
    workers = []
    try:
        ids = [engine.start(f"feature {n}", "ticket", auto_merge=False) for n in range(WORKFLOWS)]
        workers = [_worker(repo, log) for log in logs]
        _wait_for(store, ids, lambda r: r["status"] == "waiting", "reaching wait", logs)
        for workflow_id in ids:  # all approved at once: both workers merge side by side
            while True:
                try:
                    engine.decide(workflow_id, lambda c: decisions.approve_merge(c, "test"))
                    break
                except LeaseHeld:
                    time.sleep(0.05)
        _wait_for(store, ids, lambda r: r["status"] == "completed", "completing", logs)
        merge_shas = [store.workflow_row(i)["merge_sha"] for i in ids]
    finally:
        for proc in workers:
            _stop(proc)
        store.close()

    merges = git(repo, "rev-list", "--merges", "--first-parent", "main").split()
    assert sorted(merges) == sorted(merge_shas), "one merge on main per workflow"
    on_main = git(repo, "ls-tree", "--name-only", "main").split()
    assert sorted(n.removesuffix(".txt") for n in on_main if n.endswith(".txt")) == sorted(ids)
    text = "".join(p.read_text(errors="replace") for p in logs)
    assert "cannot lock ref" not in text and "Traceback" not in text


def test_the_merge_lock_admits_one_holder_at_a_time_across_threads(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    ws = Workspace()
    inside: list[int] = []
    overlaps: list[int] = []

    def hold() -> None:
        with ws.merge_lock(repo):
            inside.append(1)
            if len(inside) > 1:
                overlaps.append(len(inside))
            time.sleep(0.05)
            inside.pop()

    threads = [threading.Thread(target=hold) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == []
    assert (Path(ws.common_dir(repo)) / "phasegate" / "merge.lock").exists()


def test_a_worktree_entry_another_add_is_still_making_is_retried_not_a_failure(
    tmp_path: Path,
) -> None:
    # Found by two workers of concurrency 8: one's `worktree add` had made
    # .git/worktrees/<name>/ and not yet written its commondir when the other's
    # `git branch --list` read every worktree, and pr_review failed on it. Made here
    # half-made for good: git keeps failing, and it must be read as contention.
    repo = make_repo(tmp_path / "repo")
    entry = repo / ".git" / "worktrees" / "half-made"
    entry.mkdir(parents=True)
    (entry / "gitdir").write_text(f"{tmp_path / 'half-made'}/.git\n")
    (entry / "commondir").write_text("")  # git writes it after gitdir
    with pytest.raises(GitTransient, match="failed to read .*half-made/commondir"):
        run_git(["branch", "--list", "main"], repo)
    (entry / "commondir").write_text("../..\n")  # the add went on and made it whole
    assert run_git(["branch", "--list", "main"], repo).stdout.strip() == "* main"
