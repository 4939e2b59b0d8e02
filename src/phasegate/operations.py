"""Every person's action, once: the rules and errors the CLI and the dashboard share,
so the two front ends never disagree.

A front end parses its input, calls one function here and renders what it
returns; nothing here prints. Each action takes what it needs explicitly (an
Engine, the workflow or proposal id, its arguments, ``by``: who acts) and
returns the workflow's new row (``cleanup`` and the gate: their outcome).

Who acts is recorded where the action records a person (approve-merge's
``merge_approved_by``, verify-override's ``verified_by``, a proposal's
``decided_by``) and, for every action, in the event it adds to the workflow's
stream: ``decision`` with ``{"action", "by", ...}`` (the dashboard's
timeline reads it). An action a person commanded in a forge comment
(integrations/commands.py) names that comment too: ``{"comment": "kind:id"}``
(``via``), in the same commit, so the comment is acted on once.

The queue's actions (a workflow's priority, the shared store's caps on agent
calls) and the cleanup's (merged workflows' cleanup retried, the worktree
retention, ``cleanup --all``) live beside it in ``phasegate.actions``,
re-exported here.

Errors (each a PhasegateError whose message is what the CLI prints):

- ActionRefused: the input does not fit the action (an empty ticket, a
  ``by`` naming phasegate's own gate, a stale proposal); nothing recorded.
- ContractViolation: the decision does not fit the workflow's state
  (``decisions``); nothing recorded.
- LeaseHeld: another process advances the workflow; nothing recorded.
- WorkflowNotFound, ProposalNotFound, ProposalDecided, CartridgeError,
  StoreUnavailable as their modules raise them.
"""

from __future__ import annotations

import dataclasses
import functools
import getpass
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from phasegate.actions import epic as epic_actions
from phasegate.actions.cleanup import cleanup, expire_worktrees, retire_worktrees
from phasegate.actions.offered import ACTIONS, actions, offered
from phasegate.actions.queue import clear_queue_cap, queue_view, set_priority, set_queue_cap
from phasegate.agents.env import cartridge_secrets
from phasegate.config.cartridge import CARTRIDGE_FILE
from phasegate.core import decisions, review
from phasegate.core.autonomy import AutonomyPolicy, streak
from phasegate.core.contract import (
    AWAITING_APPROVAL,
    BLOCKED,
    CANCELLED,
    DEVELOPMENT,
    ENDED_STATUSES,
    NEEDS_YOU_STATUSES,
    PIECES,
    PLANNING,
    RUNNABLE_STATUSES,
    ContractViolation,
    EventWrite,
    PhasegateError,
    PhaseResult,
    WorkflowContext,
)
from phasegate.core.decisions import DECISION_EVENT, decision_event
from phasegate.core.dependencies import ENDED_UNCOMPLETED
from phasegate.core.inputs import (
    MAX_TICKET_BYTES,
    MAX_TITLE_CHARS,
    ActionRefused,
    check_by,
    check_size,
    check_ticket,
    check_title,
    title_of,
)
from phasegate.core.priority import check_priority
from phasegate.core.profiles import AutomationProfile
from phasegate.core.redaction import redact
from phasegate.core.state import WorkflowState
from phasegate.phases import acceptance_verification
from phasegate.phases import cleanup as cleanup_phase
from phasegate.phases.graph_mode import epic
from phasegate.phases.graph_mode.run import CHECKS_GATE
from phasegate.runtime.engine import Engine, LeaseHeld
from phasegate.runtime.retention import Retirable
from phasegate.store import APPLY_ARM, Store

