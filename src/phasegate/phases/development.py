"""development: the build role changes the worktree, the change is committed, checks run.

Bounded retries on failing checks (spec 000, development).

- preconditions: the worktree exists on branch_name; a ``plan_finalized``
  milestone exists (state.plan); current_phase == "development".
- inputs: state.plan, dev_round, state.test_retries, the previous attempt's
  failing checks (state.last_check_failure), review comments from pr_review
  (state.review_feedback), user_feedback.
- authoritative evidence: ``tests_run`` (per attempt, the checks' structured
  results: command, exit code, duration, output tail) and ``dev_completed``.
- side effects: the build agent run (writes code), a git commit, the
  cartridge's checks, the branch push (journaled).
- postconditions: on success current_phase == "pr_review", status ==
  "pr_review", current_round == 0, retry counters cleared.
- re-entry point: dev_round and test_retries are persisted; a completed
  ``dev_completed`` for this dev_round short-circuits, so a restart never
  builds the same round twice.
- recovery behavior: failing checks → retry up to limits.max_dev_retries,
  then a reversion to planning (spec 003, Execute → Strategize) with the
  failure as the next plan's input where the profile's
  ``auto_strategy_revision`` < 1.0 allows it, else a pause for a person
  (``phasegate revert`` or ``resume``); past the loop guard, failed (pause
  where a person decides anyway). A build agent that answers ``REPLAN: why``
  (the plan's constraints are too restrictive) is handled the same way at
  once, its changes discarded. A build agent that fails every try → failed.
  Shutdown raises WorkflowPaused and commits nothing.
- terminal outcomes: completed → pr_review; completed → planning (reversion);
  retry; pause; failed.
"""

from __future__ import annotations

import re
from pathlib import Path

from phasegate.agents.env import secret_names_in
from phasegate.agents.service import AgentFailed
from phasegate.contract import DEVELOPMENT, MilestoneWrite, PhaseResult, WorkflowContext
from phasegate.phases import graph_mode
from phasegate.phases.deps import PhaseDeps, agent_failure, developed, worktree_of
from phasegate.profiles import reversion_or_stop
from phasegate.workspace import CheckResult

__all__ = ["run"]

BUILD_PROMPT = """Implement the plan below in the repository in your working directory.
Edit the files directly and make the change complete, with tests. Do not commit;
phasegate commits your changes. Finish with a short summary of what you changed.
If the plan's constraints make the ticket impossible to implement as planned,
change nothing and end your answer with one line:  REPLAN: <why>

## Ticket: {title}

{ticket}

## Plan

{plan}
{extra}"""


#: The build agent's word that the plan cannot be implemented as constrained.
_REPLAN = re.compile(r"^\s*REPLAN:\s*(.+?)\s*$", re.MULTILINE | re.IGNORECASE)


def replan_request(text: str) -> str | None:
    """The reason of the last ``REPLAN: why`` line of a build answer, or None."""
    found = _REPLAN.findall(text)
    return found[-1] if found else None


def _failure_summary(checks: list[CheckResult]) -> str:
    parts = []
    for check in checks:
        if not check.passed:
            how = "timed out" if check.timed_out else f"exit code {check.exit_code}"
            parts.append(f"$ {check.command}  ({how})\n{check.output[-1500:]}")
    return "\n\n".join(parts)


