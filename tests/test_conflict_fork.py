"""The conflict fork and preparation's fork fast path (docs/contracts/lifecycle.md:
merge, preparation), on real git, real worktrees, a real SQLite file and real
subprocesses.

Two workflows change the same line of feature.txt; the second's merge conflicts
with the base the first merged, forks a child workflow, pauses, and resumes
once the child ended.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from phasegate import operations
from phasegate.agents.base import AgentRequest, AgentResult
from phasegate.core import decisions
from phasegate.core.contract import PhaseResult
from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.testing import CRASH_EXIT_CODE, InMemoryForge, ScriptedRunner

from conftest import git, make_repo, phasegate_cli, scripted_cartridge

Build = Callable[..., tuple[Engine, Store]]

ANSWERS = """
[[plan]]
text = "1. Write feature.txt"
[[plan_review]]
text = "VERDICT: approve"
[[build]]
text = "not used: the test's build runner answers"
[[review]]
text = "VERDICT: approve"
[[verification]]
text = "VERDICT: confirmed"
"""

BOTH = "alpha\nbeta\n"


def resolution(content: str | None, **files: str) -> dict[str, Any]:
    """A scripted build answer of a conflict child: feature.txt's resolved content
    (None: it leaves the markers as they are) and any other file it writes."""
    written = dict(files)
    if content is not None:
        written["feature.txt"] = content
    return {"text": "resolved feature.txt", "files": written}


class Builds:
    """The build role: per workflow in development (the test fills ``by_workflow``),
    and ``resolutions`` (by the child's call index) for conflict children in merge."""

    name = "scripted"

    def __init__(self, resolutions: list[dict[str, Any]]) -> None:
        self.by_workflow: dict[str, ScriptedRunner] = {}
        self.resolutions = ScriptedRunner({"build": resolutions})
        self.requests: list[AgentRequest] = []

    def writes(self, workflow_id: str, content: str) -> None:
        answer = {"text": "wrote feature.txt", "files": {"feature.txt": content}}
        self.by_workflow[workflow_id] = ScriptedRunner({"build": [answer]})

    def run(
        self,
        request: AgentRequest,
        cancel: threading.Event,
        on_spawn: Callable[[int], None] | None = None,
    ) -> AgentResult:
        self.requests.append(request)
        runner = (
            self.resolutions if request.phase == "merge" else self.by_workflow[request.workflow_id]
        )
        return runner.run(request, cancel, on_spawn)


def project(tmp_path: Path, *, checks: list[str] | None = None, **cartridge: Any) -> Path:
    repo = make_repo(
        tmp_path / "repo",
        {
            "README.md": "# r\n",
            "feature.txt": "original\n",
            ".gitignore": ".phasegate/\n",
            "check.sh": "grep -qE 'alpha|beta' feature.txt\n",
        },
    )
    (repo / "answers.toml").write_text(ANSWERS)
    (repo / "phasegate.toml").write_text(scripted_cartridge(checks=checks, **cartridge))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "cartridge")
    return repo


def two_conflicting(engine: Engine, builds: Builds, *, auto_merge: bool = True) -> tuple[str, str]:
    """Workflow A (feature.txt = alpha) merged and completed; B (beta) started, its
    change made on the base A did not have yet."""
    a = engine.start("alpha", "feature.txt says alpha", auto_merge=auto_merge)
    b = engine.start("beta", "feature.txt says beta", auto_merge=auto_merge)
    builds.writes(a, "alpha\n")
    builds.writes(b, "beta\n")
    if not auto_merge:
        for wf in (a, b):
            assert engine.advance(wf)["current_phase"] == "wait"
            engine.decide(wf, lambda ctx: decisions.approve_merge(ctx, "test"))
    else:  # B's branch is made before A merges
        assert engine.advance(b, max_steps=1)["current_phase"] == "planning"
    row = engine.advance(a)
    assert row["status"] == "completed", row["error"]
    return a, b


def kinds(store: Store, wf: str, kind: str) -> list[Any]:
    return [m for m in store.milestones(wf) if m.kind == kind]


