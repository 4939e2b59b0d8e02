"""Automation profiles and phase reversion (docs/contracts/autonomy.md).

Pure module: a profile, a workflow's state and a timestamp in; a decision or a
PhaseResult out. No store, no clock, no git: phases pass ``deps.clock.now()``.

Other tools' phase names map onto ours: Strategize = planning, Execute =
development (and pr_review), Apply = merge. So the two reversion paths are

- development → planning: the checks keep failing (``limits.max_dev_retries``
  is exhausted), or the build agent reports the plan's constraints too
  restrictive (a ``REPLAN:`` line);
- merge → planning: the merge cannot proceed within the plan (the branch
  conflicts with the base).

**The threshold rule.** Each profile has two thresholds in [0, 1]:
``auto_strategy_revision`` (development → planning) and
``auto_reversion_from_apply`` (merge → planning). A threshold below 1.0
allows the automatic reversion; 1.0 never does (a person decides, with
``phasegate revert``). ``allows_automatic`` is that rule and nothing else.

**The loop guard.** A workflow is reverted at most ``MAX_REVERSIONS`` (3)
times, automatically or by a person; the fourth is refused
(``reversion_refusal``), which stops an endless plan-build-revert cycle.
A cycle that plans again what the last cycle built (``repeated_plan``) stops
before it builds, as ``no_progress``.

**A reversion** (``reversion_result``) is one PhaseResult for the single
commit path: the phase goes to planning with status ``planning``, the error
is cleared, ``reversion_count`` is incremented, a decision record is
appended to ``state["decisions"]`` and written as a ``reversion`` milestone,
and the failure becomes ``state["replan_context"]`` for the next plan. The
worktree, branch, milestones, sessions and agent runs are kept.

The profile also gives the defaults of ``auto_merge`` and of the autonomy
policy (``autonomy.AutonomyPolicy.from_cartridge``). Precedence for
auto_merge: an explicit ``--auto-merge/--no-auto-merge``, then a profile
named on the command line, then an explicit ``workflow.auto_merge``, then the
cartridge's profile; for the policy, an explicit ``[autonomy]`` key wins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from phasegate.core.contract import (
    DEVELOPMENT,
    MERGE,
    PLANNING,
    PR_REVIEW,
    REPORT,
    WAIT,
    EventWrite,
    MilestoneWrite,
    PhaseResult,
    WorkflowContext,
)
from phasegate.core.state import WorkflowState

if TYPE_CHECKING:
    from datetime import datetime

__all__ = [
    "BUILTIN_PROFILES",
    "DEFAULT_PROFILE",
    "MAX_REVERSIONS",
    "PROFILE_NAMES",
    "REVERTIBLE_PHASES",
    "AutomationProfile",
    "ReversionDecision",
    "allows_automatic",
    "decide_reversion",
    "decisions_of",
    "repeated_plan",
    "reversion_count",
    "reversion_or_stop",
    "reversion_refusal",
    "reversion_result",
]

#: The loop guard: reversions allowed per workflow (docs/contracts/autonomy.md: the loop guard).
MAX_REVERSIONS = 3

#: Phases a person may revert from: after planning, before the merge is done.
#: Automatic reversions leave development (Execute) and merge (Apply) only.
REVERTIBLE_PHASES: tuple[str, ...] = (DEVELOPMENT, PR_REVIEW, REPORT, WAIT, MERGE)

#: The profile of a workflow whose cartridge names none.
DEFAULT_PROFILE = "review"


def allows_automatic(threshold: float) -> bool:
    """The threshold rule (docs/contracts/autonomy.md: thresholds): below 1.0 the reversion
    is automatic; 1.0 never is."""
    return threshold < 1.0


@dataclass(frozen=True)
class AutomationProfile:
    """How far a workflow goes without a person.

    - ``auto_reversion_from_apply``: merge → planning when the merge is
      constrained; in [0, 1], below 1.0 automatic.
    - ``auto_strategy_revision``: development → planning; in [0, 1], below
      1.0 automatic.
    - ``auto_merge``: the default of ``workflow.auto_merge`` (merge without
      ``phasegate approve-merge``).
    - ``autonomy``: the default policy of every proposal kind, ``propose`` (a
      person gates it) or ``auto`` (the apply arm takes it).
    - ``graduation``: whether a ``propose`` kind may graduate to ``auto``
      after a streak of clean approvals (``manual``: never).

    Raises ValueError for a threshold outside [0, 1] or an unknown autonomy.
    """

    name: str
    auto_reversion_from_apply: float
    auto_strategy_revision: float
    auto_merge: bool = False
    autonomy: Literal["propose", "auto"] = "propose"
    graduation: bool = True

    def __post_init__(self) -> None:
        for key in ("auto_reversion_from_apply", "auto_strategy_revision"):
            value = getattr(self, key)
            if isinstance(value, bool) or not 0.0 <= value <= 1.0:
                raise ValueError(f"profile {self.name!r}: {key} must be in [0, 1], not {value!r}")
        if self.autonomy not in ("propose", "auto"):
            raise ValueError(
                f"profile {self.name!r}: autonomy is propose or auto, not {self.autonomy!r}"
            )

    def threshold(self, source_phase: str) -> float:
        """The threshold gating an automatic reversion from ``source_phase``.

        development and pr_review (Execute): ``auto_strategy_revision``; merge
        (Apply): ``auto_reversion_from_apply``. Raises ValueError for another phase.
        """
        if source_phase in (DEVELOPMENT, PR_REVIEW):
            return self.auto_strategy_revision
        if source_phase == MERGE:
            return self.auto_reversion_from_apply
        raise ValueError(f"no automatic reversion path from {source_phase!r}")

    def reverts_automatically(self, source_phase: str) -> bool:
        """Whether a reversion from ``source_phase`` is taken without a person."""
        return allows_automatic(self.threshold(source_phase))

    def threshold_key(self, source_phase: str) -> str:
        return "auto_reversion_from_apply" if source_phase == MERGE else "auto_strategy_revision"

    def as_state(self) -> dict[str, Any]:
        """The profile as the workflow's state keeps it (``state["profile"]``)."""
        return asdict(self)

    @classmethod
    def from_state(cls, state: WorkflowState) -> AutomationProfile:
        """The profile a workflow was started with; DEFAULT_PROFILE for one without."""
        kept = state.get("profile")
        if isinstance(kept, Mapping):
            return cls(**{k: kept[k] for k in cls.__dataclass_fields__ if k in kept})
        if isinstance(kept, str) and kept in BUILTIN_PROFILES:
            return BUILTIN_PROFILES[kept]
        return BUILTIN_PROFILES[DEFAULT_PROFILE]


