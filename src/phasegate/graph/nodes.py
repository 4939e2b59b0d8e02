"""The graph's nodes: scope, the plan stage, handoff and one review round.

Each node that asks an agent is a generator (``yield from`` it inside the
graph); a node that cannot go on raises ``Stop`` with a named reason, which
``lifecycle_propose`` turns into the run record's ``stopped``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from phasegate.graph.calls import AgentCall, Answer, Graph, call_row
from phasegate.graph.facts import ChangeFacts
from phasegate.graph.parse import (
    REVIEW_VERDICTS,
    field,
    items,
    section,
    subtask_pieces,
    verdict,
    without_fields,
)
from phasegate.graph.prompts import (
    adversary_prompt,
    arbitrate_prompt,
    plan_adversary_prompt,
    plan_alternative_prompt,
    plan_arbitrate_prompt,
    plan_prompt,
    plan_revision_prompt,
    review_prompt,
    scope_prompt,
)
from phasegate.graph.rules import GraphRules

__all__ = [
    "PLAN_AUTHORS",
    "PLAN_CHOICES",
    "PLAN_VERDICTS",
    "STOP_REASONS",
    "Handoff",
    "ReviewRound",
    "Run",
    "Stop",
    "handoff",
    "plan_choice",
    "plan_stage",
    "review_round",
    "scope",
]

#: Why a graph stops before emit, besides the fix loop's own stops.
STOP_REASONS = (
    "agent_failed",  # a role failed every try the shell allowed it
    "garbage",  # an answer without what the node needs (a verdict, a choice, a plan)
    "merged_without_plan",  # plan_arbitrate merged but wrote no plan
    "handoff_incomplete",  # build's output lacks what review needs
    "routed",  # scope routed the ticket elsewhere than this run's build
)


class Stop(Exception):
    """A node ends the graph: ``node``, a reason from STOP_REASONS, a detail."""

    def __init__(self, node: str, reason: str, detail: str = "") -> None:
        super().__init__(f"{node}: {reason}: {detail}")
        self.node = node
        self.reason = reason
        self.detail = detail

    def as_dict(self) -> dict[str, str]:
        return {"node": self.node, "reason": self.reason, "detail": self.detail}


class Run:
    """One run's inputs and the calls it made so far (its only mutable state)."""

    def __init__(self, rules: GraphRules, ticket: str) -> None:
        self.rules = rules
        self.ticket = ticket
        self.calls: list[dict[str, Any]] = []

    def ask(self, node: str, role: str, thread: str, prompt: str) -> Graph[Answer]:
        """Yield the call, record it with its answer, return the answer (even a failure)."""
        call = AgentCall(node=node, role=role, thread=thread, prompt=prompt)
        answer = yield call
        self.calls.append(call_row(len(self.calls), call, answer))
        return answer

    def ask_ok(self, node: str, role: str, thread: str, prompt: str) -> Graph[Answer]:
        """``ask``, stopping the graph (``agent_failed``) when the role failed."""
        answer = yield from self.ask(node, role, thread, prompt)
        if not answer.ok:
            raise Stop(node, "agent_failed", f"{role}: {answer.error_kind}: {answer.error or ''}")
        return answer

    def ask_text(self, node: str, role: str, thread: str, prompt: str) -> Graph[str]:
        """``ask_ok`` for a free-text answer; a blank one stops the graph (``garbage``)."""
        answer = yield from self.ask_ok(node, role, thread, prompt)
        if not answer.text.strip():
            raise Stop(node, "garbage", f"{role} answered with nothing")
        return answer.text


# -- scope ----------------------------------------------------------------------


def scope(run: Run) -> Graph[dict[str, Any]]:
    """Ask scope_epic for the pieces of work and the earlier pieces each needs
    (``SUBTASK: title [after 1, 2]``); epic_threshold shapes the ticket from their
    count, work_routing routes the shape (docs/contracts/graph.md: scope). An
    ``[after ...]`` naming anything but earlier pieces stops the graph (garbage)."""
    text = yield from run.ask_text("scope", "scope_epic", "scope", scope_prompt(run.ticket))
    listed = items(text, "subtask")
    if not listed:
        raise Stop("scope", "garbage", "scope_epic listed no SUBTASK line")
    try:
        pieces = subtask_pieces(listed)
    except ValueError as exc:
        raise Stop("scope", "garbage", str(exc)) from None
    threshold = run.rules.epic_threshold
    shape = threshold.shape(len(pieces))
    return {
        "shape": shape,
        "pieces": len(pieces),
        "subtasks": [title for title, _ in pieces],
        # Per piece, the 1-based places of the earlier pieces it needs ([after N]).
        "depends_on": [after for _, after in pieces],
        "route": run.rules.work_routing[shape],
        "epic_threshold": {"parent_at": threshold.parent_at, "epic_at": threshold.epic_at},
        "work_routing": dict(sorted(run.rules.work_routing.items())),
    }