__all__ = [
    "ACTIONS",
    "CANCELLED",
    "DECISION_EVENT",
    "MAX_TICKET_BYTES",
    "MAX_TITLE_CHARS",
    "ActionRefused",
    "GateOutcome",
    "Retirable",
    "PhasegateError",  # the base of every error here, for a front end's except
    "actions",
    "offered",
    "approve",
    "approve_merge",
    "awaiting",
    "cancel",
    "check_by",
    "check_ticket",
    "check_title",
    "cleanup",
    "clear_queue_cap",
    "comment",
    "expire_worktrees",
    "retire_worktrees",
    "feedback",
    "login_name",
    "queue_view",
    "reject",
    "resume",
    "revert",
    "review_drafts",
    "send_review",
    "set_priority",
    "set_queue_cap",
    "start",
    "title_of",
    "verify_override",
]


def login_name() -> str:
    """Who acts when a front end names nobody: the login name, else ``cli``."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "cli"


# -- starting ---------------------------------------------------------------------


def start(
    engine: Engine,
    ticket: str,
    *,
    by: str,
    title: str | None = None,
    auto_merge: bool | None = None,
    profile: str | None = None,
    state: WorkflowState | None = None,
    priority: int = 0,
    after: Sequence[str] = (),
) -> dict[str, Any]:
    """File a ticket as ``phasegate run`` does before it drives: a new workflow in
    preparation (``Engine.start``: ``auto_merge``, ``profile``, ``state``,
    ``priority``), its title ``title`` else ``title_of(ticket)``, ``blocked`` until
    each of ``after`` completed. Returns the workflow's row; nothing is advanced.
    Raises ActionRefused (the ticket; an id of ``after`` failed or cancelled),
    CartridgeError (a role left unbound, the profile, the base branch), PhasegateError
    (no commit yet), WorkflowNotFound (an id of ``after``)."""
    check_by(by)
    check_ticket(ticket)
    check_priority(priority)
    if title is not None:
        check_title(title)
    engine.cartridge.require_roles(engine.repo / CARTRIDGE_FILE)
    for target in after:  # one that ended without completing would never release it
        ended = engine.store.workflow_row(target)["status"]
        if ended in ENDED_UNCOMPLETED:
            raise ActionRefused(f"--after {target}: that workflow is {ended}; nothing recorded")
    workflow_id = engine.start(
        title or title_of(ticket),
        ticket,
        auto_merge=auto_merge,
        profile=profile,
        state={**(state or {}), "started_by": by},
        priority=priority,
        after=after,
    )
    engine.store.add_event(workflow_id, decision_event("start", by))
    return engine.store.workflow_row(workflow_id)


# -- a workflow's decisions -------------------------------------------------------


#: Seconds a person's decision waits for a worker that holds a workflow waiting for
#: people: it holds one only for a moment (the end of the advance that left it
#: waiting, or a look that found something new). A workflow that a worker is
#: advancing is refused at once.
DECISION_WAIT_S = 5.0


def _decide(
    engine: Engine,
    workflow_id: str,
    action: str,
    by: str,
    decision: Callable[[WorkflowContext], PhaseResult],
    **data: Any,
) -> dict[str, Any]:
    """Commit ``decision`` under the workflow's lease (``Engine.decide``) with its
    decision event; a cancelled workflow refuses every decision. While another
    process holds a workflow that waits for people, the decision waits for it to
    let go (``DECISION_WAIT_S`` at most), then raises LeaseHeld; ActionRefused
    (``check_by``) before anything is recorded."""
    check_by(by)

    def decided(ctx: WorkflowContext) -> PhaseResult:
        if ctx.status == CANCELLED:
            raise ContractViolation(f"workflow {ctx.id} is cancelled; nothing moves it on")
        result = decision(ctx)
        return dataclasses.replace(
            result, events=(*result.events, decision_event(action, by, **data))
        )

    deadline = time.monotonic() + DECISION_WAIT_S
    feed = None
    try:
        while True:
            try:
                return engine.decide(workflow_id, decided)
            except LeaseHeld as held:
                left = deadline - time.monotonic()
                row = engine.store.workflow_row(workflow_id)
                if left <= 0 or row["status"] not in NEEDS_YOU_STATUSES:
                    raise _naming_holder(held, row.get("lease_owner")) from None
                feed = feed or engine.store.changes()
                feed.wait(min(left, 0.5))  # the holder's release is a change
    finally:
        if feed is not None:
            feed.close()


def _naming_holder(held: LeaseHeld, owner: str | None) -> LeaseHeld:
    """``held``'s refusal naming its holder as ``status`` does (``host:pid``), so the
    person knows which worker or run to wait for or stop."""
    if not owner:
        return held
    holder = ":".join(owner.split(":")[:2])
    return LeaseHeld(str(held).replace("another process", f"another process ({holder})", 1))


def _via(via: str | None) -> dict[str, Any]:
    """The decision event's ``comment``: the forge comment that commanded it."""
    return {"comment": via} if via else {}


