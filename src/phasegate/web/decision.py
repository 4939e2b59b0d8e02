"""What a workflow page puts first: why it needs a person, and what deciding it takes.

The panel gathers what is otherwise spread over the page: the status in
words, the checks the round ran with their output, the size of the change,
the feedback the round answered, and what it cost. The report and the
buttons sit beside it in the template.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from phasegate.core.contract import AWAITING_APPROVAL
from phasegate.web.board import machine_of

__all__ = ["CHECK_OUTPUT_CHARS", "decision_panel", "headline"]

#: The last characters of a check's output the panel shows; ``show`` has it all.
CHECK_OUTPUT_CHARS = 4000


def headline(
    summary: Mapping[str, Any], hold: Mapping[str, Any] | None = None, *, may_decide: bool = True
) -> str:
    """The workflow's status as a sentence saying what, if anything, it needs a
    person for; ``hold`` is what holds a waiting merge (``merge_hold``). To a
    person who may not decide (``may_decide`` false: a viewer) what waits for a
    person waits for an approver."""
    status, phase = summary.get("status"), summary.get("current_phase")
    error = str(summary.get("error") or "").strip()
    if summary.get("worker"):
        return f"A worker on {machine_of(summary['worker'])} is running {_words(phase)}."
    if status == "waiting" and phase == "wait":
        if summary.get("merge_approved_by"):
            return f"The merge is approved by {summary['merge_approved_by']}: a worker merges it."
        if hold:
            who = "you" if may_decide else "an approver"
            return f"The merge waits for {who}: {hold.get('reason')}."
        if not may_decide:
            return "The report is ready: it waits for an approver to merge it or send feedback."
        return "The report is ready: approve the merge, or send feedback for another round."
    if status == AWAITING_APPROVAL:
        if not may_decide:
            return "A proposal waits for an approver's decision."
        return "A proposal waits for your decision: approve or reject it."
    if status == "paused" and summary.get("verification_status") == "rejected":
        if not may_decide:
            return (
                "Acceptance verification rejected the change: it waits for an approver's verdict."
            )
        return "Acceptance verification rejected the change: record your own verdict."
    if status == "paused":
        if error:
            return f"Paused: {error}"
        return "Paused: resume it when you are ready." if may_decide else "Paused."
    if status == "planning_timeout":
        if not may_decide:
            return "Planning ran out of time: an approver may resume it."
        return "Planning ran out of time: resume it to try again."
    if status == "failed":
        return f"Failed: {error}" if error else "Failed: resume runs its phase again."
    if status == "cancelled":
        return "Cancelled: nothing moves it on."
    if status == "completed":
        return "Merged and verified." if summary.get("merge_sha") else "Completed."
    if summary.get("resumes_at"):
        return f"The forge is unavailable: it resumes by itself at {summary['resumes_at']}."
    return f"Waiting for a worker to run {_words(phase)}."


def decision_panel(detail: Mapping[str, Any], pending_feedback: str | None) -> dict[str, Any]:
    """The panel of a workflow page (``views.workflow_page``'s ``detail``):
    ``headline`` (``viewer_headline``: the same to a viewer); ``checks`` (the
    last check run of the current round, each
    ``{"command", "passed", "exit_code", "duration_s", "output"}`` with the
    output's last CHECK_OUTPUT_CHARS, and ``summary``; None before any);
    ``changes`` (files, insertions, deletions from the report; None before
    one, and once merged); ``merged_as`` (a merged workflow's short merge commit,
    else None); ``feedback`` (the texts the round answered, oldest first);
    ``pending_feedback`` (what the next round will read); and ``cost``
    (tokens, USD, agent runs)."""
    summary = detail["workflow"]
    report = detail.get("report") or {}
    runs = [
        m
        for m in detail.get("milestones") or ()
        if m.get("kind") == "tests_run" and m.get("round") == summary.get("dev_round")
    ]
    checks = None
    if runs:
        last = runs[-1]
        checks = {
            "summary": last.get("summary") or "",
            "results": [
                {
                    "command": c.get("command"),
                    "passed": bool(c.get("passed")),
                    "exit_code": c.get("exit_code"),
                    "duration_s": float(c.get("duration_s") or 0),
                    "output": str(c.get("output") or "")[-CHECK_OUTPUT_CHARS:],
                }
                for c in (last.get("data") or {}).get("checks") or ()
            ],
        }
    feedback = report.get("feedback") or {}
    # A merged workflow's change is its merge commit, which the report's figures may not
    # be (a merge that changed nothing): it names the commit, and the diff link shows it.
    merged = summary.get("merge_sha") if summary.get("status") == "completed" else None
    return {
        "headline": headline(summary, detail.get("merge_hold")),
        "viewer_headline": headline(summary, detail.get("merge_hold"), may_decide=False),
        "checks": checks,
        "changes": None if merged else report.get("changes") or None,
        "merged_as": str(merged)[:12] if merged else None,
        "feedback": [str(t) for t in feedback.get("texts") or ()],
        "pending_feedback": pending_feedback or None,
        "cost": {
            "tokens": summary.get("tokens") or 0,
            "usd": summary.get("cost_usd") or 0.0,
            "runs": len(detail.get("agent_runs") or ()),
        },
    }


def _words(phase: Any) -> str:
    return str(phase or "its next phase").replace("_", " ")
