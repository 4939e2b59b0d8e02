"""Automation profiles and phase reversion (docs/contracts/autonomy.md), on real git, SQLite
and the real CLI.

Strategize = planning, Execute = development, Apply = merge (other tools' names).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from phasegate.config.cartridge import CartridgeError, load_cartridge
from phasegate.core import decisions
from phasegate.core.autonomy import AutonomyPolicy
from phasegate.core.contract import ContractViolation, PhaseResult, StaleContext
from phasegate.core.profiles import (
    BUILTIN_PROFILES,
    MAX_REVERSIONS,
    AutomationProfile,
    allows_automatic,
    decide_reversion,
)
from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.testing import FixedClock

from conftest import git, make_repo, phasegate_cli, scripted_cartridge

Build = Callable[..., tuple[Engine, Store]]

#: The profiles' thresholds (docs/contracts/autonomy.md: automation profiles):
#: profile → (auto_reversion_from_apply, auto_strategy_revision).
SPEC_TABLE = {
    "manual": (1.0, 1.0),
    "review": (1.0, 1.0),
    "trusted": (1.0, 1.0),
    "auto": (1.0, 0.0),
    "ci": (0.0, 0.0),
    "full-auto": (0.0, 0.0),
}
RECORD_FIELDS = {"type", "source_phase", "target_phase", "reason", "timestamp", "reversion_number"}
CLOCK_START = FixedClock().now()

PLAN_REVIEW = '[[plan_review]]\ntext = "VERDICT: approve"\n'
REVIEW = '[[review]]\ntext = "VERDICT: approve"\n'
VERIFICATION = '[[verification]]\ntext = "VERDICT: confirmed"\n'


def build_answers(*contents: str) -> str:
    """One scripted build answer per content of feature.txt (the last one repeats)."""
    return "".join(
        f'[[build]]\ntext = "wrote feature.txt"\n[build.files]\n"feature.txt" = "{c}\\n"\n'
        for c in contents
    )


#: One plan a planning cycle, each its own: a cycle that plans what the last one
#: built stops as no_progress (test_an_identical_plan_after_a_reversion_...).
PLANS = "".join(f'[[plan]]\ntext = "1. Write feature.txt (plan {n})"\n' for n in range(1, 5))


def answers(build: str, plans: str = PLANS) -> str:
    return "\n".join([plans, PLAN_REVIEW, build, REVIEW])


def project(tmp_path: Path, answers_text: str, **cartridge: Any) -> Path:
    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(answers_text + "\n" + VERIFICATION)
    (repo / "phasegate.toml").write_text(scripted_cartridge(**cartridge))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "cartridge")
    return repo


def state(store: Store, wf: str) -> dict[str, Any]:
    return dict(store.workflow_row(wf)["state"])


def kinds(store: Store, wf: str, kind: str) -> list[Any]:
    return [m for m in store.milestones(wf) if m.kind == kind]


def assert_record(record: dict[str, Any], source: str, number: int, automatic: bool) -> None:
    assert set(record) >= RECORD_FIELDS
    assert (record["type"], record["source_phase"], record["target_phase"]) == (
        "reversion",
        source,
        "planning",
    )
    assert record["reversion_number"] == number and record["automatic"] is automatic
    assert isinstance(record["reason"], str) and record["reason"]
    assert datetime.fromisoformat(record["timestamp"]).tzinfo is not None


def cli(*args: str) -> tuple[int, Any]:
    proc = phasegate_cli(*args, "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def flat(text: str) -> str:
    return " ".join(text.split())


# -- the profiles and the threshold rule (pure) ------------------------------------------


def test_the_threshold_rule_below_one_is_automatic_one_never_is() -> None:
    assert allows_automatic(0.0) and allows_automatic(0.5) and allows_automatic(0.999)
    assert not allows_automatic(1.0)
    with pytest.raises(ValueError, match="must be in \\[0, 1\\]"):
        AutomationProfile("x", auto_reversion_from_apply=1.5, auto_strategy_revision=0.0)


def test_the_builtin_profiles_are_spec_003s_table() -> None:
    assert list(BUILTIN_PROFILES) == list(SPEC_TABLE)
    for name, (apply, strategy) in SPEC_TABLE.items():
        profile = BUILTIN_PROFILES[name]
        assert (profile.auto_reversion_from_apply, profile.auto_strategy_revision) == (
            apply,
            strategy,
        )
        assert profile.reverts_automatically("merge") is (apply < 1.0)
        assert profile.reverts_automatically("development") is (strategy < 1.0)
        assert profile.auto_merge is (name in ("auto", "ci", "full-auto"))
    assert MAX_REVERSIONS == 3


def test_the_loop_guard_comes_before_the_threshold() -> None:
    ci = BUILTIN_PROFILES["ci"]
    assert decide_reversion(ci, "merge", "w", {"reversion_count": 2}).action == "revert"
    refused = decide_reversion(ci, "merge", "w", {"reversion_count": 3})
    assert refused.action == "refuse" and "reverted 3 times" in refused.why
    assert decide_reversion(BUILTIN_PROFILES["auto"], "merge", "w", {}).action == "pause"


# -- the cartridge: custom profiles, defaults, precedence --------------------------------


def write_cartridge(tmp_path: Path, text: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "phasegate.toml").write_text(text)
    return tmp_path


def test_a_custom_profile_is_read_and_validated(tmp_path: Path) -> None:
    good = write_cartridge(
        tmp_path / "good",
        '[workflow]\nprofile = "cautious"\n'
        "[profiles.cautious]\nauto_reversion_from_apply = 1\nauto_strategy_revision = 0.5\n",
    )
    profile = load_cartridge(good).profile()
    assert (profile.name, profile.auto_reversion_from_apply, profile.auto_strategy_revision) == (
        "cautious",
        1.0,
        0.5,
    )
    assert profile.reverts_automatically("development") and not profile.auto_merge
    assert load_cartridge(good).profile("ci") is BUILTIN_PROFILES["ci"]

    thresholds = "auto_reversion_from_apply = 1\nauto_strategy_revision = 0\n"
    bad = {
        f"[profiles.x]\n{thresholds}auto_revert = 1\n": "profiles.x.auto_revert: unknown key",
        "[profiles.x]\nauto_reversion_from_apply = 1\n": "profiles.x.auto_strategy_revision",
        "[profiles.x]\nauto_reversion_from_apply = 2\nauto_strategy_revision = 0\n": (
            "profiles.x.auto_reversion_from_apply"
        ),
        "[profiles.ci]\nauto_reversion_from_apply = 1\nauto_strategy_revision = 1\n": (
            "'ci' is a built-in profile"
        ),
        '[workflow]\nprofile = "nope"\n': "workflow.profile: unknown profile 'nope'",
    }
    for i, (text, message) in enumerate(bad.items()):
        with pytest.raises(CartridgeError) as caught:
            load_cartridge(write_cartridge(tmp_path / f"bad{i}", text))
        assert message in str(caught.value), text
    with pytest.raises(CartridgeError, match="unknown profile 'nope'"):
        load_cartridge(good).profile("nope")


def test_the_profile_sets_the_autonomy_defaults_the_cartridge_wins(tmp_path: Path) -> None:
    plain = load_cartridge(write_cartridge(tmp_path / "plain", ""))
    manual = AutonomyPolicy.from_cartridge(plain, BUILTIN_PROFILES["manual"])
    assert manual.mode_of("merge") == "propose" and manual.graduation_streak == 0
    full = AutonomyPolicy.from_cartridge(plain, BUILTIN_PROFILES["full-auto"])
    assert full.mode_of("merge") == "auto" and full.mode_of("item_create") == "auto"
    default = AutonomyPolicy.from_cartridge(plain)  # review
    assert default.mode_of("merge") == "propose" and default.graduation_streak == 3

    pinned = load_cartridge(
        write_cartridge(
            tmp_path / "pinned",
            '[workflow]\nprofile = "full-auto"\n'
            '[autonomy]\ngraduation_streak = 5\npolicy = { merge = "propose" }\n',
        )
    )
    policy = AutonomyPolicy.from_cartridge(pinned)
    assert policy.mode_of("merge") == "propose" and policy.mode_of("draft_pr_create") == "auto"
    kept = AutonomyPolicy.from_cartridge(pinned, BUILTIN_PROFILES["manual"])
    assert kept.graduation_streak == 5  # given explicitly: the profile does not override it


def test_auto_merge_the_flag_then_a_named_profile_then_the_cartridge(
    tmp_path: Path, engine_for: Build
) -> None:
    repo = project(tmp_path / "a", answers(build_answers("x")), auto_merge=None)
    engine, store = engine_for(repo)
    assert not store.workflow_row(engine.start("t", "ticket"))["auto_merge"]  # review
    ci = engine.start("t", "ticket", profile="ci")
    assert store.workflow_row(ci)["auto_merge"]
    assert state(store, ci)["profile"]["name"] == "ci"
    forced = engine.start("t", "ticket", profile="ci", auto_merge=False)
    assert not store.workflow_row(forced)["auto_merge"]

    explicit = project(tmp_path / "b", answers(build_answers("x")), auto_merge=False)
    engine, store = engine_for(explicit)
    assert not store.workflow_row(engine.start("t", "ticket"))["auto_merge"]  # the file's key
    # a profile named for this run beats the file: manual never merges without a person
    assert store.workflow_row(engine.start("t", "ticket", profile="full-auto"))["auto_merge"]
    merging = project(tmp_path / "c", answers(build_answers("x")), auto_merge=True)
    engine, store = engine_for(merging)
    assert not store.workflow_row(engine.start("t", "ticket", profile="manual"))["auto_merge"]
    assert store.workflow_row(engine.start("t", "t", profile="manual", auto_merge=True))[
        "auto_merge"
    ]
    with pytest.raises(CartridgeError, match="profile name is empty"):
        engine.start("t", "ticket", profile=" ")


# -- the table: six profiles x two paths x automatic and manual --------------------------


@pytest.mark.parametrize("profile", list(SPEC_TABLE))
def test_development_reverts_to_planning_where_the_profile_allows(
    tmp_path: Path, engine_for: Build, profile: str
) -> None:
    repo = project(
        tmp_path,
        answers(build_answers("x")),
        checks=["echo the check failed; exit 1"],
        extra="[limits]\nmax_dev_retries = 0\n",
    )
    clock = FixedClock()
    engine, store = engine_for(repo, clock=clock)
    automatic = SPEC_TABLE[profile][1] < 1.0

    wf = engine.start("t", "ticket", profile=profile)
    row = engine.advance(wf, max_steps=3)  # preparation, planning, development
    if automatic:
        assert (row["current_phase"], row["status"], row["error"]) == ("planning", "planning", None)
        (record,) = row["state"]["decisions"]
        assert_record(record, "development", 1, automatic=True)
        assert record["timestamp"] == CLOCK_START.isoformat()  # deps.clock, not the wall
        assert "the check failed" in row["state"]["replan_context"]
        assert row["state"]["reversion_count"] == 1 and row["dev_round"] == 2
        assert row["current_round"] == 0 and row["state"]["test_retries"] == 0
        assert [m.round for m in kinds(store, wf, "reversion")] == [1]
    else:
        assert (row["current_phase"], row["status"]) == ("development", "paused")
        assert "auto_strategy_revision = 1" in row["error"]
        assert f"phasegate revert {wf}" in row["error"]
        assert "decisions" not in row["state"]

    # Manual: whatever the profile, a person may revert until the guard.
    parked = engine.start("t", "ticket", profile=profile)
    assert engine.advance(parked, max_steps=2)["current_phase"] == "development"
    clock.advance(60)
    row = engine.decide(
        parked, lambda ctx: decisions.revert(ctx, "planning", "too strict", clock.now())
    )
    assert (row["current_phase"], row["status"]) == ("planning", "planning")
    (record,) = row["state"]["decisions"]
    assert_record(record, "development", 1, automatic=False)
    assert record["reason"] == "too strict" and record["timestamp"] == clock.now().isoformat()
    assert "too strict" in row["state"]["replan_context"]


@pytest.mark.parametrize("profile", list(SPEC_TABLE))
def test_a_merge_conflict_reverts_to_planning_where_the_profile_allows(
    tmp_path: Path, engine_for: Build, profile: str
) -> None:
    # The check refuses the conflict fork's resolution (phases/conflict.py), never a
    # build's commit: the child fails, the merge cannot proceed, the profile decides.
    refuse_fork = "! git log -1 --format=%B | grep -q Phasegate-Conflict"
    repo = project(
        tmp_path, answers(build_answers("the feature")), auto_merge=False, checks=[refuse_fork]
    )
    engine, store = engine_for(repo, clock=FixedClock())
    automatic = SPEC_TABLE[profile][0] < 1.0
    wf, parked = (engine.start("t", "ticket", profile=profile, auto_merge=False) for _ in range(2))
    for workflow in (wf, parked):
        assert engine.advance(workflow)["current_phase"] == "wait"
        engine.decide(workflow, lambda ctx: decisions.approve_merge(ctx, "test"))
    (repo / "feature.txt").write_text("someone else's feature\n")
    git(repo, "add", "feature.txt")
    git(repo, "commit", "-qm", "a conflicting change on main")

    row = engine.advance(wf, max_steps=3)  # wait → merge, merge (fork), merge
    worktree = Path(row["worktree_path"])
    assert [c["status"] for c in store.child_workflows(wf)] == ["failed"]
    if automatic:
        assert (row["current_phase"], row["status"], row["error"]) == ("planning", "planning", None)
        (record,) = row["state"]["decisions"]
        assert_record(record, "merge", 1, automatic=True)
        assert "conflicts with main" in row["state"]["replan_context"]
        assert row["state"]["merge_approved"] is False  # the new change needs a new approval
    else:
        assert (row["current_phase"], row["status"]) == ("merge", "paused")
        assert "conflicts" in row["error"] and "auto_reversion_from_apply = 1" in row["error"]
    # The worktree and the branch are kept either way.
    assert worktree.is_dir() and git(repo, "branch", "--list", row["branch_name"])
    assert [m.status for m in kinds(store, wf, "merge_failed")] == ["failed"]

    assert engine.advance(parked, max_steps=1)["current_phase"] == "merge"
    row = engine.decide(
        parked, lambda ctx: decisions.revert(ctx, "strategize", "base moved", engine.clock.now())
    )
    assert (row["current_phase"], row["status"]) == ("planning", "planning")
    assert_record(row["state"]["decisions"][0], "merge", 1, automatic=False)


def test_a_manual_reversion_is_refused_where_it_cannot_apply(
    tmp_path: Path, engine_for: Build
) -> None:
    repo = project(tmp_path, answers(build_answers("the feature")))
    engine, store = engine_for(repo)
    wf = engine.start("t", "ticket")
    engine.advance(wf, max_steps=2)
    now = engine.clock.now()
    with pytest.raises(ContractViolation, match="planning only"):
        engine.decide(wf, lambda ctx: decisions.revert(ctx, "preparation", "x", now))
    with pytest.raises(ContractViolation, match="reason is empty"):
        engine.decide(wf, lambda ctx: decisions.revert(ctx, "planning", " ", now))
    done = engine.advance(wf)
    assert done["status"] == "completed"
    with pytest.raises(ContractViolation, match="is completed"):
        engine.decide(wf, lambda ctx: decisions.revert(ctx, "planning", "late", now))
    assert store.workflow_row(wf)["version"] == done["version"]


# -- the loop guard -----------------------------------------------------------------------


def test_the_fourth_automatic_reversion_is_refused_and_the_workflow_fails(
    tmp_path: Path, engine_for: Build
) -> None:
    repo = project(
        tmp_path,
        answers(build_answers("x")),
        checks=["echo still broken; exit 1"],
        extra="[limits]\nmax_dev_retries = 0\n",
        profile="ci",
    )
    engine, store = engine_for(repo)
    wf = engine.start("t", "ticket")
    row = engine.advance(wf)
    assert (row["current_phase"], row["status"]) == ("development", "failed")
    assert "reversion refused" in row["error"] and "MAX_REVERSIONS = 3" in row["error"]
    assert row["state"]["reversion_count"] == MAX_REVERSIONS
    assert [d["reversion_number"] for d in row["state"]["decisions"]] == [1, 2, 3]
    # Four planning cycles, four development rounds: no cycle overwrote another's rows.
    assert len({m.dedupe_key for m in kinds(store, wf, "plan_created")}) == 4
    assert len(kinds(store, wf, "plan_finalized")) == 4
    assert [m.round for m in kinds(store, wf, "tests_run")] == [1, 2, 3, 4]
    assert row["dev_round"] == 4


def test_the_fourth_manual_reversion_is_refused_with_exit_2(tmp_path: Path) -> None:
    repo = project(
        tmp_path,
        answers(build_answers("x")),
        checks=["echo still broken; exit 1"],
        extra="[limits]\nmax_dev_retries = 0\n",
    )
    r = str(repo)
    code, run = cli("run", "--repo", r, "the ticket")
    assert (code, run["status"], run["profile"]) == (1, "paused", "review")
    wf = run["id"]
    for n in range(1, MAX_REVERSIONS + 1):
        proc = phasegate_cli("revert", wf, "--repo", r, "--reason", f"try {n}", "--json")
        code, after = proc.returncode, json.loads(proc.stdout)
        assert (code, after["status"], after["reversion_count"]) == (1, "paused", n)
        assert f"reverted {wf} from development to planning (reversion {n} of 3)" in flat(
            proc.stderr
        )
    before = cli("show", wf, "--repo", r)[1]
    refused = phasegate_cli("revert", wf, "--repo", r, "--reason", "once more")
    assert refused.returncode == 2
    message = flat(refused.stderr)
    assert "reversion refused" in message and "reverted 3 times" in message
    assert "MAX_REVERSIONS = 3" in message
    after = cli("show", wf, "--repo", r)[1]
    assert after["workflow"] == before["workflow"] and len(after["decisions"]) == 3
    wrong = phasegate_cli("revert", wf, "--repo", r, "--reason", "x", "--to-phase", "development")
    assert wrong.returncode == 2 and "planning only" in flat(wrong.stderr)


# -- a whole workflow: checks fail, re-plan with the failure, complete ----------------------


def plan_recorder(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A plan role (the command runner) that saves every prompt it gets."""
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    command = (
        f"cat > {prompts}/plan-$PHASEGATE_CALL_INDEX.txt; "
        'echo "1. Write feature.txt (plan $PHASEGATE_CALL_INDEX)"'
    )
    body = f"runner = \"command\"\ncommand = '{command}'\ntimeout = 30\n"
    return prompts, {"plan": body}


