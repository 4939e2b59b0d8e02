"""Planning, development and pr_review run by the development graph inside the phases.

On when the cartridge says ``[graph] enabled = true`` (docs/contracts/graph.md).

One graph run (``{workflow}-g{n}``) spans a planning and its development:

- planning drives the graph up to build (``graph.plan_propose``: scope when
  bound, the plan, the competing plan and its arbiter, the plan adversary)
  and finalizes the plan with ``plan_competition``/``plan_attack`` evidence;
- development drives the whole graph for the same run. Its first calls are
  answered from the answers planning kept (``harness.WorkflowAnswers``), then
  build, review, adversary and arbitrate run live, the fix loop included. The
  run is recorded with its proposals; the harness applies the draft PR's
  patch in a scratch worktree and runs ``landing_areas.checks`` there, as
  evidence before any gate. Failing checks: the harness rejects the proposal
  (CHECKS_GATE) and a new run is told why, within ``limits.max_dev_retries``.
  Passing checks: the mode the autonomy policy gave the proposal decides.
  ``auto`` → the apply arm applies the patch in the workflow's worktree,
  commits and publishes the branch; ``propose`` → the workflow pauses until
  ``phasegate approve ID`` (the apply arm then lands it) or ``phasegate
  reject ID --reason`` (a new run, told why);
- pr_review opens or updates the pull request with the graph's evidence and
  goes on to the report: the graph has reviewed the change, under the tier
  its facts gave it, and there is no second review.

Every answer is kept as it arrives, so a phase killed at any moment is driven
again from the kept answers and asks the agents only what it never got an
answer to; a recorded run is never run again, so no proposal is made twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from phasegate.core.autonomy import AutonomyPolicy
from phasegate.core.contract import (
    AWAITING_APPROVAL,
    DEVELOPMENT,
    PLANNING,
    MilestoneWrite,
    PhaseResult,
    WorkflowContext,
    WorkflowPaused,
)
from phasegate.core.profiles import AutomationProfile, reversion_or_stop
from phasegate.core.state import WorkflowState
from phasegate.graph import drive, lifecycle_propose, plan_propose
from phasegate.graph.proposals import Evidence
from phasegate.phases.deps import PhaseDeps, worktree_of
from phasegate.phases.graph_mode import epic
from phasegate.phases.graph_mode.apply import PROPOSAL_TRAILER, apply_draft
from phasegate.phases.graph_mode.harness import (
    ProposeInterrupted,
    WorkflowAnswers,
    check_proposals,
    with_harness,
)
from phasegate.phases.graph_mode.outcome import (
    agents_failed,
    check_failure,
    plan_failed,
    plan_summary,
    run_summary,
    tests_run,
    why_nothing,
)
from phasegate.phases.graph_mode.review import evidence_of, review
from phasegate.phases.limits import limit_reached

__all__ = ["CHECKS_GATE", "PROPOSAL_TRAILER", "develop", "enabled", "plan", "review"]

#: ``decided_by`` of a proposal the harness rejected because its checks failed.
CHECKS_GATE = "harness:checks"


def enabled(ctx: WorkflowContext, deps: PhaseDeps) -> bool:
    """Whether the development graph runs this workflow's planning, development and
    pr_review: as the cartridge said when the workflow was started (``state["graph_mode"]``,
    so turning the flag over never strands a workflow midway), else as it says now."""
    kept = ctx.state.get("graph_mode")
    return bool(deps.cartridge.graph.enabled if kept is None else kept)


def _ticket(ctx: WorkflowContext, *, feedback: bool = True) -> str:
    """The graph's ticket: the title line (the proposals' title), the ticket, and what
    a reversion (and, with ``feedback``, a person) added since."""
    body = ctx.ticket.strip()
    first = body.splitlines()[0].strip().lstrip("#").strip() if body else ""
    parts = [body] if first == ctx.title.strip() else [ctx.title, body]
    if ctx.state.get("replan_context"):
        parts.append(f"## Why the previous attempt was reverted\n\n{ctx.state['replan_context']}")
    if feedback and ctx.user_feedback:
        parts.append(f"## Feedback from a person\n\n{ctx.user_feedback}")
    if ctx.state.get("scope_feedback"):
        parts.append(f"## Why the last pieces were rejected\n\n{ctx.state['scope_feedback']}")
    return "\n\n".join(p for p in parts if p)


def _new_run(ctx: WorkflowContext, deps: PhaseDeps, ticket: str) -> WorkflowState:
    """The state that starts run n + 1. Derived from the committed state only, so a
    phase driven again after a crash starts the very same run and finds its answers."""
    n = int(ctx.state.get("graph_runs") or 0) + 1
    return {
        "graph_runs": n,
        "graph_run": f"{ctx.id}-g{n}",
        "graph_ticket": ticket,
        "graph_date": deps.clock.now().date().isoformat(),
    }


def _answers(
    ctx: WorkflowContext, deps: PhaseDeps, run: Mapping[str, Any], phase: str, round: int
) -> WorkflowAnswers:
    return WorkflowAnswers(
        deps.agents,
        ctx,
        str(run["graph_run"]),
        phase=phase,
        cwd=worktree_of(ctx),
        round=round,
        session_tag=f"g{run['graph_runs']}",
    )


# -- planning ---------------------------------------------------------------------


def plan(ctx: WorkflowContext, deps: PhaseDeps) -> PhaseResult:
    """planning in graph mode: one round of scope and the plan stage.

    Evidence: ``plan_created`` and ``plan_finalized`` (the plan, the run id,
    scope's decision, plan_competition and plan_attack when their roles ran),
    keyed by the run. A graph that stops here (scope routed the ticket
    elsewhere, merged without a plan) is recorded with its proposals (scope's
    item_create) and pauses the workflow with the stop named; ``resume``
    starts a new run. Scope's routed pieces are an epic's (``epic``): filed as
    tickets once their item_create is approved or auto. A role that failed
    every try (garbage included) fails the workflow, a spend cap pauses it;
    neither is recorded, and ``resume`` continues the same run from its kept
    answers.
    """
    filing = epic.resumed(ctx, deps)  # an epic's pieces: filed, finished or turned down
    if filing is not None:
        return filing
    started: WorkflowState = {"sync_base": False} if ctx.state.get("sync_base") else {}
    ticket = _ticket(ctx) + (_sync_base(ctx, deps) if started else "")
    run = _new_run(ctx, deps, ticket)
    started.update(run)
    answers = _answers(ctx, deps, run, PLANNING, round=1)
    planned = drive(plan_propose(cartridge=epic.graph_rules(ctx, deps), ticket=ticket), answers)
    key = f"g{run['graph_runs']}"
    if planned["stopped"] is not None:
        stop = planned["stopped"]
        why = f"the development graph stopped at {stop['node']}: {stop['reason']}: {stop['detail']}"
        # An agent that failed every try: the run is not over. Nothing is recorded
        # and the run number is kept, so `resume` continues this very run: the
        # answers kept are replayed and only the failed call is asked again.
        agents = agents_failed(
            planned,
            review_limit=deps.limits.max_review_parse_failures,
            state={"sync_base": False} if "sync_base" in started else {},
            milestones=(plan_failed(run, key, why, stop),),
        )
        if agents is not None:
            return agents
        record, _ = _run_graph(ctx, deps, run, PLANNING, 1)
        proposed = [p["id"] for p in deps.store.proposals(run_id=run["graph_run"])]
        hint = (
            f"; its proposal(s) {', '.join(proposed)} are listed by `phasegate proposals`"
            if proposed
            else ""
        )
        if stop["reason"] == "routed" and record["scope"]:
            shaped = record["scope"]
            why = (
                f"scope found {shaped['pieces']} pieces of work (a {shaped['shape']} ticket), "
                f"which [graph.work_routing] sends to {shaped['route']!r}, not to this build"
            )
            stopped = plan_failed(run, key, why, stop, "scope_routed")  # a route, no failure
            return epic.routed(ctx, deps, str(run["graph_run"]), why, started, stopped)
        return PhaseResult(
            "pause",
            reason=f"{why}{hint}; then `phasegate resume {ctx.id}`",
            state={**started, "stopped_on": why},
            milestones=(plan_failed(run, key, why, stop),),
        )
    text = str(planned["plan"])
    if ctx.issue_number:
        deps.effects.comment(
            PLANNING, ctx.issue_number, f"**Plan**\n\n{text}", f"plan:{key}", best_effort=True
        )
    evidence = {
        "run_id": run["graph_run"],
        "scope": planned["scope"],
        "plan_competition": planned["plan_competition"],
        "plan_attack": planned["plan_attack"],
    }
    return PhaseResult.advance(
        DEVELOPMENT,
        updates={"current_round": 0, "user_feedback": None},
        state={
            **started,
            "plan": text,
            "plan_feedback": None,
            "replan_context": None,
            "graph_feedback": None,
            "scope_feedback": None,
        },
        milestones=(
            MilestoneWrite(
                "plan_created",
                round=1,
                key=key,
                summary=text.splitlines()[0][:200] if text.strip() else "",
                data={"plan": text, "run_id": run["graph_run"]},
            ),
            MilestoneWrite(
                "plan_finalized",
                round=1,
                key=key,
                summary=plan_summary(planned),
                data={"plan": text, "approved": True, "rounds": 1, **evidence},
            ),
        ),
    )


def _sync_base(ctx: WorkflowContext, deps: PhaseDeps) -> str:
    """A merge reverted for a conflict: build the next change on what the base holds now.

    The base is merged into the branch; when it conflicts, the branch is
    rebuilt from the base instead (the graph's agents are read-only and
    cannot resolve conflict markers): the note returned tells the ticket, else "".
    """
    cwd = worktree_of(ctx)
    base = deps.forge.branch_ref(ctx.base_branch)
    conflicted = deps.workspace.start_base_merge(cwd, base)
    note = ""
    if conflicted:  # resetting to the base also ends the merge left in progress
        deps.workspace.reset_to(cwd, deps.workspace.rev(cwd, base))
        note = (
            f"\n\n## The branch was rebuilt from {ctx.base_branch}\n\nThe previous change "
            f"conflicted with {ctx.base_branch} in: {', '.join(conflicted)}. Write the whole "
            "change again on what the base holds now."
        )
    return note


# -- development --------------------------------------------------------------------


def develop(ctx: WorkflowContext, deps: PhaseDeps) -> PhaseResult:
    """development in graph mode: the whole graph for the run, then the gate, then the apply arm.

    Evidence: ``graph_run`` (the run, its fix loop, the proposals and their
    modes), ``tests_run`` (the harness's checks on the proposed patch, run
    before the gate) and on landing ``dev_completed`` with the commit. No
    draft PR proposed (a fix loop stop, a graph stop) is a failed attempt:
    a reversion to planning where the profile allows it, else a pause; a
    fix loop that ran out leaves ``limit_reached`` (the report lists it) and
    its findings go into the next run's ticket (state.graph_feedback).
    Failing checks reject the proposal (CHECKS_GATE) and start a new run told
    why, up to ``limits.max_dev_retries`` more; then a reversion or a pause.
    A ``propose`` proposal pauses the workflow for ``phasegate approve`` or
    ``reject``; a rejection starts a new run told why. Shutdown raises
    WorkflowPaused with the answers so far kept.
    """
    if not ctx.state.get("plan"):
        return PhaseResult("failed", reason="no finalized plan (plan_finalized milestone missing)")
    stored: Mapping[str, Any] = ctx.state  # read by the names the loop gives
    run = {k: stored.get(k) for k in ("graph_runs", "graph_run", "graph_ticket", "graph_date")}
    started: WorkflowState = {"graph_feedback": None, "ci_failure": None}
    ci_failure = ctx.state.get("ci_failure")
    if not run["graph_run"] or ctx.user_feedback or ctx.state.get("graph_feedback") or ci_failure:
        # A new run: feedback from a person, the last proposal was rejected, or CI failed.
        ticket = str(run["graph_ticket"] or _ticket(ctx, feedback=False))
        if ctx.user_feedback:
            ticket += f"\n\n## Feedback from a person\n\n{ctx.user_feedback}"
        if ctx.state.get("graph_feedback"):
            ticket += f"\n\n## The previous change was rejected\n\n{ctx.state['graph_feedback']}"
        if ci_failure:
            ticket += f"\n\n## CI failed on the pull request\n\n{ci_failure}"
        started.update(fresh := _new_run(ctx, deps, ticket))
        run = dict(fresh)
    if not run["graph_date"]:
        run["graph_date"] = deps.clock.now().date().isoformat()
    updates = {"user_feedback": None} if ctx.user_feedback else {}
    record, recorded = _run_graph(ctx, deps, run, DEVELOPMENT, ctx.dev_round)
    key = f"g{run['graph_runs']}"
    if not recorded:
        # An agent that failed every try: a reversion would only fail the same way
        # again. The run is kept open: `resume` replays its answers and asks again
        # only what failed.
        stopped = MilestoneWrite(
            "graph_run",
            status="failed",
            round=ctx.dev_round,
            key=key,
            summary=f"run {run['graph_run']}: {why_nothing(record)}"[:500],
            data={"run_id": run["graph_run"], "stopped": record["stopped"], "open": True},
        )
        failed = agents_failed(
            record,
            state=started,
            milestones=(stopped,),
            updates=updates,
            review_limit=deps.limits.max_review_parse_failures,
        )
        assert failed is not None
        return failed
    rows = deps.store.proposals(run_id=str(run["graph_run"]))
    draft = next((r for r in rows if r["kind"] == "draft_pr_create"), None)
    evidence = MilestoneWrite(
        "graph_run",
        status="completed" if draft else "failed",
        round=ctx.dev_round,
        key=key,
        summary=run_summary(record, draft),
        data={
            "run_id": run["graph_run"],
            "fix_loop": record["fix_loop"],
            "stopped": record["stopped"],
            "change_facts": record["change_facts"],
            "usage": record["usage"],
            "proposals": [
                {k: r[k] for k in ("id", "kind", "mode", "status", "attempts")} for r in rows
            ],
        },
    )
    if draft is None:
        why = why_nothing(record)
        limits: tuple[MilestoneWrite, ...] = ()
        if not record.get("stopped"):  # the fix loop ran out (not a graph stop)
            attempts = int(record["fix_loop"]["attempts"])
            limit = limit_reached(
                "graph fix loop", "graph.fix_attempts", attempts, why, round=ctx.dev_round, key=key
            )
            limits = (limit,)
        return reversion_or_stop(
            ctx,
            reason=f"the development graph proposed no change: {why}",
            context=f"Development round {ctx.dev_round}, graph run {run['graph_run']}: {why}",
            at=deps.clock.now(),
            milestones=(evidence, *limits),
            # whatever a person or a reversion does next, it is a new run, told what the
            # last one found
            state={**started, "graph_run": None, "graph_feedback": why},
        )
    checked = evidence_of(draft, "checks")
    tests = tests_run(ctx, draft, checked, key)
    milestones: tuple[MilestoneWrite, ...] = (evidence, tests)
    state = started.copy()
    if draft["status"] == "proposed" and not checked.get("passed", True):
        # Work that fails its checks is never offered for landing: the harness
        # rejects it (the kind's streak resets) and the next run is told why.
        draft = deps.store.decide_proposal(
            str(draft["id"]), "rejected", CHECKS_GATE, check_failure(checked)[:4000]
        )
    if draft["status"] == "rejected":
        return _rejected(ctx, deps, draft, run, updates, state, milestones)
    if draft["status"] == "proposed" and draft["mode"] == "propose":
        why = (
            "it changes governance paths (self_modification), which a person always decides"
            if draft["self_modification"]
            else "the autonomy policy proposes this kind"
        )
        return PhaseResult(
            "pause",
            status=AWAITING_APPROVAL,
            updates=updates,
            reason=f"proposal {draft['id']} (draft_pr_create; its checks passed; {why}) awaits "
            f"a person: `phasegate approve {draft['id']}` lands it, "
            f"`phasegate reject {draft['id']} --reason TEXT` starts a new run told why",
            # what a later plan reads if a person reverts instead: no instructions for people
            state={
                **state,
                "stopped_on": f"the draft PR of run {run['graph_run']} (proposal "
                f"{draft['id']}) waited for a person's approval",
            },
            milestones=milestones,
        )
    return apply_draft(ctx, deps, draft, run, updates, state, milestones)


def _rejected(
    ctx: WorkflowContext,
    deps: PhaseDeps,
    draft: Mapping[str, Any],
    run: Mapping[str, Any],
    updates: dict[str, Any],
    state: WorkflowState,
    milestones: tuple[MilestoneWrite, ...],
) -> PhaseResult:
    """A new run told why the proposal was rejected. Rejections by the checks are
    bounded like failing checks outside graph mode: after ``limits.max_dev_retries``
    more runs, a reversion to planning where the profile allows it, else a pause."""
    why = f"proposal {draft['id']} was rejected by {draft['decided_by']}: {draft['reason']}"
    next_run: WorkflowState = {**state, "graph_run": None, "graph_feedback": why}
    if draft["decided_by"] != CHECKS_GATE:
        return PhaseResult("retry", updates=updates, state=next_run, milestones=milestones)
    attempt = int(ctx.state.get("test_retries") or 0) + 1
    if attempt <= deps.limits.max_dev_retries:
        return PhaseResult(
            "retry",
            updates=updates,
            state={**next_run, "test_retries": attempt},
            milestones=milestones,
        )
    reason = (
        f"the harness rejected the draft PR of {attempt} graph run(s) in a row; "
        f"the last: {str(draft['reason'])[:1500]}"
    )
    return reversion_or_stop(
        ctx,
        reason=reason,
        context=f"Development round {ctx.dev_round}, graph run {run['graph_run']}: {reason}",
        at=deps.clock.now(),
        milestones=milestones,
        state={**next_run, "test_retries": 0, "last_check_failure": draft["reason"]},
    )


def _run_graph(
    ctx: WorkflowContext, deps: PhaseDeps, run: Mapping[str, Any], phase: str, round: int
) -> tuple[dict[str, Any], bool]:
    """The run's record, and whether it is recorded.

    A recorded run is read back, never run again. Otherwise the whole graph is
    driven (kept answers replayed, the rest asked in ``phase``), its draft PRs
    checked, and the run recorded with its proposals, in one transaction;
    except a run an agent's failure ended, which is returned unrecorded (it is
    resumed, not repeated). Shutdown raises WorkflowPaused.
    """
    run_id = str(run["graph_run"])
    found = deps.store.find_run(run_id)
    if found is not None:
        return found["record"], True
    answers = _answers(ctx, deps, run, phase, round=round)
    record = drive(
        lifecycle_propose(
            run_id=run_id,
            date=str(run["graph_date"]),
            cartridge=epic.graph_rules(ctx, deps),
            ticket=str(run["graph_ticket"]),
        ),
        answers,
    )
    if agents_failed(record, state={}, milestones=()) is not None:
        return record, False
    try:
        checked = check_proposals(
            deps.cartridge,
            worktree_of(ctx),
            run_id,
            record["proposals"],
            workspace=deps.workspace,
            cancel=deps.shutdown,
            run_checks=deps.run_checks,
        )
    except ProposeInterrupted as exc:
        raise WorkflowPaused(str(exc)) from None
    if checked:
        record = with_harness(record, checked)
    profile = AutomationProfile.from_state(ctx.state)
    deps.store.record_run(
        record,
        policy=AutonomyPolicy.from_cartridge(deps.cartridge, profile),
        workflow_id=ctx.id,
        extra_evidence={pid: [Evidence("checks", data)] for pid, data in checked.items()},
    )
    return record, True
