"""The graph's settings, resolved from the cartridge into plain data.

``GraphRules`` is what the graph reads of the cartridge: which roles are
bound (an unbound optional role is absent), the review tier rules, the fix
attempts, epic_threshold, work_routing, the governance paths and the
worktree root. It round-trips through ``as_dict``/``from_dict``, so a run
record carries the rules it ran under and a replay needs nothing else.
``GraphRules.from_cartridge`` reads a ``phasegate.config.cartridge.Cartridge``
without importing it (the graph imports nothing outside itself and core): it
names only what it reads, ``CartridgeView``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from phasegate.graph.calls import GraphError
from phasegate.graph.facts import ChangeFacts, path_matches

__all__ = [
    "GRAPH_ROLES",
    "SCOPE_SHAPES",
    "CartridgeView",
    "EpicThreshold",
    "GraphRules",
    "TierRule",
    "review_tier",
]


class CartridgeView(Protocol):
    """What the graph reads of a cartridge (``phasegate.config.cartridge.Cartridge``
    is one): its ``[graph]`` table, its roles and its landing areas."""

    @property
    def graph(self) -> Any: ...

    @property
    def roles(self) -> Any: ...

    @property
    def landing_areas(self) -> Any: ...


#: Every role the graph may ask; plan, build and review are required, the rest optional.
GRAPH_ROLES: tuple[str, ...] = (
    "scope_epic",
    "plan",
    "plan_alternative",
    "plan_arbitrate",
    "plan_adversary",
    "build",
    "review",
    "review_adversary",
    "arbitrate",
)
REQUIRED_ROLES: tuple[str, ...] = ("plan", "build", "review")

#: What scope decides a ticket is.
SCOPE_SHAPES: tuple[str, ...] = ("single", "parent", "epic")


@dataclass(frozen=True)
class TierRule:
    """A review tier rule: ``tier`` when every condition it names holds.

    ``min_files``/``min_lines`` compare with the change facts (lines are
    insertions plus deletions); ``paths`` (patterns as ``facts.path_matches``
    reads them) match when any touched path matches one; ``self_modification``
    matches when the change touches governance paths (True) or does not (False).
    """

    tier: int
    min_files: int | None = None
    min_lines: int | None = None
    paths: tuple[str, ...] = ()
    self_modification: bool | None = None

    def matches(self, facts: ChangeFacts) -> bool:
        if self.min_files is not None and facts.files < self.min_files:
            return False
        if self.min_lines is not None and facts.lines < self.min_lines:
            return False
        if self.paths and not any(
            path_matches(p, pattern) for p in facts.paths for pattern in self.paths
        ):
            return False
        return self.self_modification is None or facts.self_modification == self.self_modification

    def as_dict(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "min_files": self.min_files,
            "min_lines": self.min_lines,
            "paths": list(self.paths),
            "self_modification": self.self_modification,
        }


@dataclass(frozen=True)
class EpicThreshold:
    """How many pieces of work make a parent with subtasks, and how many an epic."""

    parent_at: int = 2
    epic_at: int = 5

    def shape(self, pieces: int) -> str:
        """``single``, ``parent`` or ``epic`` for a ticket of ``pieces`` pieces of work."""
        if pieces >= self.epic_at:
            return "epic"
        if pieces >= self.parent_at:
            return "parent"
        return "single"


#: work_routing's default: a single ticket is built in this run; the others are filed.
DEFAULT_WORK_ROUTING: Mapping[str, str] = {
    "single": "build",
    "parent": "breakdown",
    "epic": "roadmap",
}
#: The route that continues this run into planning and build.
BUILD_ROUTE = "build"


@dataclass(frozen=True)
class GraphRules:
    """What the graph reads of the cartridge. Raises GraphError when incoherent."""

    bound_roles: frozenset[str]
    fix_attempts: int = 2
    default_tier: int = 0
    tier_rules: tuple[TierRule, ...] = ()
    epic_threshold: EpicThreshold = field(default_factory=EpicThreshold)
    work_routing: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_WORK_ROUTING))
    governance_paths: tuple[str, ...] = ()
    worktree_root: str = ".phasegate/worktrees"

    def __post_init__(self) -> None:
        missing = [r for r in REQUIRED_ROLES if r not in self.bound_roles]
        if missing:
            raise GraphError(f"the graph needs the roles {', '.join(missing)} bound")
        if self.fix_attempts < 0:
            raise GraphError(f"fix_attempts must be 0 or more, not {self.fix_attempts}")
        tiers = [self.default_tier, *(r.tier for r in self.tier_rules)]
        if any(t not in (0, 1, 2) for t in tiers):
            raise GraphError(f"review tiers are 0, 1 or 2; got {tiers}")
        # Tier 1 asks the adversary, and the arbitrator when the two reviewers disagree.
        unbound = [r for r in ("review_adversary", "arbitrate") if not self.bound(r)]
        if max(tiers) >= 1 and unbound:
            raise GraphError(
                f"a review tier of {max(tiers)} needs roles.review_adversary and "
                f"roles.arbitrate bound; {' and '.join(f'roles.{r}' for r in unbound)} "
                f"{'is' if len(unbound) == 1 else 'are'} not"
            )
        unrouted = [s for s in SCOPE_SHAPES if s not in self.work_routing]
        if unrouted:
            raise GraphError(f"work_routing has no route for {', '.join(unrouted)}")

    def bound(self, role: str) -> bool:
        return role in self.bound_roles

    def as_dict(self) -> dict[str, Any]:
        return {
            "bound_roles": sorted(self.bound_roles),
            "fix_attempts": self.fix_attempts,
            "default_tier": self.default_tier,
            "tier_rules": [r.as_dict() for r in self.tier_rules],
            "epic_threshold": {
                "parent_at": self.epic_threshold.parent_at,
                "epic_at": self.epic_threshold.epic_at,
            },
            "work_routing": dict(sorted(self.work_routing.items())),
            "governance_paths": list(self.governance_paths),
            "worktree_root": self.worktree_root,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GraphRules:
        """The rules ``as_dict`` gave (a run record's ``rules``)."""
        return cls(
            bound_roles=frozenset(data["bound_roles"]),
            fix_attempts=int(data["fix_attempts"]),
            default_tier=int(data["default_tier"]),
            tier_rules=tuple(
                TierRule(
                    tier=int(r["tier"]),
                    min_files=r["min_files"],
                    min_lines=r["min_lines"],
                    paths=tuple(r["paths"]),
                    self_modification=r["self_modification"],
                )
                for r in data["tier_rules"]
            ),
            epic_threshold=EpicThreshold(**data["epic_threshold"]),
            work_routing=dict(data["work_routing"]),
            governance_paths=tuple(data["governance_paths"]),
            worktree_root=str(data["worktree_root"]),
        )

    @classmethod
    def from_cartridge(cls, cartridge: CartridgeView) -> GraphRules:
        """The rules a validated cartridge gives (its ``graph`` table and roles)."""
        settings = cartridge.graph
        return cls(
            bound_roles=frozenset(
                role for role in GRAPH_ROLES if getattr(cartridge.roles, role, None) is not None
            ),
            fix_attempts=settings.fix_attempts,
            default_tier=settings.review_tiers.default,
            tier_rules=tuple(
                TierRule(
                    tier=rule.tier,
                    min_files=rule.min_files,
                    min_lines=rule.min_lines,
                    paths=tuple(rule.paths),
                    self_modification=rule.self_modification,
                )
                for rule in settings.review_tiers.rules
            ),
            epic_threshold=EpicThreshold(
                parent_at=settings.epic_threshold.parent_at,
                epic_at=settings.epic_threshold.epic_at,
            ),
            work_routing=settings.work_routing.model_dump(),
            governance_paths=tuple(settings.governance_paths),
            worktree_root=cartridge.landing_areas.worktree_root,
        )


def review_tier(facts: ChangeFacts, rules: GraphRules) -> tuple[int, list[int]]:
    """The review tier of a change, and the indexes of the tier rules that matched.

    The tier is the highest of ``default_tier`` and every matching rule's
    tier; the author has no say in it (docs/contracts/graph.md: review tiers).
    """
    matched = [i for i, rule in enumerate(rules.tier_rules) if rule.matches(facts)]
    return max([rules.default_tier, *(rules.tier_rules[i].tier for i in matched)]), matched
