"""An epic in graph mode: scope's pieces filed as tickets, one workflow each, the parent waiting.

When scope routes a ticket to ``breakdown`` or ``roadmap`` (docs/epics.md), its
``item_create`` proposal lists the pieces and the earlier pieces each needs. The
workflow pauses ``awaiting_approval`` for it (policy ``propose``); once it is
approved (or at once, policy ``auto``) planning files the pieces:

- preconditions: the workflow is in planning with ``state["epic_run"]`` naming the
  run whose ``item_create`` is approved or auto.
- side effects: one forge issue per piece (journaled ``ticket_filed``, keyed by its
  place, found again by its marker), each saying ``Part of #N`` and ``Depends on
  #M``; then one workflow per piece, started in one store transaction
  (``Store.start_pieces``: idempotent on the parent's piece edges), blocked after
  the pieces it needs. The proposal is marked applied.
- postconditions: the parent is ``pieces`` (not runnable) with
  ``state["epic_pieces"]``; the commit that completes its last piece makes it
  runnable again, and its planning then closes its issue (journaled) and
  completes it.
- re-entry point: ``epic_run`` or ``epic_pieces`` in the state. Every step is
  keyed, so a kill at any moment files no ticket and starts no workflow twice.
- terminal outcomes: ``pieces``; completed once every piece completed.

A piece runs the graph without scope: it is one piece of work already. Under
``branch_strategy = "epic"`` (``state["branch_strategy"]``, set in preparation) the
pieces' base is the branch ``phasegate/epic-<parent id>``, made from the base when
they are filed; once they all completed, the parent opens that branch as its pull
request and goes on to report, wait and merge, so the base gets the epic whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from phasegate.config.cartridge import Cartridge
from phasegate.core.contract import (
    AWAITING_APPROVAL,
    COMPLETED,
    PIECES,
    PLANNING,
    REPORT,
    MilestoneWrite,
    PhaseResult,
    WorkflowContext,
)
from phasegate.core.state import WorkflowState, state_of
from phasegate.graph.rules import GraphRules
from phasegate.phases.deps import PhaseDeps
from phasegate.store.dependencies import Piece

__all__ = ["epic_branch", "graph_rules", "resumed", "routed", "turned_down"]

#: The state a piece takes from its parent: how it runs, and who started the epic.
_INHERITED = ("profile", "graph_mode", "cartridge_sha", "started_by", "forge_repository")


def graph_rules(ctx: WorkflowContext, deps: PhaseDeps) -> Cartridge | GraphRules:
    """What the graph runs under: the cartridge, but for an epic's piece without
    scope (its run record says so, so a replay asks the same calls)."""
    if not ctx.state.get("epic_parent"):
        return deps.cartridge
    rules = GraphRules.from_cartridge(deps.cartridge)
    return replace(rules, bound_roles=rules.bound_roles - {"scope_epic"})


def _item_create(deps: PhaseDeps, run_id: str) -> dict[str, Any] | None:
    found = [p for p in deps.store.proposals(run_id=run_id) if p["kind"] == "item_create"]
    return found[-1] if found else None


def routed(
    ctx: WorkflowContext,
    deps: PhaseDeps,
    run_id: str,
    why: str,
    state: WorkflowState,
    stopped: MilestoneWrite,
) -> PhaseResult:
    """Scope routed the ticket away from this build, and run ``run_id`` is recorded with
    its ``item_create``: the pieces are filed now (policy ``auto``), or the workflow
    pauses ``awaiting_approval`` for it (paused with ``why`` when it has none)."""
    proposal = _item_create(deps, run_id)
    if proposal is None:
        reason = f"{why}; then `phasegate resume {ctx.id}`"
        return PhaseResult("pause", reason=reason, state=state, milestones=(stopped,))
    if proposal["mode"] == "auto":
        return _file_pieces(ctx, deps, proposal, state)
    count = len(proposal["payload"].get("subtasks") or ())
    return PhaseResult(
        "pause",
        status=AWAITING_APPROVAL,
        reason=(
            f"{why}; `phasegate approve {proposal['id']}` files its {count} pieces as tickets, "
            f"each a workflow run in the order scope gave, or `phasegate reject "
            f"{proposal['id']} --reason TEXT`"
        ),
        state={**state, "epic_run": run_id, "stopped_on": why},
        milestones=(stopped,),
    )


def resumed(ctx: WorkflowContext, deps: PhaseDeps) -> PhaseResult | None:
    """Planning re-entered for an epic: its pieces filed (approved), its end (every
    piece completed), or its proposal turned down. None: plan as usual."""
    if ctx.state.get("epic_pieces"):
        return _settle(ctx, deps)
    run_id = ctx.state.get("epic_run")
    if not run_id:
        return None
    proposal = _item_create(deps, run_id)
    if proposal is not None and (
        proposal["status"] in ("approved", "applied")
        or (proposal["status"] == "proposed" and proposal["mode"] == "auto")
    ):
        return _file_pieces(ctx, deps, proposal, {})
    if proposal is not None and proposal["status"] == "rejected":
        return turned_down(ctx, proposal)
    return PhaseResult("retry", state={"epic_run": None})  # resumed undecided: scope again


def turned_down(ctx: WorkflowContext, proposal: Mapping[str, Any]) -> PhaseResult:
    """A person rejected the pieces (``proposal``, the workflow's ``item_create``): it
    pauses with their reason, and its next scope is told it (``state["scope_feedback"]``,
    part of that run's ticket, so a replay reads it too)."""
    return PhaseResult(
        "pause",
        reason=(
            f"proposal {proposal['id']} (its pieces) was rejected by "
            f"{proposal['decided_by']}: {proposal['reason']}; `phasegate resume {ctx.id}` "
            "scopes the ticket again, told why, or set [graph.work_routing] to build it as one"
        ),
        state={"epic_run": None, "scope_feedback": str(proposal["reason"] or "")},
    )


def _file_pieces(
    ctx: WorkflowContext, deps: PhaseDeps, proposal: Mapping[str, Any], state: WorkflowState
) -> PhaseResult:
    payload = proposal["payload"]
    titles = [str(t) for t in payload.get("subtasks") or ()]
    needs = list(payload.get("depends_on") or [[] for _ in titles])
    numbers: list[int] = []
    pieces = []
    for place, (title, after) in enumerate(zip(titles, needs, strict=True), 1):
        body = _piece_body(ctx, title, place, len(titles), [numbers[n - 1] for n in after])
        number = deps.effects.file_ticket(PLANNING, f"piece{place}", title, body)
        if ctx.issue_number:  # a sub-issue of the parent's, where the forge has them
            deps.effects.link_sub_issue(PLANNING, f"piece{place}", ctx.issue_number, number)
        numbers.append(number)
        pieces.append(Piece(title, body, number, tuple(int(n) for n in after)))
    inherited = state_of({k: v for k, v in ctx.state.items() if k in _INHERITED})
    base = None
    if ctx.state.get("branch_strategy") == "epic":  # the pieces build on one branch
        base = epic_branch(ctx)
        deps.effects.create_branch(PLANNING, base, deps.forge.branch_ref(ctx.base_branch))
        deps.forge.publish_branch(base)  # publishing again is harmless: no journal needed
    ids = deps.store.start_pieces(ctx.id, pieces, inherited, base_branch=base)
    deps.store.apply_proposal(str(proposal["id"]))
    filed = [
        {"id": wid, "issue_number": n, "title": t, "after": list(a)}
        for wid, n, t, a in zip(ids, numbers, titles, needs, strict=True)
    ]
    return PhaseResult(
        "wait",
        status=PIECES,
        state={**state, "epic_run": None, "epic_pieces": ids, "scope_feedback": None},
        milestones=(
            MilestoneWrite(
                "pieces_filed",
                key=str(proposal["id"]),
                summary=f"{len(ids)} pieces filed as tickets: "
                + ", ".join(f"#{n}" for n in numbers),
                data={"proposal": proposal["id"], "pieces": filed},
            ),
        ),
    )


def _piece_body(
    ctx: WorkflowContext, title: str, place: int, count: int, after: Sequence[int]
) -> str:
    """A piece's ticket: what to do, whose part it is, what it waits for, and the
    whole ticket for context."""
    lines = [title, ""]
    if ctx.issue_number:
        lines.append(f"Part of #{ctx.issue_number} ({ctx.title}).")
    lines += [f"Depends on #{n}" for n in after]
    lines += [
        "",
        f"Piece {place} of {count} of the ticket below: do this piece only; the others "
        "are tickets of their own.",
        "",
        "## The whole ticket",
        "",
        ctx.ticket,
    ]
    return "\n".join(lines)


def epic_branch(ctx: WorkflowContext) -> str:
    """The branch an epic's pieces build on under ``branch_strategy = "epic"``."""
    return f"phasegate/epic-{ctx.id}"


def _settle(ctx: WorkflowContext, deps: PhaseDeps) -> PhaseResult:
    """Every piece completed (the commit of the last released this parent): its issue
    closes and it completes, or, its pieces on the epic's branch, it lands that branch
    through its own pull request, report, wait and merge. A piece not completed yet:
    it waits again."""
    pieces = [e for e in deps.store.dependencies(ctx.id) if e["kind"] == "piece"]
    if any(e["status"] != "completed" for e in pieces):
        return PhaseResult("wait", status=PIECES)
    done = MilestoneWrite(
        "pieces_completed",
        summary=f"every piece completed: {', '.join(e['depends_on'] for e in pieces)}",
        data={"pieces": [e["depends_on"] for e in pieces]},
    )
    # The parent's own checkout and branch never held a change (its planning is
    # read-only): gone, as a merged workflow's are. Healing makes them again after a
    # crash before the commit, and this removes them again.
    repo = Path(ctx.repo_path)
    if ctx.worktree_path:
        deps.workspace.remove_worktree(repo, Path(ctx.worktree_path))
    if ctx.branch_name and ctx.branch_name != epic_branch(ctx):
        deps.workspace.delete_branch(repo, ctx.branch_name)
    if ctx.state.get("branch_strategy") == "epic":
        return _land(ctx, deps, pieces, done)
    if ctx.issue_number:
        deps.effects.close_issue(PLANNING, ctx.issue_number)
    return PhaseResult.advance(COMPLETED, updates={"worktree_path": None}, milestones=(done,))


def _land(
    ctx: WorkflowContext,
    deps: PhaseDeps,
    pieces: Sequence[Mapping[str, Any]],
    done: MilestoneWrite,
) -> PhaseResult:
    """The epic's branch, holding every piece, opened as the parent's pull request into
    the base: the parent goes on to its report, wait and merge like any workflow."""
    branch, repo = epic_branch(ctx), Path(ctx.repo_path)
    path = deps.cartridge.landing_areas.worktree_dir(repo) / f"{ctx.id}-epic"
    worktree = deps.workspace.ensure_worktree(repo, branch, path)
    listed = "\n".join(
        f"- #{e['issue_number']} {e['title']}" if e["issue_number"] else f"- {e['title']}"
        for e in pieces
    )
    body = f"The pieces of #{ctx.issue_number}, each reviewed and verified:\n\n{listed}"
    number = deps.effects.open_pull_request(PLANNING, branch, ctx.base_branch, ctx.title, body)
    return PhaseResult.advance(
        REPORT,
        updates={"branch_name": branch, "worktree_path": str(worktree), "pr_number": number},
        milestones=(done,),
    )