# -- the plan stage ---------------------------------------------------------------

#: Who wrote a plan, by choice: the role and thread a revision goes back to.
PLAN_AUTHORS = {
    "first": ("plan", "plan"),
    "second": ("plan_alternative", "plan_alternative"),
    "merged": ("plan_arbitrate", "plan_arbitrate"),
}
#: What plan_arbitrate may choose (``CHOICE:``).
PLAN_CHOICES = ("first", "second", "merged")
#: What plan_adversary may say (``VERDICT:``).
PLAN_VERDICTS = ("proceed", "revise")


def plan_choice(text: str) -> str | None:
    """plan_arbitrate's ``CHOICE:`` (one of PLAN_CHOICES), or None."""
    choice = (field(text, "choice") or "").strip("*`'\". ").lower()
    return choice if choice in PLAN_CHOICES else None


def plan_stage(
    run: Run,
) -> Graph[tuple[str, dict[str, Any] | None, dict[str, Any] | None]]:
    """plan → plan_alternative → plan_arbitrate → plan_adversary.

    Returns ``(plan, plan_competition, plan_attack)``; the last two are None
    when their roles are unbound. The competition runs only when both
    plan_alternative and plan_arbitrate are bound; a pick passes the chosen
    plan verbatim. The adversary's one revision is asked of the plan's author
    on the author's own thread, with the objections verbatim, and is not
    attacked again.
    """
    rules, ticket = run.rules, run.ticket
    first = yield from run.ask_text("plan", "plan", "plan", plan_prompt(ticket))
    plan, choice, competition = first, "first", None
    if rules.bound("plan_alternative") and rules.bound("plan_arbitrate"):
        second = yield from run.ask_text(
            "plan_alternative",
            "plan_alternative",
            "plan_alternative",
            plan_alternative_prompt(ticket, first),
        )
        answer = yield from run.ask_ok(
            "plan_arbitrate",
            "plan_arbitrate",
            "plan_arbitrate",
            plan_arbitrate_prompt(ticket, first, second),
        )
        chosen = plan_choice(answer.text)
        if chosen is None:
            raise Stop("plan_arbitrate", "garbage", f"no CHOICE of {'/'.join(PLAN_CHOICES)}")
        choice = chosen
        if choice == "merged":
            merged = section(answer.text, "plan")
            if merged is None:
                raise Stop(
                    "plan_arbitrate",
                    "merged_without_plan",
                    "the arbiter merged the plans but wrote no plan; neither planner's "
                    "plan is built under the arbiter's name",
                )
            plan = merged
        else:
            plan = first if choice == "first" else second
        competition = {
            "choice": choice,
            "price": field(answer.text, "price") or "",
            "author": PLAN_AUTHORS[choice][0],
            "first": first,
            "second": second,
            "losers": {"first": ["second"], "second": ["first"]}.get(choice, ["first", "second"]),
        }
    attack = None
    if rules.bound("plan_adversary"):
        answer = yield from run.ask_ok(
            "plan_adversary",
            "plan_adversary",
            "plan_adversary",
            plan_adversary_prompt(ticket, plan),
        )
        said = verdict(answer.text, PLAN_VERDICTS)
        if said is None:
            raise Stop("plan_adversary", "garbage", "no VERDICT: proceed|revise")
        objections = items(answer.text, "objection")
        role, thread = PLAN_AUTHORS[choice]
        attack = {
            "verdict": said,
            "objections": objections,
            "revised": False,
            "author": role,
            "thread": thread,
            "attacked_plan": plan,
        }
        if said == "revise":
            verbatim = "\n".join(f"OBJECTION: {o}" for o in objections) or answer.text.strip()
            plan = yield from run.ask_text(
                "plan_adversary", role, thread, plan_revision_prompt(ticket, plan, verbatim)
            )
            attack["revised"] = True
    return plan, competition, attack


