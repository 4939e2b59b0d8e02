"""A build attempt's journal, and what re-entering development after a crash does
with what a dead attempt left (issue 9, item 2; DESIGN.md §1).

The rule is development's (its docstring, re-entry point): an attempt starts by
journaling ``build_attempt`` in_progress with the branch's HEAD as ``start``;
its commit carries ``Phasegate-Attempt: <workflow>/d<R>/a<N>/<token>`` and
``Phasegate-Agent-Run: <id>``; re-entering with that journal unsettled either
recognises HEAD as the attempt's commit (its trailer names the token) or
discards everything since ``start`` with an ``attempt_discarded`` milestone.
``account_build_runs`` checks from the store and git that every ``ok`` build
run was kept, discarded or changed nothing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phasegate.agents.env import secret_names_in
from phasegate.contract import DEVELOPMENT, MilestoneView, MilestoneWrite, WorkflowContext
from phasegate.phases.deps import PhaseDeps
from phasegate.store import Store
from phasegate.workspace import git

__all__ = [
    "ATTEMPT_TRAILER",
    "RUN_TRAILER",
    "Attempt",
    "account_build_runs",
    "begin",
    "discard",
    "ok_build_runs",
    "trailers",
]

#: The trailers of an attempt's commit: the attempt that made it, and its agent run.
ATTEMPT_TRAILER = "Phasegate-Attempt"
RUN_TRAILER = "Phasegate-Agent-Run"

#: Statuses of a ``build_attempt`` journal whose attempt died before its result
#: was committed (reconciliation cancels what a dead process left in_progress).
_UNSETTLED = ("in_progress", "cancelled")


@dataclass(frozen=True)
class Attempt:
    """The journal of one build attempt: dev round, attempt number, the commit it
    started from, its token (what its commit's trailer names) and the newest
    ``agent_runs`` id when it started (its own runs come after)."""

    workflow: str
    round: int
    number: int
    start: str
    last_run: int

    @property
    def token(self) -> str:
        # Fixed by what the attempt starts from: a retry after a discarded run
        # (last_run moved) or a resume that reuses the number gets another one.
        seed = f"{self.workflow}/{self.round}/{self.number}/{self.start}/{self.last_run}"
        return hashlib.sha256(seed.encode()).hexdigest()[:12]

    @property
    def trailer(self) -> str:
        return f"{self.workflow}/d{self.round}/a{self.number}/{self.token}"

    def journal(self, status: str = "in_progress", **data: Any) -> MilestoneWrite:
        return MilestoneWrite(
            "build_attempt",
            status=status,  # type: ignore[arg-type]
            round=self.round,
            attempt=self.number,
            # One row per try: a resume that reuses the number keeps the earlier rows.
            key=self.token,
            summary=f"from {self.start[:12]}, token {self.token}",
            data={
                "start": self.start,
                "token": self.token,
                "last_run": self.last_run,
                "trailer": self.trailer,
                **data,
            },
        )

    @classmethod
    def of(cls, ctx: WorkflowContext, view: MilestoneView) -> Attempt:
        return cls(
            ctx.id, view.round, view.attempt, str(view.data["start"]), int(view.data["last_run"])
        )


def _journal_of(ctx: WorkflowContext, dev_round: int, attempt: int) -> MilestoneView | None:
    for m in reversed(ctx.milestones_of("build_attempt")):
        if m.phase == DEVELOPMENT and m.round == dev_round and m.attempt == attempt:
            return m
    return None


def ok_build_runs(store: Store, attempt: Attempt) -> list[int]:
    """Ids of the attempt's build agent runs recorded ``ok``: their output is the attempt's."""
    return [
        int(r["id"])
        for r in store.agent_runs(attempt.workflow)
        if r["phase"] == DEVELOPMENT
        and r["role"] == "build"
        and r["outcome"] == "ok"
        and r["round"] == attempt.round
        and r["attempt"] == attempt.number
        and int(r["id"]) > attempt.last_run
    ]


def _last_run_id(store: Store, workflow_id: str) -> int:
    return max((int(r["id"]) for r in store.agent_runs(workflow_id)), default=0)


def trailers(message: str) -> dict[str, str]:
    """phasegate's attempt trailers (ATTEMPT_TRAILER, RUN_TRAILER) in a commit message."""
    found: dict[str, str] = {}
    for line in message.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in (ATTEMPT_TRAILER, RUN_TRAILER):
            found[key.strip()] = value.strip()
    return found


def _diff_facts(diff: str) -> tuple[list[str], int, int]:
    paths: list[str] = []
    insertions = deletions = 0
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            path = line.split(" b/", 1)[-1]
            if path not in paths:
                paths.append(path)
        elif line.startswith("+") and not line.startswith("+++"):
            insertions += 1
        elif line.startswith("-") and not line.startswith("---"):
            deletions += 1
    return paths, insertions, deletions


def discard(
    ctx: WorkflowContext,
    deps: PhaseDeps,
    cwd: Path,
    start: str,
    why: str,
    attempt: Attempt | None = None,
) -> MilestoneView | None:
    """Put the worktree back at ``start``, dropping everything beyond it (commits,
    staged, unstaged, untracked, a merge in progress); None when there was
    nothing to drop and no ``ok`` run of ``attempt`` to account for.

    The ``attempt_discarded`` milestone is written before the reset: a kill in
    between finds the same leftovers and writes the same row again.
    """
    head = deps.workspace.rev(cwd, "HEAD")
    diff = deps.workspace.change_since(cwd, start)
    runs = ok_build_runs(deps.store, attempt) if attempt is not None else []
    merging = deps.workspace.merge_in_progress(cwd)
    if not diff and head == start and not runs and not merging:
        return None
    paths, insertions, deletions = _diff_facts(diff)
    digest = hashlib.sha256(f"{head}\n{diff}".encode()).hexdigest()
    number = attempt.number if attempt is not None else int(ctx.state.get("test_retries", 0)) + 1
    view = deps.store.write_milestone(
        ctx.id,
        DEVELOPMENT,
        MilestoneWrite(
            "attempt_discarded",
            round=ctx.dev_round,
            attempt=number,
            key=attempt.token if attempt is not None else digest[:12],
            summary=f"{why}: {len(paths)} path(s), +{insertions} −{deletions}"[:300],
            data={
                "why": why,
                "start": start,
                "head": head,
                "paths": paths[:50],
                "insertions": insertions,
                "deletions": deletions,
                "diff_sha256": digest,
                # What was thrown away, to read or re-apply by hand (a person's
                # edits in the worktree go too), unless it holds a secret's value.
                "diff": "" if secret_names_in(diff) else diff[:20_000],
                "merge_in_progress": merging,
                "agent_runs": runs,
                # how many ok build runs' output this discards (0 or 1: one ok run
                # per try), for a reader that counts rows, not ids
                "recorded_run": len(runs),
            },
        ),
    )
    deps.workspace.reset_to(cwd, start)
    return view


def begin(ctx: WorkflowContext, deps: PhaseDeps, cwd: Path, number: int) -> tuple[Attempt, str]:
    """The attempt to run now and the commit recognised as its output ("" when the
    agent must run): recovery of a dead attempt of the same number first
    (this module's docstring, re-entry point)."""
    head = deps.workspace.rev(cwd, "HEAD")
    view = _journal_of(ctx, ctx.dev_round, number)
    if view is not None and view.status in _UNSETTLED:
        dead = Attempt.of(ctx, view)
        if head != dead.start:
            named = trailers(deps.workspace.commit_message(cwd, head)).get(ATTEMPT_TRAILER)
            if named == dead.trailer:
                # Committed before its result: the attempt's output. Only what the
                # checks left uncommitted goes.
                deps.workspace.discard_changes(cwd)
                return dead, head
        discard(ctx, deps, cwd, dead.start, "the attempt died before its commit", dead)
        head = dead.start
    else:
        discard(ctx, deps, cwd, head, "uncommitted changes found at the start of an attempt")
    attempt = Attempt(ctx.id, ctx.dev_round, number, head, _last_run_id(deps.store, ctx.id))
    deps.store.write_milestone(ctx.id, DEVELOPMENT, attempt.journal())
    return attempt, ""


def account_build_runs(store: Store, repo: Path, workflow_id: str, rev: str) -> dict[str, list]:
    """Every ``ok`` build agent run of ``workflow_id``'s development (classic
    mode), by what became of its output; ``rev`` is the branch head or the
    merge commit on the base whose history holds the attempts' commits.

    Returns ``{"kept": [run ids named by a commit trailer reachable from rev],
    "discarded": [run ids named by attempt_discarded], "unchanged": [run ids
    of settled build_attempt rows without a commit], "unaccounted": [the
    rest]}`` (ids as ints). The rule holds when ``unaccounted`` is empty and
    no id is in two lists; an agent that appends one line per run has then
    appended ``len(kept)`` lines. Raises GitError when ``rev`` is unknown.
    """
    runs = [
        int(r["id"])
        for r in store.agent_runs(workflow_id)
        if r["phase"] == DEVELOPMENT and r["role"] == "build" and r["outcome"] == "ok"
    ]
    kept: set[int] = set()
    for message in git(["log", "--format=%B%x00", rev], repo).split("\x00"):
        found = trailers(message)
        attempt = found.get(ATTEMPT_TRAILER, "")
        if attempt.startswith(f"{workflow_id}/") and found.get(RUN_TRAILER, "").isdigit():
            kept.add(int(found[RUN_TRAILER]))
    discarded: set[int] = set()
    unchanged: set[int] = set()
    for m in store.milestones(workflow_id):
        if m.kind == "attempt_discarded":
            discarded.update(int(i) for i in m.data.get("agent_runs", []))
        elif (
            m.kind == "build_attempt"
            and m.status not in _UNSETTLED
            and not m.data.get("commit")
            and str(m.data.get("agent_run", "")).isdigit()
        ):
            unchanged.add(int(m.data["agent_run"]))
    unchanged -= discarded
    return {
        "kept": sorted(kept & set(runs)),
        "discarded": sorted(discarded),
        "unchanged": sorted(unchanged),
        "unaccounted": sorted(set(runs) - kept - discarded - unchanged),
    }
