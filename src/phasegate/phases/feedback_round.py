"""A round started by a person's feedback: the feedback it answers, and what it changed.

A feedback round is a development round with a ``requirement_received``
milestone: the wait phase (``phasegate feedback``, a dashboard review) or
``forge_feedback`` (a comment on the forge) wrote it when a person's feedback
sent the workflow back. Its build is measured against the head the previous
round's report described. A build that adds nothing to that head stops for the
person (``FEEDBACK_UNCHANGED``), and the round's report quotes the feedback and
says what changed since.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from phasegate.core.contract import MilestoneWrite, PhaseResult, WorkflowContext
from phasegate.git.workspace import GitError
from phasegate.phases.deps import PhaseDeps

__all__ = [
    "FEEDBACK_UNCHANGED",
    "feedback_texts",
    "reported_head",
    "since_last_round",
    "unanswered",
    "unchanged_stop",
]

#: The reason (its first word) of a feedback round stopped because its build added nothing.
FEEDBACK_UNCHANGED: Final = "feedback_unchanged"

#: Paths a report lists one by one; the counts cover the rest.
_PATHS_LISTED = 50


def feedback_texts(ctx: WorkflowContext) -> list[str]:
    """The feedback the current development round answers, oldest first, each once:
    the text that started the round, then any other a person sent while it was
    stopped (the text its build last saw, kept in ``dev_completed``). Empty when
    the round was not started by feedback."""
    received = ctx.milestone("requirement_received", round=ctx.dev_round)
    if received is None:
        return []
    texts = [str(received.data.get("feedback") or received.summary)]
    done = ctx.milestone("dev_completed", round=ctx.dev_round)
    later = str(done.data.get("feedback") or "") if done else ""
    if later and later not in texts:
        texts.append(later)
    return texts


def reported_head(ctx: WorkflowContext) -> str | None:
    """The branch head the newest report of an earlier round described (its
    payload's ``head``; a report written before it kept one gives its round's
    ``dev_completed`` head), or None when there is none."""
    for m in reversed(ctx.milestones_of("progress_reported")):
        if m.round < ctx.dev_round:
            head = (m.data.get("report") or {}).get("head")
            if head:
                return str(head)
            done = ctx.milestone("dev_completed", round=m.round)
            kept = str(done.data.get("head") or "") if done else ""
            return kept or None
    return None


def _change(deps: PhaseDeps, repo: Path, old: str, new: str) -> dict[str, Any] | None:
    try:
        return deps.workspace.change_between(repo, old, new)
    except GitError:
        # The reported head is not in this clone (a takeover from another clone
        # that never fetched it): what changed since is unknown, never "nothing".
        return None


def unanswered(ctx: WorkflowContext, deps: PhaseDeps, head: str) -> dict[str, Any] | None:
    """The facts of a feedback round whose build left ``head`` adding nothing to the
    head the last report described: ``{"feedback", "since", "head"}``; None when
    the round was not started by feedback, the build changed something, or a
    person resumed the round after it stopped so for the same feedback (they
    have seen that nothing changed and let it go on)."""
    texts = feedback_texts(ctx)
    since = reported_head(ctx)
    if not texts or since is None:
        return None
    said = ctx.user_feedback or texts[-1]
    stopped = ctx.state.get(FEEDBACK_UNCHANGED) or {}
    if stopped.get("round") == ctx.dev_round and stopped.get("feedback") == said:
        return None
    change = _change(deps, Path(ctx.repo_path), since, head)
    if change is None or change["files"]:
        return None
    return {"feedback": said, "since": since, "head": head}


def unchanged_stop(
    ctx: WorkflowContext,
    facts: dict[str, Any],
    agent_summary: str,
    attempt: int,
    evidence: tuple[MilestoneWrite, ...],
) -> PhaseResult:
    """The pause of a feedback round whose build added nothing (``unanswered``'s
    ``facts``): reason ``feedback_unchanged: ...`` with what the build agent
    said and what a person can do, a ``feedback_unchanged`` milestone beside
    ``evidence``. ``resume`` builds again and goes on even if the build adds
    nothing again; ``phasegate feedback`` sends new words."""
    said = " ".join(agent_summary.split())[-300:]
    why = (
        f"the build for the feedback of development round {ctx.dev_round} added no change "
        f"to {facts['since'][:12]}, the head the last report described"
    )
    reason = (
        f"{FEEDBACK_UNCHANGED}: {why}; the build agent said: {said or '(nothing)'}; "
        f'`phasegate feedback {ctx.id} "..."` says more, `phasegate resume {ctx.id}` '
        "builds again and goes on with the change as it is should it add nothing again"
    )
    return PhaseResult(
        "pause",
        reason=reason,
        state={
            FEEDBACK_UNCHANGED: {"round": ctx.dev_round, "feedback": facts["feedback"]},
            "stopped_on": why,
        },
        milestones=(
            *evidence,
            MilestoneWrite(
                FEEDBACK_UNCHANGED,
                status="failed",
                round=ctx.dev_round,
                attempt=attempt,
                summary=why[:300],
                data={**facts, "agent_summary": agent_summary},
            ),
        ),
    )


def since_last_round(
    ctx: WorkflowContext, deps: PhaseDeps, head: str | None
) -> dict[str, Any] | None:
    """The report's ``feedback`` entry of a feedback round, None for another round:
    ``{"round", "texts": [the feedback quoted], "since": the head the last report
    described or None, "head", "changed": bool or None when unknown, "files",
    "insertions", "deletions", "paths": [{"path", "insertions", "deletions"}]
    (at most 50)}``."""
    texts = feedback_texts(ctx)
    if not texts:
        return None
    since = reported_head(ctx)
    change = _change(deps, Path(ctx.repo_path), since, head) if since and head else None
    counts = change or {"files": 0, "insertions": 0, "deletions": 0, "paths": []}
    return {
        "round": ctx.dev_round,
        "texts": [text[:3000] for text in texts],
        "since": since,
        "head": head,
        "changed": None if change is None else bool(change["files"]),
        "files": counts["files"],
        "insertions": counts["insertions"],
        "deletions": counts["deletions"],
        "paths": list(counts["paths"])[:_PATHS_LISTED],
    }
