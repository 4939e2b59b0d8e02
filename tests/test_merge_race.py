"""A base that moves between the merge phase's sync and its merge, on real git.

Two sibling workflows reach merge together: each syncs its branch with the base
outside the repository's merge lock, then merges under it. The one that merges
second finds a base its sync did not see. When that base conflicts with its
branch, the local forge refuses the merge as not mergeable and the phase forks a
conflict-resolution child, as when the sync itself finds the conflict; it never
fails. The sibling's merge is landed by a seam: right before the real merge.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_conflict_fork import BOTH, Builds, kinds, project, resolution

from phasegate.forge.base import ForgeNotMergeable
from phasegate.forge.local import LocalForge
from phasegate.git.errors import MergeConflict
from phasegate.git.workspace import Workspace
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store

from conftest import git, make_repo

Build = Callable[..., tuple[Engine, Store]]


def _land_on_main(repo: Path, content: str) -> None:
    """A sibling's merge: ``feature.txt`` = ``content`` committed on main, which
    ``repo`` (the person's checkout) has checked out."""
    (repo / "feature.txt").write_text(content)
    git(repo, "commit", "-qam", "a sibling merged first")


def test_a_base_moved_between_sync_and_merge_forks_a_child_never_fails(
    tmp_path: Path, engine_for: Build, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = project(tmp_path, checks=["sh check.sh"])
    builds = Builds([resolution(BOTH)])
    engine, store = engine_for(repo, runners={"build": builds})
    wf = engine.start("beta", "feature.txt says beta", auto_merge=True)
    builds.writes(wf, "beta\n")
    real = Workspace.merge_into_base
    landed: list[str] = []

    def sibling_lands_first(self: Workspace, *args: Any, **kwargs: Any) -> str:
        if not landed:  # once: the child's own merge later finds the base still
            _land_on_main(repo, "alpha\n")
            landed.append(git(repo, "rev-parse", "main"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Workspace, "merge_into_base", sibling_lands_first)

    row = engine.advance(wf)

    assert landed, "the merge never ran"
    assert (row["current_phase"], row["status"]) == ("completed", "completed"), row["error"]
    assert kinds(store, wf, "merge_failed") == []
    (child,) = store.child_workflows(wf)
    assert child["state"]["conflicted"] == ["feature.txt"]
    (fork,) = kinds(store, wf, "conflict_fork")
    assert fork.data["child"] == child["id"]
    # Both changes are on the base, the sibling's under the merge.
    assert git(repo, "show", "main:feature.txt") == BOTH.strip()
    assert git(repo, "merge-base", "--is-ancestor", landed[0], "main") == ""
    assert git(repo, "status", "--porcelain") == ""


@pytest.mark.parametrize("checked_out", [True, False], ids=["in-checkout", "in-scratch"])
def test_a_conflicting_merge_into_the_base_is_refused_with_nothing_merged(
    tmp_path: Path, checked_out: bool
) -> None:
    repo = make_repo(tmp_path / "repo", {"NOTES.md": "start\n"})
    git(repo, "checkout", "-qb", "p1")
    (repo / "NOTES.md").write_text("piece 1\n")
    git(repo, "commit", "-qam", "piece 1")
    git(repo, "checkout", "-q", "main")
    (repo / "NOTES.md").write_text("piece 2\n")
    git(repo, "commit", "-qam", "piece 2")
    if not checked_out:
        git(repo, "checkout", "-q", "--detach")
    base = git(repo, "rev-parse", "main")
    workspace = Workspace()

    with pytest.raises(MergeConflict) as raised:
        workspace.merge_into_base(repo, "main", "p1", "merge p1")

    assert raised.value.conflicted == ["NOTES.md"]
    assert git(repo, "rev-parse", "main") == base
    assert git(repo, "status", "--porcelain") == ""  # aborted: no MERGE_HEAD, no markers
    assert not workspace.merge_in_progress(repo)
    assert workspace.scratch_holders(repo) == []

    # The local forge refuses it as GitHub does: not mergeable, so the phase syncs again.
    store = open_store(f"sqlite:///{tmp_path / 'forge.db'}")
    try:
        forge = LocalForge(store, repo, workspace, secrets=[])
        number = forge.create_pull_request("p1", "main", "piece 1", "")
        with pytest.raises(ForgeNotMergeable, match="conflicts with main"):
            forge.merge_pull_request(number, "merge p1")
        assert forge.pull_request(number).state == "open"
    finally:
        store.close()
