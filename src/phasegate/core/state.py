"""The typed workflow state: each key of ``WorkflowContext.state``, its type, its writers, readers.

Pure module: no I/O. The state is one JSON object stored with the workflow row
(the ``workflows.state`` column). A phase reads it from its context and adds to
it through ``PhaseResult.state``; ``commit_phase_result`` merges the two in the
same transaction, so a key written here is what the next phase reads.

``WorkflowState`` declares each key once, with its type. It is a ``TypedDict``
with ``total=False``: a key is absent until a module writes it, and the type
checker refuses a key not declared here. At run time it is the plain ``dict``
that the store loads and saves, so the stored JSON is unchanged.

``OWNERS`` names, for each key, the modules that write it and those that read
it, relative to ``phasegate`` (``phases.planning`` is the planning phase).
``tests/test_state.py`` scans the source for every key written or read and
fails on one not declared here, or on a module not named as its writer or
reader. A key can have no reader: it is kept for a person (``phasegate show``
prints the whole state) or for a later look at how a workflow ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypedDict, cast

__all__ = ["OWNERS", "Owner", "WorkflowState", "state_of"]


class WorkflowState(TypedDict, total=False):
    """The workflow's state; each key is optional (see ``OWNERS`` for who writes it)."""

    # -- set when the workflow starts (Engine.start, a trigger, a new project) --
    #: The automation profile (``AutomationProfile.as_state``); a profile's name in
    #: workflows started before profiles were kept whole.
    profile: dict[str, Any] | str | None
    #: Whether the graph runs planning, development and pr_review ([graph] enabled).
    graph_mode: bool
    #: The committed cartridge's blob SHA the workflow runs under, None when uncommitted.
    cartridge_sha: str | None
    #: The forge repository (``owner/name``) the workflow's issue lives in.
    forge_repository: str
    #: The repository a new-project workflow makes first (``NewProject.state``).
    new_project: dict[str, Any]
    #: The trigger's ticket snapshot (forge/tickets.py, ``TicketSnapshot.state``).
    acceptance_hash: str
    ticket_source: str
    ticket_authors: list[str]
    triggered_by: str
    ticket_vouched_hash: str
    trigger: str
    #: The labels the forge issue carried when its workflow started.
    issue_labels: list[str]
    #: Who started the workflow from the CLI or the dashboard.
    started_by: str
    #: Forge comment ids already heard: only comments made after them are feedback.
    heard_comments: list[str]
    #: The worker's automatic resumes of forge_unavailable pauses in a row; a commit
    #: of the workflow's own, or a person's decision, sets it back to 0.
    forge_retry_after_s: float
    forge_resumes: int

    # -- preparation --
    #: The base branch's commit the workflow's branch starts from.
    base_sha: str

    # -- planning, and the reversion that starts a new planning cycle --
    plan: str
    plan_feedback: str | None
    replan_context: str | None
    plan_cycle: int
    #: The planning cycle that stopped on a plan repeated without progress.
    no_progress: int
    #: What the last bounded loop that ran out left open, for the next prompt.
    carried_findings: str | None
    cycle_start_dev_round: int
    reversion_count: int
    #: Decision records (``type``, ``source_phase``, ``reason``, ``timestamp``, ...).
    decisions: list[dict[str, Any]]
    #: Why the workflow stopped last; the next plan's prompt reads it after a reversion.
    stopped_on: str | None

    # -- development and pr_review --
    test_retries: int
    last_check_failure: str | None
    review_feedback: str | None
    #: The branch head development published, which CI checks.
    head_sha: str
    #: Whether the next build starts from the base branch (after a merge that could not).
    sync_base: bool
    ci_failure: str | None
    ci_repairs: int
    #: The build that added nothing to a person's feedback: ``round`` and ``feedback``.
    feedback_unchanged: dict[str, Any]

    # -- graph mode (phases/graph_mode) --
    graph_runs: int
    graph_run: str | None
    graph_ticket: str | None
    #: The run's date (ISO 8601), so a run driven again after a crash is the same run.
    graph_date: str
    graph_feedback: str | None
    #: Why a person rejected scope's pieces: the next scope's ticket says it.
    scope_feedback: str | None
    graph_proposal: str
    #: The run whose item_create an epic awaits (approve files its pieces).
    epic_run: str | None
    #: The workflows an epic's pieces run as, in scope's order (docs/epics.md).
    epic_pieces: list[str]
    #: The epic a piece is one piece of.
    epic_parent: str
    #: How an epic's pieces branch: ``ticket`` (each from the base) or ``epic`` (all on
    #: the epic's branch, which it merges at the end; docs/epics.md).
    branch_strategy: str

    # -- report, wait and merge --
    #: The report's payload, the single source of truth for what the report says.
    report: dict[str, Any]
    wait_started_at: str
    #: What holds the merge for a person (``MergeHold.as_state``), None when nothing does.
    merge_hold: dict[str, Any] | None
    #: The branch head the merge gate judged last.
    merge_judged_head: str
    merge_rechecked: str
    merge_approved: bool
    merge_approved_by: str | None
    #: Whether the merge removed the workflow's worktree.
    worktree_removed: bool

    # -- a merge conflict: the parent's keys, then the conflict-resolution child's --
    conflict_child: str
    conflict_settled: str
    kind: str
    fork_round: int
    parent_head: str
    parent_worktree: str | None
    parent_title: str
    parent_ticket: str
    conflicted: list[str]
    #: The commit that resolved the conflict.
    resolution: str

    # -- acceptance_verification --
    verification_status: str
    verified_by: str
    verification_attempt: int
    verification_parse_failures: int
    #: The ticket as the forge issue reads now, when it was edited since the start.
    verified_ticket: str


