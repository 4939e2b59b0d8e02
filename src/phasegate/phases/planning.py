"""planning: plan-then-review rounds until the plan is approved or rounds run out.

One round per handler call, so every round commits its evidence
(docs/contracts/lifecycle.md: planning).

- preconditions: the worktree exists (``advance()`` self-heals it first);
  current_phase == "planning".
- inputs: ticket, current_round, limits.max_plan_rounds, issue_number, the
  previous round's review comments (state.plan_feedback), user_feedback, and
  after a reversion (docs/contracts/autonomy.md) why it was reverted
  (state.replan_context) and the planning cycle (state.plan_cycle).
- authoritative evidence: ``plan_finalized`` (approved, or the last plan when
  max_plan_rounds is exhausted); per round ``plan_created``/``plan_refined``
  and ``plan_reviewed``.
- side effects: two agent runs per round (plan on the main line, review on the
  review line), both read-only; an issue comment with the plan; clears
  user_feedback after putting it in the prompt.
- postconditions: on approval current_phase == "development", status ==
  "developing", current_round == 0, state.plan holds the finalized plan.
  A plan agent that timed out every try: status "planning_timeout".
- re-entry point: current_round is persisted; the round number is always
  current_round + 1, never kept in memory. A cycle after a reversion starts
  at round 1 again; its milestones' dedupe keys and its comments' markers
  carry the cycle (``c1``, ...), so the earlier cycles' rows are kept.
- recovery behavior: agent failures retry within limits.agent_retries; a
  shutdown (WorkflowPaused) leaves the status untouched. When the rounds run
  out with the plan not approved, the last review's comments are carried on
  as a ``limit_reached`` milestone (the report lists it)
  and state.carried_findings, which the build prompt holds. A cycle after a
  reversion whose final plan is the one the last cycle built
  (``profiles.repeated_plan``) pauses with reason ``no_progress`` and a
  ``no_progress`` milestone, never building it again; ``resume`` plans again
  and lets a repeat through, ``phasegate feedback`` plans again with it.
- terminal outcomes: completed → development; retry (next round); pause
  (planning_timeout, no_progress, or a plan_review that gave no readable
  verdict limits.max_review_parse_failures times); failed (the agents failed
  every try).
"""

from __future__ import annotations

from typing import Final

from phasegate.agents.service import AgentFailed
from phasegate.core.contract import (
    DEVELOPMENT,
    PLANNING,
    MilestoneWrite,
    PhaseResult,
    WorkflowContext,
)
from phasegate.core.profiles import repeated_plan
from phasegate.core.state import WorkflowState
from phasegate.graph.facts import NO_PROGRESS_SIMILARITY
from phasegate.phases.deps import (
    PhaseDeps,
    agent_failure,
    non_empty,
    review_failure,
    verdict_parser,
    worktree_of,
)
from phasegate.phases.graph_mode import run as graph_mode
from phasegate.phases.limits import limit_reached

#: The stop (reason, milestone kind, state key) of a cycle that plans what the last
#: cycle built (the fix loop's name for a loop that makes no progress:
#: docs/contracts/graph.md, the loop's stops).
NO_PROGRESS: Final = "no_progress"

__all__ = ["run"]

PLAN_PROMPT = """You are planning a change to the repository in your working directory.
Do not modify any file. Read what you need, then write a concise, numbered
implementation plan: the files to change, the functions to add or edit, and
the tests that will prove it.

## Ticket: {title}

{ticket}
{extra}"""

REVIEW_PROMPT = """Review this implementation plan for the ticket below. Do not modify any file.
Approve it if it would resolve the ticket correctly and is testable; otherwise
say precisely what must change. End your answer with one line:
VERDICT: approve    or    VERDICT: revise

## Ticket: {title}

{ticket}

## Plan (round {round})

{plan}
"""