def failing_then_passing(tmp_path: Path) -> tuple[Path, Path]:
    prompts, overrides = plan_recorder(tmp_path)
    repo = project(
        tmp_path,
        answers(build_answers("bad", "good")),
        checks=["grep -q good feature.txt || { echo feature.txt is not good; exit 1; }"],
        extra="[limits]\nmax_dev_retries = 0\n",
        role_overrides=overrides,
        auto_merge=None,
    )
    return repo, prompts


def test_under_ci_failing_checks_re_plan_with_the_failure_and_complete(tmp_path: Path) -> None:
    repo, prompts = failing_then_passing(tmp_path)
    code, run = cli("run", "--repo", str(repo), "--profile", "ci", "the ticket")
    assert (code, run["status"], run["profile"], run["reversion_count"]) == (
        0,
        "completed",
        "ci",
        1,
    )
    first, second = ((prompts / f"plan-{i}.txt").read_text() for i in (0, 1))
    assert "Why the previous attempt was reverted" not in first
    assert "Why the previous attempt was reverted" in second
    assert "feature.txt is not good" in second and "checks still failing" in second
    assert git(repo, "show", "main:feature.txt") == "good"

    code, detail = cli("show", run["id"], "--repo", str(repo))
    assert code == 0 and detail["workflow"]["profile"] == "ci"
    (record,) = detail["decisions"]
    assert_record(record, "development", 1, automatic=True)
    assert "feature.txt is not good" in record["reason"]
    kinds_shown = [m["kind"] for m in detail["milestones"]]
    assert kinds_shown.count("plan_created") == 2 and "reversion" in kinds_shown

    shown = flat(phasegate_cli("show", run["id"], "--repo", str(repo)).stdout)
    assert "profile ci" in shown
    assert "decisions" in shown and "reversion 1: development → planning" in shown
    assert record["timestamp"] in shown and "automatic" in shown