@dataclass(frozen=True)
class Owner:
    """Who writes a state key and who reads it (modules relative to ``phasegate``)."""

    writes: tuple[str, ...]
    reads: tuple[str, ...] = ()


def _owners(**table: Owner) -> Mapping[str, Owner]:
    return MappingProxyType(table)


_PROFILES = "core.profiles"  # the reversion to planning (spec 003)
_DECISIONS = "core.decisions"  # a person's decisions: resume, approve-merge
_START = "runtime.engine"  # Engine.start

#: For each key of WorkflowState: the modules that write it, then those that read it.
OWNERS: Mapping[str, Owner] = _owners(
    profile=Owner((_START, "phases.conflict"), ("core.profiles", "phases.conflict")),
    graph_mode=Owner((_START, "phases.conflict"), ("phases.graph_mode.run",)),
    cartridge_sha=Owner((_START,), ("summary",)),
    forge_repository=Owner(
        ("store.workflows",),
        ("forge.tickets", "integrations.triggers", "store.dependencies", "store.workflows"),
    ),
    new_project=Owner(
        ("cli.workflows", "tools.new_project"),
        ("phases.preparation", "phases.repo_setup", "tools.new_project"),
    ),
    acceptance_hash=Owner(
        ("integrations.triggers", "phases.acceptance_verification"),
        ("phases.acceptance_verification",),
    ),
    ticket_source=Owner(("integrations.triggers",), ("forge.tickets", "integrations.triggers")),
    ticket_authors=Owner(("integrations.triggers",)),
    triggered_by=Owner(
        ("integrations.triggers",), ("forge.tickets", "integrations.triggers", "web.views")
    ),
    ticket_vouched_hash=Owner(
        ("integrations.triggers",), ("forge.tickets", "integrations.triggers")
    ),
    trigger=Owner(("integrations.triggers",)),
    issue_labels=Owner(("integrations.triggers",), ("web.views",)),
    started_by=Owner(("operations", "cli.demo"), ("web.views",)),
    heard_comments=Owner(
        ("integrations.triggers", "phases.forge_feedback"),
        ("integrations.commands", "phases.forge_feedback"),
    ),
    forge_resumes=Owner(("runtime.outage",), ("runtime.outage",)),
    # The wait a rate-limited forge asked for (seconds) when it paused the workflow.
    forge_retry_after_s=Owner(("runtime.faults",), ("runtime.outage",)),
    base_sha=Owner(("phases.preparation",), ("runtime.healing",)),
    plan=Owner(
        ("phases.planning", "phases.graph_mode.run"),
        (
            "core.profiles",
            "phases.development",
            "phases.graph_mode.review",
            "phases.graph_mode.run",
            "phases.pr_review",
            "phases.report",
            "web.views",
        ),
    ),
    plan_feedback=Owner(
        ("phases.planning", "phases.graph_mode.run", _PROFILES), ("phases.planning",)
    ),
    replan_context=Owner(
        ("phases.planning", "phases.graph_mode.run", _PROFILES),
        ("phases.planning", "phases.graph_mode.run"),
    ),
    plan_cycle=Owner((_PROFILES,), ("core.profiles", "phases.planning")),
    no_progress=Owner(("phases.planning",), ("phases.planning",)),
    carried_findings=Owner(
        ("phases.planning", "phases.development", "phases.pr_review"),
        ("phases.development", "phases.planning"),
    ),
    cycle_start_dev_round=Owner((_PROFILES, "phases.pr_review"), ("phases.pr_review",)),
    reversion_count=Owner((_PROFILES,), ("core.profiles", "summary")),
    decisions=Owner((_PROFILES,), ("core.profiles", "cli.workflows")),
    stopped_on=Owner(
        (
            _PROFILES,
            "phases.feedback_round",
            "phases.graph_mode.epic",
            "phases.graph_mode.run",
            "phases.planning",
            "phases.pr_review",
        ),
        ("core.decisions",),
    ),
    test_retries=Owner(
        (
            _DECISIONS,
            _PROFILES,
            "phases.conflict",
            "phases.deps",
            "phases.development",
            "phases.graph_mode.run",
        ),
        ("phases.attempts", "phases.conflict", "phases.development", "phases.graph_mode.run"),
    ),
    last_check_failure=Owner(
        (
            _PROFILES,
            "phases.conflict",
            "phases.deps",
            "phases.development",
            "phases.graph_mode.run",
        ),
        ("phases.conflict", "phases.development"),
    ),
    review_feedback=Owner(
        (_PROFILES, "phases.deps", "phases.pr_review"), ("phases.development", "phases.pr_review")
    ),
    head_sha=Owner(("phases.deps",), ("changes", "phases.ci")),
    sync_base=Owner(
        (_PROFILES, "phases.deps", "phases.graph_mode.run"),
        ("core.profiles", "phases.development", "phases.graph_mode.run"),
    ),
    ci_failure=Owner(("phases.ci", "phases.deps"), ("phases.development", "phases.graph_mode.run")),
    ci_repairs=Owner(("phases.ci", "phases.graph_mode.review", "phases.pr_review"), ("phases.ci",)),
    feedback_unchanged=Owner(("phases.feedback_round",), ("phases.feedback_round",)),
    graph_runs=Owner(("phases.graph_mode.run",), ("phases.graph_mode.run",)),
    graph_run=Owner(
        ("phases.graph_mode.run",), ("cli.demo", "operations", "phases.graph_mode.run")
    ),
    graph_ticket=Owner(
        ("phases.graph_mode.apply", "phases.graph_mode.run"), ("phases.graph_mode.run",)
    ),
    graph_date=Owner(("phases.graph_mode.run",), ("phases.graph_mode.run",)),
    graph_feedback=Owner(("phases.graph_mode.run",), ("phases.graph_mode.run",)),
    graph_proposal=Owner(("phases.graph_mode.apply",), ("phases.graph_mode.review",)),
    epic_run=Owner(("phases.graph_mode.epic",), ("operations", "phases.graph_mode.epic")),
    scope_feedback=Owner(
        ("phases.graph_mode.epic", "phases.graph_mode.run"), ("phases.graph_mode.run",)
    ),
    epic_pieces=Owner(("phases.graph_mode.epic",), ("phases.graph_mode.epic",)),
    epic_parent=Owner(("store.dependencies",), ("phases.graph_mode.epic", "summary")),
    branch_strategy=Owner(
        ("cli.workflows", "phases.preparation"),
        ("phases.graph_mode.epic", "phases.preparation", "summary"),
    ),
    report=Owner(("phases.report",), ("cli.demo", "phases.merge", "summary")),
    wait_started_at=Owner(("phases.report",)),
    merge_hold=Owner(
        ("phases.merge", "phases.merge_gate"), ("phases.merge_gate", "store.commit", "summary")
    ),
    merge_judged_head=Owner(("phases.merge", "phases.merge_gate"), ("phases.merge",)),
    # The head a merge refusal had its required checks read again for (a new rule).
    merge_rechecked=Owner(("phases.merge",), ("phases.merge",)),
    merge_approved=Owner(
        (_DECISIONS, _PROFILES, "phases.forge_feedback", "phases.merge", "phases.wait"),
        ("cli.render", "core.decisions", "phases.merge", "phases.wait", "store.commit", "summary"),
    ),
    merge_approved_by=Owner(
        (_DECISIONS, _PROFILES, "phases.forge_feedback"),
        ("core.decisions", "phases.wait", "summary"),
    ),
    worktree_removed=Owner(("phases.merge",), ("runtime.healing",)),
    conflict_child=Owner(
        ("phases.conflict",),
        ("integrations.notify", "phases.conflict", "runtime.engine", "store.commit"),
    ),
    conflict_settled=Owner(("phases.conflict",), ("phases.conflict",)),
    kind=Owner(("phases.conflict",), ("phases.conflict",)),
    fork_round=Owner(("phases.conflict",), ("phases.conflict",)),
    parent_head=Owner(("phases.conflict",), ("phases.conflict",)),
    parent_worktree=Owner(("phases.conflict",), ("phases.conflict",)),
    parent_title=Owner(("phases.conflict",), ("phases.conflict",)),
    parent_ticket=Owner(("phases.conflict",), ("phases.conflict",)),
    conflicted=Owner(("phases.conflict",)),
    resolution=Owner(("phases.conflict",)),
    verification_status=Owner(("phases.acceptance_verification",), ("cli.render", "summary")),
    verified_by=Owner(("phases.acceptance_verification",), ("summary",)),
    verification_attempt=Owner(
        ("phases.acceptance_verification", _DECISIONS), ("phases.acceptance_verification",)
    ),
    verification_parse_failures=Owner(
        ("phases.acceptance_verification", _DECISIONS), ("phases.acceptance_verification",)
    ),
    verified_ticket=Owner(("phases.acceptance_verification",), ("phases.acceptance_verification",)),
)


def state_of(stored: Mapping[str, Any] | None) -> WorkflowState:
    """The state as the store keeps it (the decoded JSON object), typed.

    The object is copied, never checked key by key: the keys a workflow has
    are those its modules wrote, which the type checker held to WorkflowState.
    """
    # A JSON object read back is a dict of whatever was written: the one place
    # the stored state is taken as the declared shape.
    return cast(WorkflowState, dict(stored or {}))
