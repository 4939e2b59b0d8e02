"""Retiring failed and cancelled workflows' worktrees and branches: after their days, or now.

``landing_areas.keep_failed_days`` and ``keep_cancelled_days`` say how many
days after a failed or cancelled workflow ended (its row's last change) its
worktree and its local branch are removed; unset, they are kept, as a
merged workflow's are not (docs/worktrees.md: retention). ``phasegate
cleanup`` and every worker's cleanup pass apply them (``expire``);
``phasegate cleanup --all`` retires every failed and cancelled workflow's now
(``retire``). Nothing else is ever touched: a workflow in any other status
(running, paused, waiting) keeps its worktree whatever its age. A workflow
that ended during its preparation never recorded its worktree or branch: they
are found where preparation makes them, the worktree root's ``<id>`` and
``phasegate/<id>-<slug>``.

The branch on a team's forge is never deleted here: a failed workflow's branch
may hold work, and where it was pushed the forge keeps it (a resume brings it
back: ``runtime.healing``). What was never pushed, and every branch of the
local forge (whose branches are the repository's), is gone with the local
branch; each outcome says how many commits that was and the head they ended
at, which ``git branch BRANCH HEAD`` brings back until git prunes it. A
retirement holds the workflow's lease (``decide``), so a person resuming the
workflow at that moment is never raced; it commits no move, only a ``worktree_retired``
milestone and event, and releases the workflow's ports. One that git refuses
(a person's checkout holds the branch) commits nothing and is tried again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from phasegate.config.cartridge import Cartridge, CartridgeError
from phasegate.core.contract import (
    CANCELLED,
    EventWrite,
    MilestoneWrite,
    PhasegateError,
    PhaseResult,
    WorkflowContext,
)
from phasegate.git.command import run_git
from phasegate.git.workspace import GitError, Workspace
from phasegate.phases.cleanup import clean_up
from phasegate.phases.preparation import branch_name
from phasegate.store import Store, StoreUnavailable

log = logging.getLogger(__name__)

__all__ = ["KIND", "RETIRABLE", "Retirable", "candidates", "expire", "retire"]

#: The milestone and the event of a retirement.
KIND = "worktree_retired"
#: The statuses whose worktrees may be retired.
RETIRABLE = ("failed", CANCELLED)


class _NotRetirable(Exception):
    """The workflow moved out of failed and cancelled since it was found."""


class _NotRetired(Exception):
    """Git or the file system refused a step; the message says which and why."""


class _Engine(Protocol):
    """What retiring needs of an engine (``runtime.engine.Engine`` is one)."""

    store: Store
    repo: Path
    cartridge: Cartridge

    def decide(
        self, workflow_id: str, decision: Callable[[WorkflowContext], PhaseResult]
    ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Retirable:
    """A failed or cancelled workflow that still has a worktree or a local branch here.

    ``head``: the branch's last commit (``git branch BRANCH HEAD`` brings the branch
    back until git prunes it); ``commits``: its commits beyond its base;
    ``unpushed``: whether those commits live only here (never pushed, or the
    local forge, whose branches are the repository's)."""

    id: str
    status: str
    ended_at: datetime
    worktree: str | None
    branch: str | None
    head: str | None
    commits: int
    unpushed: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "ended_at": self.ended_at.isoformat(),
            "worktree": self.worktree,
            "branch": self.branch,
            "head": self.head,
            "commits": self.commits,
            "unpushed": self.unpushed,
        }


def keep_days(cartridge: Cartridge, status: str) -> float | None:
    """The days a workflow ended in ``status`` keeps its worktree; None: for good."""
    areas = cartridge.landing_areas
    return areas.keep_cancelled_days if status == CANCELLED else areas.keep_failed_days


def candidates(engine: _Engine, *, workspace: Workspace | None = None) -> list[Retirable]:
    """Every failed or cancelled workflow of the engine's repository (this clone)
    whose worktree or local branch is still there, oldest first. Reads git's
    files, runs git only for a branch that is there. Raises StoreUnavailable."""
    workspace = workspace or Workspace()
    store, repo = engine.store, engine.repo.resolve()
    # The local forge's branches are the repository's own: deleted here, gone there.
    remote = engine.cartridge.forge.kind != "local"
    found = []
    for row in store.list_workflows(RETIRABLE):
        if row["repo_path"] != str(repo):
            continue
        worktree, branch = _left(engine, repo, row)
        here = bool(worktree) and Path(str(worktree)).exists()
        has_branch = (
            bool(branch)
            and branch != row["base_branch"]
            and workspace.branch_exists(repo, str(branch))
        )
        if not here and not has_branch:
            continue
        head, commits, unpushed = (
            _work(store, repo, row, str(branch), remote) if has_branch else (None, 0, False)
        )
        found.append(
            Retirable(
                id=row["id"],
                status=row["status"],
                ended_at=row["updated_at"],
                worktree=str(worktree) if here else None,
                branch=str(branch) if has_branch else None,
                head=head,
                commits=commits,
                unpushed=unpushed,
            )
        )
    return found