def test_under_review_failing_checks_pause_for_a_person_who_reverts(tmp_path: Path) -> None:
    repo, prompts = failing_then_passing(tmp_path)
    code, run = cli("run", "--repo", str(repo), "--profile", "review", "the ticket")
    assert (code, run["current_phase"], run["status"]) == (1, "development", "paused")
    assert "phasegate revert" in run["error"] and run["reversion_count"] == 0
    assert not (prompts / "plan-1.txt").exists()  # nobody re-planned

    code, done = cli("revert", run["id"], "--repo", str(repo), "--reason", "split the work")
    # review's default: a person approves the merge too
    assert (code, done["status"], done["reversion_count"]) == (0, "waiting", 1)
    code, done = cli("approve-merge", run["id"], "--repo", str(repo))
    assert (code, done["status"]) == (0, "completed")
    second = (prompts / "plan-1.txt").read_text()
    assert "split the work" in second and "feature.txt is not good" in second
    record = cli("show", run["id"], "--repo", str(repo))[1]["decisions"][0]
    assert_record(record, "development", 1, automatic=False)


def test_a_build_agent_that_finds_the_plan_too_strict_re_plans_at_once(
    tmp_path: Path, engine_for: Build
) -> None:
    build = (
        '[[build]]\ntext = "The plan forbids touching feature.txt.\\nREPLAN: feature.txt is '
        'off limits"\n[build.files]\n"scratch.txt" = "half done\\n"\n' + build_answers("good")
    )
    repo = project(tmp_path, answers(build), profile="auto")
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert row["status"] == "completed" and row["state"]["reversion_count"] == 1
    record = row["state"]["decisions"][0]
    assert "too restrictive: feature.txt is off limits" in record["reason"]
    assert [m.summary for m in kinds(store, row["id"], "plan_blocked")] == [
        "feature.txt is off limits"
    ]
    assert "scratch.txt" not in git(repo, "ls-tree", "--name-only", "-r", "main")


