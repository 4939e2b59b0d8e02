"""lifecycle-propose: one ticket in, reviewed work and proposals out (docs/contracts/graph.md).

    scope → plan → plan_alternative → plan_arbitrate → plan_adversary →
    build → change_facts → handoff → review → adversary → arbitrate → emit

with the bounded fix loop between build and review. ``lifecycle_propose`` is
the graph, a generator of AgentCalls (see ``phasegate.graph.calls``);
``run_lifecycle`` drives it with an answer source, ``replay`` drives it with a
run record's own answers. Nothing is pushed, opened, applied or merged: the
build node returns a unified diff, and the graph's output is proposals.

The fix loop's stops (``fix_loop.stop``):

- ``no_progress``: the retry's patch is at least NO_PROGRESS_SIMILARITY like
  the previous one; it is not reviewed.
- ``objection_standing``: a retry's adversary raises a claim already standing
  (compared stripped and case-insensitively) and the round did not approve.
- ``attempts_exhausted``: ``fix_attempts`` more attempts (default 2; 0
  disables retries) and no approval.
- ``budget``: a retry's build failed with ``error_kind="budget"``; the attempt
  is spent, and build/review still describe the last patch reviewed.

Besides those, ``stopped`` names why a graph ended before emit had work to
propose (``nodes.STOP_REASONS``), or is None.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from phasegate.graph.calls import AnswerSource, Graph, RecordedAnswers, ReplayDivergence, drive
from phasegate.graph.facts import (
    NO_PROGRESS_SIMILARITY,
    ChangeFacts,
    change_facts,
    extract_patch,
    similarity,
)
from phasegate.graph.nodes import ReviewRound, Run, Stop, handoff, plan_stage, review_round, scope
from phasegate.graph.parse import claim_key
from phasegate.graph.prompts import build_prompt
from phasegate.graph.proposals import Evidence, Proposal
from phasegate.graph.rules import BUILD_ROUTE, CartridgeView, GraphRules, review_tier

__all__ = [
    "FIX_LOOP_STOPS",
    "RUN_RECORD_KEYS",
    "canonical_json",
    "lifecycle_propose",
    "plan_propose",
    "replay",
    "run_lifecycle",
]

FIX_LOOP_STOPS = ("no_progress", "objection_standing", "attempts_exhausted", "budget")

#: The keys of a run record, in the order they are written.
RUN_RECORD_KEYS = (
    "run_id",
    "date",
    "ticket",
    "rules",
    "scope",
    "plan",
    "plan_competition",
    "plan_attack",
    "build",
    "review",
    "change_facts",
    "fix_loop",
    "stopped",
    "proposals",
    "calls",
    "usage",
)


@dataclass
class _State:
    """What the run has decided so far; build/review/change_facts describe the
    last patch reviewed (or the only build, when none was)."""

    scope: dict[str, Any] | None = None
    plan: str | None = None
    plan_competition: dict[str, Any] | None = None
    plan_attack: dict[str, Any] | None = None
    build: dict[str, Any] | None = None
    review: ReviewRound | None = None
    facts: ChangeFacts | None = None
    stopped: dict[str, str] | None = None
    fix_loop: dict[str, Any] = field(default_factory=dict)


def lifecycle_propose(
    *,
    run_id: str,
    date: str,
    cartridge: CartridgeView | GraphRules,
    ticket: str,
    fix_attempts: int | None = None,
    worktree_root: str | None = None,
) -> Graph[dict[str, Any]]:
    """The development graph for ``ticket``; returns the run record.

    ``run_id`` and ``date`` are recorded as given (the graph has no clock).
    ``cartridge`` is the resolved cartridge (or its GraphRules); no fallback.
    ``fix_attempts`` overrides the cartridge's (0 disables retries);
    ``worktree_root`` the cartridge's ``landing_areas.worktree_root``.
    The record's keys are RUN_RECORD_KEYS; every value is JSON.
    Raises GraphError when the rules are incoherent (a tier without its roles).
    """
    rules = _rules(cartridge, fix_attempts, worktree_root)
    run = Run(rules, ticket)
    state = _State(
        fix_loop={
            "attempts": 0,
            "fix_attempts": rules.fix_attempts,
            "stop": None,
            "approved_attempt": None,
            "rounds": [],
        }
    )
    try:
        yield from _plan_part(run, state)
        yield from _fix_loop(run, state)
    except Stop as stop:
        state.stopped = stop.as_dict()
    proposals = [p.as_dict() for p in _emit(run_id, run, state)]
    usage = {
        "input_tokens": sum(c["input_tokens"] for c in run.calls),
        "output_tokens": sum(c["output_tokens"] for c in run.calls),
        "cost_usd": round(sum(c["cost_usd"] for c in run.calls), 6),
    }
    return {
        "run_id": run_id,
        "date": date,
        "ticket": ticket,
        "rules": rules.as_dict(),
        "scope": state.scope,
        "plan": state.plan,
        "plan_competition": state.plan_competition,
        "plan_attack": state.plan_attack,
        "build": state.build,
        "review": state.review.as_dict() if state.review else None,
        "change_facts": state.facts.as_dict() if state.facts else None,
        "fix_loop": state.fix_loop,
        "stopped": state.stopped,
        "proposals": proposals,
        "calls": run.calls,
        "usage": usage,
    }


def _rules(
    cartridge: CartridgeView | GraphRules, fix_attempts: int | None, worktree_root: str | None
) -> GraphRules:
    rules = cartridge if isinstance(cartridge, GraphRules) else GraphRules.from_cartridge(cartridge)
    if fix_attempts is not None:
        rules = replace(rules, fix_attempts=fix_attempts)
    if worktree_root is not None:
        rules = replace(rules, worktree_root=worktree_root)
    return rules


def _plan_part(run: Run, state: _State) -> Graph[None]:
    """scope (when bound) → the plan stage; fills scope, plan, plan_competition, plan_attack."""
    if run.rules.bound("scope_epic"):
        state.scope = yield from scope(run)
        if state.scope["route"] != BUILD_ROUTE:
            raise Stop(
                "scope",
                "routed",
                f"a {state.scope['shape']} ticket goes to {state.scope['route']!r}",
            )
    state.plan, state.plan_competition, state.plan_attack = yield from plan_stage(run)


def plan_propose(
    *, cartridge: CartridgeView | GraphRules, ticket: str, fix_attempts: int | None = None
) -> Graph[dict[str, Any]]:
    """The graph up to build: scope (when bound) and the plan stage, for the
    planning phase of a workflow run in graph mode.

    Its calls are exactly the first calls ``lifecycle_propose`` makes with the
    same arguments (the same nodes, in the same order, with the same prompts),
    so a development phase that drives the whole graph afterwards is answered
    from these recorded answers before it asks anything new. Returns
    ``{scope, plan, plan_competition, plan_attack, stopped, calls}``; ``stopped``
    is set (and ``plan`` may be None) when scope routed the ticket elsewhere
    or the plan stage stopped the graph.
    """
    run = Run(_rules(cartridge, fix_attempts, None), ticket)
    state = _State()
    try:
        yield from _plan_part(run, state)
    except Stop as stop:
        state.stopped = stop.as_dict()
    return {
        "scope": state.scope,
        "plan": state.plan,
        "plan_competition": state.plan_competition,
        "plan_attack": state.plan_attack,
        "stopped": state.stopped,
        "calls": run.calls,
    }


def _fix_loop(run: Run, state: _State) -> Graph[None]:
    """build → change_facts → handoff → review_tier → review, up to 1 + fix_attempts times."""
    rules, loop = run.rules, state.fix_loop
    assert state.plan is not None
    standing: list[str] = []
    standing_keys: set[str] = set()
    previous_patch: str | None = None
    for attempt in range(1, rules.fix_attempts + 2):
        loop["attempts"] = attempt
        prompt = build_prompt(
            run.ticket,
            state.plan,
            attempt,
            previous_patch,
            state.review.critique() if state.review else "",
            standing,
        )
        answer = yield from run.ask("build", "build", "build", prompt)
        if not answer.ok:
            loop["rounds"].append(
                {"attempt": attempt, "outcome": answer.error_kind, "error": answer.error}
            )
            if attempt > 1 and answer.error_kind == "budget":
                loop["stop"] = "budget"
                return
            raise Stop("build", "agent_failed", f"build: {answer.error_kind}: {answer.error or ''}")
        patch, summary = extract_patch(answer.text)
        similar = None
        if previous_patch is not None:
            ratio = similarity(previous_patch, patch)
            similar = round(ratio, 4)
            if ratio >= NO_PROGRESS_SIMILARITY:
                loop["rounds"].append(
                    {"attempt": attempt, "outcome": "no_progress", "similarity": similar}
                )
                loop["stop"] = "no_progress"
                return
        facts = change_facts(patch, rules.governance_paths)
        ready = handoff(patch, summary, facts)
        build = {"attempt": attempt, "patch": patch, "summary": summary, "handoff": ready.as_dict()}
        if state.review is None:
            state.build, state.facts = build, facts
        if not ready.complete:
            loop["rounds"].append(
                {"attempt": attempt, "outcome": "handoff_incomplete", "similarity": similar}
            )
            raise Stop("handoff", "handoff_incomplete", ready.reason or "")
        tier, matched = review_tier(facts, rules)
        reviewed = yield from review_round(
            run, attempt, tier, matched, state.plan, ready.brief, patch, facts, standing
        )
        state.build, state.facts, state.review = build, facts, reviewed
        previous_patch = patch
        repeated = [o for o in reviewed.objections if claim_key(o) in standing_keys]
        loop["rounds"].append(
            {
                "attempt": attempt,
                "outcome": "reviewed",
                "similarity": similar,
                "tier": tier,
                "decision": reviewed.decision,
                "repeated_objections": repeated,
            }
        )
        if reviewed.decision == "approve":
            loop["approved_attempt"] = attempt
            return
        if repeated:
            loop["stop"] = "objection_standing"
            return
        for objection in reviewed.objections:
            if claim_key(objection) not in standing_keys:
                standing_keys.add(claim_key(objection))
                standing.append(objection)
    loop["stop"] = "attempts_exhausted"


def _title(ticket: str) -> str:
    first = next((line.strip() for line in ticket.splitlines() if line.strip()), "")
    first = first.lstrip("#").strip()
    return first if len(first) <= 72 else first[:71] + "…"


def _emit(run_id: str, run: Run, state: _State) -> list[Proposal]:
    """item_create when scope ran; draft_pr_create when an attempt was approved."""
    proposals: list[Proposal] = []
    title = _title(run.ticket)
    if state.scope is not None:
        shaped = state.scope
        proposals.append(
            Proposal(
                id=f"{run_id}/item_create/{len(proposals) + 1}",
                kind="item_create",
                title=title,
                payload={
                    "title": title,
                    "body": run.ticket,
                    "shape": shaped["shape"],
                    "route": shaped["route"],
                    "subtasks": shaped["subtasks"],
                    "depends_on": shaped["depends_on"],
                },
                evidence=(
                    Evidence(
                        "epic_threshold",
                        {"pieces": shaped["pieces"], **shaped["epic_threshold"]}
                        | {"shape": shaped["shape"]},
                    ),
                    Evidence(
                        "work_routing",
                        {
                            "shape": shaped["shape"],
                            "route": shaped["route"],
                            "routing": shaped["work_routing"],
                        },
                    ),
                ),
            )
        )
    approved = state.fix_loop["approved_attempt"]
    if approved is not None:
        assert state.build is not None and state.facts is not None and state.review is not None
        facts, reviewed = state.facts, state.review
        evidence = [
            Evidence("change_facts", facts.as_dict()),
            Evidence(
                "review",
                {
                    "tier": reviewed.tier,
                    "decision": reviewed.decision,
                    "review": reviewed.review["verdict"],
                    "adversary": reviewed.adversary["verdict"] if reviewed.adversary else None,
                    "arbitrate": reviewed.arbitrate["verdict"] if reviewed.arbitrate else None,
                },
            ),
        ]
        if state.plan_competition is not None:
            competition = state.plan_competition
            evidence.append(
                Evidence(
                    "plan_competition",
                    {k: competition[k] for k in ("choice", "price", "author", "losers")},
                )
            )
        if state.plan_attack is not None:
            attack = state.plan_attack
            evidence.append(
                Evidence(
                    "plan_attack",
                    {k: attack[k] for k in ("verdict", "objections", "revised", "author")},
                )
            )
        evidence.append(
            Evidence(
                "attempts",
                {
                    "attempts": state.fix_loop["attempts"],
                    "approved_attempt": approved,
                    "fix_attempts": state.fix_loop["fix_attempts"],
                    "first_attempt": approved == 1,
                },
            )
        )
        summary = state.build["summary"]
        proposals.append(
            Proposal(
                id=f"{run_id}/draft_pr_create/{len(proposals) + 1}",
                kind="draft_pr_create",
                title=title,
                payload={
                    "title": title,
                    "body": f"{summary}\n\n## Plan\n\n{state.plan}".strip(),
                    "patch": state.build["patch"],
                    "worktree_root": run.rules.worktree_root,
                },
                evidence=tuple(evidence),
                attempts=approved,
                self_modification=facts.self_modification,
                paths=facts.paths,
            )
        )
    return proposals


def run_lifecycle(answers: AnswerSource, **kwargs: Any) -> dict[str, Any]:
    """Drive ``lifecycle_propose(**kwargs)`` with ``answers``; return its run record."""
    return drive(lifecycle_propose(**kwargs), answers)


def replay(record: dict[str, Any]) -> dict[str, Any]:
    """Re-run a recorded run from its own answers; return the new run record.

    The rules, ticket, run_id and date come from the record; each call must be
    the one recorded (node, role, thread, prompt hash) and every recorded call
    must be asked, else ReplayDivergence. The graph is pure, so the replay's
    proposals are byte-for-byte those recorded (compare ``canonical_json``).
    """
    answers = RecordedAnswers(record["calls"])
    replayed = run_lifecycle(
        answers,
        run_id=record["run_id"],
        date=record["date"],
        cartridge=GraphRules.from_dict(record["rules"]),
        ticket=record["ticket"],
    )
    if answers.next != len(answers.rows):
        raise ReplayDivergence(
            f"the replay asked {answers.next} of the {len(answers.rows)} recorded call(s)"
        )
    return replayed


def canonical_json(value: Any) -> str:
    """``value`` as canonical JSON: sorted keys, no spaces, UTF-8 kept as is."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
