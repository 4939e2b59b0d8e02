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

from phasegate.agents.base import VIOLATIONS
from phasegate.agents.env import cartridge_secrets, redact
from phasegate.contract import WorkflowContext
from phasegate.phases.deps import PhaseDeps
from phasegate.protected import links_out, protected_patterns, protected_touched

__all__ = ["MAX_SHOWN_DIFF", "SYMLINK_MODE", "MergeHold", "held", "judged", "merge_hold"]

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
    """

    protected: tuple[str, ...]
    violations: tuple[Mapping[str, Any], ...]
    diff: str
    head: str

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
    found = []
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


def merge_hold(ctx: WorkflowContext, deps: PhaseDeps, head: str) -> MergeHold | None:
    """The hold on merging ``head`` (a commit of the workflow's branch) into the
    forge's base, or None when nothing holds it. Raises GitError when git cannot
    read the change."""
    repo = Path(ctx.repo_path)
    base = deps.forge.branch_ref(ctx.base_branch)
    entries = deps.workspace.change_entries(repo, base, head)
    paths = sorted({path for path, _, _ in entries})
    cartridge = deps.cartridge
    patterns = protected_patterns(
        cartridge.workflow.protected_paths, cartridge.landing_areas.checks, paths
    )
    touched = protected_touched(paths, patterns)
    violations = _round_violations(ctx, deps)
    for path, mode, blob in entries:
        if mode != SYMLINK_MODE:
            continue
        target = deps.workspace.blob_text(repo, blob)
        if links_out(path, target):
            violations.append(
                {
                    "name": "outward_symlink",
                    "role": "build",
                    "phase": "development",
                    "detail": f"{path} links out of the repository, to {target}",
                    "paths": [path],
                    "round": ctx.dev_round,
                }
            )
    if not touched and not violations:
        return None
    secrets = cartridge_secrets(cartridge)
    diff = redact(deps.workspace.file_diff(repo, base, head, touched), secrets)
    if len(diff) > MAX_SHOWN_DIFF:
        diff = diff[:MAX_SHOWN_DIFF] + f"\n[… {len(diff) - MAX_SHOWN_DIFF} more characters]\n"
    return MergeHold(tuple(touched), tuple(violations), diff, head)


def judged(ctx: WorkflowContext, deps: PhaseDeps) -> dict[str, Any]:
    """The state keys the report records for the branch's head: ``merge_hold``
    (``MergeHold.as_state``, or None) and ``merge_judged_head`` (the commit judged)."""
    assert ctx.branch_name is not None
    head = deps.workspace.rev(Path(ctx.repo_path), ctx.branch_name)
    hold = merge_hold(ctx, deps, head)
    return {"merge_hold": hold.as_state() if hold else None, "merge_judged_head": head}
