"""What people say on the forge while a workflow waits: wait reads the forge and
writes only the store (docs/contracts/lifecycle.md: wait).

Read in wait from the pull request (its conversation, review summaries and
inline review comments) and the issue; only
what trusted people wrote counts (write, maintain or admin permission: the
forge's ``permission``). Text by anyone else never reaches a prompt.

- an approving review, or a comment whose first line is ``/phasegate merge``:
  approve-merge, recorded with who;
- a comment whose first line is another ``/phasegate`` command (``resume``,
  ``cancel``, ``verify ...``; ``command_of``): not feedback, and not heard here:
  the watcher applies it (integrations/commands.py), whatever the status;
- any other comment or review: feedback — development with dev_round + 1, the
  text in ``user_feedback`` for the build prompt; an inline comment keeps its
  path, line and diff hunk;
- the pull request merged by a person on the forge: on to merge, which finds the
  merge and goes on to acceptance verification on that merge SHA;
- the pull request closed unmerged: the workflow ends ``cancelled`` with who
  (``pull_request_settled``, which pr_review's CI gate asks too while CI is pending);
- the issue closed by a person (phasegate closes it only after verification, so
  in wait it is always a person's, "not planned" say): ``cancelled``, and
  phasegate's own pull request closed, as ``phasegate cancel`` closes it.

Comments are told apart by id, never by clock: ``state.heard_comments`` starts as
every comment on the issue when the workflow started from it (``triggers``: what
was there is in the ticket or was left out) and grows with each one heard, so
none is heard twice, and one written while development ran is heard at the first
wait. The local forge answers empty: its people use the CLI.
"""

from __future__ import annotations

import logging

from phasegate.agents.env import cartridge_secrets
from phasegate.core.contract import DEVELOPMENT, MERGE, MilestoneWrite, PhaseResult, WorkflowContext
from phasegate.core.redaction import redact
from phasegate.forge.base import Comment, TrustCache, access_names, shown_number
from phasegate.phases.cleanup import close_pull_request
from phasegate.phases.deps import PhaseDeps

__all__ = [
    "COMMAND_PREFIX",
    "HEARD_KEPT",
    "MERGE_COMMAND",
    "command_of",
    "listen",
    "pull_request_settled",
]

log = logging.getLogger(__name__)

#: The untrusted comments already logged, oldest first, at most _LOGGED_KEPT.
_LOGGED: dict[tuple[str, str], None] = {}
_LOGGED_KEPT = 4096

MERGE_COMMAND = "/phasegate merge"
#: What a comment's first line starts with to command phasegate.
COMMAND_PREFIX = "/phasegate"
#: Comment keys (``Comment.key``) remembered, the newest. Every comment is read on
#: each look, so one forgotten would be heard again: only a workflow whose issue and
#: pull request hold more comments than this could see its oldest again.
HEARD_KEPT = 5000


def listen(ctx: WorkflowContext, deps: PhaseDeps) -> PhaseResult | None:
    """The result of what people did on the forge since the wait began, or None
    when nothing new (the wait phase goes on as for the local forge).

    Raises ForgeError (ForgeUnavailable: the engine pauses, resume listens again).
    """
    if not ctx.pr_number:
        return None
    settled = pull_request_settled(ctx, deps, ctx.pr_number)
    if settled is not None:
        return settled

    kept = [str(k) for k in ctx.state.get("heard_comments") or ()]
    heard = set(kept)
    said = [(ctx.pr_number, c) for c in deps.forge.comments(ctx.pr_number)]
    if ctx.issue_number and ctx.issue_number != ctx.pr_number:
        said += [(ctx.issue_number, c) for c in deps.forge.comments(ctx.issue_number)]
    # A command other than merge is the watcher's to apply, never anyone's feedback.
    said = [(n, c) for n, c in said if command_of(c.body) is None]
    fresh = sorted((x for x in said if x[1].key not in heard), key=lambda x: x[1].created_at)
    new = [c for _, c in fresh]
    if not new:
        return None
    trusted = _trusted(ctx, deps, fresh)
    ids = [*kept, *(c.key for c in new)][-HEARD_KEPT:]  # the newest heard last
    approval = next((c for c in trusted if _approves(c)), None)
    words = [c for c in trusted if not _approves(c) and c.body.strip()]
    if words:
        # A key someone pasted must reach neither the store nor a prompt.
        text = redact("\n\n".join(_quoted(c) for c in words), cartridge_secrets(deps.cartridge))
        authors = sorted({c.author for c in words})
        return PhaseResult.advance(
            DEVELOPMENT,
            updates={
                "dev_round": ctx.dev_round + 1,
                "current_round": 0,
                "user_feedback": text,
            },
            state={"merge_approved": False, "heard_comments": ids},
            milestones=(
                MilestoneWrite(
                    "requirement_received",
                    round=ctx.dev_round + 1,
                    summary=f"from {', '.join(authors)} on the forge: {text[:160]}",
                    data={"feedback": text, "authors": authors, "comments": [c.id for c in words]},
                ),
            ),
        )
    if approval is not None:
        return PhaseResult.advance(
            MERGE,
            # A person's approval, as approve-merge's: the merge gate lets it through.
            state={
                "heard_comments": ids,
                "merge_approved": True,
                "merge_approved_by": approval.author,
            },
            milestones=(
                MilestoneWrite(
                    "merge_approved",
                    round=ctx.dev_round,
                    summary=f"{approval.author} on the forge",
                    data={"by": approval.author, "comment": approval.id},
                ),
            ),
        )
    # Only untrusted words (or empty reviews): remember them, so they are not
    # weighed again on every look; nothing else changes.
    return PhaseResult("wait", state={"heard_comments": ids})