def test_a_conflicting_merge_forks_a_child_that_resolves_and_the_parent_completes(
    tmp_path: Path, engine_for: Build
) -> None:
    # The check's script reads feature.txt: a check naming it would make the builds'
    # change a protected path's, held for a person.
    repo = project(tmp_path, checks=["sh check.sh"])
    builds = Builds([resolution(BOTH)])
    engine, store = engine_for(repo, runners={"build": builds})
    a, b = two_conflicting(engine, builds)

    row = engine.advance(b)

    assert (row["current_phase"], row["status"]) == ("completed", "completed"), row["error"]
    assert git(repo, "show", "main:feature.txt") == BOTH.strip()  # both changes on the base
    (child,) = store.child_workflows(b)
    assert child["parent_workflow_id"] == b and child["state"]["kind"] == "conflict"
    assert (child["current_phase"], child["status"]) == ("completed", "completed")
    assert child["branch_name"] == row["branch_name"] and child["base_branch"] == "main"
    assert "feature.txt" in child["ticket"] and child["state"]["conflicted"] == ["feature.txt"]
    assert store.child_workflows(a) == []
    (fork,) = kinds(store, b, "conflict_fork")
    assert (fork.status, fork.data["child"]) == ("completed", child["id"])
    # The parent's merge paused for the child, then went on once the child's end woke it.
    events = [e["type"] for e in store.events(b)]
    assert "child_ended" in events
    # A throwaway session of the child's own, never the parent's main line.
    (resolving,) = [r for r in builds.requests if r.phase == "merge"]
    assert resolving.workflow_id == child["id"] and resolving.session_line == "conflict-a1"
    assert resolving.session_id is None and "feature.txt" in resolving.prompt
    # The resolution is the merge commit on the parent's branch that the base merged.
    merge_parents = git(repo, "log", "-1", "--format=%P", row["merge_sha"]).split()
    resolved = merge_parents[1]
    assert f"Phasegate-Conflict: {child['id']}" in git(repo, "log", "-1", "--format=%B", resolved)
    assert len(git(repo, "log", "-1", "--format=%P", resolved).split()) == 2
    (attempt,) = kinds(store, child["id"], "conflict_attempt")
    assert attempt.status == "completed" and "+alpha" in attempt.data["diff"]

    # status and show say who forked whom, a line each.
    status = phasegate_cli("status", "--repo", str(repo))
    assert status.returncode == 0 and f"child of {b}" in status.stdout, status.stdout
    shown = phasegate_cli("show", b, "--repo", str(repo)).stdout
    assert f"conflict-resolution child {child['id']}: completed" in shown
    shown = phasegate_cli("show", child["id"], "--repo", str(repo)).stdout
    assert f"conflict-resolution child of {b}" in shown


@pytest.mark.slow
def test_a_conflict_resolution_s_checkout_is_prepared_as_a_worktree_is(
    tmp_path: Path, engine_for: Build
) -> None:
    # The check needs the ignored .env of the main checkout and what the setup made:
    # in the resolution's checkout too, or the resolution would fail its checks.
    prepared = 'copy = [".env"]\nsetup = "echo made > setup.done"\n'
    repo = project(tmp_path, checks=["sh check.sh"], extra=prepared)
    (repo / ".gitignore").write_text(".phasegate/\n.env\nsetup.done\n")
    (repo / "check.sh").write_text(
        "grep -qE 'alpha|beta' feature.txt && grep -q KEY .env && test -f setup.done\n"
    )
    git(repo, "commit", "-qam", "the check needs .env and the setup")
    (repo / ".env").write_text("KEY=local\n")
    builds = Builds([resolution(BOTH)])
    engine, store = engine_for(repo, runners={"build": builds})
    a, b = two_conflicting(engine, builds)

    row = engine.advance(b)

    assert (row["current_phase"], row["status"]) == ("completed", "completed"), row["error"]
    (child,) = store.child_workflows(b)
    (attempt,) = kinds(store, child["id"], "conflict_attempt")
    assert attempt.status == "completed" and attempt.data["checks"][0]["passed"], attempt.data
    files = [e["data"] for e in store.events(child["id"]) if e["type"] == "worktree_files"]
    assert [(f["checkout"], f["copied"]) for f in files] == [("conflict resolution", [".env"])]
    (setup,) = [e["data"] for e in store.events(child["id"]) if e["type"] == "worktree_setup"]
    assert setup["checkout"] == "conflict resolution" and setup["passed"], setup
    # Brought and made for the checks only: neither is in what was merged.
    tree = git(repo, "ls-tree", "-r", "--name-only", "main").split()
    assert ".env" not in tree and "setup.done" not in tree