def run(ctx: WorkflowContext, deps: PhaseDeps) -> PhaseResult:
    if graph_mode.enabled(ctx, deps):
        return graph_mode.plan(ctx, deps)
    round_num = ctx.current_round + 1
    cycle = int(ctx.state.get("plan_cycle") or 0)
    cycle_key = f"c{cycle}" if cycle else ""  # cycle 0 keeps the keys it always had
    cwd = worktree_of(ctx)
    extra = ""
    if ctx.state.get("plan_feedback"):
        extra += (
            f"\n## The reviewer's comments on your previous plan\n\n{ctx.state['plan_feedback']}\n"
        )
    if ctx.state.get("replan_context"):
        extra += f"\n## Why the previous attempt was reverted\n\n{ctx.state['replan_context']}\n"
    if ctx.user_feedback:
        extra += f"\n## Feedback from a person\n\n{ctx.user_feedback}\n"

    try:
        plan = deps.agents.ask(
            ctx,
            PLANNING,
            "plan",
            PLAN_PROMPT.format(title=ctx.title, ticket=ctx.ticket, extra=extra),
            cwd,
            round=round_num,
            parse=non_empty,
        ).parsed
        review = deps.agents.ask(
            ctx,
            PLANNING,
            "plan_review",
            REVIEW_PROMPT.format(title=ctx.title, ticket=ctx.ticket, round=round_num, plan=plan),
            cwd,
            round=round_num,
            parse=verdict_parser(("approve", "revise")),
            garbage_limit=deps.limits.max_review_parse_failures,
        ).parsed
    except AgentFailed as exc:
        failed = MilestoneWrite(
            "plan_failed", status="failed", round=round_num, summary=str(exc), key=cycle_key
        )
        if exc.kind == "timeout":
            return PhaseResult(
                "pause", status="planning_timeout", reason=str(exc), milestones=(failed,)
            )
        if exc.role == "plan_review":
            return review_failure(exc, deps.limits.max_review_parse_failures, milestones=(failed,))
        return agent_failure(exc, milestones=(failed,))

    if ctx.issue_number:
        deps.effects.comment(
            PLANNING,
            ctx.issue_number,
            f"**Plan (round {round_num})**\n\n{plan}",
            f"plan:{cycle_key}:r{round_num}" if cycle else f"plan:r{round_num}",
            best_effort=True,
        )
    approved = review.verdict == "approve"
    milestones = [
        MilestoneWrite(
            "plan_created" if round_num == 1 else "plan_refined",
            round=round_num,
            summary=plan.splitlines()[0][:200],
            data={"plan": plan},
            key=cycle_key,
        ),
        MilestoneWrite(
            "plan_reviewed",
            round=round_num,
            summary=review.verdict,
            data={"verdict": review.verdict, "comments": review.comments},
            key=cycle_key,
        ),
    ]
    if approved or round_num >= deps.limits.max_plan_rounds:
        repeated = _repeated(ctx, plan, cycle)
        if repeated is not None:
            return _no_progress(ctx, round_num, cycle, cycle_key, repeated, plan, milestones)
        carried: WorkflowState = {}
        if not approved:
            limit = limit_reached(
                "plan review rounds",
                "limits.max_plan_rounds",
                round_num,
                review.comments,
                round=round_num,
                key=f"plan_review_rounds{cycle_key}",
            )
            milestones.append(limit)
            # What an earlier loop left open (a reversion's) stays beside it.
            earlier = str(ctx.state.get("carried_findings") or "")
            carried["carried_findings"] = "\n\n".join(
                part for part in (earlier, str(limit.data["carried"])) if part
            )
        milestones.append(
            MilestoneWrite(
                "plan_finalized",
                round=round_num,
                summary="approved" if approved else "max_plan_rounds reached",
                data={"plan": plan, "approved": approved, "rounds": round_num},
                key=cycle_key,
            )
        )
        return PhaseResult.advance(
            DEVELOPMENT,
            updates={"current_round": 0, "user_feedback": None},
            state={"plan": plan, "plan_feedback": None, "replan_context": None, **carried},
            milestones=tuple(milestones),
        )
    return PhaseResult(
        "retry",
        updates={"current_round": round_num, "user_feedback": None},
        state={"plan_feedback": review.comments},
        milestones=tuple(milestones),
    )


def _repeated(ctx: WorkflowContext, plan: str, cycle: int) -> float | None:
    """``profiles.repeated_plan``, unless a person resumed this cycle after it stopped
    so, without new feedback: they have seen the plan repeat and let it be built."""
    resumed = ctx.state.get(NO_PROGRESS) == cycle and not ctx.user_feedback
    return None if resumed else repeated_plan(ctx.state, plan)


def _no_progress(
    ctx: WorkflowContext,
    round_num: int,
    cycle: int,
    cycle_key: str,
    ratio: float,
    plan: str,
    milestones: list[MilestoneWrite],
) -> PhaseResult:
    """The stop of a cycle whose plan is the one the last cycle built: a pause for a
    person with reason ``no_progress``, never another development cycle."""
    why = (
        f"the plan of planning cycle {cycle} is {ratio:.0%} like the plan cycle {cycle - 1} "
        f"built (no_progress at {NO_PROGRESS_SIMILARITY:.0%}): building it again would "
        "repeat what was reverted"
    )
    reason = (
        f'{NO_PROGRESS}: {why}; `phasegate feedback {ctx.id} "..."` tells the planner what '
        f"to change, `phasegate resume {ctx.id}` plans again and builds the plan even if it "
        "is the same"
    )
    stop = MilestoneWrite(
        NO_PROGRESS,
        status="failed",
        round=round_num,
        summary=why[:300],
        data={"similarity": round(ratio, 4), "cycle": cycle, "plan": plan},
        key=cycle_key,
    )
    return PhaseResult(
        "pause",
        reason=reason,
        # The next round after a resume is a new one: this round's rows stay.
        updates={"current_round": round_num, "user_feedback": None},
        state={NO_PROGRESS: cycle, "stopped_on": why},
        milestones=(*milestones, stop),
    )
