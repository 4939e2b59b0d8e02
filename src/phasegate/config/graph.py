"""The cartridge's ``[graph]`` table (docs/contracts/graph.md): review tiers, the epic threshold,
work routing, governance paths.

Split out of cartridge.py, which re-exports it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["EpicThreshold", "GraphSettings", "ReviewTierRule", "ReviewTiers", "WorkRouting"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)  # "yes" is not a bool


class ReviewTierRule(_Strict):
    """``tier`` for a change when every condition the rule names holds (docs/contracts/graph.md:
    review tiers).

    ``min_files``, ``min_lines`` (insertions plus deletions) compare with the
    change facts; ``paths`` match when a touched path is one of them, under
    one ending in ``/``, or matched as a glob; ``self_modification`` when the
    change touches governance paths (true) or does not (false).
    """

    tier: int = Field(ge=0, le=2)  # not Literal: strict ints refuse `true`
    """The tier the rule gives a change it matches: 0, 1 or 2."""
    min_files: int | None = Field(default=None, ge=1)
    """Matches a change of at least this many files."""
    min_lines: int | None = Field(default=None, ge=1)
    """Matches a change of at least this many lines, inserted plus deleted."""
    paths: list[str] = Field(default_factory=list)
    """Matches a change touching one of these paths (a trailing / for a directory, or a glob)."""
    self_modification: bool | None = None
    """Matches a change that touches governance paths (true) or one that does not (false)."""

    @model_validator(mode="after")
    def _has_condition(self) -> ReviewTierRule:
        if (
            self.min_files is None
            and self.min_lines is None
            and not self.paths
            and self.self_modification is None
        ):
            raise ValueError(
                "a tier rule needs a condition: min_files, min_lines, paths or self_modification"
            )
        return self


class ReviewTiers(_Strict):
    """How many reviewers a change gets: tier 0 review once, 1 with an adversary
    (and the arbitrator when the two disagree), 2 with the adversary and always the
    arbitrator. The highest matching tier wins; any tier of 1 or more needs both
    [roles.review_adversary] and [roles.arbitrate] bound."""

    default: int = Field(default=0, ge=0, le=2)
    """The tier of a change no rule matches."""
    rules: list[ReviewTierRule] = Field(default_factory=list)
    """Rules that give a change a tier; the highest matching tier wins."""


class EpicThreshold(_Strict):
    """Pieces of work (scope_epic's SUBTASK lines) that make a parent, and an epic."""

    parent_at: int = Field(default=2, ge=2)
    """Pieces of work from which a ticket is a parent."""
    epic_at: int = Field(default=5, ge=3)
    """Pieces of work from which a ticket is an epic."""

    @model_validator(mode="after")
    def _ordered(self) -> EpicThreshold:
        if self.epic_at <= self.parent_at:
            raise ValueError("epic_at must be greater than parent_at")
        return self


#: Where scope may send a shape of ticket: ``build`` continues into the run; the
#: others stop it with an item_create proposal of the pieces.
WorkRoute = Literal["build", "breakdown", "roadmap"]


class WorkRouting(_Strict):
    """Where scope sends each shape of ticket (a WorkRoute); ``build`` continues
    into this run."""

    single: WorkRoute = "build"
    """Where a ticket of one piece goes."""
    parent: WorkRoute = "breakdown"
    """Where a parent ticket goes."""
    epic: WorkRoute = "roadmap"
    """Where an epic goes."""


class GraphSettings(_Strict):
    """The development graph's ``[graph]`` table (docs/contracts/graph.md)."""

    enabled: bool = Field(
        default=False,
        description="planning, development and pr_review of `phasegate run` follow the graph",
    )
    fix_attempts: int = Field(
        default=2, ge=0, description="build attempts after the first; 0 disables retries"
    )
    review_tiers: ReviewTiers = Field(default_factory=ReviewTiers)
    """How many reviewers a change gets."""
    epic_threshold: EpicThreshold = Field(default_factory=EpicThreshold)
    """When scope's pieces of work make a ticket a parent or an epic."""
    work_routing: WorkRouting = Field(default_factory=WorkRouting)
    """Where scope sends each shape of ticket."""
    governance_paths: list[str] = Field(
        default_factory=list,
        description="paths that make a change self_modification, besides the cartridge and .ci/",
    )
