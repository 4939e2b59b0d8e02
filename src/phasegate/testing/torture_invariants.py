"""The kill-torture harness's invariants, checked on a settled trial (see
``phasegate.testing.torture`` for the list and the kinds of ``Violation``)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from pathlib import Path

from phasegate.testing.torture_github import check_github
from phasegate.testing.torture_lab import (
    Lab,
    Violation,
    cmdline,
    kill_all,
    trial_processes,
    wait_for,
)

__all__ = ["Violation", "check_invariants"]


# -- the invariants -------------------------------------------------------------------


def check_invariants(lab: Lab, workflow_id: str) -> list[Violation]:
    """Every invariant of the module docstring, checked on the settled trial."""
    found: list[Violation] = []

    def expect(ok: bool, kind: str, detail: str) -> None:
        if not ok:
            found.append(Violation(kind, detail))

    row = lab.row(workflow_id)
    expect(row["status"] == "completed", "not_completed", f"{row['status']}: {row['error']}")
    if lab.forge is not None:
        found += check_github(lab, lab.forge, workflow_id)
    else:
        found += _check_local_forge(lab)
    stuck = lab.query(
        "SELECT phase, kind FROM milestones WHERE workflow_id = ? AND status = 'in_progress'",
        workflow_id,
    )
    expect(not stuck, "in_progress", f"milestones left in_progress: {stuck}")

    wait_for(lambda: not trial_processes(lab.root), 5.0, poll_s=0.1)
    alive = [f"{pid} {cmdline(pid)}" for pid in trial_processes(lab.root)]
    expect(not alive, "process_alive", f"still running: {alive}")
    kill_all(lab.root, None)

    git_dir = lab.repo / ".git"
    locks = [str(p.relative_to(git_dir)) for p in git_dir.rglob("*.lock")]
    locks = [p for p in locks if not p.startswith("phasegate/")]  # phasegate's own flock files
    expect(not locks, "git_lock", f"lock files left: {locks}")
    worktrees = [
        line[len("worktree ") :]
        for line in lab._git("worktree", "list", "--porcelain").splitlines()
        if line.startswith("worktree ")
    ]
    expect(worktrees == [str(lab.repo)], "worktree_left", f"worktrees: {worktrees}")
    leftovers = [
        str(p)
        for folder in (lab.repo / ".phasegate" / "worktrees", git_dir / "phasegate")
        if folder.is_dir()
        for p in folder.iterdir()
        if p.is_dir()
    ]
    expect(not leftovers, "worktree_left", f"checkout directories left: {leftovers}")

    found += _check_change(lab, workflow_id)

    with contextlib.suppress(subprocess.CalledProcessError):
        lab._git("stash", "list")  # harmless; makes sure the person's git still runs
    probe = subprocess.run(
        ["git", "-c", "user.name=p", "-c", "user.email=p@l", "branch", "torture-probe"],
        cwd=lab.repo, capture_output=True, text=True,
    )  # fmt: skip
    deleted = subprocess.run(
        ["git", "branch", "-D", "torture-probe"], cwd=lab.repo, capture_output=True, text=True
    )
    status = subprocess.run(["git", "status"], cwd=lab.repo, capture_output=True, text=True)
    expect(
        probe.returncode == 0 and deleted.returncode == 0 and status.returncode == 0,
        "repository",
        f"git branch/-D/status: {probe.stderr}{deleted.stderr}{status.stderr}".strip(),
    )
    return found


def _check_local_forge(lab: Lab) -> list[Violation]:
    """One issue, one pull request, no marker twice in the store; one merge on main."""
    found: list[Violation] = []

    def expect(ok: bool, kind: str, detail: str) -> None:
        if not ok:
            found.append(Violation(kind, detail))

    repo_key = str(lab.repo)
    issues = lab.query("SELECT count(*) FROM forge_issues")[0][0]
    prs = lab.query("SELECT count(*) FROM forge_pull_requests")[0][0]
    expect(issues == 1, "issues", f"{issues} issues in {repo_key}")
    expect(prs == 1, "pull_requests", f"{prs} pull requests")
    markers = lab.query(
        "SELECT marker, count(*) FROM forge_comments WHERE marker IS NOT NULL "
        "GROUP BY marker HAVING count(*) > 1"
    )
    expect(not markers, "duplicate_comment", f"markers posted twice: {markers}")

    merges = lab._git("rev-list", "--first-parent", "--merges", "main").split()
    expect(len(merges) == 1, "merges", f"{len(merges)} merge commits on main")
    first_parent = lab._git("rev-list", "--first-parent", "main").split()
    expect(
        len(first_parent) == lab.base_commits + 1,
        "merges",
        f"main's first-parent line has {len(first_parent)} commits; "
        f"{lab.base_commits} + one merge expected",
    )
    return found


def _check_change(lab: Lab, workflow_id: str) -> list[Violation]:
    """The base holds one whole line per build run recorded ``ok`` and kept (classic);
    the applied proposal's patch exactly once (graph)."""
    if lab.mode == "graph":
        return _check_graph_change(lab, workflow_id)
    found = []
    try:
        text = lab._git("show", "main:changes.txt", cwd=lab.base_repo) + "\n"
    except subprocess.CalledProcessError:
        text = ""
    lines = text.splitlines(keepends=True) if text.strip() else []
    recorded = lab.query(
        "SELECT count(*) FROM agent_runs WHERE workflow_id = ? AND role = 'build' "
        "AND outcome = 'ok'",
        workflow_id,
    )[0][0]
    discarded = lab.query(
        "SELECT count(*) FROM milestones WHERE workflow_id = ? AND kind = 'attempt_discarded' "
        "AND json_extract(data, '$.recorded_run') = 1",
        workflow_id,
    )[0][0]
    kept = recorded - discarded
    if len(lines) != kept:
        found.append(
            Violation(
                "change",
                f"main's changes.txt has {len(lines)} line(s); {recorded} build run(s) "
                f"recorded ok, {discarded} of them discarded: {kept} expected",
            )
        )
    # The same rule by phasegate's own accounting: every ok build run kept (a trailer on
    # main names it), discarded as evidence, or unchanged; one line per kept run.
    from phasegate.phases.attempts import account_build_runs
    from phasegate.store import open_store

    store = open_store(f"sqlite:///{lab.db}")
    try:
        runs = account_build_runs(store, lab.base_repo, workflow_id, "main")
    finally:
        store.close()
    if runs["unaccounted"] or len(runs["kept"]) != len(lines):
        found.append(
            Violation(
                "change",
                f"{len(lines)} line(s) on main; build runs by phasegate's accounting: {runs}",
            )
        )
    with tempfile.TemporaryDirectory(prefix="torture-main-") as scratch:
        where = lab.repo
        if lab.forge is not None:  # GitHub's main, in a directory of its own
            where = Path(scratch)
            tar = subprocess.run(
                ["git", "archive", "main"], cwd=lab.base_repo, check=True, capture_output=True
            )
            subprocess.run(["tar", "-x", "-C", scratch], input=tar.stdout, check=True)
        check = subprocess.run(
            [sys.executable, "check_changes.py"], cwd=where, capture_output=True, text=True
        )
    if check.returncode != 0 and row_completed(lab, workflow_id):
        found.append(Violation("base_checks", (check.stderr or check.stdout).strip()[-300:]))
    return found


