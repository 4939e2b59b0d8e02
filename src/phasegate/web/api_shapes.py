"""The JSON API's request and answer shapes (pydantic), as its OpenAPI description lists them.

An answer's shape is the CLI's: a workflow is ``phasegate status --json``'s
item (``phasegate.summary.workflow_summary``), its detail ``phasegate show
--json``'s (``workflow_detail``), an event ``phasegate events --json``'s line.
Every answer model allows fields it does not name, so a field the summary
gains reaches API clients without a change here; the fields named are the
ones a client may count on.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

__all__ = [
    "Board",
    "BoardGroup",
    "BudgetShown",
    "Card",
    "CleanupOutcome",
    "CommentBody",
    "CostRow",
    "Costs",
    "CostsReport",
    "Diff",
    "DiffFile",
    "DiffLine",
    "Draft",
    "Error",
    "ErrorAnswer",
    "Event",
    "FeedbackBody",
    "GateOutcome",
    "Proposal",
    "RejectBody",
    "RevertBody",
    "ReviewBody",
    "StartBody",
    "VerifyBody",
    "WorkflowDetail",
    "WorkflowMoved",
    "WorkflowSummary",
]


class _Open(BaseModel):
    """An answer: the fields named, and any other the summary carries."""

    model_config = ConfigDict(extra="allow")


class _Closed(BaseModel):
    """A request body: a field it does not name is refused (400), not ignored."""

    model_config = ConfigDict(extra="forbid")


# -- errors ------------------------------------------------------------------------


class Error(BaseModel):
    """What went wrong: ``code`` the HTTP status, ``kind`` the refusal's name (the
    same names ``--json`` errors of the CLI carry), ``message`` in words."""

    code: int
    kind: str
    message: str


class ErrorAnswer(BaseModel):
    """Every refusal under ``/api``: ``{"error": {"code", "kind", "message"}}``."""

    error: Error


# -- workflows ---------------------------------------------------------------------


class WorkflowSummary(_Open):
    """A workflow as ``phasegate status --json`` lists it (times in ISO 8601,
    ``cost_usd`` in USD, ``tokens`` counted over every agent run)."""

    id: str
    title: str
    current_phase: str
    status: str
    error: str | None = None
    awaiting_proposal: str | None = None
    dev_round: int = 0
    profile: str | None = None
    reversion_count: int = 0
    issue_number: int | None = None
    pr_number: int | None = None
    pr_ref: str | None = None
    branch_name: str | None = None
    repository: str | None = None
    merge_sha: str | None = None
    merge_approved_by: str | None = None
    verification_status: str | None = None
    verified_by: str | None = None
    tokens: int = 0
    cost_usd: float = 0.0
    agent_runs: int = 0
    created_at: str | None = None
    updated_at: str | None = None
    completed_at: str | None = None
    resumes_at: str | None = None
    parent_workflow_id: str | None = None
    children: list[dict[str, Any]] = Field(default_factory=list)
    waits_for: list[dict[str, Any]] = Field(
        default_factory=list, description="the workflows (or forge issues) it runs after"
    )
    pieces: list[dict[str, Any]] = Field(
        default_factory=list, description="an epic's pieces, in order, with their statuses"
    )
    epic_parent: str | None = Field(None, description="the epic this workflow is a piece of")
    branch_strategy: str | None = Field(
        None, description="how an epic's pieces branch: ticket or epic (set in preparation)"
    )
    worker: str | None = Field(None, description="host:pid:token of the worker holding it")
    lease_expires_at: str | None = None


class Card(WorkflowSummary):
    """A board's card: the summary and ``elapsed_s``, seconds from its creation
    to its end (completed or cancelled), else to now."""

    elapsed_s: float = 0.0


class BoardGroup(_Open):
    """One column of the board: ``key`` needs_you, running, waiting, done or failed."""

    key: str
    title: str
    cards: list[Card]


class Board(_Open):
    """The board: its groups in the order the page shows them, what needs a person first."""

    groups: list[BoardGroup]


class WorkflowDetail(_Open):
    """A workflow as ``phasegate show --json`` prints it, and ``actions``: the
    actions that apply to it now (``phasegate.operations.offered``; none while a
    worker holds it)."""

    workflow: WorkflowSummary
    timeline: list[dict[str, Any]]
    milestones: list[dict[str, Any]]
    agent_runs: list[dict[str, Any]]
    report: dict[str, Any] | None = None
    violations: list[dict[str, Any]] = Field(default_factory=list)
    decisions: list[dict[str, Any]] = Field(default_factory=list)
    cleanup: dict[str, Any] | None = None
    merge_hold: dict[str, Any] | None = None
    forge_faults: list[dict[str, Any]] = Field(default_factory=list)
    actions: list[str]


class WorkflowMoved(_Open):
    """A workflow after a person's action: its summary and the actions that apply now."""

    workflow: WorkflowSummary
    actions: list[str]


class Event(_Open):
    """An event row as ``phasegate events --json`` prints it."""

    id: int
    workflow_id: str | None = None
    type: str
    data: dict[str, Any]
    created_at: str | None = None