def pull_request_settled(ctx: WorkflowContext, deps: PhaseDeps, number: int) -> PhaseResult | None:
    """What a person did to pull request ``number`` or the workflow's issue on the
    forge: merged the pull request → on to merge (which finds that merge and
    verifies its SHA); closed it unmerged, or closed the issue → the workflow
    ``cancelled`` (a closed issue closes phasegate's own pull request too, as a
    cancel does); None while both are open. Asked in wait and by pr_review's CI
    gate while CI is pending. Raises ForgeError."""
    pr = deps.forge.pull_request(number)
    if pr.state == "merged":
        who = pr.merged_by or "a person"
        return PhaseResult.advance(
            MERGE,
            milestones=(
                MilestoneWrite(
                    "merge_approved",
                    round=ctx.dev_round,
                    summary=f"merged on the forge by {who}",
                    data={"by": who, "merge_sha": pr.merge_sha},
                ),
            ),
        )
    # phasegate closes the issue only after verification: before it, a closed
    # issue is a person's "not planned". It is asked first: the pull request a
    # look before closed for it must not pass for a person's close.
    if ctx.issue_number and ctx.issue_number != number:
        issue = deps.forge.issue(ctx.issue_number)
        if issue.state == "closed":
            reason = f"issue #{issue.number} was closed on the forge"
            # as a cancel does: the work is not wanted, so neither is phasegate's pull
            # request for it (a close the forge fails is retried as a cancel's is)
            close_pull_request(ctx, deps.effects, ctx.current_phase)
            return PhaseResult("failed", status="cancelled", reason=reason)
    if pr.state == "closed":
        reason = f"pull request {shown_number(pr.number)} was closed unmerged on the forge"
        return PhaseResult("failed", status="cancelled", reason=reason)
    return None


def _trusted(
    ctx: WorkflowContext, deps: PhaseDeps, said: list[tuple[int, Comment]]
) -> list[Comment]:
    """The comments of ``said`` (each with the number it was said on) whose
    author is trusted; each other one logged once, with where it was said, an
    untrusted ``/phasegate merge`` as loudly as an untrusted command."""
    trust = TrustCache(deps.forge)
    names = access_names(deps.cartridge.forge.kind)
    kept = []
    for number, c in said:
        if trust.trusted(c.author):
            kept.append(c)
            continue
        if not _first_time(ctx.id, c.key):
            continue
        whose = names.whose(trust.permission(c.author))
        if _approves(c) and c.kind != "review":
            log.warning(
                "%s on %s ignored: %s, %s: only %s merge", MERGE_COMMAND, shown_number(number),
                c.author or "someone unknown", whose, names.trusted,
            )  # fmt: skip
        else:
            log.info("comment %s on %s by %s, %s, ignored", c.key, shown_number(number),
                     c.author, whose)  # fmt: skip
    return kept


def _first_time(workflow_id: str, key: str) -> bool:
    """Whether comment ``key`` of the workflow is logged for the first time in
    this process: the worker's look before an advance (``Engine.idle_at``) runs
    this phase too, and the comment is heard only when the advance commits."""
    seen = (workflow_id, key)
    if seen in _LOGGED:
        return False
    _LOGGED[seen] = None
    while len(_LOGGED) > _LOGGED_KEPT:
        del _LOGGED[next(iter(_LOGGED))]
    return True


def command_of(body: str) -> tuple[str, str] | None:
    """``(command, rest)`` of a comment whose first line is a ``/phasegate``
    command other than MERGE_COMMAND (which wait hears): ``/phasegate verify
    rejected too slow`` → ``("verify", "rejected too slow")``; the command in
    lower case, ``rest`` the first line's remainder then the lines after it,
    stripped. None for any other comment, and for ``/phasegate merge``."""
    lines = body.strip().splitlines()
    first = lines[0].split() if lines else []
    if not first or first[0].lower() != COMMAND_PREFIX or len(first) < 2:
        return None
    command = first[1].lower()
    if command == MERGE_COMMAND.split()[1]:
        return None
    rest = " ".join(first[2:])
    more = "\n".join(lines[1:]).strip()
    return command, f"{rest}\n{more}".strip() if more else rest


def _approves(c: Comment) -> bool:
    if c.kind == "review" and c.review_state == "approved":
        return True
    first = c.body.strip().splitlines()[0].strip().lower() if c.body.strip() else ""
    return first == MERGE_COMMAND


def _quoted(c: Comment) -> str:
    if c.kind == "inline":
        where = f"`{c.path}` line {c.line}" if c.line else f"`{c.path}`"
        hunk = f"\n```diff\n{c.diff_hunk.strip()[-1500:]}\n```" if c.diff_hunk else ""
        return f"**{c.author}** commented on {where}:{hunk}\n{c.body.strip()}"
    if c.kind == "review":
        return f"**{c.author}** reviewed ({c.review_state or 'commented'}):\n{c.body.strip()}"
    return f"**{c.author}** wrote:\n{c.body.strip()}"