def test_a_reversion_grants_a_fresh_set_of_review_rounds(tmp_path: Path, engine_for: Build) -> None:
    review = (
        '[[review]]\ntext = "Name it better.\\nVERDICT: request_changes"\n'
        '[[review]]\ntext = "VERDICT: approve"\n'
    )
    build = build_answers("bad", "good")
    repo = project(
        tmp_path,
        "\n".join([PLANS, PLAN_REVIEW, build, review]),
        checks=["grep -q good feature.txt"],
        extra="[limits]\nmax_dev_retries = 0\nmax_pr_review_rounds = 2\n",
        profile="ci",
    )
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    # dev rounds 1 (reverted), 2 (changes requested), 3 (approved): the second
    # review round of the cycle, not the workflow's third development round
    assert (row["status"], row["dev_round"], row["state"]["reversion_count"]) == (
        "completed",
        3,
        1,
    )
    assert [m.round for m in kinds(store, row["id"], "pr_reviewed")] == [2, 3]


def test_run_and_demo_take_a_profile(tmp_path: Path) -> None:
    repo, _ = failing_then_passing(tmp_path)
    bad = phasegate_cli("run", "--repo", str(repo), "--profile", "nope", "the ticket")
    assert bad.returncode == 2 and "unknown profile 'nope'" in flat(bad.stderr)

    code, demo = cli("demo", "--dir", str(tmp_path / "demo"), "--profile", "review")
    assert (code, demo["status"], demo["profile"]) == (0, "waiting", "review")


def test_a_result_the_commit_path_refuses_leaves_the_reversion_unwritten(
    tmp_path: Path, engine_for: Build
) -> None:
    # The reversion is one transaction: a stale context writes none of it.
    repo = project(tmp_path, answers(build_answers("x")))
    engine, store = engine_for(repo)
    wf = engine.start("t", "ticket")
    engine.advance(wf, max_steps=2)
    ctx = store.load_context(wf)
    engine.commit(ctx, PhaseResult("retry"))
    with pytest.raises(StaleContext):
        store.commit_phase_result(ctx, decisions.revert(ctx, "planning", "x", engine.clock.now()))
    assert "decisions" not in state(store, wf) and not kinds(store, wf, "reversion")
