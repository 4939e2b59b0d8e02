"""The forge's base on GitHub: a workflow branches from,
syncs with and forks its conflict resolution against GitHub's main, which the
local main no longer matches once a pull request merged on GitHub.

The fake GitHub behind Prism, real git: two workflows write feature.txt's one
line, the first merges by GitHub's API, the second's merge finds the conflict
with GitHub's main locally and forks a conflict-resolution child, whose
resolution is pushed to the pull request's branch on the fake.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from phasegate.core import decisions
from phasegate.runtime.engine import Engine
from phasegate.store import Store

from conftest import ANSWERS_BUT_BUILD, GitHubLab, git, github_repo, scripted_cartridge
from support.conflict_build import BOTH, alpha_and_beta, build_script, merged_through_child

Build = Callable[..., tuple[Engine, Store]]


def conflicting_repo(lab: GitHubLab, tmp_path: Path, *, resolvable: bool) -> Path:
    """octo/widgets with feature.txt, every role scripted but build (``build_script``)."""
    allow = tmp_path / "resolvable"
    if resolvable:
        allow.write_text("yes\n")
    script = tmp_path / "build.sh"
    script.write_text(build_script(allow))
    build = f'runner = "command"\ncommand = "sh {script}"\n'
    reviews = tmp_path / "reviews"
    reviews.mkdir()
    review = (  # keeps each review prompt (the diff reviewed) in reviews/
        f'runner = "command"\ncommand = "cat > {reviews}/$(date +%s%N).txt; '
        'echo VERDICT: approve"\n'
    )
    text = scripted_cartridge(role_overrides={"build": build, "review": review}, auto_merge=False)
    return github_repo(
        lab,
        tmp_path / "repo",
        text,
        {
            "README.md": "# widgets\n",
            "feature.txt": "original\n",
            ".gitignore": ".phasegate/\n",
            "answers.toml": ANSWERS_BUT_BUILD,
        },
    )


def waiting_pair(engine: Engine) -> tuple[str, str]:
    """Workflows alpha and beta, both waiting with a pull request made from the same
    main; alpha approved and merged by the API, completed."""
    a, b = alpha_and_beta(engine)
    engine.decide(a, lambda ctx: decisions.approve_merge(ctx, "test"))
    row = engine.advance(a)
    assert row["status"] == "completed", row["error"]
    return a, b


def on_github(lab: GitHubLab, ref: str, path: str | None = None) -> str:
    """The fake's ``ref`` (its SHA), or ``path``'s content there."""
    bare = lab.server.repo(lab.repository).git
    return bare.git("show", f"{ref}:{path}") if path else bare.git("rev-parse", ref).strip()


def reviewed_diffs(tmp_path: Path) -> list[str]:
    """Every review prompt the review role was given, oldest first."""
    return [p.read_text() for p in sorted((tmp_path / "reviews").iterdir())]


def kinds(store: Store, wf: str, kind: str) -> list[Any]:
    return [m for m in store.milestones(wf) if m.kind == kind]


def test_a_conflict_with_githubs_main_forks_a_child_whose_resolution_github_merges(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    repo = conflicting_repo(github, tmp_path, resolvable=True)
    engine, store = engine_for(repo)
    gh, name = github.server, github.repository
    stale = git(repo, "rev-parse", "main")
    a, b = waiting_pair(engine)
    merged_a = on_github(github, "refs/heads/main")
    assert git(repo, "rev-parse", "main") == stale  # the local main never saw it

    # Started after alpha merged on GitHub: made from GitHub's main, not the local
    # one, and reviewed against it (alpha's change is not in its diff).
    c = engine.start("gamma", "another change")
    row = engine.advance(c, max_steps=1)
    assert row["current_phase"] == "planning", row["error"]
    assert row["state"]["base_sha"] == merged_a != stale
    assert git(repo, "merge-base", row["branch_name"], merged_a) == merged_a
    assert engine.advance(c)["status"] == "waiting"
    (reviewed,) = [t for t in reviewed_diffs(tmp_path) if "gamma" in t]
    assert "+other" in reviewed and "+alpha" not in reviewed

    row, child = merged_through_child(engine, store, b)
    # The resolution reached the pull request's branch on GitHub, and GitHub merged it.
    resolution = child["state"]["resolution"]
    pr = gh.pull(name, row["pr_number"])
    assert pr.pull.merged_at is not None and gh.counts(name)["merges"] == 2
    assert gh.pull_facts(gh.repo(name), pr).head_sha == resolution
    assert f"Phasegate-Conflict: {child['id']}" in git(repo, "log", "-1", "--format=%B", resolution)
    assert on_github(github, "refs/heads/main", "feature.txt") == BOTH
    assert on_github(github, "refs/heads/main") == row["merge_sha"]
    assert git(repo, "merge-base", "--is-ancestor", merged_a, resolution) == ""
    pushed = [m.data["params"]["sha"] for m in kinds(store, child["id"], "branch_pushed")]
    assert pushed == [resolution]
    assert git(repo, "rev-parse", "main") == stale


def test_an_unresolvable_conflict_on_github_fails_the_child_and_leaves_the_pull_request_open(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    repo = conflicting_repo(github, tmp_path, resolvable=False)
    engine, store = engine_for(repo)
    gh, name = github.server, github.repository
    a, b = waiting_pair(engine)
    merged_a = on_github(github, "refs/heads/main")
    engine.decide(b, lambda ctx: decisions.approve_merge(ctx, "test"))
    branch = store.workflow_row(b)["branch_name"]
    head = on_github(github, f"refs/heads/{branch}")

    row = engine.advance(b)

    assert (row["current_phase"], row["status"]) == ("merge", "paused"), row["error"]
    (child,) = store.child_workflows(b)
    assert child["status"] == "failed" and "conflict unresolved" in child["error"]
    assert "could not resolve" in row["error"]
    attempts = kinds(store, child["id"], "conflict_attempt")
    assert attempts and all(m.data["markers_left"] == ["feature.txt"] for m in attempts)
    # Nothing merged, nothing pushed: the pull request is open at the head it had.
    pr = gh.pull(name, row["pr_number"])
    assert pr.state == "open" and pr.pull.merged_at is None
    assert gh.counts(name)["merges"] == 1
    assert on_github(github, "refs/heads/main") == merged_a
    assert on_github(github, f"refs/heads/{branch}") == head
    assert kinds(store, child["id"], "branch_pushed") == []


class MergedMeanwhile:
    """The engine's forge, where a person merges pull request ``other`` on GitHub's
    page right before phasegate's first merge call: GitHub's main moves after the
    merge phase synced it, and GitHub refuses the merge (405, a conflict)."""

    def __init__(self, inner: Any, lab: GitHubLab, other: int) -> None:
        self.inner, self.lab, self.other = inner, lab, other
        self.raced = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def merge_pull_request(self, number: int, message: str, head: str | None = None) -> str:
        if not self.raced:
            self.raced = True
            self.lab.server.merge_by_hand(self.lab.repository, self.other, "olga")
        return self.inner.merge_pull_request(number, message, head)


def test_a_merge_github_refuses_as_not_mergeable_after_the_sync_forks_the_resolution(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    repo = conflicting_repo(github, tmp_path, resolvable=True)
    engine, store = engine_for(repo)
    gh, name = github.server, github.repository
    a, b = alpha_and_beta(engine)
    engine.decide(b, lambda ctx: decisions.approve_merge(ctx, "test"))
    raced = MergedMeanwhile(engine.forge, github, store.workflow_row(a)["pr_number"])
    engine.forge = raced  # type: ignore[assignment]

    row = engine.advance(b)

    assert raced.raced and (row["current_phase"], row["status"]) == ("completed", "completed")
    # The sync before the merge call was clean: only GitHub's 405 found the conflict.
    (done,) = kinds(store, b, "merge_completed")  # the refused try's row, settled again
    assert done.status == "completed" and done.data["result"]["sha"] == row["merge_sha"]
    (fork,) = kinds(store, b, "conflict_fork")
    (child,) = store.child_workflows(b)
    assert child["status"] == "completed" and fork.data["child"] == child["id"]
    assert gh.counts(name)["merges"] == 2
    assert on_github(github, "refs/heads/main", "feature.txt") == BOTH


def test_a_merge_github_refuses_though_it_merges_cleanly_pauses_with_githubs_reason(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    repo = conflicting_repo(github, tmp_path, resolvable=True)
    engine, store = engine_for(repo)
    gh, name = github.server, github.repository
    wf = engine.start("alpha", "feature.txt says alpha")
    assert engine.advance(wf)["status"] == "waiting"
    engine.decide(wf, lambda ctx: decisions.approve_merge(ctx, "test"))
    # A rule of GitHub's (branch protection) holds it: not a conflict to resolve.
    gh.fail("PUT", r"/pulls/\d+/merge$", 405, times=1, body={"message": "Required review"})

    row = engine.advance(wf)

    assert (row["current_phase"], row["status"]) == ("merge", "paused")
    assert "Required review" in row["error"] and "reason of its own" in row["error"]
    assert store.child_workflows(wf) == [] and gh.counts(name)["merges"] == 0
    engine.decide(wf, decisions.resume)
    row = engine.advance(wf)
    assert row["status"] == "completed", row["error"]
    assert gh.counts(name)["merges"] == 1
