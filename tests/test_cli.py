"""The real ``phasegate`` console script: status, show, the wait path, feedback, init, help."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from phasegate.cli.render import status_table
from phasegate.config.cartridge import load_cartridge
from phasegate.forge import LocalForge
from phasegate.git.workspace import Workspace
from phasegate.store import open_store

import conftest
from conftest import HAPPY_ANSWERS, git, make_repo, phasegate_cli, scripted_cartridge

LIFECYCLE = [
    "preparation",
    "planning",
    "development",
    "pr_review",
    "report",
    "wait",
    "merge",
    "acceptance_verification",
    "completed",
]


def flat(text: str) -> str:
    return " ".join(text.split())


def make_project(
    tmp_path: Path, answers: str = HAPPY_ANSWERS, cartridge: str | None = None
) -> Path:
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(answers)
    (repo / "phasegate.toml").write_text(cartridge or scripted_cartridge())
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    return repo


@pytest.fixture(autouse=True)
def _every_command_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's own tests run every command as a process, as a person does."""
    monkeypatch.setattr(conftest, "IN_PROCESS", False)


def cli_json(*args: str) -> tuple[int, Any]:
    proc = phasegate_cli(*args, "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def forge_comments(repo: Path, issue: int) -> list[str]:
    store = open_store(load_cartridge(repo).store_url(repo))
    try:
        return [str(c["body"]) for c in LocalForge(store, repo, Workspace()).comment_rows(issue)]
    finally:
        store.close()


# -- status and show ------------------------------------------------------------------------


def test_status_and_show_of_a_completed_workflow(happy_repo: Path) -> None:
    repo = str(happy_repo)
    code, run = cli_json("run", "--repo", repo, "Add the feature\n\nwith details")
    assert code == 0
    wf = run["id"]

    code, listed = cli_json("status", "--repo", repo)
    assert code == 0
    assert isinstance(listed, list) and len(listed) == 1
    entry = listed[0]
    assert {"id", "title", "current_phase", "status", "tokens", "cost_usd"} <= set(entry)
    assert (entry["id"], entry["title"]) == (wf, "Add the feature")
    assert (entry["current_phase"], entry["status"]) == ("completed", "completed")
    assert (entry["tokens"], entry["cost_usd"]) == (150, 0.01)  # HAPPY_ANSWERS' build usage
    table = phasegate_cli("status", "--repo", repo)
    header = next(line for line in table.stdout.splitlines() if "profile" in line)
    assert header.index("status") < header.index("profile") < header.index("tokens")
    assert f"│ {wf} " in table.stdout and " review " in table.stdout  # the default profile

    code, detail = cli_json("show", wf, "--repo", repo)
    assert code == 0
    assert set(detail) == {
        "workflow",
        "timeline",
        "milestones",
        "agent_runs",
        "report",
        "ticket",
        "decisions",
        "cleanup",
        "violations",
        "merge_hold",
        "scratch_checkouts",
        "forge_faults",
        "pruned",
    }
    assert detail["merge_hold"] is None  # nothing held it
    assert detail["workflow"]["cartridge_sha"] == git(
        happy_repo, "rev-parse", "main:phasegate.toml"
    )
    assert detail["violations"] == []  # the scripted agents overstepped nothing
    assert detail["scratch_checkouts"] == []  # no merge was killed
    assert detail["cleanup"] == {"status": "completed", "reason": None, "attempts": 1}
    assert detail["workflow"] == {**detail["workflow"], **entry}
    # One clock for both commands: status's timestamps are UTC like show's.
    assert entry["created_at"] == detail["workflow"]["created_at"]
    assert entry["created_at"].endswith("+00:00")
    assert [t["phase"] for t in detail["timeline"]] == LIFECYCLE
    milestones = detail["milestones"]
    assert {m["status"] for m in milestones} == {"completed"}
    assert {"kind", "phase", "round", "attempt", "status", "dedupe_key", "summary"} <= set(
        milestones[0]
    )
    kinds = [m["kind"] for m in milestones]
    for kind in (
        "issue_created",
        "branch_created",
        "plan_finalized",
        "tests_run",
        "dev_completed",
        "pr_created",
        "pr_reviewed",
        "progress_reported",
        "merge_approved",
        "merge_completed",
        "acceptance_verification",
        "issue_closed",
    ):
        assert kinds.count(kind) == 1, kind
    assert [r["role"] for r in detail["agent_runs"]] == [
        "plan",
        "plan_review",
        "build",
        "review",
        "verification",
    ]
    assert {r["outcome"] for r in detail["agent_runs"]} == {"ok"}
    assert detail["report"]["title"] == "Add the feature"

    shown = phasegate_cli("show", wf, "--repo", repo)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert f"{wf} Add the feature" in text
    assert "completed · completed · dev round 1" in flat(text)
    # Phases head the timeline, each milestone under its phase, in order.
    headings = re.findall(r"^(\w+) +\d\d:\d\d:\d\d$", text, re.M)
    assert headings == [
        "preparation",
        "planning",
        "development",
        "pr_review",
        "report",
        "wait",
        "merge",
        "acceptance_verification",
    ]
    body = flat(text)
    for kind in (
        "issue_created",
        "plan_finalized r1",
        "tests_run r1 a1",
        "pr_created",
        "merge_completed",
        "issue_closed",
    ):
        assert f"✓ {kind}" in body, kind
    for role in ("plan_review", "verification"):
        assert f"{role} scripted" in body


def _summary_row(workflow_id: str, title: str, phase: str, status: str) -> dict[str, Any]:
    return {
        "id": workflow_id,
        "title": title,
        "current_phase": phase,
        "status": status,
        "profile": "full-auto",
        "tokens": 1234567,
        "cost_usd": 12.3456,
        "updated_at": "2026-12-01T11:55:33.123456+00:00",
    }


@pytest.mark.parametrize("width", [80, 100, 150])
def test_status_fits_its_width_and_never_cuts_id_phase_or_status(width: int) -> None:
    rows = [
        _summary_row(i, "A rather long title " * 4, "acceptance_verification", s)
        for i, s in (("a1b2c3d4", "verification_pending"), ("0f0f0f0f", "awaiting_approval"))
    ] + [_summary_row("e5f6a7b8", "Short", "development", "running")]
    out = io.StringIO()
    Console(file=out, width=width).print(status_table(rows, width))
    lines = out.getvalue().splitlines()
    assert lines and all(len(line) <= width for line in lines), lines
    for r in rows:
        [line] = [line for line in lines if r["id"] in line]  # one line per workflow
        assert r["current_phase"] in line.split() or f"│ {r['current_phase']} " in line
        assert r["status"] in line
    if width >= 150:  # room for everything
        header = lines[1]
        assert all(c in header for c in ("profile", "tokens", "cost (USD)", "updated (UTC)"))


@pytest.mark.parametrize("width", [80, 150])
def test_status_names_the_repository_when_the_store_holds_several(width: int) -> None:
    rows = [
        {**_summary_row("a1b2c3d4", "One", "development", "running"), "repository": "acme/api"},
        {**_summary_row("e5f6a7b8", "Two", "wait", "waiting"), "repo_path": "/srv/clones/web"},
    ]
    out = io.StringIO()
    Console(file=out, width=width).print(status_table(rows, width))
    lines = out.getvalue().splitlines()
    assert "repository" in " ".join(lines[:3]), lines
    [one] = [line for line in lines if "a1b2c3d4" in line]
    [two] = [line for line in lines if "e5f6a7b8" in line]
    assert "acme/api" in one and "web" in two and all(len(x) <= width for x in lines)
    # One repository's rows (the usual, and every SQLite store): no column for it.
    alone = io.StringIO()
    Console(file=alone, width=width).print(status_table(rows[:1], width))
    assert "repository" not in alone.getvalue()


def test_status_and_show_are_readable_at_80_columns(happy_repo: Path) -> None:
    title = "Add the feature that makes the calculator multiply two numbers and say so"
    code, run = cli_json("run", "--repo", str(happy_repo), f"{title}\n\nwith details")
    assert code == 0
    wf = run["id"]
    narrow = {"COLUMNS": "80"}
    status = phasegate_cli("status", "--repo", str(happy_repo), env=narrow)
    shown = phasegate_cli("show", wf, "--repo", str(happy_repo), env=narrow)
    for proc in (status, shown):
        assert proc.returncode == 0, proc.stderr
        long = [line for line in proc.stdout.splitlines() if len(line) > 80]
        assert long == [], long
    [row] = [line for line in status.stdout.splitlines() if wf in line]
    assert row.split()[0] == wf and row.split().count("completed") == 2
    assert "Add the feature" in row and "…" in row  # the title is cut, not folded
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"{wf} Add the feature")
    # the title folds at a word (it is whole in show); the state line after it does not
    state = next(line for line in lines if line.startswith("  completed ·"))
    assert flat(state) == "completed · completed · dev round 1 · profile review"
    # one line per milestone: each starts with its mark, none folded onto the next
    start = next(n for n, line in enumerate(lines) if line.startswith("preparation "))
    timeline = lines[start : lines.index("", start)]
    assert any("✓ merge_completed" in line for line in timeline)
    for line in timeline:
        heading = re.fullmatch(r"\w+  \d\d:\d\d:\d\d", line)
        assert heading or line[:4] in ("  ✓ ", "  ✗ ", "  … ", "  − "), line