class DiffLine(_Open):
    """One line of a diff: ``kind`` add, del, ctx or hunk; ``old``/``new`` its
    numbers in the base and in the branch."""

    kind: str
    text: str
    old: int | None = None
    new: int | None = None


class DiffFile(_Open):
    """One file's change: ``status`` modified, added, deleted or renamed (from
    ``old_path``); ``added``/``removed`` its lines; no lines for a binary file."""

    path: str
    old_path: str | None = None
    status: str
    binary: bool = False
    added: int
    removed: int
    lines: list[DiffLine]


class Diff(_Open):
    """The workflow's change, per file: ``source`` says where it was read (its
    branch, its merge commit, the forge); ``missing`` why there is none (no
    branch yet, nothing left to read it from); ``added``/``removed`` the totals."""

    workflow: str
    source: str | None = None
    missing: str | None = None
    added: int
    removed: int
    files: list[DiffFile]


class Draft(_Open):
    """A draft review comment not sent yet: ``line`` 1-based, in the workflow's branch."""

    id: int
    path: str
    line: int
    text: str
    by: str


class CleanupOutcome(_Open):
    """``cleanup`` completed, failed, none (not merged yet) or busy (another process holds it)."""

    id: str
    cleanup: str
    retried: bool
    reason: str | None = None


class Retirement(_Open):
    """A failed or cancelled workflow's worktree and local branch, and whether they were
    removed: ``retired`` completed, failed, busy or skipped (``reason`` says why)."""

    id: str
    status: str
    retired: str
    reason: str | None = None
    worktree: str | None = None
    branch: str | None = None
    head: str | None = None
    commits: int = 0
    unpushed: bool = False


class RetireBody(_Closed):
    """The failed or cancelled workflows whose worktree and local branch go now."""

    ids: list[str]


# -- proposals ---------------------------------------------------------------------


class Proposal(_Open):
    """A proposal as ``phasegate proposals --json`` lists it."""

    id: str
    kind: str
    title: str
    status: str
    mode: str | None = None
    run_id: str | None = None
    workflow_id: str | None = None
    decided_by: str | None = None
    decided_at: str | None = None
    reason: str | None = None


class GateOutcome(_Open):
    """A person's decision on a proposal: the proposal as decided, whether it had
    been decided so before (``recorded_before``), the workflow resumed for it,
    its kind's clean approvals in a row (``streak``) and how many graduate it
    (``graduation_streak``)."""

    proposal: Proposal
    recorded_before: bool
    workflow_id: str | None = None
    streak: int
    graduation_streak: int


# -- request bodies ----------------------------------------------------------------


class StartBody(_Closed):
    """A ticket to file: a worker takes the new workflow."""

    ticket: str
    title: str | None = None
    auto_merge: bool | None = None
    profile: str | None = None
    priority: StrictInt | StrictStr | None = None
    """``high``, ``normal``, ``low`` or an integer from -100 to 100; default normal."""


class FeedbackBody(_Closed):
    text: str


class CommentBody(_Closed):
    """A draft comment on ``line`` (1-based, a line the workflow's diff shows) of ``path``."""

    path: str
    line: int
    text: str


class ReviewBody(_Closed):
    text: str = ""


class RevertBody(_Closed):
    reason: str
    to_phase: str = "planning"


class VerifyBody(_Closed):
    verdict: Literal["confirmed", "rejected"]
    reason: str = ""


class RejectBody(_Closed):
    reason: str


class PriorityBody(_Closed):
    """``high``, ``normal``, ``low``, or an integer from -100 to 100 (larger first); read
    as ``phasegate priority`` reads it, with its refusal's words."""

    priority: StrictInt | StrictStr


# -- costs and budgets -------------------------------------------------------------------


class CostRow(_Open):
    """Agents' spend in one group: ``key`` (a repository, model, role, UTC day
    ``YYYY-MM-DD`` or workflow id), ``cost_usd`` in USD, tokens, calls."""

    key: str
    cost_usd: float
    input_tokens: int
    output_tokens: int
    calls: int


class CostsReport(_Open):
    """``phasegate costs --json``: ``by``, ``since`` (ISO 8601, or null: all time),
    the groups costliest first (days in order) and their total."""

    by: str
    since: str | None = None
    rows: list[CostRow]
    total: dict[str, float | int]


class BudgetShown(_Open):
    """A budget and what is spent against it this UTC ``period`` (USD): ``scope`` a
    repository or ``*`` (the whole store), ``kind`` daily or monthly, ``source``
    store or cartridge."""

    scope: str
    kind: Literal["daily", "monthly"]
    limit_usd: float
    spent_usd: float
    left_usd: float
    reached: bool
    source: Literal["store", "cartridge"]
    period: str


class Costs(_Open):
    """What the costs page shows: the grouped spend, the repository the dashboard
    serves (as budgets name it) and every budget."""

    costs: CostsReport
    repository: str
    budgets: list[BudgetShown]
