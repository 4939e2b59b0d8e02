"""A workflow page's history as a person reads it: cycles in time order, milestones in words.

A cycle is one pass forward through the lifecycle. The workflow starts a new
one whenever it enters a phase no later than the phase before: a feedback
round goes back to development, a reversion back to planning. Each cycle
holds the phases it entered and the milestones written while it ran, so a
second round appears after the first review, never above it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup, escape

from phasegate.core.contract import (
    ACCEPTANCE_VERIFICATION,
    COMPLETED,
    DEVELOPMENT,
    MERGE,
    PLANNING,
    PR_REVIEW,
    PREPARATION,
    REPORT,
    WAIT,
)

__all__ = ["cycles", "exact_time", "milestone_words", "relative_time", "when"]

#: The lifecycle in order, its pseudo-phases included: entering one no later
#: than the one before starts a new cycle.
_LIFECYCLE = (
    PREPARATION,
    PLANNING,
    DEVELOPMENT,
    PR_REVIEW,
    REPORT,
    WAIT,
    MERGE,
    ACCEPTANCE_VERIFICATION,
    COMPLETED,
)
#: A milestone kind as a sentence's subject; its round and status are added around it.
_WORDS = {
    "requirement_received": "ticket received",
    "issue_created": "issue filed",
    "branch_created": "branch created",
    "plan_created": "plan written",
    "plan_finalized": "plan finalized",
    "dev_completed": "build",
    "pr_created": "pull request opened",
    "pr_updated": "pull request updated",
    "pr_closed": "pull request closed",
    "ci_passed": "CI passed",
    "ci_failed": "CI failed",
    "checks_passed": "checks passed",
    "checks_failed": "checks failed",
    "round_completed": "review",
    "changes_requested": "changes requested",
    "limit_reached": "round limit reached",
    "wait_started": "waiting for a person",
    "merge_completed": "merged",
    "branch_deleted": "branch deleted",
    "issue_closed": "issue closed",
    "comment_posted": "comment posted",
    "label_updated": "label updated",
    "worktree_setup": "worktree prepared",
    "worktree_retired": "worktree retired",
}
#: Kinds that happen once per round, so the round is part of their name.
_PER_ROUND = frozenset({"dev_completed", "round_completed"})
_STATUS_WORDS = {
    "in_progress": "in progress",
    "failed": "failed",
    "cancelled": "cancelled",
    "proposed": "proposed",
    "planning_timeout": "timed out",
}


def milestone_words(milestone: Mapping[str, Any]) -> str:
    """A milestone row in words: ``build of round 2 failed``, ``plan finalized``,
    ``merged``; a kind without words of its own reads as its name spaced out."""
    kind = str(milestone.get("kind") or "")
    words = _WORDS.get(kind, kind.replace("_", " "))
    if kind in _PER_ROUND:
        words = f"{words} of round {milestone.get('round')}"
    status = _STATUS_WORDS.get(str(milestone.get("status")))
    return f"{words} {status}" if status else words


def cycles(
    timeline: Sequence[Mapping[str, Any]],
    milestones: Sequence[Mapping[str, Any]],
    decisions: Sequence[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """The timeline (``{"phase", "at"}`` per phase entered, oldest first) as cycles:
    each ``{"number", "kind", "title", "at", "phases"}``, oldest first. ``kind`` is
    ``first``, ``feedback`` (back to development) or ``reversion`` (back to
    planning or before; ``title`` carries the recorded reason from
    ``decisions``). Each phase is ``{"phase", "at", "milestones"}``; a milestone
    belongs to the last phase entered at or before its ``created_at`` (ISO
    times), and one written before any phase to the first."""
    found: list[dict[str, Any]] = []
    reasons = [d for d in decisions if d.get("target_phase")]
    previous = -1
    for entry in timeline:
        phase = str(entry.get("phase"))
        order = _LIFECYCLE.index(phase) if phase in _LIFECYCLE else previous + 1
        if not found or order <= previous:
            found.append(_cycle(len(found) + 1, phase, entry.get("at"), reasons))
        found[-1]["phases"].append({"phase": phase, "at": entry.get("at"), "milestones": []})
        previous = order
    if not found:
        found.append(_cycle(1, "", None, reasons))
        found[-1]["phases"].append({"phase": PREPARATION, "at": None, "milestones": []})
    entered = [(p["at"] or "", p) for c in found for p in c["phases"]]
    for milestone in milestones:
        at = str(milestone.get("created_at") or "")
        home = entered[0][1]
        for started, phase in entered:
            if started and started <= at:
                home = phase
        home["milestones"].append({**milestone, "words": milestone_words(milestone)})
    return found


def _cycle(number: int, phase: str, at: Any, reasons: list[Mapping[str, Any]]) -> dict[str, Any]:
    """A new cycle entering ``phase``; a reversion takes the oldest unused reason."""
    if number == 1:
        kind, title = "first", "First pass"
    elif phase == DEVELOPMENT:
        kind, title = "feedback", f"Cycle {number}: another round of development"
    else:
        kind, title = "reversion", f"Cycle {number}: back to {phase}"
        match = next((r for r in reasons if r.get("target_phase") == phase), None)
        if match is not None:
            reasons.remove(match)
            if match.get("reason"):
                title += f": {match['reason']}"
    return {"number": number, "kind": kind, "title": title, "at": at, "phases": []}


def _parsed(at: datetime | str | None) -> datetime | None:
    if at is None or at == "":
        return None
    moment = at if isinstance(at, datetime) else datetime.fromisoformat(str(at))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def exact_time(at: datetime | str | None) -> str:
    """``2026-12-05 20:41:07 UTC``: to the second, in UTC; empty for no time."""
    moment = _parsed(at)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if moment else ""


def relative_time(at: datetime | str | None, now: datetime) -> str:
    """How long before ``now``: ``just now``, ``4 min ago``, ``3 h ago``,
    ``2 days ago``; past a month, the date. Empty for no time."""
    moment = _parsed(at)
    if moment is None:
        return ""
    seconds = (now - moment).total_seconds()
    if seconds < 45:
        return "just now"
    if seconds < 3600:
        return f"{max(1, round(seconds / 60))} min ago"
    if seconds < 86400:
        return f"{round(seconds / 3600)} h ago"
    if seconds < 30 * 86400:
        days = round(seconds / 86400)
        return "1 day ago" if days == 1 else f"{days} days ago"
    return moment.astimezone(UTC).strftime("%Y-%m-%d")


def when(at: datetime | str | None, now: datetime) -> Markup:
    """A ``<time>`` element: the relative time shown, the exact one on hover."""
    moment = _parsed(at)
    if moment is None:
        return Markup("")
    return Markup('<time datetime="{}" title="{}">{}</time>').format(
        moment.isoformat(), exact_time(moment), escape(relative_time(moment, now))
    )