def test_no_workflows_is_an_empty_list(happy_repo: Path) -> None:
    code, listed = cli_json("status", "--repo", str(happy_repo))
    assert (code, listed) == (0, [])
    text = phasegate_cli("status", "--repo", str(happy_repo))
    assert "no workflows yet" in text.stdout


def test_usage_totals_are_sums_of_the_agent_runs(tmp_path: Path) -> None:
    answers = """
[[plan]]
text = "1. Write feature.txt"
input_tokens = 60
output_tokens = 40
cost_usd = 0.25
[[plan_review]]
text = "VERDICT: approve"
[[build]]
text = "wrote feature.txt"
input_tokens = 30
output_tokens = 70
cost_usd = 0.5
[build.files]
"feature.txt" = "the feature\\n"
[[review]]
text = "VERDICT: approve"
[[verification]]
text = "VERDICT: confirmed"
"""
    repo = make_project(tmp_path, answers)
    code, run = cli_json("run", "--repo", str(repo), "Add the feature")
    assert code == 0
    _, detail = cli_json("show", run["id"], "--repo", str(repo))
    _, (entry,) = cli_json("status", "--repo", str(repo))

    runs = {r["role"]: r for r in detail["agent_runs"]}
    assert runs["plan"]["input_tokens"] + runs["plan"]["output_tokens"] == 100
    assert runs["build"]["input_tokens"] + runs["build"]["output_tokens"] == 100
    for summary in (detail["workflow"], entry, run):
        assert summary["tokens"] == 200
        assert summary["cost_usd"] == 0.75
    assert (detail["workflow"]["input_tokens"], detail["workflow"]["output_tokens"]) == (90, 110)
    assert detail["workflow"]["agent_runs"] == 5
    assert detail["report"]["usage"]["tokens"] >= 200  # the report ran after both calls