def _check_graph_change(lab: Lab, workflow_id: str) -> list[Violation]:
    from phasegate.demo import _CALC_AFTER

    found = []
    applied = lab.query(
        "SELECT count(*) FROM proposals WHERE workflow_id = ? AND kind = 'draft_pr_create' "
        "AND status = 'applied'",
        workflow_id,
    )[0][0]
    if applied != 1:
        found.append(Violation("change", f"{applied} draft PR proposals applied, 1 expected"))
    landed = lab._git("log", "--format=%B", "main").count("Phasegate-Proposal:")
    if landed != 1:
        found.append(Violation("change", f"{landed} Phasegate-Proposal commits on main"))
    try:
        calc = lab._git("show", "main:calc/__init__.py") + "\n"
    except subprocess.CalledProcessError:
        calc = ""
    if calc != _CALC_AFTER:
        found.append(
            Violation(
                "change", f"main's calc/__init__.py is not the patch applied once: {calc[-200:]!r}"
            )
        )
    check = subprocess.run(
        [sys.executable, "-m", "unittest", "discover", "-s", "tests"],
        cwd=lab.repo, capture_output=True, text=True,
    )  # fmt: skip
    if check.returncode != 0:
        found.append(Violation("base_checks", check.stderr.strip()[-300:]))
    return found


def row_completed(lab: Lab, workflow_id: str) -> bool:
    return lab.row(workflow_id)["status"] == "completed"
