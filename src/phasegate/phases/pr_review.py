"""pr_review: one pull request, created or updated, and independent review rounds.

One review round per development round (docs/contracts/lifecycle.md:
pr_review): changes requested send the work back to development with the
review as its input, until limits.max_pr_review_rounds. With
limits.require_full_review_rounds an approval does not end the rounds: the
same change is reviewed again, a pass of its own, until that many rounds ran.

- preconditions: ``dev_completed`` for dev_round; the branch is published;
  current_phase == "pr_review".
- inputs: pr_number, dev_round (the review round), current_round (the passes
  over this development round's change so far), limits.max_pr_review_rounds,
  limits.require_full_review_rounds, the pull request's diff.
- authoritative evidence: ``pr_reviewed`` milestones (one per round, its
  ``pass`` in data) with the parsed verdict.
- side effects: the pull request (journaled create, or update for a later
  development round), the review agent run on the review line (read-only),
  an issue comment with each review that requests changes (an approval's
  words are posted by the report that follows it).
- postconditions: on approval current_phase == "report", status ==
  "reporting"; with require_full_review_rounds, before the cap, another pass
  over the same change instead (current_round + 1). Changes requested, in any
  pass: back to development with dev_round + 1 and the review comments as its
  input; after max_pr_review_rounds (counted from
  the first development round of the planning cycle, so a reversion grants a
  fresh set), a reversion to planning where the profile allows it
  (docs/contracts/autonomy.md: phase reversion), else paused for a person. At
  that cap the last review's findings are carried on: a ``limit_reached``
  milestone (the report lists it), state.carried_findings (the next build's
  prompt, after a reversion too), and the reason ``show`` prints and the
  decision record keeps.
- re-entry point: dev_round and current_round persisted (the pass is
  current_round + 1, never kept in memory); the pull request is found by its
  head branch, never created twice, and updated once per development round. A
  person's ``resume`` (or ``feedback``) of a workflow stopped at the cap does
  not review the same diff again: it sends the change back to development
  with the last review as its input and a fresh set of review rounds.
- recovery behavior: a review agent that fails every try → failed; one that
  gives no readable verdict limits.max_review_parse_failures times → paused
  (resumable, as acceptance_verification's verifier); shutdown →
  WorkflowPaused, nothing committed.
- terminal outcomes: completed → report; completed → development;
  completed → planning (reversion); pause (review rounds exhausted); failed.
"""

from __future__ import annotations

from pathlib import Path

from phasegate.agents.service import AgentFailed
from phasegate.core.contract import (
    DEVELOPMENT,
    PR_REVIEW,
    REPORT,
    MilestoneView,
    MilestoneWrite,
    PhaseResult,
    WorkflowContext,
)
from phasegate.core.profiles import reversion_or_stop
from phasegate.core.state import WorkflowState
from phasegate.phases import ci
from phasegate.phases.deps import PhaseDeps, review_failure, verdict_parser, worktree_of
from phasegate.phases.graph_mode import run as graph_mode
from phasegate.phases.limits import limit_reached, reason_with

__all__ = ["run"]

REVIEW_PROMPT = """Review this pull request (review round {round}) for the ticket below.
Do not modify any file.
Check that it resolves the ticket, is correct, and is tested. End your answer
with one line:  VERDICT: approve   or   VERDICT: request_changes

## Ticket: {title}

{ticket}

## Checks on this change (run by phasegate)

{checks}

## Diff

```diff
{diff}
```
"""


def _checks_text(ctx: WorkflowContext, ci_passed: MilestoneWrite | None = None) -> str:
    """The last check results of this development round, for a reviewer with no shell."""
    runs = [m for m in ctx.milestones_of("tests_run") if m.round == ctx.dev_round]
    lines = [f"- CI `{c['name']}`: passed" for c in (ci_passed.data["checks"] if ci_passed else [])]
    if not runs:
        return "\n".join(lines) or "(no checks configured)"
    for check in runs[-1].data.get("checks", []):
        mark = "passed" if check.get("passed") else "FAILED"
        lines.append(
            f"- `{check.get('command')}`: {mark}\n```\n{str(check.get('output', ''))[-800:]}\n```"
        )
    return "\n".join(lines) or "(no checks configured)"


_DIFF_LIMIT = 60_000  # characters of diff put in the prompt


def _pr_body(ctx: WorkflowContext) -> str:
    plan = str(ctx.state.get("plan", ""))
    return (
        f"Implements #{ctx.issue_number}\n\n{ctx.title}\n\n## Plan\n\n{plan}\n\n"
        f"_phasegate workflow `{ctx.id}`, development round {ctx.dev_round}_"
    )


