"""A round is checked against what started it: a person's feedback, or a plan
that must differ from the one the last cycle built. Real git, SQLite, the real
CLI, command runners that write files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from test_forge_phases import hear, said

from phasegate.core import decisions
from phasegate.core.report import render_report
from phasegate.forge import LocalForge
from phasegate.git.workspace import Workspace
from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.summary import workflow_summary
from phasegate.testing import InMemoryForge
from phasegate.web.views import group_of

from conftest import git, make_repo, phasegate_cli, scripted_cartridge

Build = Callable[..., tuple[Engine, Store]]

ANSWERS = """
[[plan]]
text = "1. Write feature.txt"
[[plan_review]]
text = "VERDICT: approve"
[[build]]
text = "wrote feature.txt"
[build.files]
"feature.txt" = "the feature\\n"
[[review]]
text = "VERDICT: approve"
[[verification]]
text = "VERDICT: confirmed"
"""


def command_role(command: str) -> str:
    return f"runner = \"command\"\ncommand = '{command}'\ntimeout = 30\n"


def project(
    tmp_path: Path, build: str | None = None, checks: tuple[str, ...] = (), **cartridge: Any
) -> tuple[Path, Path]:
    """A repository whose build role is ``build`` (a shell command) when given, and
    whose first check appends a line to a log outside the worktree: the log's
    lines are the check runs. Returns (repo, log)."""
    log = tmp_path / "checks.log"
    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(ANSWERS)
    overrides = {"build": command_role(build)} if build else {}
    options: dict[str, Any] = {"auto_merge": False, **cartridge}
    (repo / "phasegate.toml").write_text(
        scripted_cartridge(
            checks=[f"echo ran >> {log}", *checks], role_overrides=overrides, **options
        )
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "cartridge")
    return repo, log


def check_runs(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def cli_json(*args: str) -> tuple[int, Any]:
    proc = phasegate_cli(*args, "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def flat(text: str) -> str:
    return " ".join(text.split())


def kinds(store: Store, wf: str, kind: str) -> list[Any]:
    return [m for m in store.milestones(wf) if m.kind == kind]


def test_feedback_whose_build_changes_nothing_stops_for_the_person(tmp_path: Path) -> None:
    # The first build writes the feature; every later one answers and changes nothing.
    build = (
        f"cat > {tmp_path}/build-$PHASEGATE_CALL_INDEX.txt; "
        'if [ "$PHASEGATE_CALL_INDEX" = 0 ]; then echo the feature > feature.txt; fi; '
        "echo empty input is already handled"
    )
    repo, log = project(tmp_path, build)
    r = str(repo)
    code, run = cli_json("run", "--repo", r, "Add the feature")
    assert (code, run["status"], check_runs(log)) == (0, "waiting", 1)
    wf = run["id"]
    head = git(repo, "rev-parse", run["branch_name"])

    feedback = "Please also handle empty input."
    code, stopped = cli_json("feedback", wf, feedback, "--repo", r)
    assert (code, stopped["current_phase"], stopped["status"]) == (1, "development", "paused")
    assert stopped["error"].startswith("feedback_unchanged: ")
    assert "empty input is already handled" in stopped["error"]  # what the agent said
    assert f"phasegate resume {wf}" in stopped["error"]
    assert f"## Feedback from a person\n\n{feedback}" in (tmp_path / "build-1.txt").read_text()
    # Nothing was added, so nothing was checked, reviewed or reported again.
    assert check_runs(log) == 1
    assert git(repo, "rev-parse", run["branch_name"]) == head

    shown = flat(phasegate_cli("show", wf, "--repo", r).stdout)
    assert "development · paused" in shown and "reason: feedback_unchanged:" in shown
    _, detail = cli_json("show", wf, "--repo", r)
    (mark,) = [m for m in detail["milestones"] if m["kind"] == "feedback_unchanged"]
    assert (mark["round"], mark["data"]["feedback"], mark["data"]["since"]) == (2, feedback, head)
    assert [m["round"] for m in detail["milestones"] if m["kind"] == "pr_reviewed"] == [1]
    assert group_of(detail["workflow"]) == "needs_you"

    # Resumed, the round builds again; adding nothing again, it goes on as it is,
    # and the report says so under the feedback it quotes.
    code, waiting = cli_json("resume", wf, "--repo", r)
    assert (code, waiting["status"], waiting["dev_round"]) == (0, "waiting", 2)
    assert (tmp_path / "build-2.txt").exists() and check_runs(log) == 2
    report = cli_json("show", wf, "--repo", r)[1]["report"]
    assert report["feedback"]["texts"] == [feedback]
    assert (report["feedback"]["since"], report["feedback"]["head"]) == (head, head)
    assert report["feedback"]["changed"] is False and report["feedback"]["files"] == 0
    shown = phasegate_cli("show", wf, "--repo", r).stdout
    assert f"> {feedback}" in shown
    assert f"Nothing changed since the last report: the head is still `{head[:12]}`" in shown


def test_a_feedback_round_reports_the_feedback_and_the_files_and_lines_it_changed(
    tmp_path: Path, engine_for: Build
) -> None:
    build = 'echo "round $PHASEGATE_CALL_INDEX" >> feature.txt; echo built'
    repo, log = project(tmp_path, build)
    engine, store = engine_for(repo)
    wf = engine.start("t", "ticket")
    first = engine.advance(wf)
    assert first["status"] == "waiting" and first["state"]["report"]["feedback"] is None
    head = first["state"]["report"]["head"]
    assert head == git(repo, "rev-parse", first["branch_name"])

    feedback = "Say which round wrote each line.\nAnd keep the old ones."
    engine.decide(wf, lambda ctx: decisions.feedback(ctx, feedback))
    row = engine.advance(wf)
    assert (row["status"], row["dev_round"], check_runs(log)) == ("waiting", 2, 2)
    report = row["state"]["report"]
    new_head = git(repo, "rev-parse", row["branch_name"])
    assert report["feedback"] == {
        "round": 2,
        "texts": [feedback],
        "since": head,
        "head": new_head,
        "changed": True,
        "files": 1,
        "insertions": 1,
        "deletions": 0,
        "paths": [{"path": "feature.txt", "insertions": 1, "deletions": 0}],
    }
    text = render_report(report, "en")
    assert "### Feedback this round answers\n\n> Say which round wrote each line.\n" in text
    assert "> And keep the old ones." in text
    assert f"Changed since the last report (`{head[:12]}` → `{new_head[:12]}`): 1 file," in text
    assert "- `feature.txt`: +1 −0" in text
    zh = render_report(report, "zh")
    assert "### 本轮回应的反馈" in zh and "自上次报告以来的变更" in zh
    # The report posted on the issue is the same text.
    forge = LocalForge(store, repo, Workspace())
    posted = [str(c["body"]) for c in forge.comment_rows(row["issue_number"])]
    assert any(body.startswith(text) for body in posted)


def test_an_empty_build_runs_no_check(tmp_path: Path, engine_for: Build) -> None:
    repo, log = project(tmp_path, "echo nothing to do", extra="[limits]\nmax_dev_retries = 1\n")
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert (row["current_phase"], row["status"]) == ("development", "paused")
    assert "changed no file" in row["error"]
    assert check_runs(log) == 0  # two empty attempts, no check run
    runs = kinds(store, row["id"], "tests_run")
    assert [(m.attempt, m.summary) for m in runs] == [
        (1, "no change, checks not run"),
        (2, "no change, checks not run"),
    ]
    assert all(m.data["checks"] == [] and m.data["checks_run"] is False for m in runs)


def test_an_identical_plan_after_a_reversion_stops_as_no_progress(
    tmp_path: Path, engine_for: Build
) -> None:
    # Under auto the failing checks revert to planning; the planner plans the same.
    repo, log = project(
        tmp_path,
        checks=("echo still broken; exit 1",),
        extra="[limits]\nmax_dev_retries = 0\n",
        profile="auto",
        auto_merge=None,
    )
    engine, store = engine_for(repo)
    wf = engine.start("t", "ticket")
    row = engine.advance(wf)
    assert (row["current_phase"], row["status"]) == ("planning", "paused")
    assert row["error"].startswith("no_progress: the plan of planning cycle 1 is 100% like")
    assert row["state"]["reversion_count"] == 1
    # One development cycle only: no second build, no second check run.
    assert [m.round for m in kinds(store, wf, "tests_run")] == [1]
    roles = [r["role"] for r in store.agent_runs(wf)]
    assert (roles.count("build"), roles.count("plan")) == (1, 2)
    assert len(kinds(store, wf, "plan_finalized")) == 1
    (stop,) = kinds(store, wf, "no_progress")
    assert (stop.data["similarity"], stop.data["cycle"]) == (1.0, 1)
    assert group_of(workflow_summary(store, row)) == "needs_you"

    # A person who resumes lets the same plan be built once; it fails the same way,
    # and the next cycle's repeat stops again before a third build.
    engine.decide(wf, decisions.resume)
    row = engine.advance(wf)
    assert (row["current_phase"], row["status"]) == ("planning", "paused")
    assert row["error"].startswith("no_progress: the plan of planning cycle 2")
    assert [m.round for m in kinds(store, wf, "tests_run")] == [1, 2]
    assert row["state"]["reversion_count"] == 2


def test_a_forge_comment_whose_build_changes_nothing_stops_as_feedback_unchanged(
    tmp_path: Path, engine_for: Build
) -> None:
    build = 'if [ "$PHASEGATE_CALL_INDEX" = 0 ]; then echo f > feature.txt; fi; echo done'
    repo, log = project(tmp_path, build)
    forge = InMemoryForge()
    forge.permissions["maya"] = "maintain"
    engine, store = engine_for(repo, forge=forge)
    wf = engine.start("t", "ticket")
    row = engine.advance(wf)
    assert row["status"] == "waiting"
    hear(forge, said(row["pr_number"], "maya", "Call it feature_flag instead."))
    row = engine.advance(wf)
    assert (row["current_phase"], row["status"]) == ("development", "paused")
    assert row["error"].startswith("feedback_unchanged: ") and check_runs(log) == 1
    (mark,) = kinds(store, wf, "feedback_unchanged")
    assert "Call it feature_flag instead." in mark.data["feedback"]


def test_a_report_names_a_gitlab_merge_request_as_gitlab_does() -> None:
    """phasegate's number for GitLab's merge request !3 is 1000003; people read !3."""
    payload = {"pr": 1_000_003, "branch": "agent/x", "round": 1}
    assert "- Pull request: !3 (agent/x)" in render_report(payload, "en")
    assert "- Pull request: #12 (agent/x)" in render_report({**payload, "pr": 12}, "en")
