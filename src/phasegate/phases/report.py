"""report: the structured progress report, posted on the issue.

Thin phase: no agent run, no git mutation (docs/contracts/lifecycle.md: report).

- preconditions: current_phase == "report"; planning, development and
  pr_review milestones exist.
- inputs: dev_round, the finalized plan, the diff stats, the last
  ``tests_run``, the ``pr_reviewed`` milestones, the ``limit_reached``
  milestones (every bounded loop that ran out, with what its last round
  found), usage totals, content_language, auto_merge; in a
  round a person's feedback started, the feedback and the change since the
  head the previous report described (``phases.feedback_round``).
- authoritative evidence: ``progress_reported``, ``round_completed`` and
  ``wait_started`` for dev_round.
- side effects: one issue comment rendered in content_language (best effort:
  a forge failure does not fail the phase); state.report holds the payload,
  the single source of truth; state.merge_hold what keeps the merge from
  going unattended (phases/merge_gate.py), None when nothing does;
  phasegate's own commit status on the head (``forge.OWN_CHECK``): success
  once reviewed and checked, pending with the hold's reason while held.
- postconditions: current_phase == "wait", status == "waiting";
  state.wait_started_at recorded.
- re-entry point: idempotent; milestones and the comment are deduplicated per
  dev_round, so a re-run re-emits the same report.
- recovery behavior: nothing to recover; the comment is journaled.
- terminal outcomes: completed → wait (parks in waiting, does not merge).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from phasegate.core.contract import REPORT, WAIT, MilestoneWrite, PhaseResult, WorkflowContext
from phasegate.core.report import render_report
from phasegate.forge.base import OWN_PASSED
from phasegate.phases import merge_gate
from phasegate.phases.deps import PhaseDeps
from phasegate.phases.feedback_round import since_last_round

__all__ = ["build_payload", "run"]


#: Characters of the last review's words the report carries (it posts them).
REVIEW_SHOWN = 4000


def build_payload(ctx: WorkflowContext, deps: PhaseDeps) -> dict[str, Any]:
    """The report payload: plan, changes, the branch ``head`` it describes,
    ``feedback`` (None unless a person's feedback started the round:
    ``feedback_round.since_last_round``), checks, review, the limits that ran
    out (``limits``: phase, round, loop, setting, rounds, findings), usage,
    what comes next."""
    finalized = ctx.milestone("plan_finalized")
    tests = [m for m in ctx.milestones_of("tests_run") if m.round == ctx.dev_round]
    last = tests[-1].data if tests else {}
    results = [
        {"command": c["command"], "passed": c["passed"], "duration_s": c["duration_s"]}
        for c in last.get("checks", [])
    ]
    reviews = ctx.milestones_of("pr_reviewed")
    usage = deps.store.usage_totals(ctx.id)
    changes = (
        deps.workspace.diff_stat(
            Path(ctx.repo_path), deps.forge.branch_ref(ctx.base_branch), ctx.branch_name
        )
        if ctx.branch_name
        else {}
    )
    # The head this report describes: the next feedback round is measured against it.
    head = deps.workspace.rev(Path(ctx.repo_path), ctx.branch_name) if ctx.branch_name else None
    return {
        "workflow": ctx.id,
        "title": ctx.title,
        "dev_round": ctx.dev_round,
        "issue": ctx.issue_number,
        "pr": ctx.pr_number,
        "branch": ctx.branch_name,
        "head": head,
        "feedback": since_last_round(ctx, deps, head),
        "plan": {
            "approved": bool(finalized and finalized.data.get("approved")),
            "rounds": int(finalized.data.get("rounds", 0)) if finalized else 0,
            "summary": str(ctx.state.get("plan", ""))[:1500],
            # graph mode: the run that planned it, and how (competition, adversary)
            "graph_run": finalized.data.get("run_id") if finalized else None,
            "how": finalized.summary if finalized and finalized.data.get("run_id") else None,
        },
        "changes": changes,
        "checks": {
            "passed": sum(1 for r in results if r["passed"]),
            "total": len(results),
            "attempts": len(tests),
            "results": results,
        },
        "review": {
            # the development rounds reviewed, and the reviews of them (passes,
            # more than rounds under limits.require_full_review_rounds)
            "rounds": len({m.round for m in reviews}),
            "passes": len(reviews),
            "verdict": reviews[-1].data.get("verdict") if reviews else None,
            "comments": str(reviews[-1].data.get("comments", ""))[:REVIEW_SHOWN] if reviews else "",
        },
        "limits": [
            {
                "phase": m.phase,
                "round": m.round,
                "loop": m.data.get("loop"),
                "setting": m.data.get("setting"),
                "rounds": m.data.get("rounds"),
                "findings": str(m.data.get("findings", ""))[:1500],
            }
            for m in ctx.milestones_of("limit_reached")
        ],
        "usage": {"tokens": usage.tokens, "cost_usd": round(usage.cost_usd, 6), "runs": usage.runs},
        "auto_merge": ctx.auto_merge,
        "content_language": ctx.content_language,
    }


def run(ctx: WorkflowContext, deps: PhaseDeps) -> PhaseResult:
    payload = build_payload(ctx, deps)
    # The hold is judged here, once per round, on the head the report describes;
    # the merge phase judges the head it merges again.
    head = payload["head"]
    gate, found = merge_gate.judged(ctx, deps, head) if head else ({}, ())
    held = gate.get("merge_hold")
    payload["merge_hold"] = (
        {k: held[k] for k in ("reason", "protected", "violations")} if held else None
    )
    payload["auto_merge"] = ctx.auto_merge and held is None  # "Next:" says who merges
    if head:
        # The head was reviewed and its CI passed in pr_review: phasegate's own status
        # says so, or says why it waits for a person.
        if held:
            deps.forge.set_commit_status(head, "pending", str(held["reason"]))
        else:
            deps.forge.set_commit_status(head, "success", OWN_PASSED)
    text = render_report(payload, ctx.content_language)
    if ctx.issue_number:
        deps.effects.comment(
            REPORT, ctx.issue_number, text, f"report:d{ctx.dev_round}", best_effort=True
        )
    r = ctx.dev_round
    return PhaseResult.advance(
        WAIT,
        state={
            "report": payload,
            "wait_started_at": deps.clock.now().isoformat(),
            **gate,
        },
        milestones=(
            MilestoneWrite(
                "progress_reported", round=r, summary=text.splitlines()[0], data={"report": payload}
            ),
            MilestoneWrite("round_completed", round=r),
            MilestoneWrite("wait_started", round=r),
        ),
        events=found,
    )
