"""The merge gate: what makes a merge wait for a person's approval whatever the profile.

A workflow's profile says whether its merge may go unattended (``auto_merge``).
Two things override it, and no setting waives them (docs/trust.md):

- the change touches a protected path (``protected.protected_patterns``: the
  cartridge, CI configuration, the files the checks run);
- an agent broke a rule during the current development round: a recorded
  ``violation`` event of that round (a sandbox refusal, a ref or ``.git``
  change undone, a secret, a read-only role's edit, an oversized change), or
  a symbolic link the change adds that points out of the repository.

``merge_hold`` computes the hold from git and the store. The report phase
records it (``judged``: ``state.merge_hold`` and the head it judged), the wait
phase keeps an unattended merge from starting while it is set, and the merge
phase judges the head it is about to merge again when that is another commit
(a sync with the base). A person's ``approve-merge`` (or an
approval on the forge) lets a held merge through and is recorded with their
name on the ``merge_approved`` milestone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phasegate.agents.base import VIOLATIONS, Violation
from phasegate.agents.env import cartridge_secrets, redact
from phasegate.agents.service import violation_event
from phasegate.core.contract import EventWrite, WorkflowContext
from phasegate.core.state import WorkflowState
from phasegate.git.protected import links_out, protected_patterns, protected_touched
from phasegate.phases.deps import PhaseDeps

__all__ = [
    "MAX_SHOWN_DIFF",
    "SYMLINK_MODE",
    "MergeHold",
    "covers",
    "found_events",
    "held",
    "judged",
    "merge_hold",
]

#: Characters of the protected files' diff kept in the hold for ``show`` and the dashboard.
MAX_SHOWN_DIFF = 20_000

#: git's mode of a symbolic link.
SYMLINK_MODE = "120000"


@dataclass(frozen=True)
class MergeHold:
    """Why a merge waits for a person.

    ``protected``: the protected paths the change touches, sorted.
    ``violations``: ``{"name", "role", "phase", "detail", "paths"}`` each, as the
    ``violation`` events hold them. ``diff``: the protected paths' unified diff,
    redacted and cut at MAX_SHOWN_DIFF characters. ``head``: the commit judged.
    ``found``: the violations among them the gate found itself, not yet events.
    """

    protected: tuple[str, ...]
    violations: tuple[Mapping[str, Any], ...]
    diff: str
    head: str
    found: tuple[Mapping[str, Any], ...] = ()

    def reason(self) -> str:
        """One line a person reads: what is held, and the command that lets it through."""
        parts = []
        if self.protected:
            parts.append("the change touches protected paths: " + ", ".join(self.protected[:20]))
        if self.violations:
            names = sorted({str(v["name"]) for v in self.violations})
            parts.append(f"{len(self.violations)} violation(s) this round: " + ", ".join(names))
        return "merge held for a person: " + "; ".join(parts)

    def as_state(self) -> dict[str, Any]:
        return {
            "reason": self.reason(),
            "protected": list(self.protected),
            "violations": [dict(v) for v in self.violations],
            "diff": self.diff,
            "head": self.head,
        }


def held(ctx: WorkflowContext) -> Mapping[str, Any] | None:
    """The hold the report recorded (``state.merge_hold``), or None."""
    hold = ctx.state.get("merge_hold")
    return hold if isinstance(hold, Mapping) else None


def _round_violations(ctx: WorkflowContext, deps: PhaseDeps) -> list[Mapping[str, Any]]:
    """The violation events of the current development round. An event from before
    rounds were recorded on it counts for every round: a hold too many is a
    person's click, one too few an unattended merge past a rule."""
    found: list[Mapping[str, Any]] = []
    for event in deps.store.events(ctx.id, types=("violation",)):
        data = event.get("data") or {}
        if data.get("name") not in VIOLATIONS:
            continue
        if data.get("round") is not None and data["round"] != ctx.dev_round:
            continue
        found.append(
            {key: data.get(key) for key in ("name", "role", "phase", "detail", "paths", "round")}
        )
    return found


def _links_out(repo: Path, worktree: Path | None, path: str, blob: str, deps: PhaseDeps) -> str:
    """Where the link ``path`` leads when that is out of the repository, else "".
    In the worktree holding the judged head the link is resolved as the system
    would, through every other link (a link to ``.`` makes ``d/d/../..`` climb
    twice); elsewhere its target's text is judged."""
    target = deps.workspace.blob_text(repo, blob)
    if worktree is not None:
        root = worktree.resolve()
        resolved = (worktree / path).resolve()
        return "" if resolved.is_relative_to(root) else f"{target} (resolved: {resolved})"
    return target if links_out(path, target) else ""


