"""Workflows whose planning, development and pr_review follow the development graph.

``[graph] enabled = true``: real git worktrees, a real SQLite file, the
scripted runner (``phasegate.testing``) for the agents; the real Claude Code
CLI runs one in ``test_graph_real_claude.py``.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from phasegate.agents.base import AgentRequest, AgentResult
from phasegate.config.cartridge import load_cartridge
from phasegate.core import decisions
from phasegate.phases.graph_mode.harness import replay_check
from phasegate.phases.graph_mode.run import CHECKS_GATE, PROPOSAL_TRAILER
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store
from phasegate.testing import CRASH_EXIT_CODE

from conftest import git, make_repo, phasegate_cli, scripted_cartridge

FEATURE = """Adds feature.txt.

```diff
--- /dev/null
+++ b/feature.txt
@@ -0,0 +1 @@
+the feature
```
"""

OTHER_FEATURE = """Adds feature.txt, worded otherwise.

```diff
--- /dev/null
+++ b/feature.txt
@@ -0,0 +1,3 @@
+the feature
+with a second line
+and a third, so the patch is not the same
```
"""

MORE_FEATURE = """Two more lines in feature.txt.

```diff
--- a/feature.txt
+++ b/feature.txt
@@ -1 +1,3 @@
 the feature
+with a second line
+and a third
```
"""

ANSWERS = f"""
[[plan]]
text = "1. Create feature.txt holding 'the feature'."
[[plan_alternative]]
text = "1. Write feature.txt from a template (the SECOND plan)."
[[plan_arbitrate]]
text = "CHOICE: second\\nPRICE: one template more"
[[build]]
text = '''{FEATURE}'''
[[review]]
text = "Correct.\\nVERDICT: approve"
[[verification]]
text = "VERDICT: confirmed"
"""

GRAPH_ROLES = ("plan_alternative", "plan_arbitrate")


def graph_repo(
    tmp_path: Path,
    *,
    policy: str = "auto",
    checks: list[str] | None = None,
    answers: str = ANSWERS,
    extra: str = "",
    profile: str | None = None,
    auto_merge: bool | None = True,
    roles: tuple[str, ...] = GRAPH_ROLES,
    item_policy: str | None = None,
) -> Path:
    """A repository whose cartridge runs workflows through the graph, every role scripted."""
    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(answers)
    optional = "".join(
        f'[roles.{role}]\nrunner = "scripted"\nscript = "answers.toml"\n\n' for role in roles
    )
    items = f', item_create = "{item_policy}"' if item_policy else ""
    settings = (
        "[graph]\nenabled = true\n\n"
        f'[autonomy]\npolicy = {{ draft_pr_create = "{policy}"{items} }}\n\n{extra}\n{optional}'
    )
    (repo / "phasegate.toml").write_text(
        scripted_cartridge(
            checks=checks if checks is not None else ["test -f feature.txt"],
            extra=settings,
            profile=profile,
            auto_merge=auto_merge,
        )
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "cartridge")
    return repo


def kinds(store: Store, workflow_id: str) -> list[str]:
    return [m.kind for m in store.milestones(workflow_id)]


def milestone(store: Store, workflow_id: str, kind: str):
    [found] = [m for m in store.milestones(workflow_id) if m.kind == kind]
    return found


def test_a_workflow_runs_through_the_graph_and_the_apply_arm_lands_it(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    repo = graph_repo(tmp_path)
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add feature.txt", "feature.txt holds 'the feature'")
    row = engine.advance(workflow_id)

    assert (row["current_phase"], row["status"]) == ("completed", "completed")
    assert git(repo, "show", "main:feature.txt") == "the feature"
    # the graph's plan competition chose the second plan; the builder got it verbatim
    finalized = milestone(store, workflow_id, "plan_finalized")
    assert finalized.data["plan_competition"]["choice"] == "second"
    assert finalized.data["plan"] == "1. Write feature.txt from a template (the SECOND plan)."
    run = store.run(f"{workflow_id}-g1")["record"]
    build_call = next(c for c in run["calls"] if c["role"] == "build")
    assert build_call["index"] == 3  # plan, plan_alternative, plan_arbitrate, then build

    # one proposal, auto, applied by the apply arm; the checks ran before the gate
    [proposal] = store.proposals(workflow_id=workflow_id)
    assert (proposal["kind"], proposal["mode"], proposal["status"]) == (
        "draft_pr_create",
        "auto",
        "applied",
    )
    assert proposal["decided_by"] == "auto"
    evidence = {e["kind"]: e["data"] for e in proposal["evidence"]}
    assert {"change_facts", "review", "plan_competition", "attempts", "checks"} <= set(evidence)
    assert evidence["checks"]["passed"] is True
    assert [r["command"] for r in evidence["checks"]["results"]] == ["test -f feature.txt"]

    # the landed commit names the proposal; pr_review asked no second reviewer
    log = git(repo, "log", "--format=%B", "main")
    assert f"{PROPOSAL_TRAILER}: {proposal['id']}" in log
    runs = store.agent_runs(workflow_id)
    assert [(r["phase"], r["role"]) for r in runs] == [
        ("planning", "plan"),
        ("planning", "plan_alternative"),
        ("planning", "plan_arbitrate"),
        ("development", "build"),
        ("development", "review"),
        ("acceptance_verification", "verification"),
    ]
    report = row["state"]["report"]
    assert report["plan"]["graph_run"] == f"{workflow_id}-g1"
    assert "second plan chosen" in report["plan"]["how"]
    reviewed = milestone(store, workflow_id, "pr_reviewed")
    assert (reviewed.data["by"], reviewed.data["verdict"]) == ("graph", "approve")
    assert kinds(store, workflow_id).index("tests_run") < kinds(store, workflow_id).index(
        "dev_completed"
    )
    # the build manifest, kept with the run before it was recorded
    [built] = run["harness"]["manifest"]
    assert built["proposal"] == proposal["record_id"]
    assert (
        built["patch_sha256"] == hashlib.sha256(proposal["payload"]["patch"].encode()).hexdigest()
    )
    assert (built["paths"], built["attempt"], built["checks_passed"]) == (["feature.txt"], 1, True)
    assert built["base"] == evidence["checks"]["base"]
    # the planning calls were asked once: development replayed them from the kept answers
    assert len(run["calls"]) == 5
    assert replay_check(run).identical


def test_a_proposed_draft_pauses_the_workflow_until_a_person_approves_it(
    tmp_path: Path,
) -> None:
    repo = graph_repo(tmp_path, policy="propose")
    proc = phasegate_cli("run", "--repo", str(repo), "--json", "Add feature.txt")
    summary = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stderr  # waiting for a person is not a failure
    assert (summary["current_phase"], summary["status"]) == (
        "development",
        "awaiting_approval",
    ), summary
    [proposal] = json.loads(phasegate_cli("proposals", "--repo", str(repo), "--json").stdout)
    assert (proposal["mode"], proposal["status"]) == ("propose", "proposed")
    assert f"phasegate approve {proposal['id']}" in summary["error"]
    assert summary["awaiting_proposal"] == proposal["id"]
    assert "feature.txt" not in git(repo, "ls-tree", "-r", "--name-only", "main")

    # resuming without a decision pauses again; the graph is not run twice
    again = phasegate_cli("resume", summary["id"], "--repo", str(repo), "--json")
    assert json.loads(again.stdout)["status"] == "awaiting_approval"
    assert len(json.loads(phasegate_cli("proposals", "--repo", str(repo), "--json").stdout)) == 1

    approved = phasegate_cli(
        "approve", proposal["id"], "--by", "ana", "--repo", str(repo), "--json"
    )
    assert approved.returncode == 0, approved.stderr
    decided = json.loads(approved.stdout)
    assert decided["workflow"]["status"] == "completed", decided
    [landed] = json.loads(phasegate_cli("proposals", "--repo", str(repo), "--json").stdout)
    assert (landed["status"], landed["decided_by"]) == ("applied", "ana")
    assert git(repo, "show", "main:feature.txt") == "the feature"


def test_a_rejection_starts_a_new_run_told_why(tmp_path: Path) -> None:
    answers = ANSWERS.replace(
        f"[[build]]\ntext = '''{FEATURE}'''",
        f"[[build]]\ntext = '''{FEATURE}'''\n[[build]]\ntext = '''{OTHER_FEATURE}'''",
    )
    repo = graph_repo(tmp_path, policy="propose", answers=answers)
    summary = json.loads(phasegate_cli("run", "--repo", str(repo), "--json", "Add it").stdout)
    [first] = json.loads(phasegate_cli("proposals", "--repo", str(repo), "--json").stdout)

    rejected = phasegate_cli(
        "reject", first["id"], "--reason", "say more than one line", "--repo", str(repo)
    )
    assert rejected.returncode == 0  # the new run's proposal waits for a person again
    assert f"workflow {summary['id']} resumes" in rejected.stdout
    rows = json.loads(phasegate_cli("proposals", "--repo", str(repo), "--json").stdout)
    assert [(r["run_id"], r["status"]) for r in rows] == [
        (f"{summary['id']}-g1", "rejected"),
        (f"{summary['id']}-g2", "proposed"),
    ]
    assert "+and a third" in rows[1]["payload"]["patch"]
    shown = json.loads(phasegate_cli("show", summary["id"], "--repo", str(repo), "--json").stdout)
    assert shown["workflow"]["status"] == "awaiting_approval"
    # the new run's ticket says why; its plan was asked again, with the reason in it
    store = open_store(load_cartridge(repo).store_url(repo))
    try:
        record = store.run(f"{summary['id']}-g2")["record"]
    finally:
        store.close()
    assert "## The previous change was rejected" in record["ticket"]
    assert "say more than one line" in record["ticket"]
    assert record["calls"][0]["role"] == "plan"


class InterruptedReview:
    """A review runner that stops the engine as it is called, like Ctrl-C mid-review."""

    name = "interrupted"

    def __init__(self) -> None:
        self.engine: Engine | None = None

    def run(self, request: AgentRequest, cancel: threading.Event, on_spawn=None) -> AgentResult:
        assert self.engine is not None
        self.engine.shutdown.set()
        return AgentResult("", error_kind="interrupted", error="stopped")


def test_a_development_stopped_mid_graph_resumes_from_its_kept_answers(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    repo = graph_repo(tmp_path)
    stopper = InterruptedReview()
    engine, store = engine_for(repo, runners={"review": stopper})
    stopper.engine = engine
    workflow_id = engine.start("Add feature.txt", "feature.txt holds 'the feature'")
    row = engine.advance(workflow_id)
    assert row["current_phase"] == "development"
    kept = store.graph_calls(f"{workflow_id}-g1")
    assert [c["role"] for c in kept] == ["plan", "plan_alternative", "plan_arbitrate", "build"]
    assert store.proposals() == []  # nothing proposed from a half-run graph

    resumed, store2 = engine_for(repo)  # a new process: the cartridge's own runners
    row = resumed.advance(workflow_id)
    assert row["status"] == "completed", row
    roles = [r["role"] for r in store2.agent_runs(workflow_id) if r["outcome"] == "ok"]
    # the plan and the build answered once; only the review was asked again
    assert roles.count("build") == 1 and roles.count("plan") == 1
    assert roles.count("review") == 1
    record = store2.run(f"{workflow_id}-g1")["record"]
    assert [c["role"] for c in record["calls"]] == [
        "plan",
        "plan_alternative",
        "plan_arbitrate",
        "build",
        "review",
    ]


def test_a_check_failing_every_run_stays_bounded_and_each_run_is_judged_on_its_own(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    repo = graph_repo(tmp_path, checks=["grep -q 'never there' feature.txt"])
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add feature.txt", "feature.txt holds 'the feature'")
    row = engine.advance(workflow_id)
    # 1 + limits.max_dev_retries runs, then the profile (review) leaves it to a person
    assert (row["current_phase"], row["status"]) == ("development", "paused")
    assert "the harness rejected the draft PR of 3 graph run(s) in a row" in row["error"]
    proposals = store.proposals(workflow_id=workflow_id)
    assert [(p["run_id"], p["status"], p["decided_by"]) for p in proposals] == [
        (f"{workflow_id}-g{n}", "rejected", CHECKS_GATE) for n in (1, 2, 3)
    ]
    runs = [m for m in store.milestones(workflow_id) if m.kind == "tests_run"]
    assert [(m.status, m.data["proposal"]) for m in runs] == [
        ("failed", p["id"]) for p in proposals
    ]
    assert all(m.data["checks"][0]["exit_code"] != 0 for m in runs)
    # each later run was told why the one before it failed, with that run's output
    record = store.run(f"{workflow_id}-g3")["record"]
    assert f"proposal {proposals[1]['id']} was rejected by {CHECKS_GATE}" in record["ticket"]
    branch = row["branch_name"]
    assert git(repo, "rev-list", "--count", f"main..{branch}") == "0"  # nothing applied


def test_a_run_whose_checks_fail_is_retried_and_the_passing_one_lands(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    answers = ANSWERS.replace(
        f"[[build]]\ntext = '''{FEATURE}'''",
        f"[[build]]\ntext = '''{FEATURE}'''\n[[build]]\ntext = '''{OTHER_FEATURE}'''",
    )
    repo = graph_repo(tmp_path, answers=answers, checks=["grep -q 'second line' feature.txt"])
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add feature.txt", "feature.txt holds 'the feature'")
    row = engine.advance(workflow_id)
    assert row["status"] == "completed", row
    first, second = store.proposals(workflow_id=workflow_id)
    assert (first["status"], second["status"]) == ("rejected", "applied")
    assert "grep -q 'second line' feature.txt" in first["reason"]
    assert "with a second line" in git(repo, "show", "main:feature.txt")
    runs = [m for m in store.milestones(workflow_id) if m.kind == "tests_run"]
    assert [m.status for m in runs] == ["failed", "completed"]


def test_a_reviewer_that_always_objects_stops_the_fix_loop_and_the_workflow_by_name(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    answers = (
        ANSWERS.replace(
            'text = "Correct.\\nVERDICT: approve"',
            'text = "Missing docs.\\nVERDICT: request_changes"',
        )
        + f"[[build]]\ntext = '''{FEATURE}'''\n"
        + f"[[build]]\ntext = '''{OTHER_FEATURE}'''\n"
    )
    repo = graph_repo(tmp_path, answers=answers, profile="manual")
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add feature.txt", "feature.txt holds 'the feature'")
    row = engine.advance(workflow_id)
    assert (row["current_phase"], row["status"]) == ("development", "paused")
    assert "the development graph proposed no change" in row["error"]
    record = store.run(f"{workflow_id}-g1")["record"]
    assert record["fix_loop"]["stop"] in ("no_progress", "attempts_exhausted")
    assert record["fix_loop"]["stop"] in row["error"]
    assert "the last review: Missing docs." in row["error"]  # why, not only which stop
    assert record["proposals"] == []
    graph_run = milestone(store, workflow_id, "graph_run")
    assert graph_run.status == "failed"
    assert graph_run.data["fix_loop"]["attempts"] == record["fix_loop"]["attempts"]


@pytest.mark.parametrize("missing", ["build", "review"])
def test_graph_mode_needs_its_roles_bound_before_anything_is_filed(
    tmp_path: Path, missing: str
) -> None:
    repo = graph_repo(tmp_path)
    text = (repo / "phasegate.toml").read_text()
    start = text.index(f"[roles.{missing}]")
    end = text.index("[roles.", start + 1)
    (repo / "phasegate.toml").write_text(text[:start] + text[end:])
    git(repo, "commit", "-qam", "unbind")
    proc = phasegate_cli("run", "--repo", str(repo), "Add it")
    assert proc.returncode == 2
    assert f"roles.{missing}" in proc.stderr
    assert not (repo / ".phasegate" / "state.db").exists() or "workflow" not in proc.stdout


def test_a_spend_cap_reached_in_the_graph_pauses_with_the_budget_named(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    answers = ANSWERS.replace(
        "[[plan]]\ntext = \"1. Create feature.txt holding 'the feature'.\"",
        "[[plan]]\ntext = \"1. Create feature.txt holding 'the feature'.\"\ncost_usd = 0.01",
    )
    repo = graph_repo(tmp_path, answers=answers, extra="[limits]\nworkflow_budget_usd = 0.005\n")
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add feature.txt", "feature.txt holds 'the feature'")
    row = engine.advance(workflow_id)
    assert (row["current_phase"], row["status"]) == ("planning", "paused")
    assert row["error"].startswith("budget: ")
    assert "workflow_budget_usd" in row["error"]
    failed = milestone(store, workflow_id, "plan_failed")
    assert failed.data["stopped"]["node"] == "plan_alternative"
    # nothing was spent past the cap's first overrun: plan_alternative never ran
    assert [r["role"] for r in store.agent_runs(workflow_id)] == ["plan"]

    # the cap raised, resume continues the same run: the plan is not asked (nor paid) again
    cartridge = repo / "phasegate.toml"
    cartridge.write_text(cartridge.read_text().replace("= 0.005", "= 1.0"))
    resumed, store2 = engine_for(repo)
    resumed.decide(workflow_id, decisions.resume)
    row = resumed.advance(workflow_id)
    assert row["status"] == "completed", row["error"]
    roles = [r["role"] for r in store2.agent_runs(workflow_id)]
    assert roles.count("plan") == 1 and roles.count("plan_alternative") == 1
    assert [p["run_id"] for p in store2.proposals(workflow_id=workflow_id)] == [f"{workflow_id}-g1"]


def test_a_build_role_failing_every_try_fails_the_workflow_without_a_reversion(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    answers = ANSWERS.replace(
        f"[[build]]\ntext = '''{FEATURE}'''", '[[build]]\ntext = "boom"\nexit_code = 3'
    )
    repo = graph_repo(tmp_path, answers=answers, profile="auto")
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add feature.txt", "feature.txt holds 'the feature'")
    row = engine.advance(workflow_id)
    assert (row["current_phase"], row["status"]) == ("development", "failed")
    assert "build agent failed 3 time(s)" in row["error"]
    assert row["state"].get("decisions", []) == []  # no reversion: it would fail the same way
    builds = [r for r in store.agent_runs(workflow_id) if r["role"] == "build"]
    assert len(builds) == 3  # 1 + limits.agent_retries


def test_a_worker_killed_after_the_apply_arm_landed_the_patch_lands_it_once(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    repo = graph_repo(tmp_path)
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add feature.txt", "feature.txt holds 'the feature'")
    # a worker that dies (os._exit) right after the branch is published: the patch is
    # committed, the proposal applied, the development result not yet committed
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "support.crash_worker",
            "--repo",
            str(repo),
            "--crash-after",
            "publish_branch",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == CRASH_EXIT_CODE, proc.stderr
    row = store.workflow_row(workflow_id)
    assert row["current_phase"] == "development"
    [proposal] = store.proposals(workflow_id=workflow_id)
    assert proposal["status"] == "applied"

    row = engine.advance(workflow_id)
    assert row["status"] == "completed", row
    [proposal] = store.proposals(workflow_id=workflow_id)
    assert (proposal["status"], proposal["decision_seq"]) == ("applied", 1)
    trailer = f"{PROPOSAL_TRAILER}: {proposal['id']}"
    assert git(repo, "log", "--format=%B", "main").count(trailer) == 1
    assert len(store.proposals()) == 1 and len(store.graph_calls(f"{workflow_id}-g1")) == 5
    prs = json.loads(phasegate_cli("show", workflow_id, "--repo", str(repo), "--json").stdout)
    assert prs["workflow"]["pr_number"] is not None


def test_a_build_diff_missing_its_final_newline_still_lands(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    bare = "Adds feature.txt.\n\n--- /dev/null\n+++ b/feature.txt\n@@ -0,0 +1 @@\n+the feature"
    answers = ANSWERS.replace(
        f"[[build]]\ntext = '''{FEATURE}'''", f"[[build]]\ntext = '''{bare}'''"
    )
    repo = graph_repo(tmp_path, answers=answers)
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add feature.txt", "feature.txt holds 'the feature'")
    row = engine.advance(workflow_id)
    assert row["status"] == "completed", row
    [proposal] = store.proposals(workflow_id=workflow_id)
    assert not proposal["payload"]["patch"].endswith("\n")
    assert git(repo, "show", "main:feature.txt") == "the feature"


def test_feedback_on_a_waiting_workflow_runs_the_graph_again_with_it(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    answers = ANSWERS.replace(
        f"[[build]]\ntext = '''{FEATURE}'''",
        f"[[build]]\ntext = '''{FEATURE}'''\n[[build]]\ntext = '''{MORE_FEATURE}'''",
    )
    repo = graph_repo(tmp_path, answers=answers, auto_merge=False)
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add feature.txt", "feature.txt holds 'the feature'")
    row = engine.advance(workflow_id)
    assert (row["current_phase"], row["status"]) == ("wait", "waiting")
    pr = row["pr_number"]

    engine.decide(workflow_id, lambda ctx: decisions.feedback(ctx, "three lines, please"))
    row = engine.advance(workflow_id)
    assert (row["current_phase"], row["status"], row["dev_round"]) == ("wait", "waiting", 2), row[
        "error"
    ]
    assert row["pr_number"] == pr  # the same pull request, updated
    record = store.run(f"{workflow_id}-g2")["record"]
    assert "## Feedback from a person\n\nthree lines, please" in record["ticket"]
    assert record["ticket"].count("## Feedback from a person") == 1
    first, second = store.proposals(workflow_id=workflow_id)
    assert (first["status"], second["status"]) == ("applied", "applied")
    branch = row["branch_name"]
    assert "and a third" in git(repo, "show", f"{branch}:feature.txt")
    assert row["user_feedback"] is None


def test_a_workflow_keeps_the_mode_it_was_started_in(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    repo = graph_repo(tmp_path, policy="propose")
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add feature.txt", "feature.txt holds 'the feature'")
    row = engine.advance(workflow_id)
    assert row["status"] == "awaiting_approval"
    [proposal] = store.proposals(workflow_id=workflow_id)

    # graph mode turned off in the cartridge while the workflow waits for its gate
    cartridge = repo / "phasegate.toml"
    cartridge.write_text(cartridge.read_text().replace("enabled = true", "enabled = false"))
    later, store2 = engine_for(repo)
    store2.decide_proposal(proposal["id"], "approved", "ana")
    later.decide(workflow_id, decisions.resume)
    row = later.advance(workflow_id)
    assert row["status"] == "completed", row["error"]
    assert store2.proposal(proposal["id"])["status"] == "applied"
    assert git(repo, "show", "main:feature.txt") == "the feature"
    assert "plan_review" not in [r["role"] for r in store2.agent_runs(workflow_id)]


def test_a_proposal_left_behind_by_a_revert_cannot_be_decided_and_is_superseded(
    tmp_path: Path,
) -> None:
    repo = graph_repo(tmp_path, policy="propose")
    summary = json.loads(phasegate_cli("run", "--repo", str(repo), "--json", "Add it").stdout)
    workflow_id = summary["id"]
    first = summary["awaiting_proposal"]
    reverted = phasegate_cli(
        "revert", workflow_id, "--reason", "plan it smaller", "--no-advance", "--repo", str(repo)
    )
    assert reverted.returncode in (0, 1), reverted.stderr

    state = json.loads(phasegate_cli("show", workflow_id, "--repo", str(repo), "--json").stdout)
    assert [d["target_phase"] for d in state["decisions"]] == ["planning"]
    late = phasegate_cli("approve", first, "--by", "ana", "--repo", str(repo))
    assert late.returncode == 2
    assert f"workflow {workflow_id}, which is not waiting for it" in late.stderr
    # the refused approval recorded nothing: no decision, no streak
    [row] = json.loads(phasegate_cli("proposals", "--repo", str(repo), "--json").stdout)
    assert (row["status"], row["decided_by"]) == ("proposed", None)

    again = json.loads(phasegate_cli("resume", workflow_id, "--repo", str(repo), "--json").stdout)
    assert again["status"] == "awaiting_approval"
    rows = json.loads(phasegate_cli("proposals", "--repo", str(repo), "--json").stdout)
    assert [(r["id"] == first, r["status"]) for r in rows] == [
        (True, "superseded"),
        (False, "proposed"),
    ]
    superseded = phasegate_cli("approve", first, "--repo", str(repo))
    assert superseded.returncode == 2 and "superseded" in superseded.stderr
    # the next plan was told why, without the instructions meant for a person
    store = open_store(load_cartridge(repo).store_url(repo))
    try:
        ticket = store.run(f"{workflow_id}-g2")["record"]["ticket"]
    finally:
        store.close()
    assert "plan it smaller" in ticket and "waited for a person's approval" in ticket
    assert "phasegate approve" not in ticket


def test_a_decision_whose_resume_a_crash_lost_is_taken_up_by_approving_again(
    tmp_path: Path,
) -> None:
    repo = graph_repo(tmp_path, policy="propose")
    summary = json.loads(phasegate_cli("run", "--repo", str(repo), "--json", "Add it").stdout)
    proposal = summary["awaiting_proposal"]
    # the decision was stored, then the process died before it resumed the workflow
    store = open_store(load_cartridge(repo).store_url(repo))
    try:
        store.decide_proposal(proposal, "approved", "ana")
    finally:
        store.close()
    shown = json.loads(phasegate_cli("show", summary["id"], "--repo", str(repo), "--json").stdout)
    assert shown["workflow"]["status"] == "awaiting_approval"
    assert shown["workflow"]["awaiting_proposal"] is None

    # approving again (what the pause reason says to do) takes the workflow on
    again = phasegate_cli("approve", proposal, "--by", "ana", "--repo", str(repo))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "recorded before; the workflow had not moved on" in again.stdout
    assert "completed" in again.stdout
    [row] = json.loads(phasegate_cli("proposals", "--repo", str(repo), "--json").stdout)
    assert (row["status"], row["decided_by"]) == ("applied", "ana")
    # a verdict other than the one recorded is still refused
    assert phasegate_cli("reject", proposal, "--reason", "no", "--repo", str(repo)).returncode == 2


SCOPE_ANSWERS = (
    ANSWERS
    + """