def resume(engine: Engine, workflow_id: str, *, by: str, via: str | None = None) -> dict[str, Any]:
    """Run the current phase again with fresh retry counters (``decisions.resume``);
    ``via``: the forge comment that commanded it (``Comment.key``). A ``blocked``
    workflow goes on without what it waits for that has not completed: the row's
    ``dropped`` lists it (``actions.epic.unfinished``). An epic's parent in ``pieces``
    goes on without its pieces that failed or were cancelled (``dropped``;
    ``actions.epic.resume_parent``); with none it is refused (ContractViolation)."""
    row = engine.store.workflow_row(workflow_id)
    if row["status"] == PIECES:
        why = decisions.pieces_refusal(workflow_id, row["error"])
        event = decision_event("resume", check_by(by), **_via(via))
        dropped = epic_actions.resume_parent(engine.store, workflow_id, event, why)
        return {**engine.store.workflow_row(workflow_id), "dropped": dropped}
    waited = epic_actions.unfinished(engine.store, workflow_id) if row["status"] == BLOCKED else []
    resumed = _decide(engine, workflow_id, "resume", by, decisions.resume, **_via(via))
    return {**resumed, "dropped": waited} if waited else resumed


def feedback(engine: Engine, workflow_id: str, text: str, *, by: str) -> dict[str, Any]:
    """Give the agents ``text``, its secrets redacted (``decisions.feedback``).
    Raises ActionRefused over MAX_TICKET_BYTES, as a ticket."""
    check_size(text, "feedback")
    # A key pasted into feedback must reach neither the store nor a prompt.
    said = redact(text, cartridge_secrets(engine.cartridge))
    return _decide(engine, workflow_id, "feedback", by, lambda ctx: decisions.feedback(ctx, said))


def comment(
    engine: Engine,
    workflow_id: str,
    path: str,
    line: int,
    text: str,
    *,
    by: str,
    shown: Collection[int] | None = None,
) -> list[review.Draft]:
    """Record a draft review comment on ``path`` line ``line`` (1-based, in the
    workflow's branch), ``text`` its secrets redacted: a ``review_comment`` event,
    outside the lease and changing no state, so no worker acts on it; it waits for
    ``send_review``. ``shown``: the lines of ``path`` the front
    end's diff shows (it parsed the diff it shows); None, not checked. Returns the
    workflow's drafts now, this one among them (``review_drafts``). Raises
    ActionRefused (no path, a line below 1, an empty or over-long text, a line not
    ``shown``), ContractViolation (a completed or cancelled workflow: no round will
    read it; said before a line not shown, which a merged branch's diff has none
    of), WorkflowNotFound."""
    check_by(by)
    if not path.strip():
        raise ActionRefused("the comment names no file")
    if line < 1:
        raise ActionRefused(f"line {line} is not a line number (they start at 1)")
    if not text.strip():
        raise ActionRefused("the comment is empty")
    if len(text.encode("utf-8", "surrogateescape")) > review.MAX_COMMENT_BYTES:
        raise ActionRefused(f"the comment is over {review.MAX_COMMENT_BYTES} bytes")
    row = engine.store.workflow_row(workflow_id)
    if row["status"] in ("completed", CANCELLED):
        raise ContractViolation(
            f"workflow {workflow_id} is {row['status']}; no round will read a comment"
        )
    if shown is not None and line not in shown:
        raise ActionRefused(f"{path} line {line} is not a line of this diff")
    said = redact(text.strip(), cartridge_secrets(engine.cartridge))
    data = {"path": path, "line": line, "text": said, "by": by}
    engine.store.add_event(workflow_id, EventWrite(review.REVIEW_COMMENT, data))
    return review_drafts(engine.store, workflow_id)