def test_an_unresolvable_conflict_fails_the_child_closed_and_pauses_the_parent(
    tmp_path: Path, engine_for: Build
) -> None:
    # Attempt 1 leaves the markers; 2 and 3 resolve them but break the checks.
    repo = project(tmp_path, checks=["test ! -e broken.txt"])
    builds = Builds([resolution(None), resolution(BOTH, **{"broken.txt": "x\n"})])
    engine, store = engine_for(repo, runners={"build": builds})
    a, b = two_conflicting(engine, builds)
    main_before = git(repo, "rev-parse", "main")

    row = engine.advance(b)

    assert (row["current_phase"], row["status"]) == ("merge", "paused")
    (child,) = store.child_workflows(b)
    assert child["status"] == "failed" and "conflict unresolved after 3" in child["error"]
    assert "could not resolve" in row["error"] and child["id"] in row["error"]
    assert "auto_reversion_from_apply" in row["error"]  # the review profile: a person decides
    # Nothing landed: the base and the parent's branch are as they were.
    assert git(repo, "rev-parse", "main") == main_before
    (fork,) = kinds(store, b, "conflict_fork")
    assert git(repo, "rev-parse", row["branch_name"]) == fork.data["head"]
    assert child["state"]["parent_head"] == fork.data["head"]
    # The child's evidence is kept: each attempt's diff and check output.
    attempts = kinds(store, child["id"], "conflict_attempt")
    assert [(m.attempt, m.status) for m in attempts] == [
        (1, "failed"),
        (2, "failed"),
        (3, "failed"),
    ]
    assert attempts[0].data["markers_left"] == ["feature.txt"]
    assert attempts[1].data["checks"][0]["passed"] is False and "+alpha" in attempts[1].data["diff"]
    assert [m.status for m in kinds(store, b, "merge_failed")] == ["failed"]
    # The child's temporary worktree is gone with it.
    assert not (repo / ".phasegate" / "worktrees" / child["id"]).exists()

    # A person resuming the parent gets a new round, a new child: never the failed one again.
    engine.decide(b, decisions.resume)
    builds.resolutions = ScriptedRunner({"build": [resolution(BOTH)]})
    row = engine.advance(b)
    assert row["status"] == "completed", row["error"]
    assert [c["status"] for c in store.child_workflows(b)] == ["failed", "completed"]
    assert git(repo, "show", "main:feature.txt") == BOTH.strip()


