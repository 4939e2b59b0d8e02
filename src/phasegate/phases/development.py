"""development: the build role changes the worktree, the change is committed, checks run.

Bounded retries on failing checks (docs/contracts/lifecycle.md: development).

- preconditions: the worktree exists on branch_name; a ``plan_finalized``
  milestone exists (state.plan); current_phase == "development".
- inputs: state.plan, dev_round, state.test_retries, the previous attempt's
  failing checks (state.last_check_failure), review comments from pr_review
  (state.review_feedback), what the last bounded loop that ran out left open
  (state.carried_findings), user_feedback.
- authoritative evidence: ``build_attempt`` (per attempt: where it started,
  its token, the agent run it kept), ``tests_run`` (per attempt, the checks'
  structured results: command, exit code, duration, output tail),
  ``attempt_discarded`` (an attempt's output thrown away, see below),
  ``limit_reached`` (the retries ran out, with the last failure) and
  ``dev_completed``.
- side effects: the build agent run (writes code), a git commit, the
  cartridge's checks, the branch push (journaled).
- postconditions: on success current_phase == "pr_review", status ==
  "pr_review", current_round == 0, retry counters cleared.
- re-entry point: dev_round and test_retries are persisted; a completed
  ``dev_completed`` for this dev_round short-circuits, so a restart never
  builds the same round twice. An attempt (dev_round R, attempt N) starts by
  journaling ``build_attempt`` in_progress (before the base sync and the
  agent) with the branch's HEAD as its ``start`` and a ``token``; its
  commit carries the trailers ``Phasegate-Attempt: <workflow>/d<R>/a<N>/<token>``
  and ``Phasegate-Agent-Run: <agent_runs id>``; its PhaseResult settles the
  journal. Re-entering with the journal of (R, N) unsettled (the process
  died) is recovery:

  * HEAD carries the journal's token: the attempt's commit was made before
    its result was committed. It is recognised as the attempt's output; the
    agent is not run again, only what the checks left uncommitted is
    discarded, and the checks run on that commit.
  * otherwise the attempt died before its commit: everything since
    ``start`` is discarded (``git reset --hard start`` and ``git clean``:
    partial edits, complete edits of an agent run already recorded ``ok``,
    commits the agent made itself, a base sync merge half done or done) and
    recorded as an ``attempt_discarded`` milestone (paths, insertions,
    deletions, sha256 of the diff, the ``ok`` agent runs whose output it was);
    then the attempt runs anew from ``start``.

  Uncommitted changes found when a new attempt starts (no dead journal) are
  discarded and recorded the same way. So the change on the branch is
  exactly what the recorded attempts made: every ``ok`` build agent run of
  this phase is named by exactly one of a commit trailer on the branch
  (kept), an ``attempt_discarded`` milestone (thrown away: died, REPLAN, a
  leaked secret), or a settled ``build_attempt`` with no commit (it changed
  nothing) — ``phases.attempts.account_build_runs`` checks it.
  An attempt whose net change is empty runs no check (``tests_run`` says
  so). In a round a person's feedback started, a build that adds nothing
  to the head the last report described pauses at once with reason
  ``feedback_unchanged`` (``phases.feedback_round``).
- recovery behavior: failing checks, no file changed, or a net change
  against the base that is empty (a commit and its revert) → retry up to
  limits.max_dev_retries, then a reversion to planning
  (docs/contracts/autonomy.md: phase reversion) with the failure as the next
  plan's input and the next build's (state.carried_findings) where the
  profile's ``auto_strategy_revision`` < 1.0 allows it, else a pause for a
  person (``phasegate revert`` or ``resume``; the failure stays the next
  attempt's input); past the loop guard, failed (pause where a person decides
  anyway). A build agent that answers ``REPLAN: why`` (the plan's
  constraints are too restrictive) is handled the same way at once, its
  changes discarded. A build agent that fails every try → failed.
  Shutdown raises WorkflowPaused and commits nothing (the next entry
  discards what the interrupted attempt left).
- terminal outcomes: completed → pr_review; completed → planning (reversion);
  retry; pause; failed.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from phasegate.agents.env import cartridge_secrets, redact
from phasegate.agents.service import AgentFailed, violation_event
from phasegate.core.contract import DEVELOPMENT, MilestoneWrite, PhaseResult, WorkflowContext
from phasegate.core.profiles import reversion_or_stop
from phasegate.git.workspace import CheckResult
from phasegate.phases import feedback_round
from phasegate.phases.attempts import (
    ATTEMPT_TRAILER,
    RUN_TRAILER,
    Attempt,
    begin,
    discard,
    measure_change,
    ok_build_runs,
    refused_change,
    trailers,
)
from phasegate.phases.deps import PhaseDeps, agent_failure, developed, worktree_of
from phasegate.phases.graph_mode import run as graph_mode
from phasegate.phases.limits import limit_reached

__all__ = ["replan_request", "run"]

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


#: The ``attempt_discarded`` reason of a change refused by ``refused_change``.
_REFUSED_WHY = {
    "oversized": "the change was over limits.max_diff_bytes",
    "secret_in_change": "the change held a secret",
    "git_dir_violation": "the change held a nested git repository",
}

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
    assert ctx.branch_name is not None

    number = int(ctx.state.get("test_retries", 0)) + 1
    attempt, recognised = begin(ctx, deps, cwd, number)
    if recognised:
        summary = f"(the attempt's commit {recognised[:12]}, recognised after a restart)"
        run_id = trailers(deps.workspace.commit_message(cwd, recognised)).get(RUN_TRAILER, "")
        commit: str | None = recognised
    else:
        built = _build(ctx, deps, cwd, plan, attempt)
        if isinstance(built, PhaseResult):
            return built
        commit, run_id, summary = built
    head = deps.workspace.rev(cwd, "HEAD")
    # The net change against the base, not the commits: a change and its revert
    # is no change, and must never go on to merge as one.
    base = deps.forge.branch_ref(ctx.base_branch)  # GitHub's, not a stale local one
    changed = deps.workspace.diff_stat(repo, base, ctx.branch_name)["files"] > 0
    # A round a person's feedback started must add something to what they saw.
    unanswered = feedback_round.unanswered(ctx, deps, head) if changed else None
    # An empty change is known now: the checks would only cost their run.
    checked = changed and unanswered is None
    checks = deps.run_checks(cwd) if checked else []
    # The checks ran on the commit just made; what they leave in the worktree
    # (bytecode, caches, rewritten files) is theirs, not the change's, and the
    # next attempt's commit_all would sweep it into the branch.
    deps.workspace.discard_changes(cwd)
    passed = checked and all(c.passed for c in checks)
    if unanswered is not None:
        failure = "the build added no change for the person's feedback"
    elif changed:
        failure = _failure_summary(checks)
    elif commit is None:
        failure = "the build agent changed no file"
    else:
        failure = (
            f"the branch's net change against {ctx.base_branch} is empty "
            "(its commits undo each other)"
        )
    settled = attempt.journal(
        "completed" if passed else "failed", commit=commit, agent_run=run_id, head=head
    )
    if checked:
        counted = f"{sum(c.passed for c in checks)}/{len(checks)} checks passed"
    elif unanswered is None:
        counted = "no change, checks not run"
    else:
        counted = "no change since the last report, checks not run"
    tests_run = MilestoneWrite(
        "tests_run",
        round=dev_round,
        attempt=number,
        status="completed" if passed else "failed",
        summary=counted,
        data={
            "checks": [c.as_dict() for c in checks],
            "checks_run": checked,
            "passed": passed,
            "commit": commit,
            "head": head,
            "agent_summary": summary,
            "recognised_after_restart": bool(recognised),
        },
    )
    if passed:
        deps.effects.push_branch(DEVELOPMENT, ctx.branch_name, head)
        return developed(
            head,
            (
                settled,
                tests_run,
                MilestoneWrite(
                    "dev_completed",
                    round=dev_round,
                    summary=f"head {head[:12]}",
                    data={"head": head, "attempts": number, "feedback": ctx.user_feedback},
                ),
            ),
            state={"carried_findings": None},
        )
    if unanswered is not None:
        return feedback_round.unchanged_stop(ctx, unanswered, summary, number, (settled, tests_run))
    if changed:
        reason = f"checks still failing after {number} attempt(s): {failure[:1500]}"
    else:
        reason = f"no change in {number} attempt(s): {failure}"
    return _retry_or_revert(ctx, deps, number, failure, reason, (settled, tests_run))


def _build(
    ctx: WorkflowContext, deps: PhaseDeps, cwd: Path, plan: str, attempt: Attempt
) -> tuple[str | None, str, str] | PhaseResult:
    """Sync the base if asked, run the build agent, commit what it made.

    Returns (the attempt's commit or None when it changed nothing, the
    agent run's id, the agent's summary), or the PhaseResult that ends the
    attempt early (the agent failed, asked to re-plan, or leaked a secret).
    """
    number = attempt.number
    extra = ""
    if ctx.state.get("carried_findings"):
        extra += (
            "\n## What the last round left open (its limit ran out)\n\n"
            f"{ctx.state['carried_findings']}\n"
        )
    if ctx.state.get("review_feedback"):
        extra += f"\n## The reviewer sent the change back\n\n{ctx.state['review_feedback']}\n"
    if ctx.state.get("ci_failure"):
        extra += f"\n## CI failed on the pull request\n\n{ctx.state['ci_failure']}\n"
    if ctx.user_feedback:
        extra += f"\n## Feedback from a person\n\n{ctx.user_feedback}\n"
    if ctx.state.get("last_check_failure"):
        extra += (
            f"\n## The checks failed on your last attempt\n\n{ctx.state['last_check_failure']}\n"
        )
    before = attempt.start
    if ctx.state.get("sync_base"):
        # Reverted from a merge that could not proceed: build on what the base holds now.
        base = deps.forge.branch_ref(ctx.base_branch)
        conflicted = deps.workspace.start_base_merge(cwd, base)
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
            round=ctx.dev_round,
            attempt=number,
        )
    except AgentFailed as exc:
        failed = MilestoneWrite(
            "dev_failed", status="failed", round=ctx.dev_round, attempt=number, summary=str(exc)
        )
        discard(ctx, deps, cwd, before, "the build agent failed", attempt)
        return agent_failure(exc, milestones=(attempt.journal("failed"), failed))
    runs = ok_build_runs(deps.store, attempt)
    run_id = str(runs[-1]) if runs else ""
    summary = answer.text.strip()[-2000:]
    blocked = replan_request(answer.text)
    if blocked is not None:
        # The agent says the plan cannot work: what it changed is not the plan's change.
        discard(ctx, deps, cwd, before, "the build agent asked to re-plan", attempt)
        reason = f"the build agent reports the plan's constraints too restrictive: {blocked}"
        return reversion_or_stop(
            ctx,
            reason=reason[:1000],
            context=f"Development round {ctx.dev_round}, attempt {number}: {reason}\n\n"
            f"The build agent's answer:\n{summary}",
            at=deps.clock.now(),
            milestones=(
                attempt.journal("failed", agent_run=run_id),
                MilestoneWrite(
                    "plan_blocked",
                    status="failed",
                    round=ctx.dev_round,
                    attempt=number,
                    summary=blocked[:500],
                    data={"agent_summary": summary},
                ),
            ),
        )
    limit = deps.limits.max_diff_bytes
    secrets = cartridge_secrets(deps.cartridge)
    change = measure_change(cwd, before, deps.workspace.rev(cwd, "HEAD"), limit)
    refused = refused_change(change, limit, secrets, cwd)
    if refused is not None:
        # An oversized change, or a key in it (raw or encoded), would be committed,
        # reviewed, merged: drop the whole attempt (commits the agent made itself
        # included); name the size or the files, never the value.
        why = _REFUSED_WHY[refused.name]
        discard(ctx, deps, cwd, before, why, attempt)
        stopped = _attempt_failed(
            ctx,
            deps,
            number,
            f"{refused.name}: {refused.detail}; it was discarded",
            attempt.journal("failed", agent_run=run_id),
        )
        event = violation_event("build", DEVELOPMENT, refused, secrets, round=ctx.dev_round)
        return replace(stopped, events=(*stopped.events, event))
    message = (
        f"{redact(ctx.title, secrets)}\n\nphasegate workflow {ctx.id}, "
        f"development round {ctx.dev_round}, attempt {number}\n\n"
        f"{ATTEMPT_TRAILER}: {attempt.trailer}\n{RUN_TRAILER}: {run_id}"
    )
    commit = deps.workspace.commit_all(cwd, message)
    if commit is None and deps.workspace.rev(cwd, "HEAD") != before:
        # The agent committed its work itself: a marker commit names the attempt,
        # so a restart recognises it instead of discarding it.
        commit = deps.workspace.commit_empty(cwd, message)
    return commit, run_id, summary


def _retry_or_revert(
    ctx: WorkflowContext,
    deps: PhaseDeps,
    attempt: int,
    failure: str,
    reason: str,
    evidence: tuple[MilestoneWrite, ...],
) -> PhaseResult:
    """Another attempt (the failure goes into its prompt) within max_dev_retries; then
    the validation failures block applying: a reversion to planning, or a stop
    (``profiles.reversion_or_stop``). At the cap the last failure is carried on
    as a ``limit_reached`` milestone, the next build's prompt
    (state.carried_findings, and state.last_check_failure for a resume), the
    reason a person and the decision record read."""
    if attempt <= deps.limits.max_dev_retries:
        return PhaseResult(
            "retry",
            state={"test_retries": attempt, "last_check_failure": failure},
            milestones=evidence,
        )
    limit = limit_reached(
        "development retries",
        "limits.max_dev_retries",
        attempt,
        failure,
        round=ctx.dev_round,
    )
    return reversion_or_stop(
        ctx,
        reason=reason,
        context=f"Development round {ctx.dev_round}: {reason}",
        at=deps.clock.now(),
        milestones=(*evidence, limit),
        state={"last_check_failure": failure, "carried_findings": limit.data["carried"]},
    )


def _attempt_failed(
    ctx: WorkflowContext, deps: PhaseDeps, attempt: int, why: str, settled: MilestoneWrite
) -> PhaseResult:
    rejected = MilestoneWrite(
        "change_rejected", status="failed", round=ctx.dev_round, attempt=attempt, summary=why
    )
    return _retry_or_revert(
        ctx, deps, attempt, why, f"attempt {attempt}: {why}", (settled, rejected)
    )
