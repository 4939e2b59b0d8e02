"""CI as evidence in pr_review and on the head that merges (docs/contracts/lifecycle.md: pr_review).

CI status on the forge is evidence for the review. CI pending: the phase waits
and polls; CI failed: a CI repair, which re-enters pr_review. The merge phase
runs the same gate on the head it is about to merge, a sync with the base
included (docs/github.md: branch protection).

The forge's checks of the pushed head (``state.head_sha``) decide before the
review agent is asked; phasegate's own status (``OWN_CHECK``) is never waited for:

- none (the local forge, a repository without CI) or all passed: the review
  goes on, with a ``ci_passed`` milestone as evidence when there were checks;
  a check named in ``forge.required_checks`` or required by the base's
  protection on the forge that has not reported on the head yet counts as
  pending (CI registers its runs a while after a push);
- any pending: the phase returns ``wait`` — the workflow stays in pr_review,
  no worker holds it, and the next look is due after ``forge.poll_s``; a
  ``ci_pending`` milestone marks the first look at each head. A head with
  required checks is not looked at the first time (just pushed, none of them
  can have reported): the wait starts at once, and the checks' end wakes the
  workflow (a webhook: docs/webhooks.md) or the next poll finds it. Each look also
  asks the pull request what wait asks of it (``forge_feedback.pull_request_settled``):
  merged by a person → on to merge; closed unmerged → ``cancelled``;
- any failed: a CI-repair round — development with dev_round + 1 and the
  failing checks' names and output as the build's input (``ci_failure``),
  at most ``forge.max_ci_repairs`` in a row; past that the profile's reversion
  to planning (docs/contracts/autonomy.md: phase reversion) or a pause for a
  person.

A forge that cannot be reached raises ForgeUnavailable: the engine pauses the
workflow with reason ``forge_unavailable`` and ``resume`` looks again.
"""

from __future__ import annotations

from dataclasses import replace

from phasegate.core.contract import (
    DEVELOPMENT,
    MERGE,
    MilestoneWrite,
    PhaseResult,
    WorkflowContext,
)
from phasegate.core.profiles import reversion_or_stop
from phasegate.forge.base import OWN_CHECK, Check
from phasegate.phases.deps import PhaseDeps
from phasegate.phases.forge_feedback import pull_request_settled

__all__ = ["OUTPUT_LIMIT", "ci_gate", "failure_text", "required_checks"]

OUTPUT_LIMIT = 4_000  # characters of one failing check's output in the build prompt


def failure_text(failed: list[Check]) -> str:
    """What the build agent reads about failing checks: name, link, output."""
    parts = ["CI failed on the pull request's head. Make these checks pass:"]
    for check in failed:
        link = f" ({check.url})" if check.url else ""
        output = check.output.strip()[-OUTPUT_LIMIT:] or "(the check said nothing more)"
        parts.append(f"### {check.name}: failed{link}\n\n```\n{output}\n```")
    return "\n\n".join(parts)


def _shown(checks: list[Check]) -> list[dict[str, str | None]]:
    return [{"name": c.name, "state": c.state, "url": c.url} for c in checks]


def required_checks(ctx: WorkflowContext, deps: PhaseDeps, *, fresh: bool = False) -> list[str]:
    """The checks a head must pass before it merges into the workflow's base:
    ``forge.required_checks`` and what the base's protection on the forge requires
    (``fresh``: read again now), sorted, phasegate's own status left out (phasegate
    posts it, it does not wait for it)."""
    named = set(deps.cartridge.forge.required_checks)
    named.update(deps.forge.required_checks(ctx.base_branch, fresh=fresh))
    named.discard(OWN_CHECK)
    return sorted(named)


