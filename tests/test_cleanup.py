"""Cleanup kept apart from the merge, its retries tracked apart
(docs/contracts/lifecycle.md: merge): a merge that landed stays recorded with
its SHA and verification runs on it, whatever removing the worktree or deleting
the branch does; a failed cleanup is a failed milestone with its reason,
retried on the next advance, by ``phasegate worker`` and ``phasegate cleanup``.

Faults are caused for real: a person's worktree holding the branch (git
refuses ``branch -D``), a file in the worktree that cannot be removed
(``chattr +i`` as root, a read-only directory otherwise).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from phasegate.git.workspace import Workspace
from phasegate.runtime.engine import Engine
from phasegate.store import Store

from conftest import HAPPY_ANSWERS, git, make_repo, phasegate_cli, scripted_cartridge


def flat(text: str) -> str:
    return " ".join(text.split())


def cli_json(*args: str) -> tuple[int, Any]:
    proc = phasegate_cli(*args, "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture
def waiting_repo(tmp_path: Path) -> Path:
    """A repository whose workflow stops at wait, so a person can act before the merge."""
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    (repo / "phasegate.toml").write_text(scripted_cartridge(auto_merge=False))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    return repo


def _cleanup_of(detail: dict[str, Any]) -> dict[str, Any]:
    [row] = [m for m in detail["milestones"] if m["kind"] == "cleanup"]
    return row


def test_a_branch_held_by_a_persons_worktree_fails_only_the_cleanup_and_cleanup_retries_it(
    waiting_repo: Path, tmp_path: Path
) -> None:
    repo = str(waiting_repo)
    code, summary = cli_json("run", "--repo", repo, "Add the feature")
    assert (code, summary["status"]) == (0, "waiting")
    workflow_id, branch = summary["id"], summary["branch_name"]
    person = tmp_path / "person-wt"
    # phasegate's worktree has the branch checked out already: a person's second
    # checkout of it needs --force, as it would for them
    git(waiting_repo, "worktree", "add", "-f", str(person), branch)

    code, done = cli_json("approve-merge", workflow_id, "--repo", repo)
    assert code == 0, done
    assert (done["current_phase"], done["status"]) == ("completed", "completed")
    assert done["merge_sha"] and done["verification_status"] == "confirmed"
    assert git(waiting_repo, "rev-parse", "main") == done["merge_sha"]  # landed on base
    assert git(waiting_repo, "branch", "--list", branch)  # still there: git refused

    code, detail = cli_json("show", workflow_id, "--repo", repo)
    merged = [m for m in detail["milestones"] if m["kind"] == "merge_completed"]
    assert [m["status"] for m in merged] == ["completed"]
    verified = [m for m in detail["milestones"] if m["kind"] == "acceptance_verification"]
    assert verified and verified[-1]["status"] == "completed"
    assert f":{done['merge_sha'][:12]}:" in verified[-1]["dedupe_key"]  # on the merge SHA
    cleanup = _cleanup_of(detail)
    assert cleanup["status"] == "failed"
    assert "checked out at" in cleanup["summary"] and str(person) in cleanup["summary"]
    assert detail["cleanup"]["status"] == "failed"
    shown = flat(phasegate_cli("show", workflow_id, "--repo", repo).stdout)
    assert "cleanup failed" in shown and "checked out at" in shown
    assert f"phasegate cleanup {workflow_id}" in shown

    still = phasegate_cli("cleanup", "--repo", repo)  # the person has not moved yet
    assert still.returncode == 1, still.stdout + still.stderr
    assert "checked out at" in flat(still.stdout)

    git(waiting_repo, "worktree", "remove", str(person))
    code, outcomes = cli_json("cleanup", "--repo", repo)
    assert code == 0, outcomes
    assert outcomes == [
        {"id": workflow_id, "cleanup": "completed", "retried": True, "reason": None}
    ]
    assert git(waiting_repo, "branch", "--list", branch) == ""
    code, detail = cli_json("show", workflow_id, "--repo", repo)
    cleanup = _cleanup_of(detail)  # settled in place: still one row
    assert (cleanup["status"], cleanup["data"]["attempts"]) == ("completed", 3)
    assert (detail["workflow"]["status"], detail["workflow"]["merge_sha"]) == (
        "completed",
        done["merge_sha"],
    )

    code, nothing = cli_json("cleanup", "--repo", repo)
    assert (code, nothing) == (0, [])
    code, again = cli_json("cleanup", workflow_id, "--repo", repo)
    assert (code, again[0]["cleanup"], again[0]["retried"]) == (0, "completed", False)


def test_cleanup_of_an_unknown_workflow_is_a_clear_error(waiting_repo: Path) -> None:
    proc = phasegate_cli("cleanup", "nope", "--repo", str(waiting_repo))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "nope" in proc.stderr


class Pin:
    """Makes a file impossible to remove, even for root, until released."""

    def __init__(self) -> None:
        self.pinned: list[Path] = []

    def __call__(self, path: Path) -> None:
        if os.geteuid() == 0:
            if shutil.which("chattr") is None:
                pytest.skip("root without chattr: no way to make a file unremovable")
            proc = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
            if proc.returncode != 0:
                pytest.skip(f"chattr +i is not supported here: {proc.stderr.strip()}")
        else:
            path.parent.chmod(0o555)
        self.pinned.append(path)

    def release(self) -> None:
        while self.pinned:
            path = self.pinned.pop()
            if os.geteuid() == 0:
                subprocess.run(["chattr", "-i", str(path)], check=True)
            else:
                path.parent.chmod(0o755)


@pytest.fixture
def pin() -> Iterator[Pin]:
    pinned = Pin()
    yield pinned
    pinned.release()  # whatever the test left pinned, so tmp_path can go


def _advance_to_wait(engine: Engine, store: Store) -> str:
    workflow_id = engine.start("Add the feature", "Add the feature")
    row = engine.advance(workflow_id)
    assert (row["current_phase"], row["status"]) == ("wait", "waiting"), row["error"]
    return workflow_id


def test_a_worktree_that_cannot_be_removed_does_not_undo_the_merge_and_the_next_advance_retries(
    waiting_repo: Path,
    engine_for: Callable[..., tuple[Engine, Store]],
    pin: Pin,
) -> None:
    from phasegate.core import decisions

    engine, store = engine_for(waiting_repo)
    workflow_id = _advance_to_wait(engine, store)
    worktree = Path(store.workflow_row(workflow_id)["worktree_path"])
    stuck = worktree / "stuck" / "file.txt"
    stuck.parent.mkdir()
    stuck.write_text("in the way\n")
    pin(stuck)

    engine.decide(workflow_id, lambda ctx: decisions.approve_merge(ctx, "ana"))
    row = engine.advance(workflow_id)
    assert (row["current_phase"], row["status"]) == ("completed", "completed"), row["error"]
    assert row["merge_sha"] == git(waiting_repo, "rev-parse", "main")
    [cleanup] = [m for m in store.milestones(workflow_id) if m.kind == "cleanup"]
    assert cleanup.status == "failed"
    assert "removing the worktree" in cleanup.summary
    assert (cleanup.data["worktree_removed"], cleanup.data["branch_deleted"]) == (False, True)

    # the same cause still there: the next advance retries, and says it failed again
    row = engine.advance(workflow_id)
    [cleanup] = [m for m in store.milestones(workflow_id) if m.kind == "cleanup"]
    assert (cleanup.status, cleanup.data["attempts"]) == ("failed", 2)

    pin.release()
    row = engine.advance(workflow_id)  # a completed workflow's advance still cleans up
    [cleanup] = [m for m in store.milestones(workflow_id) if m.kind == "cleanup"]
    assert (cleanup.status, cleanup.data["attempts"]) == ("completed", 3)
    assert not worktree.exists()
    assert row["status"] == "completed" and row["merge_sha"]
    assert not Workspace().branch_exists(waiting_repo, str(row["branch_name"]))


def test_the_worker_retries_a_failed_cleanup_of_a_completed_workflow(
    waiting_repo: Path, tmp_path: Path
) -> None:
    code, summary = cli_json("run", "--repo", str(waiting_repo), "Add the feature")
    workflow_id, branch = summary["id"], summary["branch_name"]
    person = tmp_path / "person-wt"
    git(waiting_repo, "worktree", "add", "-f", str(person), branch)
    code, done = cli_json("approve-merge", workflow_id, "--repo", str(waiting_repo))
    assert (code, done["status"]) == (0, "completed")
    git(waiting_repo, "worktree", "remove", str(person))

    ran = phasegate_cli("worker", "--once", "--repo", str(waiting_repo))
    assert ran.returncode == 0, ran.stderr
    assert git(waiting_repo, "branch", "--list", branch) == ""
    code, detail = cli_json("show", workflow_id, "--repo", str(waiting_repo))
    assert _cleanup_of(detail)["status"] == "completed"
    assert detail["cleanup"] == {"status": "completed", "reason": None, "attempts": 2}