def review_drafts(store: Store, workflow_id: str) -> list[review.Draft]:
    """The workflow's draft comments no review has sent yet, oldest first."""
    return review.drafts(store.events(workflow_id))


def send_review(engine: Engine, workflow_id: str, text: str = "", *, by: str) -> dict[str, Any]:
    """Send the drafts as one review: one feedback (``feedback``'s rules) reading
    the feedback not yet taken up, then ``text`` (a summary, may be empty), then
    each draft's ``Review comment on PATH line N: TEXT``; and, in the same commit,
    a ``review_sent`` event with the drafts' ids, so they are drafts no more. The
    drafts are read under the lease: one written meanwhile waits for the next
    review. Raises ActionRefused (no draft and no text), ContractViolation,
    LeaseHeld, WorkflowNotFound; ActionRefused over MAX_TICKET_BYTES (the summary,
    or the review it makes), as a ticket."""
    check_size(text, "review's summary")
    summary = redact(text, cartridge_secrets(engine.cartridge))

    def decide(ctx: WorkflowContext) -> PhaseResult:
        found = review_drafts(engine.store, ctx.id)
        if not found and not summary.strip():
            raise ActionRefused(
                f"workflow {ctx.id} has no draft comment to send; comment on a line or say "
                "something"
            )
        said = review.review_feedback(ctx.user_feedback, summary, found)
        check_size(said, "review (its summary, its comments and the feedback before it)")
        result = decisions.feedback(ctx, said)
        sent = EventWrite(review.REVIEW_SENT, {"comments": [d.id for d in found], "by": by})
        return dataclasses.replace(result, events=(*result.events, sent))

    return _decide(engine, workflow_id, "review", by, decide)


def approve_merge(engine: Engine, workflow_id: str, *, by: str) -> dict[str, Any]:
    """Let a waiting workflow merge; ``by`` is its ``merge_approved_by``
    (``decisions.approve_merge``)."""
    return _decide(
        engine, workflow_id, "approve_merge", by, lambda ctx: decisions.approve_merge(ctx, by)
    )


def revert(
    engine: Engine, workflow_id: str, reason: str, *, by: str, to_phase: str = "planning"
) -> dict[str, Any]:
    """Send the workflow back to planning with ``reason``, its secrets redacted
    (docs/contracts/autonomy.md: manual reversion; ``decisions.revert``). The row's
    ``state["decisions"][-1]`` is the reversion's record."""
    why = redact(reason, cartridge_secrets(engine.cartridge))
    return _decide(
        engine,
        workflow_id,
        "revert",
        by,
        lambda ctx: decisions.revert(ctx, to_phase, why, engine.clock.now()),
    )


def verify_override(
    engine: Engine,
    workflow_id: str,
    verdict: str,
    *,
    by: str,
    reason: str = "",
    via: str | None = None,
) -> dict[str, Any]:
    """A person's acceptance verdict (confirmed or rejected), ``by`` its
    ``verified_by`` (``phases.acceptance_verification.override``). A rejection's
    ``reason``, its secrets redacted, is commented on the issue. ``via``: the forge
    comment that commanded it (``Comment.key``)."""
    why = redact(reason.strip(), cartridge_secrets(engine.cartridge))

    def decide(ctx: WorkflowContext) -> PhaseResult:
        return acceptance_verification.override(ctx, engine.deps_for(ctx), verdict, by, why)

    data = {"verdict": verdict, **({"reason": why} if why else {}), **_via(via)}
    return _decide(engine, workflow_id, "verify_override", by, decide, **data)