def _builtin(
    name: str, apply: float, strategy: float, auto: bool, graduation: bool = True
) -> AutomationProfile:
    return AutomationProfile(
        name=name,
        auto_reversion_from_apply=apply,
        auto_strategy_revision=strategy,
        auto_merge=auto,
        autonomy="auto" if auto else "propose",
        graduation=graduation,
    )


#: The built-in profiles (docs/contracts/autonomy.md: automation profiles), from most to
#: least supervised.
BUILTIN_PROFILES: Mapping[str, AutomationProfile] = {
    p.name: p
    for p in (
        _builtin("manual", 1.0, 1.0, auto=False, graduation=False),
        _builtin("review", 1.0, 1.0, auto=False),
        _builtin("trusted", 1.0, 1.0, auto=False),
        _builtin("auto", 1.0, 0.0, auto=True),
        _builtin("ci", 0.0, 0.0, auto=True),
        _builtin("full-auto", 0.0, 0.0, auto=True),
    )
}
PROFILE_NAMES: tuple[str, ...] = tuple(BUILTIN_PROFILES)


# -- the loop guard and the records -----------------------------------------------------


def reversion_count(state: WorkflowState) -> int:
    """How many times the workflow has been reverted."""
    return int(state.get("reversion_count") or 0)


def decisions_of(state: WorkflowState) -> list[dict[str, Any]]:
    """The workflow's decision records (``state["decisions"]``), oldest first."""
    return [dict(d) for d in state.get("decisions") or ()]


def reversion_refusal(workflow_id: str, state: WorkflowState) -> str | None:
    """Why the loop guard refuses another reversion, or None when one is allowed."""
    count = reversion_count(state)
    if count < MAX_REVERSIONS:
        return None
    return (
        f"reversion refused: workflow {workflow_id} has been reverted {count} times, the "
        f"limit (MAX_REVERSIONS = {MAX_REVERSIONS}); re-planning has not resolved it, a "
        "person must (`phasegate feedback`, `phasegate resume`)"
    )


def repeated_plan(state: WorkflowState, plan: str) -> float | None:
    """How alike ``plan`` is to the plan the previous planning cycle built, when
    that is ``NO_PROGRESS_SIMILARITY`` or more; else None.

    The fix loop's ``no_progress`` measure of successive patches, applied to plans
    (docs/contracts/graph.md: the loop's stops):
    a cycle after a reversion that plans the same again would only build the
    same again. Only a cycle after a reversion has a previous plan. A cycle
    reverted from the merge (``sync_base``) is never a repeat: its build starts
    from the base as it is now, so the same plan is a new build.
    """
    # Here, not at the top: the profiles load for `status`, which needs no graph.
    from phasegate.graph.facts import NO_PROGRESS_SIMILARITY, similarity

    previous = state.get("plan")
    if not state.get("plan_cycle") or not previous or state.get("sync_base"):
        return None
    ratio = similarity(str(previous), plan)
    return ratio if ratio >= NO_PROGRESS_SIMILARITY else None


