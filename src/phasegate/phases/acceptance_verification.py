"""acceptance_verification: an independent, read-only verifier on the merge commit.

(docs/contracts/lifecycle.md: acceptance_verification)

- preconditions: current_phase == "acceptance_verification", status ==
  "verification_pending"; the pull request is merged, so a merge SHA resolves.
- inputs: merge_sha (from the pull request when absent), the ticket's
  acceptance hash, state.verification_attempt and
  state.verification_parse_failures, earlier acceptance_verification milestones.
- authoritative evidence: the ``acceptance_verification`` milestone, minted
  in_progress ("Acceptance verification: running") before the verifier starts,
  settled in place with the verdict; its key is (merge SHA, acceptance hash).
- side effects: the verifier run (verification line, read-only) and the
  cartridge's checks on a temporary checkout of the merge commit; an issue
  comment on a confirmed verdict, and on a rejected one with its reason
  (the verifier's, or the person's); the issue closed on a confirmed verdict
  only; a human override records who in ``verified_by``.
- postconditions: confirmed (and every check passed) → status "completed",
  issue closed, completed_at set. Rejected or indeterminate → paused for a
  person; delivered code is never marked failed.
- re-entry point: a settled confirmed row for the same (merge SHA, acceptance
  hash), or a settled verdict of this very attempt, is decided again without the
  verifier: its comment and the close, each journaled, are done at most once.
  A new merge or an edited ticket verifies again.
  The same attempt reuses its row; a row a killed process left in_progress is
  settled cancelled by reconciliation and minted again by the same attempt.
- recovery behavior: a verifier failure (exit code, timeout) retries in the
  phase up to limits.max_verification_attempts (3); an unparseable verdict up
  to limits.max_verification_parse_failures (2); then paused.
- terminal outcomes: completed (confirmed, or the phase disabled); retry;
  pause (rejected, indeterminate, retries exhausted).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import replace
from pathlib import Path

from phasegate.agents.service import AgentFailed
from phasegate.core.contract import (
    ACCEPTANCE_VERIFICATION,
    COMPLETED,
    ContractViolation,
    MilestoneStatus,
    MilestoneWrite,
    PhaseResult,
    WorkflowContext,
)
from phasegate.core.state import WorkflowState
from phasegate.forge.base import ForgeError, status_label
from phasegate.forge.tickets import TriggerRefused, resnapshot
from phasegate.phases import landing
from phasegate.phases.deps import PhaseDeps, verdict_parser

__all__ = ["acceptance_hash", "override", "run"]

KIND = "acceptance_verification"

log = logging.getLogger(__name__)

VERIFY_PROMPT = """You are an independent verifier. The change for the ticket below has been
merged; your working directory is a checkout of the merge commit. Do not modify
any file. Check whether the ticket's requirements are met by the code as it is.
The mechanical checks' results are below. End your answer with one line:
VERDICT: confirmed   or   VERDICT: rejected   or   VERDICT: indeterminate

## Ticket: {title}

{ticket}

## Checks on the merge commit

