"""The kill-torture harness's invariants, checked on a settled trial (see
``support.torture`` for the list and the kinds of ``Violation``).

The store is read through the lab's own Store (``Lab.read``: SQLAlchemy Core),
so the same checks hold on SQLite and on PostgreSQL. A trial of several
workflows (postgres) is checked for each, and the forge and the base for all:
one issue, one pull request and one merge on the base per workflow.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from phasegate.store import tables as t

from support.torture_lab import (
    Lab,
    Violation,
    cmdline,
    kill_all,
    trial_processes,
    wait_for,
)

__all__ = ["Violation", "check_invariants"]


# -- the invariants -------------------------------------------------------------------


def check_invariants(lab: Lab, workflow_ids: Sequence[str]) -> list[Violation]:
    """Every invariant of ``support.torture``'s docstring, checked on the
    settled trial of ``workflow_ids`` (a trial on a forge has one)."""
    found: list[Violation] = []

    def expect(ok: bool, kind: str, detail: str) -> None:
        if not ok:
            found.append(Violation(kind, detail))

    m = t.milestones.c
    for workflow_id in workflow_ids:
        row = lab.row(workflow_id)
        expect(
            row["status"] == "completed",
            "not_completed",
            f"{workflow_id} {row['status']}: {row['error']}",
        )
        stuck = lab.read(
            sa.select(m.phase, m.kind).where(
                m.workflow_id == workflow_id, m.status == "in_progress"
            )
        )
        expect(not stuck, "in_progress", f"{workflow_id}'s milestones left in_progress: {stuck}")
    if lab.forge is not None:
        (workflow_id,) = workflow_ids
        found += lab.forge.check(lab, workflow_id)
    else:
        found += _check_local_forge(lab, workflow_ids)

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

    for workflow_id in workflow_ids:
        found += _check_change(lab, workflow_id)
    found += _check_base(lab, workflow_ids)

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


def _check_local_forge(lab: Lab, workflow_ids: Sequence[str]) -> list[Violation]:
    """One issue and one pull request (of the workflow's branch) per workflow, no
    marker twice in the store; one merge on main per workflow, nothing else."""
    found: list[Violation] = []

    def expect(ok: bool, kind: str, detail: str) -> None:
        if not ok:
            found.append(Violation(kind, detail))

    n = len(workflow_ids)
    issues = lab.read(sa.select(t.forge_issues.c.number))
    heads = sorted(h for (h,) in lab.read(sa.select(t.forge_pull_requests.c.head)))
    branches = sorted(str(lab.row(w)["branch_name"]) for w in workflow_ids)
    expect(len(issues) == n, "issues", f"{len(issues)} issues in {lab.repo}; {n} expected")
    expect(heads == branches, "pull_requests", f"pull requests by head: {heads}; {branches}")
    c = t.forge_comments.c
    markers = lab.read(
        sa.select(c.marker, sa.func.count())
        .where(c.marker.is_not(None))
        .group_by(c.marker)
        .having(sa.func.count() > 1)
    )
    expect(not markers, "duplicate_comment", f"markers posted twice: {markers}")

    merges = lab._git("rev-list", "--first-parent", "--merges", "main").split()
    expect(len(merges) == n, "merges", f"{len(merges)} merge commits on main; {n} expected")
    first_parent = lab._git("rev-list", "--first-parent", "main").split()
    expect(
        len(first_parent) == lab.base_commits + n,
        "merges",
        f"main's first-parent line has {len(first_parent)} commits; "
        f"{lab.base_commits} + {n} merge(s) expected",
    )
    return found


def _check_change(lab: Lab, workflow_id: str) -> list[Violation]:
    """The base holds one whole line per build run recorded ``ok`` and kept, in the
    workflow's changes file (classic); the applied proposal's patch exactly once
    (graph)."""
    if lab.mode == "graph":
        return _check_graph_change(lab, workflow_id)
    found = []
    name = lab.changes_file(workflow_id)
    try:
        text = lab._git("show", f"main:{name}", cwd=lab.base_repo) + "\n"
    except subprocess.CalledProcessError:
        text = ""
    lines = text.splitlines(keepends=True) if text.strip() else []
    runs = lab.store.agent_runs(workflow_id)
    recorded = sum(1 for r in runs if r["role"] == "build" and r["outcome"] == "ok")
    discarded = sum(
        1
        for ms in lab.store.milestones(workflow_id)
        if ms.kind == "attempt_discarded" and ms.data.get("recorded_run") in (1, True)
    )
    kept = recorded - discarded
    if len(lines) != kept:
        found.append(
            Violation(
                "change",
                f"main's {name} has {len(lines)} line(s); {recorded} build run(s) "
                f"recorded ok, {discarded} of them discarded: {kept} expected",
            )
        )
    # The same rule by phasegate's own accounting: every ok build run kept (a trailer on
    # main names it), discarded as evidence, or unchanged; one line per kept run.
    from phasegate.phases.attempts import account_build_runs

    accounted = account_build_runs(lab.store, lab.base_repo, workflow_id, "main")
    if accounted["unaccounted"] or len(accounted["kept"]) != len(lines):
        found.append(
            Violation(
                "change",
                f"{len(lines)} line(s) in {name} on main; build runs by phasegate's "
                f"accounting: {accounted}",
            )
        )
    return found


def _check_base(lab: Lab, workflow_ids: Sequence[str]) -> list[Violation]:
    """The base's own checks pass once every workflow completed (classic: on main,
    the forge's main on a forge; graph: its tests, in ``_check_graph_change``)."""
    found: list[Violation] = []
    if lab.mode == "graph":
        return found
    with tempfile.TemporaryDirectory(prefix="torture-main-") as scratch:
        where = lab.repo
        if lab.forge is not None:  # the forge's main, in a directory of its own
            where = Path(scratch)
            tar = subprocess.run(
                ["git", "archive", "main"], cwd=lab.base_repo, check=True, capture_output=True
            )
            subprocess.run(["tar", "-x", "-C", scratch], input=tar.stdout, check=True)
        check = subprocess.run(
            [sys.executable, "check_changes.py"], cwd=where, capture_output=True, text=True
        )
    if check.returncode != 0 and all(row_completed(lab, w) for w in workflow_ids):
        found.append(Violation("base_checks", (check.stderr or check.stdout).strip()[-300:]))
    return found


def _check_graph_change(lab: Lab, workflow_id: str) -> list[Violation]:
    from phasegate.tools.demo import _CALC_AFTER

    found = []
    p = t.proposals.c
    applied = len(
        lab.read(
            sa.select(p.id).where(
                p.workflow_id == workflow_id, p.kind == "draft_pr_create", p.status == "applied"
            )
        )
    )
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