def test_a_child_a_person_cancels_wakes_its_parent_which_decides_as_for_a_failed_one(
    tmp_path: Path, engine_for: Build, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = project(tmp_path)
    builds = Builds([resolution(BOTH)])
    engine, store = engine_for(repo, runners={"build": builds})
    _a, b = two_conflicting(engine, builds)
    # The child is another worker's: this one pauses the parent for it and goes no further.
    monkeypatch.setattr(engine, "_advance_child", lambda _workflow_id: False)
    row = engine.advance(b)
    assert (row["current_phase"], row["status"]) == ("merge", "paused")
    (child,) = store.child_workflows(b)

    operations.cancel(engine, child["id"], by="ana")

    # The cancel's commit woke the parent, as a child's failure does.
    row = store.workflow_row(b)
    assert (row["current_phase"], row["status"]) == ("merge", "merging")
    assert [e["data"] for e in store.events(b) if e["type"] == "child_ended"] == [
        {"child": child["id"], "status": "cancelled"}
    ]
    monkeypatch.undo()
    row = engine.advance(b)
    # Nothing resolved: the profile decides (review: a person), never a wait for ever.
    assert (row["current_phase"], row["status"]) == ("merge", "paused")
    assert "could not resolve" in row["error"] and "cancelled by ana" in row["error"]
    assert builds.requests and all(r.phase != "merge" for r in builds.requests)


# One pass over the parent's merge that dies (os._exit, like SIGKILL) right after
# the child's row is committed, before the fork milestone is settled.
CRASH_AFTER_FORK = """\
import os, sys
from pathlib import Path

from phasegate.config.cartridge import load_cartridge
from phasegate.runtime.engine import Engine
from phasegate.store import open_store
from phasegate.store.workflows import WorkflowRows

repo, workflow_id = Path(sys.argv[1]), sys.argv[2]
real = WorkflowRows.create_workflow


def crashing(self, **kwargs):
    created = real(self, **kwargs)
    if kwargs.get("parent_workflow_id"):
        os._exit(137)
    return created


WorkflowRows.create_workflow = crashing
cartridge = load_cartridge(repo)
store = open_store(cartridge.store_url(repo))
Engine(repo, cartridge, store).advance(workflow_id)
sys.exit(3)
"""


def test_a_kill_right_after_the_fork_then_resuming_forks_no_second_child(
    tmp_path: Path, engine_for: Build
) -> None:
    repo = project(tmp_path)
    builds = Builds([resolution(BOTH)])
    engine, store = engine_for(repo, runners={"build": builds})
    a, b = two_conflicting(engine, builds, auto_merge=False)
    script = tmp_path / "crash_after_fork.py"
    script.write_text(CRASH_AFTER_FORK)

    proc = subprocess.run(
        [sys.executable, str(script), str(repo), b], capture_output=True, text=True, timeout=120
    )

    assert proc.returncode == CRASH_EXIT_CODE, proc.stdout + proc.stderr
    (child,) = store.child_workflows(b)
    (fork,) = kinds(store, b, "conflict_fork")
    assert fork.status == "in_progress"  # the kill came before it was settled
    assert store.workflow_row(b)["status"] == "merging"

    row = engine.advance(b)

    assert row["status"] == "completed", row["error"]
    assert [c["id"] for c in store.child_workflows(b)] == [child["id"]]  # the same one
    assert store.workflow_row(child["id"])["status"] == "completed"
    (fork,) = kinds(store, b, "conflict_fork")
    assert (fork.status, fork.data["child"]) == ("completed", child["id"])
    assert git(repo, "show", "main:feature.txt") == BOTH.strip()


# One pass that runs the parent's merge and its child with a resolving build, and
# dies (os._exit) once the resolution is the parent's branch, before the child
# publishes it or commits its end.
CRASH_AFTER_LANDING = """\
import os, sys
from pathlib import Path

from phasegate.config.cartridge import load_cartridge
from phasegate.runtime.engine import Engine
from phasegate.phases import conflict
from phasegate.store import open_store
from phasegate.testing import ScriptedRunner

repo, workflow_id = Path(sys.argv[1]), sys.argv[2]
conflict._landed = lambda *args, **kwargs: os._exit(137)
cartridge = load_cartridge(repo)
store = open_store(cartridge.store_url(repo))
answer = {"text": "resolved", "files": {"feature.txt": "alpha\\nbeta\\n"}}
runners = {"build": ScriptedRunner({"build": [answer]})}
Engine(repo, cartridge, store, runners=runners).advance(workflow_id)
sys.exit(3)
"""


def test_a_kill_after_the_resolution_landed_completes_the_child_without_resolving_again(
    tmp_path: Path, engine_for: Build
) -> None:
    repo = project(tmp_path)
    builds = Builds([resolution("never asked\n")])
    engine, store = engine_for(repo, runners={"build": builds})
    a, b = two_conflicting(engine, builds, auto_merge=False)
    script = tmp_path / "crash_after_landing.py"
    script.write_text(CRASH_AFTER_LANDING)

    proc = subprocess.run(
        [sys.executable, str(script), str(repo), b], capture_output=True, text=True, timeout=120
    )

    assert proc.returncode == CRASH_EXIT_CODE, proc.stdout + proc.stderr
    (child,) = store.child_workflows(b)
    assert child["status"] == "merging"  # its end was never committed
    landed = git(repo, "rev-parse", child["branch_name"])
    assert f"Phasegate-Conflict: {child['id']}" in git(repo, "log", "-1", "--format=%B", landed)

    row = engine.advance(b)

    assert row["status"] == "completed", row["error"]
    assert [r for r in builds.requests if r.phase == "merge"] == []  # not resolved again
    assert store.workflow_row(child["id"])["state"]["resolution"] == landed
    assert git(repo, "show", "main:feature.txt") == BOTH.strip()


def test_a_child_waits_until_its_parent_has_paused_for_it(
    tmp_path: Path, engine_for: Build
) -> None:
    # A second worker may claim the child before the parent's pause is committed
    # (or the parent died before it): the child must not resolve for a parent that
    # does not wait for it, or its end would wake nobody.
    repo = project(tmp_path)
    builds = Builds([resolution(BOTH)])
    engine, store = engine_for(repo, runners={"build": builds})
    parent = engine.start("p", "ticket")
    child = store.create_workflow(
        title="c",
        ticket="x",
        repo_path=str(repo),
        base_branch="main",
        auto_merge=False,
        content_language="en",
        parent_workflow_id=parent,
        phase="merge",
        branch_name="main",
        state={"kind": "conflict", "fork_round": 1, "parent_head": "0" * 40},
    )

    row = engine.advance(child)

    assert (row["current_phase"], row["status"]) == ("merge", "merging")
    assert builds.requests == [] and store.milestones(child) == []

    # A parent that named the child and was moved on since waits for nobody: the
    # child fails closed rather than land a resolution on its branch.
    engine.commit(store.load_context(parent), PhaseResult("retry", state={"conflict_child": child}))
    row = engine.advance(child)
    assert row["status"] == "failed" and "no longer waits" in row["error"]
    assert builds.requests == []


def test_preparation_attaches_to_a_surviving_local_branch(
    tmp_path: Path, engine_for: Build
) -> None:
    repo = project(tmp_path)
    engine, store = engine_for(repo)
    git(repo, "checkout", "-q", "-b", "feature/kept")
    (repo / "kept.txt").write_text("work that survived\n")
    git(repo, "add", "kept.txt")
    git(repo, "commit", "-qm", "kept work")
    kept = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    wf = _filed(store, repo, "feature/kept")

    row = engine.advance(wf, max_steps=1)

    assert (row["current_phase"], row["branch_name"]) == ("planning", "feature/kept")
    assert git(Path(row["worktree_path"]), "rev-parse", "HEAD") == kept  # not remade at main
    (made,) = kinds(store, wf, "branch_created")
    assert made.status == "completed" and "attached" in made.summary
    assert made.data["attached"] == "local" and made.data["result"]["sha"] == kept


def test_preparation_fetches_and_attaches_to_a_branch_only_the_remote_has(
    tmp_path: Path, engine_for: Build
) -> None:
    repo = project(tmp_path)
    remote = tmp_path / "origin.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(remote))
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", str(remote), str(other))
    git(other, "checkout", "-q", "-b", "feature/remote")
    (other / "remote.txt").write_text("pushed from elsewhere\n")
    git(other, "add", "remote.txt")
    git(other, "-c", "user.name=o", "-c", "user.email=o@x", "commit", "-qm", "remote work")
    git(other, "push", "-q", "origin", "feature/remote")
    pushed = git(other, "rev-parse", "HEAD")
    git(repo, "remote", "add", "origin", str(remote))
    engine, store = engine_for(repo)
    wf = _filed(store, repo, "feature/remote")

    row = engine.advance(wf, max_steps=1)

    assert row["current_phase"] == "planning", row["error"]
    assert git(repo, "rev-parse", "feature/remote") == pushed
    assert git(Path(row["worktree_path"]), "rev-parse", "HEAD") == pushed
    (made,) = kinds(store, wf, "branch_created")
    assert made.data["attached"] == "origin" and "attached" in made.summary


def _filed(store: Store, repo: Path, branch: str) -> str:
    """A workflow in preparation whose branch is ``branch`` (as an import or a fork files one)."""
    return store.create_workflow(
        title="t",
        ticket="ticket",
        repo_path=str(repo),
        base_branch="main",
        auto_merge=False,
        content_language="en",
        branch_name=branch,
    )


def test_a_childs_end_wakes_only_the_parent_paused_for_it_in_the_same_commit(
    tmp_path: Path, engine_for: Build
) -> None:
    # What a worker relies on when another worker advanced the child: no poll of
    # the parent, its status is back in the child's own commit.
    repo = project(tmp_path)
    engine, store = engine_for(repo)
    parent, other = engine.start("p", "ticket"), engine.start("o", "ticket")

    def child_of(wf: str) -> str:
        return store.create_workflow(
            title="c",
            ticket="x",
            repo_path=str(repo),
            base_branch="main",
            auto_merge=False,
            content_language="en",
            parent_workflow_id=wf,
            phase="merge",
        )

    child, stranger = child_of(parent), child_of(other)
    engine.commit(
        store.load_context(parent),
        PhaseResult("pause", reason="waiting for child", state={"conflict_child": child}),
    )
    engine.commit(store.load_context(other), PhaseResult("pause", reason="a person's"))

    engine.commit(store.load_context(stranger), PhaseResult("failed", reason="x"))
    assert store.workflow_row(other)["status"] == "paused"  # not waiting for that child
    engine.commit(store.load_context(child), PhaseResult.advance("completed"))

    row = store.workflow_row(parent)
    assert (row["current_phase"], row["status"], row["error"]) == (
        "preparation",
        "preparing",
        None,
    )
    assert [e["data"] for e in store.events(parent) if e["type"] == "child_ended"] == [
        {"child": child, "status": "completed"}
    ]
    assert [c["id"] for c in store.child_workflows(parent)] == [child]


def test_the_resolution_is_published_through_the_forge_so_a_pull_request_sees_it(
    tmp_path: Path, engine_for: Build
) -> None:
    # Any forge: only the Forge protocol is used (here the in-memory one, whose
    # merge touches no git, so the base's conflicting change is committed by hand).
    repo = project(tmp_path, auto_merge=False)
    forge = InMemoryForge()
    builds = Builds([resolution(BOTH)])
    engine, store = engine_for(repo, runners={"build": builds}, forge=forge)
    wf = engine.start("beta", "feature.txt says beta", auto_merge=False)
    builds.writes(wf, "beta\n")
    assert engine.advance(wf)["current_phase"] == "wait"
    (repo / "feature.txt").write_text("alpha\n")
    git(repo, "commit", "-qam", "alpha on main")
    engine.decide(wf, lambda ctx: decisions.approve_merge(ctx, "test"))
    published = len(forge.published)

    row = engine.advance(wf, max_steps=3)  # wait → merge, merge (fork), merge

    (child,) = store.child_workflows(wf)
    assert child["status"] == "completed"
    resolved = child["state"]["resolution"]
    assert forge.published[published:] == [row["branch_name"]]
    (pushed,) = kinds(store, child["id"], "branch_pushed")
    assert pushed.status == "completed" and pushed.data["params"]["sha"] == resolved
    assert git(repo, "merge-base", "--is-ancestor", "main", resolved) == ""  # holds the base
    assert row["merge_sha"] == forge.prs[row["pr_number"]].merge_sha  # merged on the forge


def test_a_resolution_holding_a_key_anywhere_is_refused_never_landed(
    tmp_path: Path, engine_for: Build, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVICE_API_KEY", "sk-live-leaked-000111")
    repo = project(tmp_path)
    leaky = resolution(BOTH, **{"config.txt": "key = sk-live-leaked-000111\n"})
    builds = Builds([leaky, resolution(BOTH)])  # the key outside the conflicted file
    engine, store = engine_for(repo, runners={"build": builds})
    a, b = two_conflicting(engine, builds)

    row = engine.advance(b)

    assert row["status"] == "completed", row["error"]
    (child,) = store.child_workflows(b)
    first, second = kinds(store, child["id"], "conflict_attempt")
    assert first.status == "failed" and "secret value in: config.txt" in first.summary
    assert first.data["diff"] == "" and first.data["checks"] == []  # nothing of it kept
    assert second.status == "completed"
    assert "sk-live-leaked" not in git(repo, "log", "-p", "--all")
    assert "sk-live-leaked" not in str([m.data for m in store.milestones(child["id"])])