{checks}
"""


def acceptance_hash(ctx: WorkflowContext) -> str:
    """A hash of what the ticket asks: 16 hex digits. A workflow started from a
    forge issue has its ticket snapshot's (``state["acceptance_hash"]``,
    phasegate.forge.tickets), so a new snapshot of an edited issue verifies again;
    else the title's and the ticket text's (the same formula as a snapshot's)."""
    snapshot = ctx.state.get("acceptance_hash")
    if snapshot:
        return str(snapshot)
    return hashlib.sha256(f"{ctx.title}\n{ctx.ticket}".encode()).hexdigest()[:16]


def _confirm(ctx: WorkflowContext, deps: PhaseDeps, row: MilestoneWrite, who: str) -> PhaseResult:
    if ctx.issue_number:
        deps.effects.comment(
            ACCEPTANCE_VERIFICATION,
            ctx.issue_number,
            f"Acceptance verification: **confirmed** ({who}).",
            f"verified:{row.key}",
            best_effort=True,
        )
        # The done label before the close, not only after the commit: a process
        # killed after the last commit has nothing left to relabel the issue.
        try:
            deps.forge.set_status_label(ctx.issue_number, status_label("completed"))
        except ForgeError as exc:
            log.warning("status label on #%s not set: %s", ctx.issue_number, exc)
        deps.effects.close_issue(ACCEPTANCE_VERIFICATION, ctx.issue_number)
    return PhaseResult.advance(
        COMPLETED,
        state={"verification_status": "confirmed", "verified_by": who},
        milestones=(row,),
    )


def run(ctx: WorkflowContext, deps: PhaseDeps) -> PhaseResult:
    """The phase (module docstring). A workflow started from a forge issue
    verifies against the issue as it is now (``tickets.resnapshot``): an edit
    since the start gives a new acceptance hash, so it verifies again, and the
    verifier reads the edited ticket; an edit the start's voucher cannot vouch
    for pauses the workflow."""
    try:
        fresh = resnapshot(deps.forge, ctx)
    except TriggerRefused as exc:
        return PhaseResult("pause", reason=str(exc))
    if fresh is None or fresh.hash == acceptance_hash(ctx):
        return _run(ctx, deps)
    edited: WorkflowState = {"acceptance_hash": fresh.hash, "verified_ticket": fresh.text}
    result = _run(replace(ctx, state={**ctx.state, **edited}), deps)
    return replace(result, state={**edited, **result.state})


def _run(ctx: WorkflowContext, deps: PhaseDeps) -> PhaseResult:
    if not deps.cartridge.workflow.acceptance_verification:
        return PhaseResult.advance(COMPLETED, state={"verification_status": "disabled"})
    merge_sha = ctx.merge_sha
    if not merge_sha and ctx.pr_number:
        merge_sha = deps.forge.pull_request(ctx.pr_number).merge_sha
    if not merge_sha:
        return PhaseResult("pause", reason="no merge SHA resolves for the pull request")
    key = f"{merge_sha[:12]}:{acceptance_hash(ctx)}"
    attempt = int(ctx.state.get("verification_attempt", 0)) + 1
    for seen in ctx.milestones_of(KIND):
        if not (seen.dedupe_key.endswith(key) and seen.status == "completed"):
            continue
        if seen.data.get("verdict") == "confirmed" or seen.attempt == attempt:
            # The verdict was reached and recorded before its comment or the close
            # failed: it is said again, and the verifier is not asked again.
            again = MilestoneWrite(
                KIND, attempt=seen.attempt, key=key, summary=seen.summary, data=seen.data
            )
            return _decided(ctx, deps, again, str(seen.data.get("verdict")), attempt)

    parse_failures = int(ctx.state.get("verification_parse_failures", 0))
    limits = deps.limits
    running = MilestoneWrite(
        KIND,
        status="in_progress",
        attempt=attempt,
        key=key,
        summary="Acceptance verification: running",
        data={"merge_sha": merge_sha},
    )
    deps.store.write_milestone(ctx.id, ACCEPTANCE_VERIFICATION, running)

    def settle(status: MilestoneStatus, summary: str, **data: object) -> MilestoneWrite:
        return MilestoneWrite(
            KIND,
            status=status,
            attempt=attempt,
            key=key,
            summary=summary,
            data={"merge_sha": merge_sha, **data},
        )

    repo = Path(ctx.repo_path)
    # Beside the worktrees, not in the git directory: an agent works here.
    path = deps.cartridge.landing_areas.worktree_dir(repo) / f"{ctx.id}-verify"
    with deps.workspace.temporary_checkout(repo, merge_sha, path) as checkout:
        # Prepared as the worktree was: its checks read the same .env, the same setup.
        setup = landing.prepare_checkout(
            ctx, deps, checkout, ACCEPTANCE_VERIFICATION, "merge commit"
        )
        # A failed setup is the failed check: the checks would only fail for want of it.
        failed = setup is not None and not setup.passed
        checks = [setup] if setup is not None and failed else deps.run_checks(checkout)
        # What the checks leave behind must not count against the read-only verifier.
        deps.workspace.discard_changes(checkout)
        check_text = (
            "\n".join(f"- `{c.command}`: {'passed' if c.passed else 'FAILED'}" for c in checks)
            or "- (no checks configured)"
        )
        try:
            answer = deps.agents.ask(
                ctx,
                ACCEPTANCE_VERIFICATION,
                "verification",
                VERIFY_PROMPT.format(
                    title=ctx.title,
                    ticket=ctx.state.get("verified_ticket") or ctx.ticket,
                    checks=check_text,
                ),
                checkout,
                round=attempt,
                attempt=attempt,
                retries=0,
                parse=verdict_parser(("confirmed", "rejected", "indeterminate")),
            )
        except AgentFailed as exc:
            garbage = exc.kind == "garbage"
            failures = parse_failures + 1 if garbage else parse_failures
            row = settle("failed", str(exc)[:500], error_kind=exc.kind)
            exhausted = (
                failures >= limits.max_verification_parse_failures
                if garbage
                else attempt >= limits.max_verification_attempts
            )
            state: WorkflowState = {
                "verification_attempt": attempt,
                "verification_parse_failures": failures,
            }
            if exc.kind == "budget":
                return PhaseResult(
                    "pause", reason=exc.reason or f"budget: {exc}", state=state, milestones=(row,)
                )
            if exhausted:
                return PhaseResult(
                    "pause", reason=f"verification gave up: {exc}", state=state, milestones=(row,)
                )
            return PhaseResult("retry", state=state, milestones=(row,))

    checks_data = [c.as_dict() for c in checks]
    verdict = answer.parsed.verdict
    if verdict == "confirmed" and not all(c.passed for c in checks):
        verdict, note = "rejected", "the verifier confirmed but a check failed on the merge commit"
    else:
        note = answer.parsed.comments[:1000]
    row = settle(
        "completed",
        f"Acceptance verification: {verdict}",
        verdict=verdict,
        comments=note,
        checks=checks_data,
        verified_by="verifier",
    )
    # The verdict is evidence before the forge hears it: a comment or a close that
    # fails pauses the workflow, and its resume says the same verdict again.
    deps.store.write_milestone(ctx.id, ACCEPTANCE_VERIFICATION, row)
    return _decided(ctx, deps, row, verdict, attempt)


def _decided(
    ctx: WorkflowContext, deps: PhaseDeps, row: MilestoneWrite, verdict: str, attempt: int
) -> PhaseResult:
    """What the verifier's ``verdict`` (recorded in ``row``) leads to: completed on
    confirmed; else the rejection commented, and paused for a person."""
    if verdict == "confirmed":
        return _confirm(ctx, deps, row, "verifier")
    note = str(row.data.get("comments") or "")
    if verdict == "rejected":
        _rejected(ctx, deps, row, "the verifier", note)
    return PhaseResult(
        "pause",
        reason=f"acceptance verification {verdict}: {note[:500]}; a person decides "
        "(`phasegate verify-override`)",
        state={"verification_status": verdict, "verification_attempt": attempt},
        milestones=(row,),
    )


def _rejected(
    ctx: WorkflowContext, deps: PhaseDeps, row: MilestoneWrite, who: str, reason: str
) -> None:
    """Say on the issue why the merged change was rejected (journaled, once per
    verdict row); best effort: the verdict stands whether the forge takes it or not."""
    if not ctx.issue_number:
        return
    why = f":\n\n{reason.strip()}" if reason.strip() else " (no reason given)."
    deps.effects.comment(
        ACCEPTANCE_VERIFICATION,
        ctx.issue_number,
        f"Acceptance verification: **rejected** by {who}{why}",
        f"rejected:{row.key}:a{row.attempt}",
        best_effort=True,
    )


def override(
    ctx: WorkflowContext, deps: PhaseDeps, verdict: str, by: str, reason: str = ""
) -> PhaseResult:
    """A person's verdict, recorded with who gave it (docs/contracts/lifecycle.md:
    acceptance_verification); a rejection's ``reason`` is commented on the issue.

    Raises ContractViolation for a verdict other than confirmed or rejected, or
    unless the workflow is in acceptance_verification.
    """
    # The verdict is the person's input: said wrong, that is what they fix first.
    if verdict not in ("confirmed", "rejected"):
        raise ContractViolation(f"verdict must be confirmed or rejected, not {verdict!r}")
    if ctx.current_phase != ACCEPTANCE_VERIFICATION:
        raise ContractViolation(
            f"workflow {ctx.id} is in {ctx.current_phase}, not acceptance_verification"
        )
    row = MilestoneWrite(
        KIND,
        key=f"override:{deps.clock.now().isoformat()}",
        summary=f"Acceptance verification: {verdict} by {by}",
        data={
            "verdict": verdict,
            "verified_by": by,
            "override": True,
            "merge_sha": ctx.merge_sha,
            **({"comments": reason[:1000]} if reason else {}),
        },
    )
    if verdict == "confirmed":
        return _confirm(ctx, deps, row, by)
    _rejected(ctx, deps, row, by, reason)
    return PhaseResult(
        "pause",
        reason=f"acceptance rejected by {by}" + (f": {reason[:500]}" if reason else ""),
        state={"verification_status": "rejected", "verified_by": by},
        milestones=(row,),
    )