[[scope_epic]]
text = "SUBTASK: feature.txt"
"""
)


@pytest.mark.parametrize("item_policy", ["auto", "propose"])
def test_scopes_item_create_never_gates_the_workflow(tmp_path: Path, item_policy: str) -> None:
    repo = graph_repo(
        tmp_path,
        answers=SCOPE_ANSWERS,
        roles=(*GRAPH_ROLES, "scope_epic"),
        item_policy=item_policy,
    )
    proc = phasegate_cli("run", "--repo", str(repo), "--json", "Add it")
    assert json.loads(proc.stdout)["status"] == "completed", proc.stdout
    rows = {
        r["kind"]: r
        for r in json.loads(phasegate_cli("proposals", "--repo", str(repo), "--json").stdout)
    }
    assert rows["draft_pr_create"]["status"] == "applied"
    item = rows["item_create"]
    if item_policy == "auto":  # the ticket it shapes is the workflow's own, now built
        assert (item["status"], item["decided_by"]) == ("applied", "auto")
    else:  # never waited for, and closed with its workflow: nobody decides it any more
        assert item["status"] == "superseded"
        decided = phasegate_cli("approve", item["id"], "--by", "ana", "--repo", str(repo))
        assert decided.returncode == 2
        assert "which is completed; nothing recorded" in decided.stderr


def test_approve_json_exits_1_when_the_workflow_then_stops(tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    repo = graph_repo(
        tmp_path, policy="propose", checks=["test -f feature.txt", f"test ! -f {flag}"]
    )
    summary = json.loads(phasegate_cli("run", "--repo", str(repo), "--json", "Add it").stdout)
    flag.write_text("the checks fail from now on\n")
    decided = phasegate_cli("approve", summary["awaiting_proposal"], "--repo", str(repo), "--json")
    payload = json.loads(decided.stdout)
    # landed, then the merge's checks on the merge commit failed: the run stops short
    assert payload["workflow"]["status"] in ("failed", "paused"), payload
    assert decided.returncode == 1
    [row] = json.loads(phasegate_cli("proposals", "--repo", str(repo), "--json").stdout)
    assert row["status"] == "applied"


def test_hints_for_a_workflow_elsewhere_carry_its_repo(tmp_path: Path) -> None:
    repo = graph_repo(tmp_path, policy="propose")
    proc = phasegate_cli("run", "--repo", str(repo), "Add it", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [proposal] = json.loads(phasegate_cli("proposals", "--repo", str(repo), "--json").stdout)
    hint = " ".join(proc.stdout.split())
    assert f"`phasegate approve {proposal['id']} --repo {repo}`" in hint
    inside = phasegate_cli(
        "resume",
        json.loads(phasegate_cli("status", "--repo", str(repo), "--json").stdout)[0]["id"],
        "--repo",
        str(repo),
        cwd=repo,
    )
    assert f"`phasegate approve {proposal['id']}`" in " ".join(inside.stdout.split())


def test_demo_refuses_an_unknown_profile_before_writing_its_directory(tmp_path: Path) -> None:
    target = tmp_path / "demo"
    proc = phasegate_cli("demo", "--profile", "bogus", "--dir", str(target))
    assert proc.returncode == 2 and "unknown profile 'bogus'" in proc.stderr
    assert not target.exists()


def test_a_merge_reverted_for_a_conflict_rebuilds_the_branch_on_the_base(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    rewrite = (
        "Rewrites feature.txt over the base's.\n\n```diff\n--- a/feature.txt\n"
        "+++ b/feature.txt\n@@ -1 +1 @@\n-theirs\n+the feature\n```\n"
    )
    answers = ANSWERS.replace(
        f"[[build]]\ntext = '''{FEATURE}'''",
        f"[[build]]\ntext = '''{FEATURE}'''\n[[build]]\ntext = '''{rewrite}'''",
    )
    repo = graph_repo(tmp_path, answers=answers, profile="ci", auto_merge=False)
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add feature.txt", "feature.txt holds 'the feature'")
    assert engine.advance(workflow_id)["status"] == "waiting"
    (repo / "feature.txt").write_text("theirs\n")  # the base moves on meanwhile
    git(repo, "add", "feature.txt")
    git(repo, "commit", "-qm", "theirs")

    engine.decide(workflow_id, lambda ctx: decisions.approve_merge(ctx, "ana"))
    row = engine.advance(workflow_id)  # merge conflicts → planning (ci) → run g2 → wait
    assert (row["current_phase"], row["state"]["reversion_count"]) == ("wait", 1)
    ticket = store.run(f"{workflow_id}-g2")["record"]["ticket"]
    assert "## The branch was rebuilt from main" in ticket and "feature.txt" in ticket
    branch = row["branch_name"]
    assert git(repo, "show", f"{branch}:feature.txt") == "the feature"
    assert git(repo, "merge-base", "--is-ancestor", "main", branch) == ""

    engine.decide(workflow_id, lambda ctx: decisions.approve_merge(ctx, "ana"))
    row = engine.advance(workflow_id)
    assert row["status"] == "completed", row["error"]
    assert git(repo, "show", "main:feature.txt") == "the feature"
