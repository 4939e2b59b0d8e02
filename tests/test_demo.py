"""``phasegate demo``: the real console script takes the sample project to completed.

Each test runs the installed ``phasegate`` executable in a subprocess and then
looks at what it left behind with the CLI's own ``status``/``show`` and with
plain git: the change must be on ``main`` and the sample's tests must pass
there, in a checkout phasegate never touched.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from phasegate.operations import login_name
from phasegate.store import open_store

from conftest import git, phasegate_cli

pytestmark = pytest.mark.slow

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
ROLES = {"plan", "plan_review", "build", "review", "verification"}
SUMMARY_KEYS = {"id", "title", "current_phase", "status", "tokens", "cost_usd"}


def _ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n"
        f"{proc.stderr[-4000:]}"
    )
    return proc


def _json(proc: subprocess.CompletedProcess[str]) -> Any:
    _ok(proc)
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"stdout is not JSON ({exc}):\n{proc.stdout[:4000]}") from None


def _status(repo: Path) -> list[dict[str, Any]]:
    rows = _json(phasegate_cli("status", "--json", "--repo", str(repo), timeout=60))
    assert isinstance(rows, list)
    return rows


def _show(repo: Path, workflow_id: str) -> dict[str, Any]:
    return _json(phasegate_cli("show", workflow_id, "--repo", str(repo), "--json", timeout=60))


def _unittest_on_main(repo: Path, scratch: Path) -> subprocess.CompletedProcess[str]:
    """The sample's own test suite, verbose, in a fresh detached worktree of ``main``."""
    checkout = scratch / "main-checkout"
    git(repo, "worktree", "add", "-q", "--detach", str(checkout), "main")
    try:
        return subprocess.run(
            [sys.executable, "-m", "unittest", "discover", "-s", "tests", "-v"],
            cwd=checkout,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        git(repo, "worktree", "remove", "--force", str(checkout))


def _assert_landed_on_main(repo: Path, row: dict[str, Any], scratch: Path) -> None:
    """The demo's change is merged into main, main's tests pass, and nothing is left over."""
    calc = git(repo, "show", "main:calc/__init__.py")
    assert "def multiply(a, b):" in calc
    # main's tip is the merge commit the workflow recorded, with the branch as second parent.
    assert row["merge_sha"] == git(repo, "rev-parse", "main")
    parents = git(repo, "rev-list", "--parents", "-n", "1", "main").split()[1:]
    assert len(parents) == 2, parents
    assert f"phasegate workflow {row['id']}" in git(repo, "log", "-1", "--format=%B", "main")
    assert sorted(git(repo, "diff", "--name-only", "main^1", "main").splitlines()) == [
        "calc/__init__.py",
        "tests/test_calc.py",
    ]

    tests = _unittest_on_main(repo, scratch)
    assert tests.returncode == 0, tests.stderr[-4000:]
    # unittest -v reports on stderr: the multiply tests really ran, next to the old one.
    assert re.search(r"test_multiply \(.*MultiplyTest.*\) \.\.\. ok", tests.stderr), tests.stderr
    assert "test_multiply_by_zero" in tests.stderr
    assert "test_add" in tests.stderr
    assert re.search(r"^Ran 3 tests", tests.stderr, re.M), tests.stderr

    # The merge ran in the checked-out main: it moved along and is clean; the
    # workflow's worktree and branch were cleaned up.
    assert git(repo, "status", "--porcelain", "--untracked-files=no") == ""
    assert "def multiply(a, b):" in (repo / "calc" / "__init__.py").read_text()
    assert git(repo, "branch", "--list", "phasegate/*") == ""
    assert len(git(repo, "worktree", "list", "--porcelain").split("\nworktree ")) == 1


def test_demo_dir_runs_to_completed_and_lands_on_main(tmp_path: Path) -> None:
    repo = tmp_path / "calc"
    proc = _ok(phasegate_cli("demo", "--dir", str(repo), timeout=300))
    assert f"sample project: {repo}" in proc.stdout
    assert re.search(r"workflow [0-9a-f]{8}: completed · completed", proc.stdout), proc.stdout

    rows = _status(repo)
    assert len(rows) == 1
    row = rows[0]
    assert row.keys() >= SUMMARY_KEYS
    assert row["title"] == "Add multiply() to calc"
    assert (row["current_phase"], row["status"]) == ("completed", "completed")
    assert row["error"] is None
    # Usage is summed over every agent run (each scripted answer reports
    # 1200 + 300 tokens and $0.0042): at least one run per role.
    assert row["agent_runs"] >= len(ROLES)
    assert row["tokens"] == 1500 * row["agent_runs"]
    assert row["cost_usd"] == pytest.approx(0.0042 * row["agent_runs"])
    # Started by the person who ran it, as `phasegate run` records it (the board says so).
    store = open_store(f"sqlite:///{repo / '.phasegate' / 'state.db'}")
    try:
        assert store.workflow_row(row["id"])["state"]["started_by"] == login_name()
    finally:
        store.close()

    _assert_landed_on_main(repo, row, tmp_path)


def test_demo_s_hint_names_phasegate_as_any_directory_can_call_it(tmp_path: Path) -> None:
    """Started by a relative path that PATH does not find (right after the README's
    set-up), demo's hint names the program by its absolute path: it works as given
    wherever the person is."""
    exe = Path(sys.executable).parent / "phasegate"
    proc = subprocess.run(
        [str(Path("bin") / "phasegate"), "demo", "--dir", str(tmp_path / "calc")],
        cwd=exe.parent.parent,  # the venv: bin/phasegate from there
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PATH": "/usr/bin:/bin", "COLUMNS": "500"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hint = re.search(r"try `(\S+) show [0-9a-f]{8} --repo ", proc.stdout)
    assert hint, proc.stdout
    assert Path(hint.group(1)).is_absolute()
    assert Path(hint.group(1)).resolve() == exe.resolve()


def test_demo_json_prints_the_summary_and_show_has_the_timeline(tmp_path: Path) -> None:
    repo = tmp_path / "calc"
    summary = _json(phasegate_cli("demo", "--json", "--dir", str(repo), timeout=300))
    assert isinstance(summary, dict)
    assert summary.keys() >= SUMMARY_KEYS
    assert (summary["current_phase"], summary["status"]) == ("completed", "completed")
    assert summary["completed_at"] is not None
    assert summary["issue_number"] is not None and summary["pr_number"] is not None

    # The JSON summary is the same workflow `status` reports.
    [row] = _status(repo)
    assert row["id"] == summary["id"] and row["merge_sha"] == summary["merge_sha"]

    detail = _show(repo, summary["id"])
    assert detail["workflow"]["status"] == "completed"
    # `status`, `show` and the summary report the same UTC-aware timestamps.
    for key in ("created_at", "updated_at", "completed_at"):
        assert row[key] == detail["workflow"][key] == summary[key], key
        assert datetime.fromisoformat(row[key]).utcoffset() == timedelta(0), row[key]
    timeline = detail["timeline"]
    # The demo's plan is sent back once, but a retry is not a phase change:
    # every phase appears exactly once, in lifecycle order, in time order.
    assert [step["phase"] for step in timeline] == LIFECYCLE
    times = [step["at"] for step in timeline]
    assert all(times) and times == sorted(times)

    milestones = {(m["kind"], m["status"]) for m in detail["milestones"]}
    for kind in (
        "issue_created",
        "plan_finalized",
        "tests_run",
        "pr_reviewed",
        "merge_completed",
        "acceptance_verification",
        "issue_closed",
    ):
        assert (kind, "completed") in milestones, kind
    assert not any(m["status"] == "in_progress" for m in detail["milestones"])
    assert {r["role"] for r in detail["agent_runs"]} == ROLES
    assert all(r["outcome"] == "ok" for r in detail["agent_runs"])
    assert detail["report"] is not None

    _assert_landed_on_main(repo, summary, tmp_path)


def test_demo_without_dir_uses_a_temp_dir(tmp_path: Path) -> None:
    # mkdtemp honours TMPDIR: the sample lands under tmp_path, where we can find it.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = _ok(phasegate_cli("demo", timeout=300, env={"TMPDIR": str(scratch)}))
    match = re.search(r"^sample project: (\S+)$", proc.stdout, re.M)
    assert match, proc.stdout
    repo = Path(match.group(1))
    assert repo.is_relative_to(scratch) and repo.name == "calc"
    assert re.search(r"workflow [0-9a-f]{8}: completed · completed", proc.stdout)

    [row] = _status(repo)
    assert (row["current_phase"], row["status"]) == ("completed", "completed")
    _assert_landed_on_main(repo, row, tmp_path)


def test_demo_refuses_a_non_empty_dir(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()
    (target / "keep.txt").write_text("mine\n")
    proc = phasegate_cli("demo", "--dir", str(target), timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "is not empty" in proc.stderr
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]


GRAPH_ROLES = {
    "plan",
    "plan_alternative",
    "plan_arbitrate",
    "plan_adversary",
    "build",
    "review",
    "review_adversary",
    "verification",
}


def _proposals(repo: Path) -> list[dict[str, Any]]:
    rows = _json(phasegate_cli("proposals", "--json", "-C", str(repo), timeout=60))
    assert isinstance(rows, list)
    return rows


def test_demo_graph_runs_the_development_graph_and_lands_its_proposal(tmp_path: Path) -> None:
    repo = tmp_path / "calc"
    summary = _json(phasegate_cli("demo", "--graph", "--json", "--dir", str(repo), timeout=300))
    assert (summary["current_phase"], summary["status"]) == ("completed", "completed"), summary
    assert summary["error"] is None
    cartridge = (repo / "phasegate.toml").read_text()
    assert "[graph]\nenabled = true" in cartridge and "[roles.plan_review]" not in cartridge

    # One draft PR, auto under the demo's auto profile, applied by the apply arm
    # after its checks (the sample's unittest suite) passed in a scratch worktree.
    [proposal] = _proposals(repo)
    assert (proposal["kind"], proposal["mode"], proposal["status"], proposal["decided_by"]) == (
        "draft_pr_create",
        "auto",
        "applied",
        "auto",
    )
    assert proposal["workflow_id"] == summary["id"]
    evidence = {e["kind"]: e["data"] for e in proposal["evidence"]}
    assert {"plan_competition", "plan_attack", "review", "checks"} <= set(evidence)
    assert (evidence["plan_competition"]["choice"], evidence["plan_competition"]["losers"]) == (
        "first",
        ["second"],
    )
    assert evidence["plan_competition"]["price"]
    assert (evidence["plan_attack"]["verdict"], evidence["plan_attack"]["revised"]) == (
        "revise",
        True,
    )
    assert len(evidence["plan_attack"]["objections"]) == 2
    assert (evidence["review"]["tier"], evidence["review"]["review"]) == (1, "approve")
    assert evidence["review"]["adversary"] == "approve"
    assert evidence["checks"]["passed"] is True
    assert sorted(evidence["change_facts"]["paths"]) == ["calc/__init__.py", "tests/test_calc.py"]

    # The graph ran: its milestones, its roles (and no plan_review), the revised plan.
    detail = _show(repo, summary["id"])
    milestones = {(m["kind"], m["status"]) for m in detail["milestones"]}
    for kind in ("plan_finalized", "graph_run", "tests_run", "pr_reviewed", "merge_completed"):
        assert (kind, "completed") in milestones, kind
    runs = detail["agent_runs"]
    assert {r["role"] for r in runs} == GRAPH_ROLES
    assert all(r["outcome"] == "ok" for r in runs)
    assert [r["role"] for r in runs].count("plan") == 2  # the plan adversary's one revision
    [finalized] = [m for m in detail["milestones"] if m["kind"] == "plan_finalized"]
    assert "MultiplyTest" in finalized["data"]["plan"]

    # The landed commit names the proposal; main holds multiply() and its tests pass.
    branch_log = git(repo, "log", "--format=%B", "main^2")
    assert f"Phasegate-Proposal: {proposal['id']}" in branch_log
    _assert_landed_on_main(repo, summary, tmp_path)

    # The recorded run replays to the same proposal, offline.
    replayed = phasegate_cli("replay", proposal["run_id"], "-C", str(repo), timeout=60)
    assert _ok(replayed).stdout.startswith("identical: 1 proposal(s)"), replayed.stdout


def test_demo_graph_under_the_review_profile_waits_for_a_person_to_approve(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "calc"
    proc = phasegate_cli("demo", "--graph", "--profile", "review", "--dir", str(repo), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # waiting for a person
    out = " ".join(proc.stdout.split())
    assert re.search(r"workflow [0-9a-f]{8}: development · awaiting_approval", out), out
    assert "graph_run r1" in out  # `show` lists the graph's run
    [proposal] = _proposals(repo)
    assert (proposal["mode"], proposal["status"]) == ("propose", "proposed")
    assert f"phasegate approve {proposal['id']}" in out
    assert "def multiply" not in git(repo, "show", "main:calc/__init__.py")

    approved = _json(
        phasegate_cli("approve", proposal["id"], "--by", "ana", "-C", str(repo), "--json")
    )
    # The review profile merges only when a person says so, after the report.
    assert (approved["workflow"]["current_phase"], approved["workflow"]["status"]) == (
        "wait",
        "waiting",
    ), approved
    [landed] = _proposals(repo)
    assert (landed["status"], landed["decided_by"]) == ("applied", "ana")