# -- handoff and review -------------------------------------------------------------


@dataclass(frozen=True)
class Handoff:
    """Whether build's output holds what review needs; ``brief`` goes to review."""

    complete: bool
    brief: str
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"complete": self.complete, "brief": self.brief, "reason": self.reason}


def handoff(patch: str, summary: str, facts: ChangeFacts) -> Handoff:
    """Complete when the build answered with a patch that changes at least one
    line of at least one file; the brief is the builder's own summary."""
    brief = summary or "(the builder wrote no summary)"
    if not patch.strip():
        return Handoff(False, brief, "the build answered without a unified diff")
    if facts.files == 0 or facts.lines == 0:
        return Handoff(False, brief, "the diff changes no line of any file")
    return Handoff(True, brief)


@dataclass(frozen=True)
class ReviewRound:
    """One attempt's review at its tier. ``decision``: approve or request_changes."""

    attempt: int
    tier: int
    tier_rules_matched: tuple[int, ...]
    decision: str
    review: dict[str, Any]
    adversary: dict[str, Any] | None
    arbitrate: dict[str, Any] | None

    @property
    def objections(self) -> list[str]:
        """The adversary's objections (none at tier 0)."""
        return list(self.adversary["objections"]) if self.adversary else []

    def critique(self) -> str:
        """What the builder gets back: the findings, the objections, the reasoning."""
        parts = [f"### Review ({self.review['verdict']})\n\n{self.review['findings'] or '(none)'}"]
        if self.adversary:
            listed = "".join(f"- {o}\n" for o in self.objections) or "(none)\n"
            parts.append(
                f"### The adversary's objections ({self.adversary['verdict']})\n\n{listed}"
            )
        if self.arbitrate:
            parts.append(
                f"### The arbitrator's reasoning ({self.arbitrate['verdict']})\n\n"
                f"{self.arbitrate['reasoning'] or '(none)'}"
            )
        return "\n\n".join(p.rstrip("\n") for p in parts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "tier": self.tier,
            "tier_rules_matched": list(self.tier_rules_matched),
            "decision": self.decision,
            "review": self.review,
            "adversary": self.adversary,
            "arbitrate": self.arbitrate,
        }


def _judged(run: Run, node: str, role: str, thread: str, prompt: str) -> Graph[tuple[str, str]]:
    answer = yield from run.ask_ok(node, role, thread, prompt)
    said = verdict(answer.text, REVIEW_VERDICTS)
    if said is None:
        raise Stop(node, "garbage", f"{role}: no VERDICT: approve|request_changes")
    return said, answer.text


def review_round(
    run: Run,
    attempt: int,
    tier: int,
    matched: Sequence[int],
    plan: str,
    brief: str,
    patch: str,
    facts: ChangeFacts,
    standing: Sequence[str],
) -> Graph[ReviewRound]:
    """review, then by tier: 0 alone; 1 with the adversary, arbitrating only a
    disagreement; 2 with the adversary and always the arbitrator."""
    change = (run.ticket, plan, attempt, brief, patch, facts, standing)
    said, text = yield from _judged(run, "review", "review", "review", review_prompt(*change))
    findings = without_fields(text, "verdict")
    review = {"verdict": said, "findings": findings}
    decision, adversary, arbitrate = said, None, None
    if tier >= 1:
        adv_said, adv_text = yield from _judged(
            run,
            "adversary",
            "review_adversary",
            "adversary",
            adversary_prompt(*change, said, findings),
        )
        adversary = {
            "verdict": adv_said,
            "objections": items(adv_text, "objection"),
            "agreed": adv_said == said,
        }
        if adv_said != said or tier >= 2:
            arb_said, arb_text = yield from _judged(
                run,
                "arbitrate",
                "arbitrate",
                "arbitrate",
                arbitrate_prompt(*change, text, adv_text),
            )
            arbitrate = {"verdict": arb_said, "reasoning": without_fields(arb_text, "verdict")}
            decision = arb_said
    return ReviewRound(attempt, tier, tuple(matched), decision, review, adversary, arbitrate)
