"""A build attempt's journal, and what re-entering development after a crash does
with what a dead attempt left (docs/contracts/lifecycle.md: recovery and re-entry).

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
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phasegate.agents.base import Violation
from phasegate.agents.env import cartridge_secrets, files_with_secrets, holds_secret
from phasegate.core.contract import (
    DEVELOPMENT,
    MilestoneStatus,
    MilestoneView,
    MilestoneWrite,
    WorkflowContext,
)
from phasegate.git.command import run_git
from phasegate.git.workspace import git
from phasegate.phases.deps import PhaseDeps
from phasegate.store import Store

__all__ = [
    "ATTEMPT_TRAILER",
    "RUN_TRAILER",
    "Attempt",
    "Change",
    "account_build_runs",
    "begin",
    "discard",
    "measure_change",
    "ok_build_runs",
    "refused_change",
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

    def journal(self, status: MilestoneStatus = "in_progress", **data: Any) -> MilestoneWrite:
        return MilestoneWrite(
            "build_attempt",
            status=status,
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


@dataclass(frozen=True)
class Change:
    """What a worktree holds beyond a commit, measured without holding it whole:
    ``size`` (bytes of ``git diff``), its ``sha256`` (hex, over the head's SHA, a
    newline and the diff), the paths, insertions and deletions (lines), and the
    diff text itself only when ``size`` is within the limit it was measured
    against (``None`` above it). ``binary`` names the paths git shows only as
    "Binary files differ": their bytes in the worktree count in ``size``;
    ``gitlinks`` the paths where the change adds or moves a nested repository."""

    size: int
    sha256: str
    paths: list[str]
    insertions: int
    deletions: int
    diff: str | None
    binary: tuple[str, ...] = ()
    gitlinks: tuple[str, ...] = ()

    @property
    def oversized(self) -> bool:
        return self.diff is None


def measure_change(cwd: Path, start: str, head: str, limit: int) -> Change:
    """Everything the worktree at ``cwd`` holds beyond ``start`` (commits made since,
    staged, unstaged, untracked), as a Change; the diff is read into memory only
    when at most ``limit`` bytes (``limits.max_diff_bytes``), so an agent that
    wrote 50 MB costs a file on disk, not its size in memory. Raises GitError."""
    git(["add", "-A", "--intent-to-add"], cwd)
    paths: list[str] = []
    binary: list[str] = []
    insertions = deletions = 0
    for line in git(["diff", "--no-renames", "--numstat", "-z", start], cwd).split("\0"):
        # -z: "added\tdeleted\tpath" per file; "-" counts for a binary file
        added, _, rest = line.partition("\t")
        deleted, _, path = rest.partition("\t")
        if not path:
            continue
        paths.append(path)
        if added == "-":
            binary.append(path)
        insertions += int(added) if added.isdigit() else 0
        deletions += int(deleted) if deleted.isdigit() else 0
    gitlinks = _new_gitlinks(cwd, start)
    # git's diff says only "Binary files differ": what such a file holds counts too
    size = sum(f.stat().st_size for f in (cwd / b for b in binary) if f.is_file())
    with tempfile.TemporaryDirectory(prefix="phasegate-diff-") as tmp:
        out = Path(tmp) / "change.diff"
        git(["diff", "--no-renames", f"--output={out}", start], cwd)
        digest = hashlib.sha256(f"{head}\n".encode())
        with out.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
        diff = out.read_text(encoding="utf-8", errors="replace") if size <= limit else None
    return Change(
        size, digest.hexdigest(), paths, insertions, deletions, diff, tuple(binary), tuple(gitlinks)
    )


def _new_gitlinks(cwd: Path, start: str) -> list[str]:
    """The paths where the index (after ``add -A``) holds a repository that ``start``
    does not, as it is there: nested repositories the change would add or move.
    (phasegate's diffs ignore submodules, so the index is compared with ``start``'s
    tree, submodules not ignored whatever a config or ``.gitmodules`` says; never
    the worktree, so nothing of the nested repository's runs: one call.)"""
    out = git(
        ["diff-index", "--cached", "--no-renames", "-z", "--ignore-submodules=none", start], cwd
    )
    fields = out.split("\0")
    # -z: ":<old mode> <new mode> <old sha> <new sha> <status>" NUL "<path>" NUL, per entry
    return sorted(
        path
        for meta, path in zip(fields[::2], fields[1::2], strict=False)
        if meta.startswith(":") and meta.split()[1:2] == ["160000"]
    )


def refused_change(change: Change, limit: int, secrets: list[str], cwd: Path) -> Violation | None:
    """Why ``change`` (measured in the worktree ``cwd``) must not be committed or
    applied, or None: ``oversized`` above ``limit`` bytes
    (``limits.max_diff_bytes``, its size named), ``git_dir_violation`` when it
    adds a nested repository (a gitlink: its ``.git`` is the agent's), or
    ``secret_in_change`` when a file of it holds a secret value, raw or
    encoded, binary files read from the worktree (the files named, never the
    value)."""
    if change.diff is None:
        return Violation(
            "oversized",
            f"the change is {change.size} bytes > limit {limit} (limits.max_diff_bytes) "
            f"over {len(change.paths)} path(s), sha256 {change.sha256[:12]}; never stored",
            tuple(change.paths[:50]),
        )
    if change.gitlinks:
        # A repository inside the change has a .git of the agent's making: its
        # config (filters, hooks) would run in every git that looks inside it.
        return Violation(
            "git_dir_violation",
            f"the change holds {len(change.gitlinks)} nested git repositor(ies) "
            "(gitlinks), refused: " + ", ".join(change.gitlinks[:10]),
            change.gitlinks[:50],
        )
    files = files_with_secrets(change.diff, secrets)
    for path in change.binary:
        found = cwd / path
        # latin-1 maps every byte to one character: an ASCII secret stays findable
        if found.is_file() and holds_secret(found.read_bytes().decode("latin-1"), secrets):
            files.append(path)
    if files:
        return Violation(
            "secret_in_change",
            f"the change held a secret value (raw or encoded) in {len(files)} file(s): "
            + ", ".join(files[:10]),
            tuple(files[:50]),
        )
    return None


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
    merging = deps.workspace.merge_in_progress(cwd)
    seen = deps.agents.seen(ctx.id, cwd)  # git's status of it since its last change
    if attempt is None and head == start and not merging and seen is not None and seen.clean:
        return None
    change = measure_change(cwd, start, head, deps.limits.max_diff_bytes)
    runs = ok_build_runs(deps.store, attempt) if attempt is not None else []
    if not change.size and head == start and not runs and not merging:
        return None
    paths, insertions, deletions = change.paths, change.insertions, change.deletions
    digest = change.sha256
    # What was thrown away, to read or re-apply by hand (a person's edits in the
    # worktree go too), unless it is oversized or holds a secret, raw or encoded.
    kept = change.diff or ""
    if refused_change(change, deps.limits.max_diff_bytes, cartridge_secrets(deps.cartridge), cwd):
        kept = ""
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
                "diff_bytes": change.size,
                "diff": kept[:20_000],
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
        if not _has_commit(cwd, dead.start):
            # It died in another clone (takeover.py), from a commit that clone never
            # pushed: what it built is lost with it; this attempt starts from the
            # branch as this clone has it (the forge's, or made again).
            why = "the attempt died in another clone, from a commit this clone lacks"
            discard(ctx, deps, cwd, head, why, dead)
        else:
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


def _has_commit(cwd: Path, sha: str) -> bool:
    return run_git(["rev-parse", "--verify", "-q", f"{sha}^{{commit}}"], cwd).returncode == 0


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