def run(ctx: WorkflowContext, deps: PhaseDeps) -> PhaseResult:
    if graph_mode.enabled(ctx, deps):
        return graph_mode.develop(ctx, deps)
    cwd = worktree_of(ctx)
    repo = Path(ctx.repo_path)
    dev_round = ctx.dev_round
    done = ctx.milestone("dev_completed", phase=DEVELOPMENT, round=dev_round)
    if done is not None and done.status == "completed":
        return developed(str(done.data.get("head", "")), ())
    plan = ctx.state.get("plan")
    if not plan:
        return PhaseResult("failed", reason="no finalized plan (plan_finalized milestone missing)")

    attempt = int(ctx.state.get("test_retries", 0)) + 1
    extra = ""
    if ctx.state.get("review_feedback"):
        extra += f"\n## The reviewer sent the change back\n\n{ctx.state['review_feedback']}\n"
    if ctx.user_feedback:
        extra += f"\n## Feedback from a person\n\n{ctx.user_feedback}\n"
    if ctx.state.get("last_check_failure"):
        extra += (
            f"\n## The checks failed on your last attempt\n\n{ctx.state['last_check_failure']}\n"
        )

    before = deps.workspace.rev(cwd, "HEAD")
    if ctx.state.get("sync_base"):
        # Reverted from a merge that could not proceed: build on what the base holds now.
        conflicted = deps.workspace.start_base_merge(cwd, ctx.base_branch)
        if conflicted:
            extra += (
                f"\n## {ctx.base_branch} was merged into your branch and these files conflict\n\n"
                + "\n".join(f"- {name}" for name in conflicted)
                + "\n\nResolve every conflict marker in them as part of your change.\n"
            )
    try:
        answer = deps.agents.ask(
            ctx,
            DEVELOPMENT,
            "build",
            BUILD_PROMPT.format(title=ctx.title, ticket=ctx.ticket, plan=plan, extra=extra),
            cwd,
            round=dev_round,
            attempt=attempt,
        )
    except AgentFailed as exc:
        failed = MilestoneWrite(
            "dev_failed", status="failed", round=dev_round, attempt=attempt, summary=str(exc)
        )
        return agent_failure(exc, milestones=(failed,))

    assert ctx.branch_name is not None
    blocked = replan_request(answer.text)
    if blocked is not None:
        # The agent says the plan cannot work: what it changed is not the plan's change.
        deps.workspace.reset_to(cwd, before)
        reason = f"the build agent reports the plan's constraints too restrictive: {blocked}"
        return reversion_or_stop(
            ctx,
            reason=reason[:1000],
            context=f"Development round {dev_round}, attempt {attempt}: {reason}\n\n"
            f"The build agent's answer:\n{answer.text.strip()[-2000:]}",
            at=deps.clock.now(),
            milestones=(
                MilestoneWrite(
                    "plan_blocked",
                    status="failed",
                    round=dev_round,
                    attempt=attempt,
                    summary=blocked[:500],
                    data={"agent_summary": answer.text.strip()[-2000:]},
                ),
            ),
        )
    leaked = secret_names_in(deps.workspace.change_since(cwd, before))
    if leaked:
        # A key in the change would be committed, reviewed, merged: drop the whole
        # attempt (commits the agent made itself included); name the variable only.
        deps.workspace.reset_to(cwd, before)
        return _attempt_failed(
            ctx,
            deps,
            attempt,
            f"the change held the value of {', '.join(leaked)}; it was discarded",
        )
    commit = deps.workspace.commit_all(
        cwd,
        f"{ctx.title}\n\nphasegate workflow {ctx.id}, development round {dev_round}, "
        f"attempt {attempt}",
    )
    head = deps.workspace.rev(cwd, "HEAD")
    changed = deps.workspace.commits_ahead(repo, ctx.base_branch, ctx.branch_name) > 0
    checks = deps.run_checks(cwd)
    # The checks ran on the commit just made; what they leave in the worktree
    # (bytecode, caches, rewritten files) is theirs, not the change's, and the
    # next attempt's commit_all would sweep it into the branch.
    deps.workspace.discard_changes(cwd)
    passed = changed and all(c.passed for c in checks)
    failure = _failure_summary(checks) if changed else "the build agent changed no file"
    tests_run = MilestoneWrite(
        "tests_run",
        round=dev_round,
        attempt=attempt,
        status="completed" if passed else "failed",
        summary=f"{sum(c.passed for c in checks)}/{len(checks)} checks passed"
        + ("" if changed else "; no change"),
        data={
            "checks": [c.as_dict() for c in checks],
            "passed": passed,
            "commit": commit,
            "head": head,
            "agent_summary": answer.text.strip()[-2000:],
        },
    )
    if passed:
        deps.effects.push_branch(DEVELOPMENT, ctx.branch_name, head)
        return developed(
            head,
            (
                tests_run,
                MilestoneWrite(
                    "dev_completed",
                    round=dev_round,
                    summary=f"head {head[:12]}",
                    data={"head": head, "attempts": attempt},
                ),
            ),
        )
    reason = (
        f"checks still failing after {attempt} attempt(s): {failure[:1500]}"
        if changed
        else f"the build agent changed no file in {attempt} attempt(s)"
    )
    return _retry_or_revert(ctx, deps, attempt, failure, reason, tests_run)


def _retry_or_revert(
    ctx: WorkflowContext,
    deps: PhaseDeps,
    attempt: int,
    failure: str,
    reason: str,
    evidence: MilestoneWrite,
) -> PhaseResult:
    """Another attempt (the failure goes into its prompt) within max_dev_retries; then
    the validation failures block applying: a reversion to planning, or a stop
    (``profiles.reversion_or_stop``)."""
    if attempt <= deps.limits.max_dev_retries:
        return PhaseResult(
            "retry",
            state={"test_retries": attempt, "last_check_failure": failure},
            milestones=(evidence,),
        )
    return reversion_or_stop(
        ctx,
        reason=reason,
        context=f"Development round {ctx.dev_round}: {reason}",
        at=deps.clock.now(),
        milestones=(evidence,),
        state={"last_check_failure": failure},
    )


def _attempt_failed(ctx: WorkflowContext, deps: PhaseDeps, attempt: int, why: str) -> PhaseResult:
    rejected = MilestoneWrite(
        "change_rejected", status="failed", round=ctx.dev_round, attempt=attempt, summary=why
    )
    return _retry_or_revert(ctx, deps, attempt, why, f"attempt {attempt}: {why}", rejected)
