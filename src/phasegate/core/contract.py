"""The phase contract: phases, statuses, the transition table and the value types.

Pure module: no I/O. The rules these names keep are in
docs/contracts/lifecycle.md.

- ``PHASE_ORDER`` and ``PHASE_STATUS_MAP`` are the canonical transition table.
- ``wait`` and ``completed`` are pseudo-phases: not in ``PHASE_ORDER``, but a
  phase result may name them as its ``next_phase``.
- A phase handler is ``(ctx: WorkflowContext, deps: PhaseDeps) -> PhaseResult``;
  ``phasegate.store.commit_phase_result`` is the only code that changes
  ``current_phase`` or ``status``.

Exceptions::

    PhasegateError
     ├── ContractViolation      a PhaseResult that the table does not allow
     ├── StaleContext           the workflow moved on since the context was read
     ├── WorkflowNotFound       an unknown workflow id
     ├── WorkflowPaused         shutdown asked mid-phase; nothing is committed
     ├── RunNotFound            an unknown development-graph run id
     ├── ProposalNotFound       an unknown proposal id
     └── ProposalDecided        a proposal that was already approved or rejected
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from .state import WorkflowState

__all__ = [
    "ACCEPTANCE_VERIFICATION",
    "COMPLETED",
    "DEVELOPMENT",
    "MERGE",
    "OUTCOMES",
    "PHASE_ORDER",
    "PHASE_STATUS_MAP",
    "PLANNING",
    "PREPARATION",
    "PR_REVIEW",
    "PSEUDO_PHASES",
    "REPORT",
    "RUNNABLE_STATUSES",
    "CANCELLED",
    "ENDED_STATUSES",
    "AWAITING_APPROVAL",
    "BLOCKED",
    "PIECES",
    "TERMINAL_STATUSES",
    "WAITING_ON_OTHERS",
    "NEEDS_YOU_STATUSES",
    "WAIT",
    "VIOLATIONS",
    "ContractViolation",
    "EventWrite",
    "MilestoneStatus",
    "MilestoneView",
    "MilestoneWrite",
    "Outcome",
    "PhaseResult",
    "PhasegateError",
    "ProposalDecided",
    "ProposalNotFound",
    "RunNotFound",
    "StaleContext",
    "Violation",
    "WorkflowContext",
    "WorkflowNotFound",
    "WorkflowPaused",
    "is_legal_next_phase",
    "next_phase",
]

PREPARATION = "preparation"
PLANNING = "planning"
DEVELOPMENT = "development"
PR_REVIEW = "pr_review"
REPORT = "report"
WAIT = "wait"
MERGE = "merge"
ACCEPTANCE_VERIFICATION = "acceptance_verification"
COMPLETED = "completed"

#: The canonical order (docs/contracts/lifecycle.md: phase order). ``wait`` sits between
#: report and merge in the lifecycle but is a pseudo-phase, not a table row.
PHASE_ORDER: tuple[str, ...] = (
    PREPARATION,
    PLANNING,
    DEVELOPMENT,
    PR_REVIEW,
    REPORT,
    MERGE,
    ACCEPTANCE_VERIFICATION,
)

#: Pseudo-phases the commit path admits as a ``next_phase`` besides PHASE_ORDER.
PSEUDO_PHASES: tuple[str, ...] = (WAIT, COMPLETED)

#: The status a workflow has while it is in each phase (docs/contracts/lifecycle.md: statuses).
PHASE_STATUS_MAP: Mapping[str, str] = MappingProxyType(
    {
        PREPARATION: "preparing",
        PLANNING: "planning",
        DEVELOPMENT: "developing",
        PR_REVIEW: "pr_review",
        REPORT: "reporting",
        WAIT: "waiting",
        MERGE: "merging",
        ACCEPTANCE_VERIFICATION: "verification_pending",
        COMPLETED: "completed",
    }
)

#: Statuses in which ``advance()`` runs the current phase's handler.
RUNNABLE_STATUSES: frozenset[str] = frozenset(
    status for phase, status in PHASE_STATUS_MAP.items() if phase != COMPLETED
)

#: A workflow paused for a person's decision on a proposal (graph mode; docs/contracts/autonomy.md:
#: the human gate):
#: ``phasegate approve`` or ``reject`` moves it on.
AWAITING_APPROVAL = "awaiting_approval"

#: A workflow a person ended for good (``phasegate cancel``): nothing moves it on.
CANCELLED = "cancelled"

#: A workflow that waits for the workflows it depends on (``phasegate run --after``,
#: ``Depends on #N``) to merge and verify: no worker claims it until then.
BLOCKED = "blocked"

#: An epic's parent that filed its pieces as tickets: it waits for every piece to
#: merge and verify, and completes then.
PIECES = "pieces"

#: Statuses in which a workflow waits for other workflows (docs/epics.md): not
#: runnable; the commit that completes the last of them makes it runnable again.
WAITING_ON_OTHERS: frozenset[str] = frozenset({BLOCKED, PIECES})

#: Statuses a workflow ends in: a conflict-resolution child's end wakes its parent.
ENDED_STATUSES: frozenset[str] = frozenset({"completed", "failed", CANCELLED})

#: Statuses that only a person (resume, feedback, override, approve) moves on from.
TERMINAL_STATUSES: frozenset[str] = frozenset(
    {"completed", "failed", "paused", "planning_timeout", AWAITING_APPROVAL}
)

#: Statuses in which a workflow waits for a person (the board's "needs you",
#: a notification): its report waits for approve-merge or feedback (waiting), a
#: proposal for approve or reject, a pause (a rejected verification among them) or a
#: planning timeout for resume.
NEEDS_YOU_STATUSES: frozenset[str] = frozenset(
    {"waiting", AWAITING_APPROVAL, "paused", "planning_timeout"}
)

Outcome = Literal["completed", "failed", "pause", "retry", "wait"]
OUTCOMES: tuple[str, ...] = ("completed", "failed", "pause", "retry", "wait")


class PhasegateError(Exception):
    """Base of every error phasegate raises on purpose."""


class ContractViolation(PhasegateError):
    """A PhaseResult the transition table does not allow; nothing was written."""


class StaleContext(PhasegateError):
    """The workflow row changed since the context was loaded; nothing was written."""


class WorkflowNotFound(PhasegateError):
    """No workflow has the given id."""

    def __init__(self, workflow_id: str) -> None:
        super().__init__(f"no workflow with id {workflow_id!r} (see `phasegate status`)")
        self.workflow_id = workflow_id


class WorkflowPaused(PhasegateError):
    """Shutdown was asked while a phase ran (docs/contracts/lifecycle.md: shutdown).

    The engine commits nothing for the interrupted phase; the workflow keeps its
    phase and status and resumes from its milestones.
    """


class RunNotFound(PhasegateError):
    """No recorded development-graph run has the given id."""

    def __init__(self, run_id: str) -> None:
        super().__init__(
            f"no recorded run with id {run_id!r} (`phasegate proposals --json` gives each "
            "proposal's run_id; a workflow's run an agent's failure stopped is recorded when "
            "`phasegate resume` finishes it)"
        )
        self.run_id = run_id


class ProposalNotFound(PhasegateError):
    """No proposal has the given id."""

    def __init__(self, proposal_id: str) -> None:
        super().__init__(f"no proposal with id {proposal_id!r} (see `phasegate proposals`)")
        self.proposal_id = proposal_id


class ProposalDecided(PhasegateError):
    """A proposal was already approved or rejected; a decision is never overwritten."""


def next_phase(phase: str) -> str:
    """The phase after ``phase`` in PHASE_ORDER (docs/contracts/lifecycle.md: phase order).

    ``acceptance_verification`` is terminal and maps to itself; an unknown
    phase maps to ``planning``, the recovery default.
    """
    if phase == ACCEPTANCE_VERIFICATION:
        return ACCEPTANCE_VERIFICATION
    if phase not in PHASE_ORDER:
        return PLANNING
    return PHASE_ORDER[PHASE_ORDER.index(phase) + 1]


def is_legal_next_phase(phase: str) -> bool:
    """Whether the commit path admits ``phase`` as a ``next_phase``."""
    return phase in PHASE_ORDER or phase in PSEUDO_PHASES


#: A milestone's status: what ``MilestoneWrite.status`` admits.
MilestoneStatus = Literal["in_progress", "completed", "failed", "cancelled"]


@dataclass(frozen=True)
class MilestoneView:
    """A milestone as a phase sees it in its context (read-only)."""

    id: int
    kind: str
    phase: str
    round: int
    attempt: int
    status: str
    dedupe_key: str
    summary: str
    data: Mapping[str, Any]


@dataclass(frozen=True)
class MilestoneWrite:
    """A milestone a PhaseResult carries; upserted on its dedupe key.

    The dedupe key is ``{workflow}:{phase}:{kind}:r{round}:a{attempt}`` plus
    ``key`` when given, so a re-run of the same round and attempt settles the
    same row in place instead of adding one.
    """

    kind: str
    status: MilestoneStatus = "completed"
    round: int = 0
    attempt: int = 0
    summary: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)
    key: str = ""
    phase: str | None = None


@dataclass(frozen=True)
class EventWrite:
    """An event a PhaseResult carries (``phase_change``, ``milestone_updated``, ...)."""

    type: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PhaseResult:
    """What a phase decided. Committed only by ``commit_phase_result``.

    - ``outcome``: one of OUTCOMES. Only ``completed`` changes ``current_phase``.
    - ``next_phase``: with ``completed``, the phase to move to (default:
      ``next_phase(current)``); must be in PHASE_ORDER or PSEUDO_PHASES. Given
      with any other outcome it is a ContractViolation.
    - ``status``: overrides the status the outcome implies (e.g.
      ``planning_timeout`` with ``pause``).
    - ``updates``: workflow columns to set (``current_round``, ``branch_name``,
      ...) and ``state`` keys to merge, in the same transaction.
    - ``reason``: shown to a person for failed and pause; cleared otherwise.
    """

    outcome: Outcome
    next_phase: str | None = None
    status: str | None = None
    reason: str | None = None
    updates: Mapping[str, Any] = field(default_factory=dict)
    state: WorkflowState = field(default_factory=WorkflowState)
    milestones: tuple[MilestoneWrite, ...] = ()
    events: tuple[EventWrite, ...] = ()

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ContractViolation(f"unknown outcome {self.outcome!r}; expected one of {OUTCOMES}")

    @classmethod
    def advance(
        cls,
        to: str,
        *,
        updates: Mapping[str, Any] | None = None,
        state: WorkflowState | None = None,
        milestones: tuple[MilestoneWrite, ...] = (),
        events: tuple[EventWrite, ...] = (),
    ) -> PhaseResult:
        """A ``completed`` result moving to ``to``, carrying its phase_change event."""
        return cls(
            outcome="completed",
            next_phase=to,
            updates=updates or {},
            state=state or WorkflowState(),
            milestones=milestones,
            events=(*events, EventWrite("phase_change", {"phase": to})),
        )


@dataclass(frozen=True)
class WorkflowContext:
    """The read-only snapshot a phase receives (docs/contracts/lifecycle.md: phase handlers).

    ``state`` holds the phase-owned counters and payloads persisted with the
    workflow (retry counters, the report payload, the finalized plan, ...);
    core/state.py declares each key, its type and who writes it.
    ``version`` fences the commit: a result computed from an older snapshot
    is refused with StaleContext.
    """

    id: str
    title: str
    ticket: str
    repo_path: str
    base_branch: str
    current_phase: str
    status: str
    version: int
    current_round: int = 0
    dev_round: int = 1
    branch_name: str | None = None
    worktree_path: str | None = None
    issue_number: int | None = None
    pr_number: int | None = None
    merge_sha: str | None = None
    auto_merge: bool = False
    user_feedback: str | None = None
    content_language: str = "en"
    error: str | None = None
    #: The workflow this one was forked from (a conflict-resolution child), else None.
    parent_workflow_id: str | None = None
    state: WorkflowState = field(default_factory=WorkflowState)
    milestones: tuple[MilestoneView, ...] = ()

    def milestone(
        self, kind: str, *, phase: str | None = None, round: int | None = None
    ) -> MilestoneView | None:
        """The newest milestone of ``kind`` (optionally in ``phase``/``round``), or None."""
        for m in reversed(self.milestones):
            if m.kind != kind:
                continue
            if phase is not None and m.phase != phase:
                continue
            if round is not None and m.round != round:
                continue
            return m
        return None

    def milestones_of(self, kind: str) -> tuple[MilestoneView, ...]:
        """Every milestone of ``kind``, oldest first."""
        return tuple(m for m in self.milestones if m.kind == kind)


#: Named ways an agent run overstepped its role, recorded as
#: ``violation`` events and printed by ``show``:
#: - ``read_only_violation``: a read-only role changed its checkout;
#: - ``ref_violation``: a branch, HEAD or another ref was moved (restored);
#: - ``git_dir_violation``: the git config, hooks or ``info/`` changed (restored);
#: - ``sandbox_denied``: the sandbox refused a write outside the agent's own areas;
#: - ``secret_in_change``: the change or answer held a secret (refused);
#: - ``oversized``: a diff or answer above its cartridge limit (refused);
#: - ``outward_symlink``: the change adds a symbolic link out of the repository
#:   (found by the merge gate, ``phases.merge_gate``).
#:
#: Any of them in a development round holds that round's merge for a person.
VIOLATIONS = (
    "read_only_violation",
    "ref_violation",
    "git_dir_violation",
    "sandbox_denied",
    "secret_in_change",
    "oversized",
    "outward_symlink",
)


@dataclass(frozen=True)
class Violation:
    """One overstep of an agent run: ``name`` (one of VIOLATIONS), what happened
    (``detail``, one line) and the paths or refs it concerned."""

    name: str
    detail: str
    paths: tuple[str, ...] = ()