def cancel(engine: Engine, workflow_id: str, *, by: str, via: str | None = None) -> dict[str, Any]:
    """Cancel a workflow that is not completed: status ``cancelled`` through the
    single commit path, its error ``cancelled by BY``; final (every later decision
    is refused). Its forge issue is left open (its status label shows
    ``phasegate:cancelled``), its worktree and branch are kept (until retention:
    ``retire_worktrees``, ``expire_worktrees``).

    Its pull request, when phasegate opened it, is closed before the status
    changes (``phases.cleanup.close_pull_request``: journaled, retried like a
    failed cleanup when the forge fails it). ``via``: the forge comment that
    commanded it (``Comment.key``).

    Under the workflow's lease like every decision: while another process (or a
    thread of ``engine``) advances it, and so may run its agents, the cancel is
    refused with LeaseHeld and nothing changes; stop that worker (its agents stop,
    the workflow pauses), then cancel. Raises ContractViolation for a completed or
    already cancelled workflow, WorkflowNotFound.

    An epic's parent in ``pieces`` cancels its pieces not ended too, after itself,
    each under these rules (``actions.epic.cancel_pieces``): the row's
    ``pieces_cancelled`` lists them, ``pieces_not_cancelled`` the ones refused (a
    worker advances it: ``{"id", "reason", "next"}``), which fail no cancel.
    """
    waiting = engine.store.workflow_row(workflow_id)["status"] == PIECES

    def decide(ctx: WorkflowContext) -> PhaseResult:
        if ctx.status == "completed":
            raise ContractViolation(f"workflow {ctx.id} is completed; there is nothing to cancel")
        effects = engine.deps_for(ctx).effects
        cleanup_phase.close_pull_request(ctx, effects, ctx.current_phase)
        return PhaseResult("failed", status=CANCELLED, reason=f"cancelled by {by}")

    row = _decide(engine, workflow_id, "cancel", by, decide, **_via(via))
    if not waiting:
        return row
    done, left = epic_actions.cancel_pieces(
        engine.store, workflow_id, lambda p: cancel(engine, p, by=by)
    )
    return {**row, "pieces_cancelled": done, "pieces_not_cancelled": left}


# -- the proposal gate (docs/contracts/autonomy.md: the human gate) ------------------


#: Per proposal kind: the phase a workflow awaits it in, the state key naming its run.
_AWAITED = {"draft_pr_create": (DEVELOPMENT, "graph_run"), "item_create": (PLANNING, "epic_run")}


def awaiting(store: Store, proposal: Mapping[str, Any]) -> str | None:
    """The id of the workflow paused for ``proposal`` (a draft PR, an epic's pieces), if any."""
    workflow_id = proposal.get("workflow_id")
    phase, key = _AWAITED.get(str(proposal.get("kind")), (None, ""))
    if not workflow_id or phase is None:
        return None
    row = store.workflow_row(str(workflow_id))
    if row["current_phase"] != phase or row["status"] != AWAITING_APPROVAL:
        return None
    return str(workflow_id) if row["state"].get(key) == proposal["run_id"] else None


@dataclass(frozen=True)
class GateOutcome:
    """A person's decision on a proposal (``approve``/``reject``).

    ``proposal``: its row as decided; ``recorded_before``: it had been decided so
    before and the process died before its workflow moved on (nothing new
    recorded); ``workflow_id``: the workflow resumed for it (graph mode), else
    None; ``streak``: its kind's clean first-attempt approvals in a row;
    ``policy``: the autonomy policy its kind graduates under.
    """

    proposal: dict[str, Any]
    recorded_before: bool
    workflow_id: str | None
    streak: int
    policy: AutonomyPolicy


def approve(engine: Engine, proposal_id: str, *, by: str) -> GateOutcome:
    """Approve a proposal at the human gate: records who and when; a workflow paused
    for it is resumed, not advanced (the apply arm lands it at its next advance)."""
    return _gate(engine, proposal_id, "approved", by, None)