# -- waiting for a person -----------------------------------------------------------------------


def test_without_auto_merge_run_waits_and_approve_merge_completes(tmp_path: Path) -> None:
    repo = make_project(tmp_path, cartridge=scripted_cartridge(auto_merge=False))
    proc = phasegate_cli("run", "--repo", str(repo), "Add the feature", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    out = flat(proc.stdout)
    assert "wait · waiting" in out
    wf = out.split("workflow ", 1)[1].split()[0]
    # the next: line is one line to paste, at any width, in a pipe too
    [hint] = [line for line in proc.stdout.splitlines() if "next:" in line]
    at = f"--repo {repo}"
    assert f"`phasegate approve-merge {wf} {at}` or `phasegate feedback {wf} " in hint
    assert len(hint) > 80

    _, detail = cli_json("show", wf, "--repo", str(repo))
    assert (detail["workflow"]["current_phase"], detail["workflow"]["status"]) == (
        "wait",
        "waiting",
    )
    assert detail["workflow"]["merge_sha"] is None
    assert "feature.txt" not in git(repo, "ls-tree", "--name-only", "main")

    code, done = cli_json("approve-merge", wf, "--by", "ana", "--repo", str(repo))
    assert code == 0
    assert (done["current_phase"], done["status"]) == ("completed", "completed")
    assert done["merge_sha"] == git(repo, "rev-parse", "main")
    assert "feature.txt" in git(repo, "ls-tree", "--name-only", "main")
    _, detail = cli_json("show", wf, "--repo", str(repo))
    approved = [m for m in detail["milestones"] if m["kind"] == "merge_approved"]
    assert [m["summary"] for m in approved] == ["ana"]


def test_feedback_sends_a_waiting_workflow_back_to_development(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    # A build agent that keeps its prompt (stdin) and changes a file every round.
    build = (
        'runner = "command"\n'
        f"command = 'cat > {prompts}/build-$PHASEGATE_CALL_INDEX.txt; "
        'echo "round $PHASEGATE_CALL_INDEX" >> feature.txt; echo built\'\n'
        "timeout = 30\n"
    )
    cartridge = scripted_cartridge(auto_merge=False, role_overrides={"build": build})
    repo = make_project(tmp_path, cartridge=cartridge)
    code, run = cli_json("run", "--repo", str(repo), "Add the feature")
    assert (code, run["status"], run["dev_round"]) == (0, "waiting", 1)
    wf = run["id"]

    feedback = "Please also handle empty input."
    code, again = cli_json("feedback", wf, feedback, "--repo", str(repo))
    assert code == 0
    assert (again["current_phase"], again["status"], again["dev_round"]) == ("wait", "waiting", 2)

    first, second = (prompts / "build-0.txt").read_text(), (prompts / "build-1.txt").read_text()
    assert feedback not in first
    assert f"## Feedback from a person\n\n{feedback}" in second
    assert not (prompts / "build-2.txt").exists()  # one build per round

    _, detail = cli_json("show", wf, "--repo", str(repo))
    received = [m for m in detail["milestones"] if m["kind"] == "requirement_received"]
    assert [(m["round"], m["data"]["feedback"]) for m in received] == [(2, feedback)]
    assert [m["round"] for m in detail["milestones"] if m["kind"] == "dev_completed"] == [1, 2]
    assert [m["round"] for m in detail["milestones"] if m["kind"] == "pr_reviewed"] == [1, 2]
    assert [m["kind"] for m in detail["milestones"]].count("pr_created") == 1
    branch = detail["workflow"]["branch_name"]
    assert git(repo, "show", f"{branch}:feature.txt") == "round 0\nround 1"
    assert detail["report"]["dev_round"] == 2


def test_feedback_on_a_completed_workflow_is_refused(happy_repo: Path) -> None:
    code, run = cli_json("run", "--repo", str(happy_repo), "Add the feature")
    assert (code, run["status"]) == (0, "completed")
    proc = phasegate_cli("feedback", run["id"], "more", "--repo", str(happy_repo))
    assert proc.returncode == 2
    assert f"workflow {run['id']} is completed" in flat(proc.stderr)


# -- init and help --------------------------------------------------------------------------------


def test_init_writes_a_cartridge_that_loads_and_excludes_the_state(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    proc = phasegate_cli("init", "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    cartridge = load_cartridge(repo)
    assert cartridge.workflow.base_branch == "main"
    assert cartridge.forge.kind == "local"
    exclude = (repo / ".git" / "info" / "exclude").read_text().splitlines()
    assert exclude.count(".phasegate/") == 1
    assert git(repo, "status", "--porcelain") == "?? phasegate.toml"

    edited = (repo / "phasegate.toml").read_text() + "\n# my edits\n"
    (repo / "phasegate.toml").write_text(edited)
    refused = phasegate_cli("init", "--repo", str(repo))
    assert refused.returncode == 2
    assert "--force" in flat(refused.stderr)
    assert (repo / "phasegate.toml").read_text() == edited

    forced = phasegate_cli("init", "--repo", str(repo), "--force")
    assert forced.returncode == 0, forced.stderr
    assert "# my edits" not in (repo / "phasegate.toml").read_text()
    load_cartridge(repo)
    exclude = (repo / ".git" / "info" / "exclude").read_text().splitlines()
    assert exclude.count(".phasegate/") == 1


def test_init_outside_a_repository_is_a_clear_error(tmp_path: Path) -> None:
    proc = phasegate_cli("init", "--repo", str(tmp_path))
    assert proc.returncode == 2
    assert "not inside a git repository" in flat(proc.stderr)
    assert not (tmp_path / "phasegate.toml").exists()


def _refused_by_git(repo: Path) -> dict[str, str]:
    """Make git refuse ``repo`` for "dubious ownership": owned by another uid when
    this test runs as root, else git's own switch for pretending so (git >= 2.36)."""
    if os.geteuid() == 0:
        for path in [repo, *repo.rglob("*")]:
            os.lchown(path, 65534, 65534)
        return {}
    return {"GIT_TEST_ASSUME_DIFFERENT_OWNER": "1"}


def test_a_repository_git_refuses_shows_gits_reason_not_not_a_repository(
    happy_repo: Path,
) -> None:
    env = _refused_by_git(happy_repo)
    for args in (["status"], ["init", "--force"], ["run", "the ticket"]):
        proc = phasegate_cli(*args, "--repo", str(happy_repo), env=env)
        said = flat(proc.stderr)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "Traceback" not in said
        assert "dubious ownership" in said and "safe.directory" in said, said
        assert "not inside a git repository" not in said
    doctor = phasegate_cli("doctor", "--repo", str(happy_repo), "--json", env=env)
    assert doctor.returncode == 1
    missing = json.loads(doctor.stdout)["missing"]
    assert any("dubious ownership" in m and str(happy_repo) in m for m in missing), missing


def test_help_lists_every_command() -> None:
    proc = phasegate_cli("--help")
    assert proc.returncode == 0, proc.stderr
    section = proc.stdout.split("Commands:", 1)[1]
    lines = [line.split(None, 1) for line in section.splitlines() if line.startswith("  ")]
    listed = [name for name, _ in lines]
    assert listed == [
        "init",
        "doctor",
        "dry-run",
        "run",
        "worker",
        "status",
        "show",
        "resume",
        "feedback",
        "approve-merge",
        "revert",
        "verify-override",
        "cancel",
        "cleanup",
        "priority",
        "diff",
        "watch",
        "import",
        "propose",
        "proposals",
        "approve",
        "reject",
        "replay",
        "serve",
        "events",
        "costs",
        "prune",
        "backup",
        "demo",
        "queue",
        "users",
        "budget",
    ]
    helps = {name: text.strip() for name, text in lines}
    assert helps["init"] == "Write phasegate.toml, from what it finds."
    assert helps["doctor"] == "Check what a run needs; list what is missing."
    assert helps["dry-run"] == "Run a workflow offline, on a throwaway clone."
    assert helps["propose"] == "Run the graph on a ticket; record its proposals."
    assert helps["replay"] == "Re-run a recorded run offline; compare its proposals."
    assert helps["users"] == "The dashboard's people: roles, personal tokens."
    assert helps["budget"] == "Daily and monthly spend budgets."
    assert "acceptance_verification" in proc.stdout


# -- content language --------------------------------------------------------------------------


def test_content_language_zh_renders_the_report_in_chinese(tmp_path: Path) -> None:
    cartridge = scripted_cartridge().replace(
        "auto_merge = true\n", 'auto_merge = true\ncontent_language = "zh"\n', 1
    )
    repo = make_project(tmp_path, cartridge=cartridge)
    code, run = cli_json("run", "--repo", str(repo), "Add the feature")
    assert (code, run["status"]) == (0, "completed")

    comments = forge_comments(repo, run["issue_number"])
    reports = [c for c in comments if f"phasegate:{run['id']}:report:d1" in c]
    assert len(reports) == 1
    assert "## 进度报告: Add the feature" in reports[0]
    assert "开发轮次: 1" in reports[0]
    assert "Progress report" not in reports[0]
    _, detail = cli_json("show", run["id"], "--repo", str(repo))
    assert detail["report"]["content_language"] == "zh"


def test_content_language_en_is_the_default(happy_repo: Path) -> None:
    code, run = cli_json("run", "--repo", str(happy_repo), "Add the feature")
    assert code == 0
    (report,) = [c for c in forge_comments(happy_repo, run["issue_number"]) if ":report:d1" in c]
    assert "## Progress report: Add the feature" in report
    assert "进度报告" not in report


def test_a_decision_is_refused_while_another_process_advances_the_workflow(
    happy_repo: Path,
) -> None:
    cartridge = load_cartridge(happy_repo)
    store = open_store(cartridge.store_url(happy_repo))
    try:
        from phasegate.runtime.engine import Engine

        wf = Engine(happy_repo, cartridge, store).start("t", "ticket")
        # a live holder: this very process, under another lease owner name; its lease
        # outlasts the three CLI calls below even on a loaded machine (each a new
        # interpreter: together they have taken over 60 s)
        import os

        assert store.claim(wf, f"{os.uname().nodename}:{os.getpid()}:other", 900) is not None
        before = store.workflow_row(wf)
        for args in (["resume", wf], ["feedback", wf, "more"], ["resume", wf, "--no-advance"]):
            proc = phasegate_cli(*args, "--repo", str(happy_repo))
            assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
            assert "being advanced by another process" in flat(proc.stderr)
        after = store.workflow_row(wf)
        assert (after["version"], after["user_feedback"]) == (before["version"], None)
    finally:
        store.close()


def test_approve_merge_is_refused_unless_the_workflow_waits(tmp_path: Path) -> None:
    # a build that changes nothing stops development (paused: the default profile)
    repo = make_project(tmp_path, HAPPY_ANSWERS.replace('"feature.txt" = "the feature\\n"', ""))
    proc = phasegate_cli("run", "--repo", str(repo), "--json", "the ticket")
    summary = json.loads(proc.stdout)
    assert (summary["current_phase"], summary["status"]) == ("development", "paused")
    refused = phasegate_cli("approve-merge", summary["id"], "--repo", str(repo))
    assert refused.returncode == 2
    assert "not waiting for a merge approval" in flat(refused.stderr)
    code, detail = cli_json("show", summary["id"], "--repo", str(repo), "--json")
    assert code == 0 and detail["workflow"]["status"] == "paused"
    assert not any(m["kind"] == "merge_approved" for m in detail["milestones"])


def test_status_and_show_still_read_the_state_while_the_cartridge_is_broken(
    happy_repo: Path,
) -> None:
    code, summary = cli_json("run", "--repo", str(happy_repo), "the ticket")
    assert code == 0
    (happy_repo / "phasegate.toml").write_text("[limits]\nmax_plan_round = 3\n")
    status = phasegate_cli("status", "--repo", str(happy_repo), "--json")
    assert status.returncode == 0, status.stderr
    assert [r["id"] for r in json.loads(status.stdout)] == [summary["id"]]
    assert "limits.max_plan_round" in flat(status.stderr)
    show = phasegate_cli("show", summary["id"], "--repo", str(happy_repo))
    assert show.returncode == 0 and "acceptance_verification" in show.stdout
    assert "limits.max_plan_round" in flat(show.stderr)


def test_show_of_a_waiting_workflow_prints_its_report(tmp_path: Path) -> None:
    repo = make_project(tmp_path, cartridge=scripted_cartridge(auto_merge=False))
    code, summary = cli_json("run", "--repo", str(repo), "the ticket")
    assert (code, summary["status"]) == (0, "waiting")
    shown = phasegate_cli("show", summary["id"], "--repo", str(repo)).stdout
    assert "Progress report" in shown and "waiting for `phasegate approve-merge`" in shown


def test_inside_a_workflows_worktree_commands_find_the_repositorys_workflows(
    happy_repo: Path,
) -> None:
    run = phasegate_cli("run", "--no-auto-merge", "--json", "Add feature.txt", cwd=happy_repo)
    workflow = json.loads(run.stdout)
    assert workflow["status"] == "waiting", run.stdout + run.stderr
    worktree = happy_repo / ".phasegate" / "worktrees" / workflow["id"]
    assert (worktree / ".git").is_file()  # a linked worktree: git's top level is here

    listed = phasegate_cli("status", "--json", cwd=worktree)
    assert listed.returncode == 0, listed.stderr
    assert [w["id"] for w in json.loads(listed.stdout)] == [workflow["id"]]
    assert not (worktree / ".phasegate").exists()  # no second, empty store made there


def test_looking_at_a_repository_with_no_store_creates_none(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    listed = phasegate_cli("status", "--json", cwd=repo)
    shown = phasegate_cli("show", "abc123", cwd=repo)
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
    assert shown.returncode == 2 and "abc123" in shown.stderr
    assert not (repo / ".phasegate").exists()
    assert git(repo, "status", "--porcelain") == ""


def test_a_relative_sqlite_store_url_is_the_repositorys_wherever_the_command_runs(
    tmp_path: Path,
) -> None:
    cartridge = scripted_cartridge(extra='[store]\nurl = "sqlite:///rel/state.db"\n')
    repo = make_project(tmp_path, cartridge=cartridge)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ran = phasegate_cli("run", "--repo", str(repo), "--json", "a ticket", cwd=elsewhere)
    assert ran.returncode == 0, ran.stderr
    assert (repo / "rel" / "state.db").is_file() and not (elsewhere / "rel").exists()
    shown = phasegate_cli("status", "--repo", str(repo), "--json", cwd=tmp_path)
    assert [r["id"] for r in json.loads(shown.stdout)] == [json.loads(ran.stdout)["id"]]


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite://state.db"])
def test_a_sqlite_store_url_that_names_no_file_is_refused_naming_the_key(
    tmp_path: Path, url: str
) -> None:
    repo = make_project(tmp_path, cartridge=scripted_cartridge(extra=f'[store]\nurl = "{url}"\n'))
    proc = phasegate_cli("run", "--repo", str(repo), "a ticket")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "store.url" in proc.stderr and "sqlite:///" in proc.stderr, proc.stderr


def test_run_no_advance_files_the_ticket_for_a_worker_and_runs_nothing(tmp_path: Path) -> None:
    repo = make_project(tmp_path)
    code, filed = cli_json("run", "--repo", str(repo), "--no-advance", "a ticket")
    assert code == 0, filed
    assert (filed["current_phase"], filed["status"], filed["agent_runs"]) == (
        "preparation",
        "preparing",
        0,
    )
    worked = phasegate_cli("worker", "--repo", str(repo), "--once")
    assert worked.returncode == 0, worked.stderr
    code, rows = cli_json("status", "--repo", str(repo))
    assert [(r["id"], r["status"]) for r in rows] == [(filed["id"], "completed")]


def test_a_suggested_repo_path_is_quoted_to_paste_as_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from phasegate.cli._app import repo_option

    spaced = tmp_path / "my project"
    spaced.mkdir()
    monkeypatch.chdir(tmp_path)
    assert repo_option({"repo_path": str(spaced)}) == f" --repo '{spaced}'"
    monkeypatch.chdir(spaced)
    assert repo_option({"repo_path": str(spaced)}) == ""  # inside it: no --repo