def ci_gate(
    ctx: WorkflowContext,
    deps: PhaseDeps,
    pr: int,
    head: str | None = None,
    *,
    fresh: bool = False,
) -> PhaseResult | MilestoneWrite | None:
    """Look at CI for pull request ``pr`` on ``head`` (default: the pushed head,
    ``state.head_sha``); returns the result that ends the phase now (wait, a
    CI-repair round, a stop), or the evidence to commit with the phase (a
    ``ci_passed`` milestone), or None when there is no CI to wait for (``fresh``:
    the base's protection read again, after the forge refused a merge). While CI is
    pending, a pull request a person closed ends the phase too, and so does one
    they merged in pr_review (the merge phase finds such a merge itself).

    Raises ForgeError (ForgeUnavailable when the forge does not answer).
    """
    head = head or ctx.state.get("head_sha")
    if not head:
        return None
    required = required_checks(ctx, deps, fresh=fresh)
    key = str(head)[:12]
    looked = ("ci_pending", "ci_passed", "ci_failed")
    seen_heads = {m.data.get("sha") for m in ctx.milestones if m.kind in looked}
    # A head just pushed: its required checks cannot have reported yet, so the first
    # look is spared. Their end wakes the workflow (a webhook), or a poll finds it.
    spared = bool(required) and head not in seen_heads
    checks = [] if spared else [c for c in deps.forge.checks(str(head)) if c.name != OWN_CHECK]
    reported = {c.name for c in checks}
    checks += [
        Check(name, "pending", "has not reported on this head yet")
        for name in required
        if name not in reported
    ]
    if spared:
        return _pending(ctx, pr, str(head), checks, marked=False)
    if not checks:
        return None
    pending = [c for c in checks if c.state == "pending"]
    failed = [c for c in checks if c.state == "failure"]
    if failed:
        return _repair(ctx, deps, pr, failed, checks, str(head))
    if pending:
        # A person may end it while CI runs; nothing else would notice before CI ends,
        # and a closed pull request's CI may never end.
        settled = pull_request_settled(ctx, deps, pr)
        if settled is not None and ctx.current_phase == MERGE and settled.outcome == "completed":
            return PhaseResult("retry")  # a person merged it: the merge phase finds that merge
        if settled is not None:
            return replace(settled, updates={**settled.updates, "pr_number": pr})
        seen = any(m.data.get("sha") == head for m in ctx.milestones_of("ci_pending"))
        return _pending(ctx, pr, str(head), checks, marked=seen)
    return MilestoneWrite(
        "ci_passed",
        round=ctx.dev_round,
        key=key,
        summary=f"CI passed: {len(checks)} check(s)",
        data={"pr": pr, "sha": head, "checks": _shown(checks)},
    )


def _pending(
    ctx: WorkflowContext, pr: int, head: str, checks: list[Check], *, marked: bool
) -> PhaseResult:
    """Wait for CI on ``head``: a ``ci_pending`` milestone the first time (``marked``:
    there is one already, and a look that found nothing new writes nothing)."""
    names = ", ".join(c.name for c in checks if c.state == "pending")
    marker = MilestoneWrite(
        "ci_pending",
        round=ctx.dev_round,
        key=head[:12],
        summary=f"waiting for CI: {names}"[:200],
        data={"pr": pr, "sha": head, "checks": _shown(checks)},
    )
    updates = {"pr_number": pr} if ctx.pr_number != pr else {}
    return PhaseResult("wait", updates=updates, milestones=() if marked else (marker,))


def _repair(
    ctx: WorkflowContext,
    deps: PhaseDeps,
    pr: int,
    failed: list[Check],
    checks: list[Check],
    head: str,
) -> PhaseResult:
    repairs = int(ctx.state.get("ci_repairs") or 0)
    limit = deps.cartridge.forge.max_ci_repairs
    text = failure_text(failed)
    evidence = MilestoneWrite(
        "ci_failed",
        status="failed",
        round=ctx.dev_round,
        key=head[:12],
        summary=("CI failed: " + ", ".join(c.name for c in failed))[:200],
        data={"pr": pr, "sha": head, "checks": _shown(checks)},
    )
    if repairs >= limit:
        reason = f"CI still fails after {repairs} CI-repair round(s) (forge.max_ci_repairs)"
        return reversion_or_stop(
            ctx,
            reason=f"{reason}: {', '.join(c.name for c in failed)}",
            context=f"{reason}.\n\n{text[-3000:]}",
            at=deps.clock.now(),
            milestones=(evidence,),
            state={"ci_failure": text, "ci_repairs": 0},
            hint="fix CI or send feedback, then `phasegate resume`",
        )
    return PhaseResult.advance(
        DEVELOPMENT,
        updates={"pr_number": pr, "current_round": 0, "dev_round": ctx.dev_round + 1},
        state={"ci_failure": text, "ci_repairs": repairs + 1},
        milestones=(evidence,),
    )
