"""pr_review in graph mode: the pull request with the graph's evidence; the graph has
reviewed the change already (docs/contracts/graph.md: review tiers), so no review
agent runs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from phasegate.core.contract import PR_REVIEW, REPORT, MilestoneWrite, PhaseResult, WorkflowContext
from phasegate.phases import ci
from phasegate.phases.deps import PhaseDeps

__all__ = ["evidence_of", "review"]


def review(ctx: WorkflowContext, deps: PhaseDeps) -> PhaseResult:
    """pr_review in graph mode: the pull request, opened (or updated) with the graph's
    evidence; ``pr_reviewed`` records the graph's review (tier, verdicts, the attempt
    approved). No review agent runs: the graph reviewed this very patch."""
    assert ctx.branch_name is not None
    proposal_id = ctx.state.get("graph_proposal")
    row = deps.store.proposal(str(proposal_id)) if proposal_id else None
    review_data = evidence_of(row, "review") if row else {}
    body = _pr_body(ctx, row)
    pr = deps.effects.open_pull_request(
        PR_REVIEW, ctx.branch_name, ctx.base_branch, ctx.title, body
    )
    if ctx.dev_round > 1:
        deps.effects.update_pull_request(PR_REVIEW, pr, body, f"dev{ctx.dev_round}")
    gate = ci.ci_gate(ctx, deps, pr)
    if isinstance(gate, PhaseResult):  # CI pending (wait), failed (repair) or past its bound
        return gate
    summary = (
        f"approve (the development graph, tier {review_data.get('tier')}, "
        f"attempt {row['attempts'] if row else '?'})"
    )
    if ctx.issue_number:
        deps.effects.comment(
            PR_REVIEW,
            ctx.issue_number,
            f"**#{pr}: {summary}**\n\nreview: {review_data.get('review')}; adversary: "
            f"{review_data.get('adversary')}; arbitrate: {review_data.get('arbitrate')}",
            f"review:r{ctx.dev_round}",
            best_effort=True,
        )
    return PhaseResult.advance(
        REPORT,
        updates={"pr_number": pr, "current_round": 0},
        state={"ci_repairs": 0} if gate is not None else {},
        milestones=(
            *(() if gate is None else (gate,)),
            MilestoneWrite(
                "pr_reviewed",
                round=ctx.dev_round,
                summary=summary,
                data={
                    "verdict": "approve",
                    "comments": f"reviewed in the development graph: {review_data}",
                    "pr": pr,
                    "by": "graph",
                    "proposal": proposal_id,
                    "review": review_data,
                },
            ),
        ),
    )


def evidence_of(row: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The data of ``row``'s last evidence of ``kind`` ({} when it has none)."""
    found = [e["data"] for e in row["evidence"] if e.get("kind") == kind]
    return dict(found[-1]) if found else {}


def _pr_body(ctx: WorkflowContext, row: Mapping[str, Any] | None) -> str:
    issue = f"Implements #{ctx.issue_number}\n\n" if ctx.issue_number else ""
    body = f"{issue}{ctx.title}\n\n## Plan\n\n{ctx.state.get('plan', '')}\n"
    if row is not None:
        lines = []
        for evidence in row["evidence"]:
            lines.append(f"- **{evidence['kind']}**: `{_short(evidence['data'])}`")
        body += (
            f"\n## Evidence (proposal {row['id']}, {row['status']} by {row['decided_by']})\n\n"
            + "\n".join(lines)
            + "\n"
        )
    return body + f"\n_phasegate workflow `{ctx.id}`, development round {ctx.dev_round}_"


def _short(value: Any, limit: int = 300) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"