def _left(engine: _Engine, repo: Path, row: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The worktree path and branch name the workflow of ``row`` has, or left behind.

    A workflow that ended during its preparation never committed them: its worktree
    is then the one preparation makes (the worktree root's ``<id>``) and its branch
    the one it names (``phasegate/<id>-<slug>``), both this workflow's alone.
    """
    worktree, branch = row.get("worktree_path"), row.get("branch_name")
    if not worktree:
        try:
            worktree = str(engine.cartridge.landing_areas.worktree_dir(repo) / row["id"])
        except CartridgeError:  # a worktree_root refused now: no worktree was made there
            worktree = None
    if not branch:
        branch = branch_name(row["id"], row["title"])
    return (str(worktree) if worktree else None), str(branch)


def _work(
    store: Store, repo: Path, row: Mapping[str, Any], branch: str, remote: bool
) -> tuple[str, int, bool]:
    """The branch's head, its commits beyond its base, and whether they live only here:
    on the local forge (``remote`` False) always, else when its head was never pushed."""
    counted = run_git(["rev-list", "--count", f"{row['base_branch']}..{branch}"], repo)
    commits = int(counted.stdout.strip() or 0) if counted.returncode == 0 else 0
    head = run_git(["rev-parse", "--verify", "-q", branch], repo).stdout.strip()
    pushed = {
        str(m.data.get("params", {}).get("sha"))
        for m in store.milestones(row["id"])
        if m.kind == "branch_pushed" and m.status == "completed"
    }
    return head, commits, commits > 0 and (not remote or head not in pushed)


def expire(
    engine: _Engine,
    now: datetime,
    *,
    busy: type[Exception],
    workspace: Workspace | None = None,
) -> list[dict[str, Any]]:
    """Retire each workflow ``candidates`` finds whose days are over (``keep_days``
    after it ended, by ``now``); their outcomes (``retire``). Nothing when the
    cartridge sets neither ``keep_failed_days`` nor ``keep_cancelled_days``."""
    areas = engine.cartridge.landing_areas
    if areas.keep_failed_days is None and areas.keep_cancelled_days is None:
        return []
    due = []
    try:
        found_all = candidates(engine, workspace=workspace)
    except GitError as exc:  # a repository git cannot read now: the next pass looks again
        log.warning("worktree retention skipped: %s", exc)
        return []
    for found in found_all:
        days = keep_days(engine.cartridge, found.status)
        if days is not None and found.ended_at + timedelta(days=days) <= now:
            due.append(found)
    return retire(engine, due, why="retention", busy=busy, workspace=workspace)


def retire(
    engine: _Engine,
    found: Iterable[Retirable],
    *,
    why: str,
    busy: type[Exception],
    workspace: Workspace | None = None,
) -> list[dict[str, Any]]:
    """Remove each workflow's worktree and local branch, under its lease; one outcome
    each: ``Retirable.as_dict`` with ``retired`` (``completed``, ``failed`` with
    ``reason``, ``busy`` when another process holds it, ``skipped`` when it is
    no longer failed or cancelled). A failed one commits nothing, so its days
    still count from its end and the next pass tries again. ``why``
    (``retention``, ``cleanup --all``) is recorded; ``busy`` is the error
    ``decide`` refuses a held workflow with (``LeaseHeld``). Raises
    StoreUnavailable."""
    workspace = workspace or Workspace()
    outcomes = []
    for one in found:
        said: dict[str, Any] = {**one.as_dict(), "retired": "skipped", "reason": None}
        try:
            engine.decide(one.id, _retiring(engine.store, workspace, one, why, said))
        except busy as exc:
            said.update(retired="busy", reason=str(exc))
        except _NotRetirable as exc:
            said.update(reason=str(exc))
        except _NotRetired as exc:
            log.warning("the worktree of %s is not retired: %s", one.id, exc)
            said.update(retired="failed", reason=str(exc))
        except StoreUnavailable:
            raise  # the worker waits the outage out, and the next pass tries again
        except PhasegateError as exc:  # git or the commit: this one fails, the rest go on
            said.update(retired="failed", reason=str(exc))
        outcomes.append(said)
    return outcomes


def _retiring(
    store: Store, workspace: Workspace, one: Retirable, why: str, said: dict[str, Any]
) -> Callable[[WorkflowContext], PhaseResult]:
    """The decision retiring ``one``: a commit that moves nothing (same status and
    error) carrying the ``worktree_retired`` milestone and event; ``said`` gets
    the outcome."""

    def decision(ctx: WorkflowContext) -> PhaseResult:
        if ctx.status not in RETIRABLE:  # resumed meanwhile: its worktree is in use
            raise _NotRetirable(f"{ctx.id} is {ctx.status} now")
        repo = Path(ctx.repo_path)
        # Ended during its preparation: what it left is what ``candidates`` found.
        path = ctx.worktree_path or one.worktree
        worktree = Path(path) if path else None
        branch = ctx.branch_name or one.branch
        problems: list[str] = []
        if branch and branch != ctx.base_branch:
            problems += clean_up(workspace, repo, worktree, branch).problems
        elif worktree is not None:
            try:
                workspace.remove_worktree(repo, worktree)
            except (GitError, OSError) as exc:
                problems.append(f"removing the worktree {worktree}: {exc}")
        if problems:
            # Nothing committed: the workflow's end stays its end, and the next pass
            # (or cleanup) tries again.
            raise _NotRetired("; ".join(problems))
        store.release_ports(ctx.id)
        said.update(retired="completed")
        lost = f"; {one.commits} commit(s) never pushed are gone" if one.unpushed else ""
        data = {"why": why, **said}
        return PhaseResult(
            "failed",
            status=ctx.status,
            reason=ctx.error or "",
            milestones=(
                MilestoneWrite(
                    KIND,
                    key=f"v{ctx.version}",
                    summary=f"worktree and local branch removed ({why}){lost}",
                    data=data,
                ),
            ),
            events=(EventWrite(KIND, data),),
        )

    return decision
