"""Graduated autonomy: whether a proposal goes to a person or to the apply arm.

Pure module, so the graph's replay and the tests can call it on data: decisions in,
a decision out; no store, no clock. The rules are in docs/contracts/autonomy.md.

Per proposal kind the cartridge's ``[autonomy]`` table names a policy:

- ``propose`` (the default): a person gates the proposal (``phasegate
  approve/reject``) until the kind *graduates*: ``graduation_streak`` clean
  approvals in a row (default 3; 0: never graduates), then ``auto``.
- ``auto``: the apply arm takes it from the start.

A kind the table does not name gets the policy ``default``: the workflow's
automation profile decides it (``profiles.py``: ``manual``, ``review`` and
``trusted`` propose, ``manual`` never graduating; ``auto``, ``ci`` and
``full-auto`` are auto). What the cartridge's ``[autonomy]`` table gives
explicitly wins over the profile.

A clean approval is a person's approval of work that passed on its first
attempt. A pass that needed retries never extends a streak (and does not
break it); a rejection resets it to 0. A proposal touching governance paths
(the cartridge ``phasegate.toml``, ``.ci/``, the cartridge's
``graph.governance_paths``) is ``self_modification``: it always goes to a
person, never counts towards a streak, whatever the policy says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from phasegate.graph.facts import governance_touched
from phasegate.graph.proposals import Proposal

if TYPE_CHECKING:
    from phasegate.core.profiles import AutomationProfile

__all__ = [
    "MODES",
    "Autonomy",
    "AutonomyPolicy",
    "GateDecision",
    "PolicySource",
    "decide",
    "is_self_modification",
    "streak",
]


class PolicySource(Protocol):
    """What ``AutonomyPolicy.from_cartridge`` reads of a cartridge
    (``phasegate.config.cartridge.Cartridge`` is one; core imports no config):
    its profile, its ``[autonomy]`` table and its ``[graph]`` table."""

    def profile(self) -> AutomationProfile: ...

    @property
    def autonomy(self) -> Any: ...

    @property
    def graph(self) -> Any: ...


Mode = Literal["propose", "auto"]
MODES: tuple[str, ...] = ("propose", "auto")


@dataclass(frozen=True)
class AutonomyPolicy:
    """The ``[autonomy]`` table as plain data. ``policy``: kind → propose|auto;
    ``default``: the mode of a kind the table does not name (the profile's)."""

    policy: Mapping[str, str] = field(default_factory=dict)
    graduation_streak: int = 3
    governance_paths: tuple[str, ...] = ()
    default: str = "propose"

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.policy.items() if v not in MODES}
        if bad:
            raise ValueError(f"autonomy policies are propose or auto; got {bad}")
        if self.default not in MODES:
            raise ValueError(f"the default autonomy is propose or auto, not {self.default!r}")
        if self.graduation_streak < 0:
            raise ValueError(f"graduation_streak must be 0 or more, not {self.graduation_streak}")

    def mode_of(self, kind: str) -> str:
        return self.policy.get(kind, self.default)

    @classmethod
    def from_cartridge(
        cls, cartridge: PolicySource, profile: AutomationProfile | None = None
    ) -> AutonomyPolicy:
        """The cartridge's ``[autonomy]`` table over ``profile``'s defaults.

        ``profile`` defaults to the cartridge's (``workflow.profile``). A kind the
        table names keeps its policy; the others get the profile's autonomy. A
        profile without graduation (``manual``) sets ``graduation_streak`` to 0
        unless the table gives one.
        """
        profile = profile or cartridge.profile()
        settings = cartridge.autonomy
        streak = settings.graduation_streak
        if not profile.graduation and "graduation_streak" not in settings.model_fields_set:
            streak = 0
        return cls(
            policy=dict(settings.policy),
            graduation_streak=streak,
            governance_paths=tuple(cartridge.graph.governance_paths),
            default=profile.autonomy,
        )


@dataclass(frozen=True)
class GateDecision:
    """One decision on a proposal, as the history keeps it.

    ``by``: ``person`` (the gate) or ``auto`` (the apply arm). ``attempts``:
    the build attempts the work took (1: clean).
    """

    kind: str
    outcome: Literal["approved", "rejected"]
    attempts: int = 1
    self_modification: bool = False
    by: Literal["person", "auto"] = "person"
    proposal_id: str = ""

    @classmethod
    def of(
        cls,
        proposal: Proposal | Mapping[str, Any],
        outcome: Literal["approved", "rejected"],
        by: Literal["person", "auto"] = "person",
        policy: AutonomyPolicy | None = None,
    ) -> GateDecision:
        """The history row for deciding ``proposal`` (a Proposal or its dict)."""
        found = _proposal(proposal)
        return cls(
            kind=found.kind,
            outcome=outcome,
            attempts=found.attempts,
            self_modification=is_self_modification(found, policy or AutonomyPolicy()),
            by=by,
            proposal_id=found.id,
        )

    @property
    def clean(self) -> bool:
        """A person approved work that passed first time and governs nothing."""
        return (
            self.outcome == "approved"
            and self.by == "person"
            and self.attempts == 1
            and not self.self_modification
        )


@dataclass(frozen=True)
class Autonomy:
    """What ``decide`` says: ``mode`` (propose or auto), why, and the streak."""

    mode: Mode
    reason: Literal[
        "self_modification",
        "checks_failed",
        "policy_auto",
        "graduated",
        "streak",
        "no_graduation",
    ]
    streak: int
    needed: int


def _proposal(proposal: Proposal | Mapping[str, Any]) -> Proposal:
    return proposal if isinstance(proposal, Proposal) else Proposal.from_dict(proposal)


def is_self_modification(proposal: Proposal | Mapping[str, Any], policy: AutonomyPolicy) -> bool:
    """Whether the proposal says so, or touches a governance path by its paths."""
    found = _proposal(proposal)
    return found.self_modification or bool(governance_touched(found.paths, policy.governance_paths))


def streak(kind: str, history: Iterable[GateDecision]) -> int:
    """Clean approvals of ``kind`` since its last rejection (history oldest first)."""
    count = 0
    for decision in history:
        if decision.kind != kind:
            continue
        if decision.outcome == "rejected":
            count = 0
        elif decision.clean:
            count += 1
    return count


def decide(
    proposal: Proposal | Mapping[str, Any],
    history: Iterable[GateDecision],
    policy: AutonomyPolicy,
) -> Autonomy:
    """``propose`` (a person gates it) or ``auto`` (the apply arm takes it).

    ``history`` is every earlier decision, oldest first. Self-modification
    always proposes, and so does a proposal whose machine evidence says its
    checks failed (the harness's ``checks`` row): no policy applies work
    the checks reject. Otherwise a kind whose policy is ``auto`` is auto, or
    the kind is auto once its streak reaches ``graduation_streak`` (never when 0).
    """
    found = _proposal(proposal)
    needed = policy.graduation_streak
    current = streak(found.kind, history)
    if is_self_modification(found, policy):
        return Autonomy("propose", "self_modification", current, needed)
    if any(e.kind == "checks" and not e.data.get("passed") for e in found.evidence):
        return Autonomy("propose", "checks_failed", current, needed)
    if policy.mode_of(found.kind) == "auto":
        return Autonomy("auto", "policy_auto", current, needed)
    if needed == 0:
        return Autonomy("propose", "no_graduation", current, needed)
    if current >= needed:
        return Autonomy("auto", "graduated", current, needed)
    return Autonomy("propose", "streak", current, needed)