def merge_hold(ctx: WorkflowContext, deps: PhaseDeps, head: str) -> MergeHold | None:
    """The hold on merging ``head`` (a commit of the workflow's branch) into the
    forge's base, or None when nothing holds it. Raises GitError when git cannot
    read the change."""
    repo = Path(ctx.repo_path)
    base = deps.forge.branch_ref(ctx.base_branch)
    entries = deps.workspace.change_entries(repo, base, head)
    paths = sorted({path for path, _, _, _ in entries})
    tracked = {path for path, _, _, status in entries if status != "A"}
    cartridge = deps.cartridge
    worktree = Path(ctx.worktree_path) if ctx.worktree_path else None
    roots = [str(repo), *([str(worktree)] if worktree else [])]
    if worktree is not None and not worktree.is_dir():
        worktree = None
    if worktree is not None and deps.workspace.rev(worktree, "HEAD") != head:
        worktree = None  # not a checkout of the judged head: links are judged by their text
    patterns = protected_patterns(
        cartridge.workflow.protected_paths, cartridge.landing_areas.checks, paths, roots, tracked
    )
    touched = protected_touched(paths, patterns)
    violations = _round_violations(ctx, deps)
    recorded = {(v["name"], tuple(v.get("paths") or ())) for v in violations}
    found = []
    for path, mode, blob, _ in entries:
        if mode != SYMLINK_MODE or ("outward_symlink", (path,)) in recorded:
            continue
        where = _links_out(repo, worktree, path, blob, deps)
        if where:
            found.append(
                {
                    "name": "outward_symlink",
                    "role": "build",
                    "phase": "development",
                    "detail": f"{path} links out of the repository, to {where}",
                    "paths": [path],
                    "round": ctx.dev_round,
                }
            )
    if not touched and not violations and not found:
        return None
    secrets = cartridge_secrets(cartridge)
    diff = redact(deps.workspace.file_diff(repo, base, head, touched), secrets)
    if len(diff) > MAX_SHOWN_DIFF:
        diff = diff[:MAX_SHOWN_DIFF] + f"\n[… {len(diff) - MAX_SHOWN_DIFF} more characters]\n"
    return MergeHold(tuple(touched), (*violations, *found), diff, head, tuple(found))


def found_events(hold: MergeHold | None, secrets: list[str]) -> tuple[EventWrite, ...]:
    """The ``violation`` events of what the hold found itself (an outward link), so
    ``show`` and the dashboard list them with the agents' violations."""
    if hold is None:
        return ()
    return tuple(
        violation_event(
            str(v["role"]),
            str(v["phase"]),
            Violation(str(v["name"]), str(v["detail"]), tuple(v["paths"])),
            secrets,
            round=int(v["round"]),
        )
        for v in hold.found
    )


def covers(approved: Mapping[str, Any] | None, hold: MergeHold) -> bool:
    """Whether the hold a person approved (``MergeHold.as_state``; None: they
    approved a merge nothing held) covers ``hold``: every protected path and
    every violation of ``hold`` was in it. A sync with the base changes the head
    but not the branch's own change, so an approval stands; a protected file or
    a violation the person never saw does not pass."""
    if approved is None:
        return False
    seen = {(v["name"], tuple(v.get("paths") or ())) for v in approved.get("violations", ())}
    return set(hold.protected) <= set(approved.get("protected", ())) and all(
        (v["name"], tuple(v.get("paths") or ())) in seen for v in hold.violations
    )


def judged(
    ctx: WorkflowContext, deps: PhaseDeps, head: str
) -> tuple[WorkflowState, tuple[EventWrite, ...]]:
    """What the report records for ``head``, the branch head it describes: the state
    keys ``merge_hold`` (``MergeHold.as_state``, or None) and ``merge_judged_head``
    (``head``), and the events of the violations the hold found itself."""
    hold = merge_hold(ctx, deps, head)
    state: WorkflowState = {
        "merge_hold": hold.as_state() if hold else None,
        "merge_judged_head": head,
    }
    return state, found_events(hold, cartridge_secrets(deps.cartridge))