def reversion_result(
    ctx: WorkflowContext,
    *,
    reason: str,
    context: str,
    at: datetime,
    automatic: bool,
    milestones: Sequence[MilestoneWrite] = (),
    state: WorkflowState | None = None,
) -> PhaseResult:
    """Revert ``ctx`` from its phase to planning (docs/contracts/autonomy.md: state reset).

    ``reason`` goes into the decision record (and the timeline); ``context``
    (the failure in full) into the next plan's prompt; ``at`` is the record's
    timestamp (ISO 8601). ``milestones`` and ``state`` are the source phase's
    own evidence, committed in the same transaction. The guard is the
    caller's to check first (``reversion_refusal``).

    The new planning cycle gets ``plan_cycle`` (its milestones' dedupe keys
    carry it, so the old cycle's rows stay), ``current_round`` 0 and a fresh
    development round (``dev_round`` + 1, ``test_retries`` 0, no carried
    check failure, review or merge approval).
    """
    number = reversion_count(ctx.state) + 1
    record = {
        "type": "reversion",
        "source_phase": ctx.current_phase,
        "target_phase": PLANNING,
        "reason": reason,
        "timestamp": at.isoformat(),
        "reversion_number": number,
        "automatic": automatic,
    }
    dev_round = ctx.dev_round + 1
    return PhaseResult.advance(
        PLANNING,
        updates={"current_round": 0, "dev_round": dev_round},
        state={
            **(state or {}),
            "reversion_count": number,
            "decisions": [*decisions_of(ctx.state), record],
            "replan_context": context,
            "plan_cycle": number,
            "cycle_start_dev_round": dev_round,
            "test_retries": 0,
            "last_check_failure": None,
            "review_feedback": None,
            "plan_feedback": None,
            "merge_approved": False,
            "merge_approved_by": None,
            "stopped_on": None,
            # after a merge that could not proceed, the next build starts from the base
            "sync_base": ctx.current_phase == MERGE,
        },
        milestones=(
            *milestones,
            MilestoneWrite(
                "reversion",
                round=number,
                summary=f"{ctx.current_phase} → {PLANNING}: {reason}"[:300],
                data=record,
            ),
        ),
        events=(EventWrite("reversion", record),),
    )


@dataclass(frozen=True)
class ReversionDecision:
    """What a phase does with a reversion trigger: ``revert``, ``pause`` or ``refuse``."""

    action: Literal["revert", "pause", "refuse"]
    why: str


def decide_reversion(
    profile: AutomationProfile, source_phase: str, workflow_id: str, state: WorkflowState
) -> ReversionDecision:
    """Whether a trigger in ``source_phase`` reverts now, pauses for a person, or is refused.

    The loop guard comes first (``refuse``); then the profile's threshold
    for the path (``revert`` below 1.0, else ``pause``).
    """
    refusal = reversion_refusal(workflow_id, state)
    if refusal is not None:
        return ReversionDecision("refuse", refusal)
    key = profile.threshold_key(source_phase)
    threshold = profile.threshold(source_phase)
    if allows_automatic(threshold):
        return ReversionDecision(
            "revert", f"profile {profile.name}: {key} = {threshold:g} < 1.0 reverts automatically"
        )
    return ReversionDecision(
        "pause",
        f"profile {profile.name} ({key} = {threshold:g}) leaves re-planning to a person: "
        f"`phasegate revert {workflow_id} --to-phase planning --reason TEXT` re-plans, "
        f"`phasegate resume {workflow_id}` tries again",
    )


def reversion_or_stop(
    ctx: WorkflowContext,
    *,
    reason: str,
    context: str,
    at: datetime,
    milestones: Sequence[MilestoneWrite] = (),
    state: WorkflowState | None = None,
    hint: str = "",
) -> PhaseResult:
    """A phase's answer to a reversion trigger, under the workflow's profile.

    Automatic reversion where the profile allows it (``reversion_result``);
    otherwise ``pause`` for a person with ``reason`` and what they can do. Once
    the loop guard is reached: ``failed`` with the guard's message where the
    reversion would have been automatic, ``pause`` with it where not. ``hint``
    (what else a person can do) is added to a pause's or failure's reason only.
    """
    profile = AutomationProfile.from_state(ctx.state)
    decision = decide_reversion(profile, ctx.current_phase, ctx.id, ctx.state)
    if decision.action == "revert":
        return reversion_result(
            ctx,
            reason=reason,
            context=context,
            at=at,
            automatic=True,
            milestones=milestones,
            state=state,
        )
    # A refused automatic reversion ends the run (failed); where a person was
    # going to decide anyway, the workflow pauses for them with the guard's word.
    stop = decision.action == "refuse" and profile.reverts_automatically(ctx.current_phase)
    return PhaseResult(
        "failed" if stop else "pause",
        reason="; ".join(part.strip() for part in (reason, hint, decision.why) if part.strip()),
        # The failure alone, for a plan after a person's revert: the hints are for people.
        state={**(state or {}), "stopped_on": context},
        milestones=tuple(milestones),
    )
