"""The forge's base on Gitea: a workflow branches from, syncs with and forks its
conflict resolution against Gitea's main, which the local main no longer matches
once a pull request merged on Gitea.

The fake Gitea, real git: two workflows write feature.txt's one line, the first
merges by Gitea's API, the second's merge finds the conflict with Gitea's main
(locally when it syncs, or by Gitea's refusal when main moved after the sync)
and forks a conflict-resolution child, whose resolution is pushed to the pull
request's branch on the fake and merged there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from phasegate.core import decisions
from phasegate.runtime.engine import Engine
from phasegate.store import Store

from conftest import ANSWERS_BUT_BUILD, git, make_repo, scripted_cartridge
from gitea_forge_kit import PEOPLE, GiteaLab, gitea
from support.conflict_build import BOTH, alpha_and_beta, build_script, merged_through_child

__all__ = ["gitea"]

Build = Callable[..., tuple[Engine, Store]]


def conflicting_repo(lab: GiteaLab, tmp_path: Path) -> Path:
    """octo/widgets with feature.txt, every role scripted but build (``build_script``)."""
    script = tmp_path / "build.sh"
    script.write_text(build_script())
    build = f'runner = "command"\ncommand = "sh {script}"\n'
    text = scripted_cartridge(role_overrides={"build": build}, auto_merge=False)
    files = {
        "README.md": "# widgets\n",
        "feature.txt": "original\n",
        ".gitignore": ".phasegate/\n",
        "answers.toml": ANSWERS_BUT_BUILD,
        "phasegate.toml": text + "\n" + lab.cartridge(),
    }
    repo = make_repo(tmp_path / "repo", files)
    lab.server.create_repo(lab.repository, from_path=repo)
    for login, mode in PEOPLE.items():
        lab.server.add_collaborator(lab.repository, login, mode)
    return repo


def on_gitea(lab: GiteaLab, ref: str, path: str | None = None) -> str:
    """The fake's ``ref`` (its SHA), or ``path``'s content there."""
    bare = lab.server.repo(lab.repository).bare
    return bare.git("show", f"{ref}:{path}") if path else bare.git("rev-parse", ref).strip()


def kinds(store: Store, wf: str, kind: str) -> list[Any]:
    return [m for m in store.milestones(wf) if m.kind == kind]


def test_a_conflict_with_giteas_main_forks_a_child_whose_resolution_gitea_merges(
    gitea: GiteaLab, tmp_path: Path, engine_for: Build
) -> None:
    repo = conflicting_repo(gitea, tmp_path)
    engine, store = engine_for(repo)
    stale = git(repo, "rev-parse", "main")
    a, b = alpha_and_beta(engine)
    engine.decide(a, lambda ctx: decisions.approve_merge(ctx, "test"))
    assert engine.advance(a)["status"] == "completed"
    merged_a = on_gitea(gitea, "refs/heads/main")
    assert git(repo, "rev-parse", "main") == stale  # the local main never saw it

    row, child = merged_through_child(engine, store, b)
    # The resolution reached the pull request's branch on Gitea, and Gitea merged it.
    resolution = child["state"]["resolution"]
    pr = gitea.issue(row["pr_number"]).pull
    assert pr is not None and pr.merged and pr.merged_head == resolution
    assert gitea.counts()["merges"] == 2
    assert on_gitea(gitea, "refs/heads/main", "feature.txt") == BOTH
    assert on_gitea(gitea, "refs/heads/main") == row["merge_sha"]
    assert git(repo, "merge-base", "--is-ancestor", merged_a, resolution) == ""


class MergedMeanwhile:
    """The engine's forge, where a person merges pull request ``other`` on Gitea
    right before phasegate's first merge call: Gitea's main moves after the merge
    phase synced it, and Gitea refuses the merge (a conflict)."""

    def __init__(self, inner: Any, lab: GiteaLab, other: int) -> None:
        self.inner, self.lab, self.other = inner, lab, other
        self.raced = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def merge_pull_request(self, number: int, message: str, head: str | None = None) -> str:
        if not self.raced:
            self.raced = True
            self.lab.act("olga", "POST", f"/pulls/{self.other}/merge", Do="merge")
        return self.inner.merge_pull_request(number, message, head)


def test_a_merge_gitea_refuses_as_not_mergeable_after_the_sync_forks_the_resolution(
    gitea: GiteaLab, tmp_path: Path, engine_for: Build
) -> None:
    repo = conflicting_repo(gitea, tmp_path)
    engine, store = engine_for(repo)
    a, b = alpha_and_beta(engine)
    engine.decide(b, lambda ctx: decisions.approve_merge(ctx, "test"))
    raced = MergedMeanwhile(engine.forge, gitea, store.workflow_row(a)["pr_number"])
    engine.forge = raced  # type: ignore[assignment]

    row = engine.advance(b)

    assert raced.raced and (row["current_phase"], row["status"]) == ("completed", "completed")
    # The sync before the merge call was clean: only Gitea's refusal found the conflict.
    refused = [r.status for r in gitea.posts("/merge") if r.login == "phasegate-bot"]
    assert refused[0] in (405, 409) and refused[-1] == 200
    (fork,) = kinds(store, b, "conflict_fork")
    (child,) = store.child_workflows(b)
    assert child["status"] == "completed" and fork.data["child"] == child["id"]
    assert gitea.counts()["merges"] == 2
    assert on_gitea(gitea, "refs/heads/main", "feature.txt") == BOTH


def test_a_merge_gitea_refuses_though_it_merges_cleanly_pauses_with_giteas_reason(
    gitea: GiteaLab, tmp_path: Path, engine_for: Build
) -> None:
    repo = conflicting_repo(gitea, tmp_path)
    engine, store = engine_for(repo)
    wf = engine.start("alpha", "feature.txt says alpha")
    assert engine.advance(wf)["status"] == "waiting"
    engine.decide(wf, lambda ctx: decisions.approve_merge(ctx, "test"))
    # A rule of Gitea's holds it: not a conflict to resolve.
    reason = "not allowed to merge [reason: Does not have enough approvals]"
    gitea.server.fail("POST", r"/pulls/\d+/merge$", 405, times=1, body={"message": reason})

    row = engine.advance(wf)

    assert (row["current_phase"], row["status"]) == ("merge", "paused")
    assert "enough approvals" in row["error"] and "reason of its own" in row["error"]
    assert store.child_workflows(wf) == [] and gitea.counts()["merges"] == 0
    engine.decide(wf, decisions.resume)
    row = engine.advance(wf)
    assert row["status"] == "completed", row["error"]
    assert gitea.counts()["merges"] == 1
