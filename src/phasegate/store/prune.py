"""Pruning: the events of finished workflows deleted after a while, summarized in
one event a workflow (docs/operations-at-scale.md: prune).

A finished workflow is one that moves no more: completed, cancelled, or failed
and left so; its ``completed_at`` (else ``updated_at``) is its last change. Of
such a workflow older than the cutoff, every event but its trail (KEPT_EVENTS:
the phases it entered, the decisions, violations, review comments, forge
commands heard and notifications sent) is deleted, the agents' output lines above all, and so are
its graph run's call rows (the run's record keeps every call). What was
deleted is counted in one ``events_pruned`` event. Its workflow row, its
milestones, its agent runs (tokens and cost), its graph runs and proposals stay:
``show`` and the totals read the same.

Each workflow is pruned in a transaction of its own: workers write between
two, never wait on the whole prune.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from phasegate.core.contract import EventWrite
from phasegate.store import tables as t
from phasegate.store._base import StoreBase

#: What a pruned workflow keeps of its events: its trail, few rows a workflow.
KEPT_EVENTS = frozenset(
    {
        "phase_change",
        "decision",
        "reversion",
        "violation",
        "review_comment",
        "review_sent",
        "needs_you",
        "notified",
        "forge_command",
        "events_pruned",
    }
)
#: The event that counts what a prune deleted: ``{"events": {type: n}, "graph_calls": n,
#: "older_than": ISO 8601 cutoff}``.
PRUNED_EVENT = "events_pruned"
#: The statuses of a finished workflow.
FINISHED_STATUSES = ("cancelled", "completed", "failed")


@dataclass
class Pruned:
    """What a prune deleted (or, dry, would delete): per workflow and in all."""

    workflows: list[str] = field(default_factory=list)
    events: dict[str, int] = field(default_factory=dict)
    graph_calls: int = 0

    @property
    def event_count(self) -> int:
        return sum(self.events.values())


class PruneRows(StoreBase):
    """Deleting what finished workflows no longer need."""

    def prunable(self, before: datetime) -> list[str]:
        """The finished workflows whose last change is before ``before``, holding no
        lease, oldest first."""
        c = t.workflows.c
        last = sa.func.coalesce(c.completed_at, c.updated_at)
        query = (
            sa.select(c.id)
            .where(c.status.in_(FINISHED_STATUSES), last < before, c.lease_owner.is_(None))
            .order_by(last, c.id)
        )
        with self.reading() as conn:
            return list(conn.execute(query).scalars())

    def prune(self, before: datetime, *, dry_run: bool = False) -> Pruned:
        """Delete the events (but KEPT_EVENTS) and graph call rows of every workflow of
        ``prunable(before)``, each counted in a PRUNED_EVENT of that workflow; with
        ``dry_run``, count only. Raises StoreUnavailable (the workflows pruned
        before stay pruned)."""
        e = t.events.c
        g = t.graph_calls.c
        done = Pruned()
        for workflow_id in self.prunable(before):
            doomed = sa.and_(e.workflow_id == workflow_id, e.type.not_in(sorted(KEPT_EVENTS)))
            with self.reading() if dry_run else self.transaction() as conn:
                counts = {
                    kind: int(n)
                    for kind, n in conn.execute(
                        sa.select(e.type, sa.func.count()).where(doomed).group_by(e.type)
                    )
                }
                calls = int(
                    conn.execute(
                        sa.select(sa.func.count()).where(g.workflow_id == workflow_id)
                    ).scalar_one()
                )
                if not counts and not calls:
                    continue
                if not dry_run:
                    conn.execute(t.events.delete().where(doomed))
                    conn.execute(t.graph_calls.delete().where(g.workflow_id == workflow_id))
                    data: dict[str, Any] = {
                        "events": counts,
                        "graph_calls": calls,
                        "older_than": before.isoformat(),
                    }
                    self.write_event(conn, workflow_id, EventWrite(PRUNED_EVENT, data))
            done.workflows.append(workflow_id)
            for kind, n in counts.items():
                done.events[kind] = done.events.get(kind, 0) + n
            done.graph_calls += calls
        return done

    def pruned_of(self, workflow_id: str) -> dict[str, Any] | None:
        """What prunes deleted of the workflow, summed over its PRUNED_EVENTs:
        ``{"events": {type: n}, "event_count": n, "graph_calls": n, "at": ISO 8601
        of the latest}``; None when it was never pruned."""
        found = self._workflow_rows(t.events, workflow_id, t.events.c.type == PRUNED_EVENT)
        if not found:
            return None
        events: dict[str, int] = {}
        calls = 0
        for row in found:
            for kind, n in (row["data"].get("events") or {}).items():
                events[kind] = events.get(kind, 0) + int(n)
            calls += int(row["data"].get("graph_calls") or 0)
        return {
            "events": events,
            "event_count": sum(events.values()),
            "graph_calls": calls,
            "at": found[-1]["created_at"].isoformat(),
        }