def run(ctx: WorkflowContext, deps: PhaseDeps) -> PhaseResult:
    if graph_mode.enabled(ctx, deps):
        return graph_mode.review(ctx, deps)
    assert ctx.branch_name is not None
    repo = Path(ctx.repo_path)
    round_num = ctx.dev_round  # one review round per development round
    review_pass = ctx.current_round + 1  # and more over the same change, when required
    capped = ctx.milestone("limit_reached", phase=PR_REVIEW, round=round_num)
    if capped is not None:
        return _resumed_after_the_cap(ctx, capped)
    body = _pr_body(ctx)
    pr = deps.effects.open_pull_request(
        PR_REVIEW, ctx.branch_name, ctx.base_branch, ctx.title, body
    )
    if ctx.dev_round > 1:
        deps.effects.update_pull_request(PR_REVIEW, pr, body, f"dev{ctx.dev_round}")
    gate = ci.ci_gate(ctx, deps, pr)
    if isinstance(gate, PhaseResult):  # CI pending (wait), failed (repair) or past its bound
        return gate
    ci_evidence = () if gate is None else (gate,)

    base = deps.forge.branch_ref(ctx.base_branch)  # GitHub's: the local one may be stale
    diff = deps.workspace.diff(repo, base, ctx.branch_name)
    try:
        review = deps.agents.ask(
            ctx,
            PR_REVIEW,
            "review",
            REVIEW_PROMPT.format(
                title=ctx.title,
                ticket=ctx.ticket,
                diff=diff[:_DIFF_LIMIT],
                round=round_num if review_pass == 1 else f"{round_num}, pass {review_pass}",
                checks=_checks_text(ctx, gate),
            ),
            worktree_of(ctx),
            round=round_num,
            pass_number=review_pass,
            parse=verdict_parser(("approve", "request_changes")),
            garbage_limit=deps.limits.max_review_parse_failures,
        ).parsed
    except AgentFailed as exc:
        return review_failure(exc, deps.limits.max_review_parse_failures, updates={"pr_number": pr})

    # A later pass over the same change is a row of its own; the first keeps its old key.
    again = "" if review_pass == 1 else f"p{review_pass}"
    reviewed = MilestoneWrite(
        "pr_reviewed",
        round=round_num,
        summary=review.verdict,
        data={
            "verdict": review.verdict,
            "comments": review.comments,
            "pr": pr,
            "pass": review_pass,
        },
        key=again,
    )
    if ctx.issue_number and review.verdict != "approve":
        # An approval is posted by the report that follows it, its words included.
        deps.effects.comment(
            PR_REVIEW,
            ctx.issue_number,
            f"**Review of #{pr}, round {round_num}: {review.verdict}**\n\n{review.comments}",
            f"review:r{round_num}{again}",
            best_effort=True,
        )
    passed: WorkflowState = {"ci_repairs": 0} if ci_evidence else {}
    cycle_rounds = _cycle_rounds(ctx, review_pass)
    if review.verdict == "approve":
        if (
            deps.limits.require_full_review_rounds
            and cycle_rounds < deps.limits.max_pr_review_rounds
        ):
            # The team wants every round's pass, an approval included: review again.
            return PhaseResult(
                "retry",
                updates={"pr_number": pr, "current_round": review_pass},
                state=passed,
                milestones=(*ci_evidence, reviewed),
            )
        return PhaseResult.advance(
            REPORT,
            updates={"pr_number": pr, "current_round": 0},
            state=passed,
            milestones=(*ci_evidence, reviewed),
        )
    if cycle_rounds >= deps.limits.max_pr_review_rounds:
        # The reviewers keep rejecting what this plan builds (docs/contracts/autonomy.md:
        # phase reversion): re-plan where the profile allows it, else a person decides.
        reason = (
            f"review still requests changes after {cycle_rounds} round(s) "
            "(limits.max_pr_review_rounds)"
        )
        limit = limit_reached(
            "PR review rounds",
            "limits.max_pr_review_rounds",
            cycle_rounds,
            review.comments,
            round=round_num,
        )
        return reversion_or_stop(
            ctx,
            reason=reason_with(reason, review.comments),
            context=f"{reason}. The last review:\n\n{review.comments[-3000:]}",
            at=deps.clock.now(),
            milestones=(*ci_evidence, reviewed, limit),
            state={
                **passed,
                "carried_findings": limit.data["carried"],
                "review_feedback": review.comments,
            },
            hint="send feedback or resume",
        )
    return PhaseResult.advance(
        DEVELOPMENT,
        updates={"pr_number": pr, "current_round": 0, "dev_round": ctx.dev_round + 1},
        state={**passed, "review_feedback": review.comments},
        milestones=(*ci_evidence, reviewed),
    )


def _cycle_rounds(ctx: WorkflowContext, review_pass: int) -> int:
    """The review rounds of this planning cycle, the running one included: one per
    development round since the cycle began, and each later pass over a change."""
    start = int(ctx.state.get("cycle_start_dev_round") or 1)
    earlier_passes = sum(
        1
        for m in ctx.milestones_of("pr_reviewed")
        if m.phase == PR_REVIEW and start <= m.round < ctx.dev_round and m.data.get("pass", 1) > 1
    )
    return ctx.dev_round - start + 1 + earlier_passes + review_pass - 1


def _resumed_after_the_cap(ctx: WorkflowContext, capped: MilestoneView) -> PhaseResult:
    """A person resumed a workflow whose review rounds ran out: another build with the
    last review as its input, and a fresh set of review rounds from it."""
    findings = str(capped.data.get("findings", ""))
    return PhaseResult.advance(
        DEVELOPMENT,
        updates={"current_round": 0, "dev_round": ctx.dev_round + 1},
        state={
            "review_feedback": ctx.state.get("review_feedback") or findings,
            "carried_findings": capped.data.get("carried"),
            "cycle_start_dev_round": ctx.dev_round + 1,
            "stopped_on": None,
        },
    )
