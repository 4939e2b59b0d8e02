"""Phase behaviour through the engine with scripted agents, on real git and SQLite."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from phasegate.cli._app import console
from phasegate.cli.detail import print_detail
from phasegate.core.report import render_report
from phasegate.forge import LocalForge
from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.summary import workflow_detail

from conftest import git, land_held, make_repo, scripted_cartridge

BUILD = """
[[build]]
text = "wrote feature.txt"
[build.files]
"feature.txt" = "the feature\\n"
"""


def repo_with(
    tmp_path: Path,
    answers: str,
    *,
    checks: list[str] | None = None,
    extra: str = "",
    auto_merge: bool = True,
) -> Path:
    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(answers)
    (repo / "phasegate.toml").write_text(
        scripted_cartridge(checks=checks, extra=extra, auto_merge=auto_merge)
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "cartridge")
    return repo


def answers(
    *,
    plan_review: str = '[[plan_review]]\ntext = "VERDICT: approve"\n',
    build: str = BUILD,
    review: str = '[[review]]\ntext = "VERDICT: approve"\n',
    verification: str = '[[verification]]\ntext = "VERDICT: confirmed"\n',
    plan: str = '[[plan]]\ntext = "the plan"\n',
) -> str:
    return "\n".join([plan, plan_review, build, review, verification])


Build = Callable[..., tuple[Engine, Store]]


def edit_cartridge(repo: Path, old: str, new: str) -> None:
    """Rewrite part of the committed cartridge (and commit it: merges need a clean base)."""
    text = (repo / "phasegate.toml").read_text()
    assert old in text
    (repo / "phasegate.toml").write_text(text.replace(old, new))
    git(repo, "commit", "-qam", "edit cartridge")


def milestones(store: Store, wf: str, kind: str) -> list:
    return [m for m in store.milestones(wf) if m.kind == kind]


def test_plan_rounds_run_out_and_the_last_plan_is_taken(tmp_path: Path, engine_for: Build) -> None:
    repo = repo_with(
        tmp_path,
        answers(plan_review='[[plan_review]]\ntext = "VERDICT: revise"\n'),
        extra="[limits]\nmax_plan_rounds = 2\n",
    )
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert row["status"] == "completed"
    finalized = milestones(store, row["id"], "plan_finalized")
    assert [(m.round, m.data["approved"]) for m in finalized] == [(2, False)]
    assert len(milestones(store, row["id"], "plan_reviewed")) == 2


def test_a_plan_agent_that_keeps_timing_out_pauses_as_planning_timeout(
    tmp_path: Path, engine_for: Build
) -> None:
    repo = repo_with(tmp_path, answers(), extra="[limits]\nagent_retries = 1\n")
    edit_cartridge(
        repo,
        '[roles.plan]\nrunner = "scripted"\nscript = "answers.toml"\ntimeout = 30',
        '[roles.plan]\nrunner = "command"\ncommand = "sleep 20"\ntimeout = 0.5',
    )
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert (row["current_phase"], row["status"]) == ("planning", "planning_timeout")
    assert "timeout" in row["error"]
    assert len(store.agent_runs(row["id"])) == 2


def test_changes_requested_go_back_to_development_with_the_review(
    tmp_path: Path, engine_for: Build
) -> None:
    review = (
        '[[review]]\ntext = "Missing a test.\\nVERDICT: request_changes"\n'
        '[[review]]\ntext = "VERDICT: approve"\n'
    )
    repo = repo_with(tmp_path, answers(review=review))
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert row["status"] == "completed" and row["dev_round"] == 2
    reviews = milestones(store, row["id"], "pr_reviewed")
    assert [(m.round, m.data["verdict"]) for m in reviews] == [
        (1, "request_changes"),
        (2, "approve"),
    ]
    assert len(milestones(store, row["id"], "dev_completed")) == 2
    assert len(LocalForge(store, repo, engine.workspace).pull_requests()) == 1


def test_review_rounds_run_out_and_the_workflow_pauses(tmp_path: Path, engine_for: Build) -> None:
    repo = repo_with(
        tmp_path,
        answers(review='[[review]]\ntext = "VERDICT: request_changes"\n'),
        extra="[limits]\nmax_pr_review_rounds = 2\n",
    )
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert (row["current_phase"], row["status"]) == ("pr_review", "paused")
    assert "max_pr_review_rounds" in row["error"]
    assert len(milestones(store, row["id"], "pr_reviewed")) == 2


def passes(store: Store, wf: str) -> list[tuple[int, int, str]]:
    """Each review recorded: (development round, pass, verdict)."""
    return [
        (m.round, m.data["pass"], m.data["verdict"]) for m in milestones(store, wf, "pr_reviewed")
    ]


@pytest.mark.parametrize("full", [True, False])
def test_full_review_rounds_review_an_approved_change_again(
    tmp_path: Path, engine_for: Build, full: bool
) -> None:
    limits = "[limits]\nmax_pr_review_rounds = 2\n"
    repo = repo_with(
        tmp_path, answers(), extra=limits + ("require_full_review_rounds = true\n" if full else "")
    )
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert (row["status"], row["dev_round"]) == ("completed", 1)
    expected = [(1, 1, "approve"), (1, 2, "approve")] if full else [(1, 1, "approve")]
    assert passes(store, row["id"]) == expected
    reviews = [r for r in store.agent_runs(row["id"]) if r["role"] == "review"]
    assert len(reviews) == len(expected)
    assert len(milestones(store, row["id"], "dev_completed")) == 1  # the same change reviewed
    report = milestones(store, row["id"], "progress_reported")[-1].data["report"]
    assert (report["review"]["rounds"], report["review"]["passes"]) == (1, len(expected))
    said = render_report(report, "en")
    assert ("approve (1 round, 2 passes)" if full else "approve (1 round)") in said, said
    # the progress line and show's milestone lines tell the passes apart
    started = store.events(row["id"], types=["agent_started"])
    assert [e["data"].get("pass") for e in started if e["data"]["role"] == "review"] == (
        [None, 2] if full else [None]
    )
    with console.capture() as shown:
        print_detail(workflow_detail(store, row["id"]))
    lines = [line.split()[1:3] for line in shown.get().splitlines() if "pr_reviewed" in line]
    assert lines == ([["pr_reviewed", "r1"], ["pr_reviewed", "r1"]] if full else [lines[0]])
    assert ("pr_reviewed r1 pass 2 " in shown.get()) == full, shown.get()


def test_a_later_full_round_that_requests_changes_sends_the_change_back(
    tmp_path: Path, engine_for: Build
) -> None:
    review = (
        '[[review]]\ntext = "VERDICT: approve"\n'
        '[[review]]\ntext = "Missing a test.\\nVERDICT: request_changes"\n'
        '[[review]]\ntext = "VERDICT: approve"\n'
    )
    repo = repo_with(
        tmp_path,
        answers(review=review),
        extra="[limits]\nmax_pr_review_rounds = 3\nrequire_full_review_rounds = true\n",
    )
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert (row["status"], row["dev_round"]) == ("completed", 2)
    # three rounds in all: the third, after the second build, is the last one asked for
    assert passes(store, row["id"]) == [
        (1, 1, "approve"),
        (1, 2, "request_changes"),
        (2, 1, "approve"),
    ]
    builds = [r for r in store.agent_runs(row["id"]) if r["role"] == "build"]
    assert len(builds) == 2


def test_failing_checks_are_retried_then_pause_for_a_person(
    tmp_path: Path, engine_for: Build
) -> None:
    # The default profile (review) leaves re-planning to a person
    # (docs/contracts/autonomy.md: thresholds).
    repo = repo_with(
        tmp_path, answers(), checks=["echo broken; exit 1"], extra="[limits]\nmax_dev_retries = 1\n"
    )
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert (row["current_phase"], row["status"]) == ("development", "paused")
    assert "phasegate revert" in row["error"] and "reversion_count" not in row["state"]
    runs = milestones(store, row["id"], "tests_run")
    assert [(m.attempt, m.status) for m in runs] == [(1, "failed"), (2, "failed")]
    assert runs[0].data["checks"][0]["output"].strip() == "broken"
    assert "broken" in row["error"]


def test_a_build_that_changes_nothing_is_not_a_pass(tmp_path: Path, engine_for: Build) -> None:
    repo = repo_with(
        tmp_path,
        answers(build='[[build]]\ntext = "done!"\n'),
        extra="[limits]\nmax_dev_retries = 0\n",
    )
    engine, _ = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert row["status"] == "paused" and "changed no file" in row["error"]


def test_waits_for_a_person_without_auto_merge(tmp_path: Path, engine_for: Build) -> None:
    repo = repo_with(tmp_path, answers(), auto_merge=False)
    engine, store = engine_for(repo)
    wf = engine.start("t", "ticket")
    row = engine.advance(wf)
    assert (row["current_phase"], row["status"]) == ("wait", "waiting")
    version = row["version"]
    assert engine.advance(wf)["version"] == version  # polling a waiting workflow writes nothing
    assert "feature.txt" not in git(repo, "ls-tree", "--name-only", "main")


def test_a_conflict_with_the_base_is_resolved_by_a_forked_child(
    tmp_path: Path, engine_for: Build
) -> None:
    repo = repo_with(tmp_path, answers(), auto_merge=False)
    engine, store = engine_for(repo)
    wf = engine.start("t", "ticket")
    engine.advance(wf)
    (repo / "feature.txt").write_text("someone else's feature\n")
    git(repo, "add", "feature.txt")
    git(repo, "commit", "-qm", "conflicting change on main")
    from phasegate.core.contract import PhaseResult

    engine.commit(store.load_context(wf), PhaseResult("retry", state={"merge_approved": True}))
    row = engine.advance(wf)
    # The child's build (the scripted answer rewrites feature.txt) resolves the
    # markers (phases/conflict.py; tests/test_conflict_fork.py has the rest).
    assert (row["current_phase"], row["status"]) == ("completed", "completed"), row["error"]
    assert [c["status"] for c in store.child_workflows(wf)] == ["completed"]
    assert git(repo, "status", "--porcelain") == ""


def test_edits_in_the_way_of_the_merge_pause_it_and_lose_nothing(
    tmp_path: Path, engine_for: Build
) -> None:
    from phasegate.core.contract import PhaseResult

    repo = repo_with(tmp_path, answers(), auto_merge=False)
    engine, store = engine_for(repo)
    wf = engine.start("t", "ticket")
    engine.advance(wf)
    (repo / "README.md").write_text("my unsaved work\n")  # unrelated: no obstacle
    (repo / "feature.txt").write_text("my own feature\n")  # in the merge's way
    engine.commit(store.load_context(wf), PhaseResult("retry", state={"merge_approved": True}))
    row = engine.advance(wf)
    assert (row["current_phase"], row["status"]) == ("merge", "paused")
    assert "are in the way" in row["error"] and "feature.txt" in row["error"]
    assert (repo / "feature.txt").read_text() == "my own feature\n"
    assert git(repo, "rev-list", "--merges", "--count", "main") == "0"

    (repo / "feature.txt").unlink()
    engine.commit(store.load_context(wf), PhaseResult("retry", status="merging"))
    assert engine.advance(wf)["status"] == "completed"
    assert git(repo, "rev-list", "--merges", "--count", "main") == "1"
    assert (repo / "README.md").read_text() == "my unsaved work\n"  # still the person's


def test_verifier_failures_retry_up_to_three_attempts_then_pause(
    tmp_path: Path, engine_for: Build
) -> None:
    repo = repo_with(
        tmp_path, answers(verification='[[verification]]\ntext = "crash"\nexit_code = 2\n')
    )
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert (row["current_phase"], row["status"]) == ("acceptance_verification", "paused")
    rows = milestones(store, row["id"], "acceptance_verification")
    assert [(m.attempt, m.status) for m in rows] == [(1, "failed"), (2, "failed"), (3, "failed")]
    forge = LocalForge(store, repo, engine.workspace)
    assert [i.state for i in forge.issues()] == ["open"]


def test_unparseable_verdicts_are_capped_at_two(tmp_path: Path, engine_for: Build) -> None:
    repo = repo_with(tmp_path, answers(verification='[[verification]]\ntext = "looks fine"\n'))
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert row["status"] == "paused" and "garbage" in row["error"]
    assert len(milestones(store, row["id"], "acceptance_verification")) == 2


def test_a_failing_check_on_the_merge_commit_overrules_a_confirmation(
    tmp_path: Path, engine_for: Build
) -> None:
    # passes in development (feature.txt absent is fine there?) -> use a check that only
    # fails on a detached checkout, as the merge commit is verified detached
    check = "test \"$(git symbolic-ref -q HEAD)\" != ''"
    repo = repo_with(tmp_path, answers(), checks=[check])
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert row["status"] == "paused"
    verdict = milestones(store, row["id"], "acceptance_verification")[-1].data
    assert verdict["verdict"] == "rejected" and verdict["checks"][0]["passed"] is False
    assert [i.state for i in LocalForge(store, repo, engine.workspace).issues()] == ["open"]


def test_a_confirmed_verification_is_a_terminal_no_op(tmp_path: Path, engine_for: Build) -> None:
    repo = repo_with(tmp_path, answers())
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert row["status"] == "completed"
    ctx = store.load_context(row["id"])
    from dataclasses import replace

    from phasegate.phases import acceptance_verification

    again = acceptance_verification.run(
        replace(ctx, current_phase="acceptance_verification"), engine.deps_for(ctx)
    )
    assert again.outcome == "completed" and again.next_phase == "completed"
    assert len(store.agent_runs(row["id"])) == 5  # the verifier did not run again


def test_verification_disabled_completes_without_closing_the_issue(
    tmp_path: Path, engine_for: Build
) -> None:
    repo = repo_with(tmp_path, answers())
    edit_cartridge(
        repo, "auto_merge = true\n", "auto_merge = true\nacceptance_verification = false\n"
    )
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert row["status"] == "completed"
    assert [i.state for i in LocalForge(store, repo, engine.workspace).issues()] == ["open"]
    assert not any(r["role"] == "verification" for r in store.agent_runs(row["id"]))


def test_a_removed_worktree_is_healed_before_the_next_phase(
    tmp_path: Path, engine_for: Build
) -> None:
    repo = repo_with(tmp_path, answers(), auto_merge=False)
    engine, store = engine_for(repo)
    wf = engine.start("t", "ticket")
    row = engine.advance(wf)
    worktree = Path(row["worktree_path"])
    git(repo, "worktree", "remove", "--force", str(worktree))
    assert not worktree.exists()
    from phasegate.core.contract import PhaseResult

    engine.commit(store.load_context(wf), PhaseResult("retry", state={"merge_approved": True}))
    row = engine.advance(wf)
    assert row["status"] == "completed"
    assert any(e["type"] == "worktree_healed" for e in store.events(wf))


@pytest.mark.parametrize("language,marker", [("en", "Progress report"), ("zh", "进度报告")])
def test_the_report_is_rendered_in_the_content_language(
    tmp_path: Path, engine_for: Build, language: str, marker: str
) -> None:
    repo = repo_with(tmp_path, answers())
    edit_cartridge(
        repo, "auto_merge = true\n", f'auto_merge = true\ncontent_language = "{language}"\n'
    )
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert row["status"] == "completed"
    comments = LocalForge(store, repo, engine.workspace).comment_rows()
    reports = [c for c in comments if ":report:" in str(c["marker"])]
    assert len(reports) == 1 and marker in str(reports[0]["body"])
    assert row["state"]["report"]["changes"]["files"] == 1


def test_an_approving_review_is_posted_by_the_report_and_a_request_for_changes_by_itself(
    tmp_path: Path, engine_for: Build
) -> None:
    reviews = (
        '[[review]]\ntext = "Name the constant.\\nVERDICT: request_changes"\n'
        '[[review]]\ntext = "Clear and small now.\\nVERDICT: approve"\n'
    )
    repo = repo_with(tmp_path, answers(review=reviews, build=BUILD + BUILD))
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert row["status"] == "completed" and row["dev_round"] == 2, row["error"]
    comments = LocalForge(store, repo, engine.workspace).comment_rows()
    reviews_posted = [str(c["body"]) for c in comments if ":review:" in str(c["marker"])]
    assert len(reviews_posted) == 1 and "Name the constant." in reviews_posted[0]
    reports = [str(c["body"]) for c in comments if ":report:" in str(c["marker"])]
    assert "### Review\n\n> Clear and small now." in reports[-1]


def test_a_workflow_spend_cap_pauses_with_reason_budget(tmp_path: Path, engine_for: Build) -> None:
    priced = (
        answers()
        .replace('text = "the plan"', 'text = "the plan"\ncost_usd = 0.01')
        .replace(
            '[[plan_review]]\ntext = "VERDICT: approve"',
            '[[plan_review]]\ntext = "VERDICT: approve"\ncost_usd = 0.01',
        )
    )
    repo = repo_with(tmp_path, priced, extra="[limits]\nworkflow_budget_usd = 0.015\n")
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert (row["current_phase"], row["status"]) == ("development", "paused")
    assert row["error"].startswith("budget:")
    assert [r["role"] for r in store.agent_runs(row["id"])] == ["plan", "plan_review"]


def test_a_role_spend_cap_stops_that_role(tmp_path: Path, engine_for: Build) -> None:
    repo = repo_with(
        tmp_path, answers(review='[[review]]\ntext = "VERDICT: request_changes"\ncost_usd = 0.5\n')
    )
    edit_cartridge(
        repo,
        '[roles.review]\nrunner = "scripted"\nscript = "answers.toml"\ntimeout = 30\n',
        '[roles.review]\nrunner = "scripted"\nscript = "answers.toml"\ntimeout = 30\n'
        "budget_usd = 0.75\n",
    )
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert (row["current_phase"], row["status"]) == ("pr_review", "paused")
    assert "budget" in row["error"]
    assert [r["role"] for r in store.agent_runs(row["id"])].count("review") == 2


def test_checks_see_no_keys_and_their_output_is_redacted(
    tmp_path: Path, engine_for: Build, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_sentinel_not_for_checks")
    monkeypatch.setenv("DEPLOY_TOKEN", "dt_sentinel_passed_but_redacted")
    repo = repo_with(tmp_path, answers(), checks=["env; echo deploy: $DEPLOY_TOKEN; false"])
    edit_cartridge(
        repo, "check_timeout = 60\n", 'check_timeout = 60\npass_env = ["DEPLOY_TOKEN"]\n'
    )
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert row["status"] == "paused"
    output = milestones(store, row["id"], "tests_run")[0].data["checks"][0]["output"]
    assert "GITHUB_TOKEN" not in output and "ghp_sentinel" not in output
    # The colon keeps the line from looking like a wrapped base64 block, which
    # redaction would take whole with its neighbours.
    assert "deploy: ***" in output and "dt_sentinel" not in output
    assert "dt_sentinel" not in row["error"]


def test_a_change_holding_a_key_is_discarded_never_committed(
    tmp_path: Path, engine_for: Build, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVICE_API_KEY", "sk-live-leaked-000111")
    build = (
        '[[build]]\ntext = "wrote config"\n[build.files]\n'
        '"config.txt" = "key = sk-live-leaked-000111\\n"\n'
        '[[build]]\ntext = "wrote config without the key"\n[build.files]\n'
        '"config.txt" = "key = read from the environment\\n"\n'
    )
    repo = repo_with(tmp_path, answers(build=build))
    engine, store = engine_for(repo)
    row = land_held(engine, engine.advance(engine.start("t", "ticket")), "secret_in_change")
    assert row["status"] == "completed"
    rejected = milestones(store, row["id"], "change_rejected")
    assert [(m.attempt, m.summary) for m in rejected] == [
        (
            1,
            "secret_in_change: the change held a secret value (raw or encoded) in 1 file(s): "
            "config.txt; it was discarded",
        )
    ]
    assert "sk-live-leaked" not in git(repo, "log", "-p", "--all", "--", "config.txt")
    assert git(repo, "show", "main:config.txt") == "key = read from the environment"


def test_the_reviewer_is_shown_the_checks_results(tmp_path: Path, engine_for: Build) -> None:
    seen = tmp_path / "review-prompt.txt"
    repo = repo_with(tmp_path, answers(), checks=["echo all 3 tests ok"])
    edit_cartridge(
        repo,
        '[roles.review]\nrunner = "scripted"\nscript = "answers.toml"\ntimeout = 30\n',
        f'[roles.review]\nrunner = "command"\ncommand = "cat > {seen}; echo VERDICT: approve"\n',
    )
    engine, _ = engine_for(repo)
    assert engine.advance(engine.start("t", "ticket"))["status"] == "completed"
    prompt = seen.read_text()
    assert "## Checks on this change" in prompt
    assert "- `echo all 3 tests ok`: passed\n```\nall 3 tests ok" in prompt


def test_a_merge_conflict_reverts_under_ci_and_the_next_build_starts_from_the_base(
    tmp_path: Path, engine_for: Build
) -> None:
    from phasegate.core.contract import PhaseResult

    # The check refuses the conflict fork's resolution (phases/conflict.py), never a
    # build's commit: the child fails and the ci profile reverts the parent.
    refuse_fork = "! git log -1 --format=%B | grep -q Phasegate-Conflict"
    repo = repo_with(tmp_path, answers(), auto_merge=False, checks=[refuse_fork])
    edit_cartridge(repo, "auto_merge = false\n", 'auto_merge = false\nprofile = "ci"\n')
    engine, store = engine_for(repo)
    wf = engine.start("t", "ticket", auto_merge=False)
    assert engine.advance(wf)["status"] == "waiting"
    (repo / "feature.txt").write_text("someone else's feature\n")
    git(repo, "add", "feature.txt")
    git(repo, "commit", "-qm", "a conflicting feature on main")
    engine.decide(wf, lambda ctx: PhaseResult("retry", state={"merge_approved": True}))
    row = engine.advance(wf)
    # the conflict reverted to planning; the new build ran on a branch holding main's
    # feature.txt in conflict, and its own version resolved it
    decisions = row["state"]["decisions"]
    assert [(d["source_phase"], d["target_phase"]) for d in decisions] == [("merge", "planning")]
    assert (row["current_phase"], row["status"]) == ("wait", "waiting")
    engine.decide(wf, lambda ctx: PhaseResult("retry", state={"merge_approved": True}))
    assert engine.advance(wf)["status"] == "completed"
    assert git(repo, "show", "main:feature.txt") == "the feature"


def test_reviews_that_keep_rejecting_re_plan_under_ci(tmp_path: Path, engine_for: Build) -> None:
    repo = repo_with(
        tmp_path,
        answers(
            review='[[review]]\ntext = "Wrong approach.\\nVERDICT: request_changes"\n',
            # a plan of its own each cycle: a repeated one would stop as no_progress
            plan="".join(f'[[plan]]\ntext = "plan {n}"\n' for n in range(1, 5)),
        ),
        extra="[limits]\nmax_pr_review_rounds = 1\n",
    )
    edit_cartridge(repo, "auto_merge = true\n", 'auto_merge = true\nprofile = "ci"\n')
    engine, _ = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    decisions = row["state"]["decisions"]
    assert [d["source_phase"] for d in decisions] == ["pr_review"] * 3
    assert "review still requests changes" in decisions[0]["reason"]
    assert (row["current_phase"], row["status"]) == ("pr_review", "failed")
    assert "MAX_REVERSIONS" in row["error"]
