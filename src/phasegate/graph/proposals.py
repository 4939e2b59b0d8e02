"""Proposals: the graph's only output, carried as data with their evidence.

A proposal asks for one act the graph never performs itself: a draft PR is
emitted as a proposal and never executed (docs/contracts/graph.md: proposals).
The autonomy policy (``phasegate.core.autonomy``) decides whether a person gates
it or the apply arm takes it.

- ``item_create``: file the ticket as scope shaped it (single, parent with
  subtasks, epic), on the route work_routing gave it.
- ``draft_pr_create``: stage the approved patch as a draft pull request.
- ``merge``: merge a reviewed pull request (emitted downstream, not here).

``attempts`` says how many build attempts the work took (1: it passed clean);
``self_modification`` that the change touches governance paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["PROPOSAL_KINDS", "Evidence", "Proposal"]

PROPOSAL_KINDS: tuple[str, ...] = ("item_create", "draft_pr_create", "merge")


@dataclass(frozen=True)
class Evidence:
    """One evidence row: what it is (``kind``) and its data (JSON values)."""

    kind: str
    data: Mapping[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "data": dict(self.data)}


@dataclass(frozen=True)
class Proposal:
    """One proposed act. ``id`` is ``{run_id}/{kind}/{n}``, unique in its run."""

    id: str
    kind: str
    title: str
    payload: Mapping[str, Any]
    evidence: tuple[Evidence, ...] = ()
    attempts: int = 1
    self_modification: bool = False
    paths: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "title": self.title,
            "payload": dict(self.payload),
            "evidence": [e.as_dict() for e in self.evidence],
            "attempts": self.attempts,
            "self_modification": self.self_modification,
            "paths": list(self.paths),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Proposal:
        """The proposal ``as_dict`` gave (a run record's ``proposals`` row)."""
        return cls(
            id=str(data["id"]),
            kind=str(data["kind"]),
            title=str(data["title"]),
            payload=dict(data["payload"]),
            evidence=tuple(Evidence(str(e["kind"]), dict(e["data"])) for e in data["evidence"]),
            attempts=int(data["attempts"]),
            self_modification=bool(data["self_modification"]),
            paths=tuple(data["paths"]),
        )

    def evidence_of(self, kind: str) -> Evidence | None:
        """The first evidence row of ``kind``, or None."""
        return next((e for e in self.evidence if e.kind == kind), None)