def reject(engine: Engine, proposal_id: str, reason: str, *, by: str) -> GateOutcome:
    """Reject a proposal saying why (``reason``, its secrets redacted); a workflow
    paused for its draft PR is resumed (its next advance starts a new run told why),
    one paused for its pieces (``item_create``) pauses with the reason (its next
    scope is told why)."""
    return _gate(engine, proposal_id, "rejected", by, reason)


def _not_awaited(proposal: Mapping[str, Any], owner: Mapping[str, Any]) -> str:
    """Why a person may not decide ``proposal``: its workflow ended or does not wait for it."""
    where = f"workflow {owner['id']}, which is {owner['status']}"
    if owner["status"] not in ENDED_STATUSES:
        where = (
            f"workflow {owner['id']}, which is not waiting for it (it is in "
            f"{owner['current_phase']} · {owner['status']})"
        )
    was = f" ({proposal['reason']})" if proposal["status"] == "superseded" else ""
    return (
        f"proposal {proposal['id']} ({proposal['kind']}{was}) is from run {proposal['run_id']} "
        f"of {where}; nothing recorded"
    )


def _gate(
    engine: Engine, proposal_id: str, verdict: str, by: str, reason: str | None
) -> GateOutcome:
    """Record ``verdict`` on the proposal, then resume the workflow paused for it.

    Who may decide: a person, never phasegate's own gates. A workflow's proposal
    that its workflow does not wait for (it ended, or a revert or a newer run
    left it behind) is refused, nothing recorded and no streak counted. A
    proposal decided so before while its workflow had not moved on is taken as
    decided (the process died in between); decided so before and its workflow
    went on: refused. Raises ActionRefused,
    ProposalNotFound, ProposalDecided, LeaseHeld.
    """
    who = check_by(by)
    if who in (APPLY_ARM, CHECKS_GATE):
        raise ActionRefused(f"--by {who!r} names phasegate's own gate; give a person's name")
    if reason is not None and not reason.strip():
        raise ActionRefused("--reason is empty; say why")
    store = engine.store
    if reason is not None:  # a key pasted into a reason reaches neither store nor prompt
        reason = redact(reason, cartridge_secrets(engine.cartridge))
    found = store.proposal(proposal_id)
    profile = None
    # A workflow's proposal (its draft PR, an epic's pieces) is decided only while the
    # workflow waits for it: one it ended, left behind or never paused for is refused.
    gating = bool(found["workflow_id"])
    owner: dict[str, Any] = {}
    if gating:
        owner = store.workflow_row(str(found["workflow_id"]))
        profile = AutomationProfile.from_state(owner["state"])
        if found["status"] in ("proposed", "superseded") and awaiting(store, found) is None:
            raise ActionRefused(_not_awaited(found, owner))
    if gating and found["status"] == verdict and awaiting(store, found) is not None:
        row, before = found, True
    elif gating and found["status"] == verdict and owner["status"] in RUNNABLE_STATUSES:
        raise ActionRefused(
            f"proposal {proposal_id} was {verdict} already by {found['decided_by']}; "
            f"workflow {owner['id']} is in {owner['current_phase']} · {owner['status']}: "
            f"`phasegate resume {owner['id']}` (or a worker) goes on with it"
        )
    else:
        row, before = store.decide_proposal(proposal_id, verdict, who, reason), False
    policy = AutonomyPolicy.from_cartridge(engine.cartridge, profile)
    clean = streak(row["kind"], store.gate_history(row["kind"]))
    workflow_id = awaiting(store, row) if gating else None
    if workflow_id is not None:
        action = "approve" if verdict == "approved" else "reject"
        # Rejected pieces pause their workflow with the reason; anything else resumes it.
        settle = decisions.resume
        if verdict == "rejected" and row["kind"] == "item_create":
            settle = functools.partial(epic.turned_down, proposal=row)
        _decide(engine, workflow_id, action, who, settle, proposal=row["id"])
    return GateOutcome(row, before, workflow_id, clean, policy)
