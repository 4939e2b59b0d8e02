"""Reads for pages that show many workflows at once: in a few queries, whatever the
store's size.

A board, ``status`` and a workflow's page would otherwise read per workflow (its
usage, its children) or read every event of a workflow to show its newest few:
fine for a hundred workflows, seconds for ten thousand and a million events
(benchmarks/store_scale.py). Each method here is one query served by an index
(``tables``: ``ix_events_workflow_type``, ``ix_workflows_status_created``).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import sqlalchemy as sa

from phasegate.store import tables as t
from phasegate.store._base import StoreBase, utc_row
from phasegate.store.commit import workflow_dict
from phasegate.store.values import FINISHED_GROUPS, UsageTotals

#: Above this many ids, usage is summed over every workflow in one pass: an IN list
#: that long costs more than the rows it would skip.
_IN_LIST_MAX = 500


class BoardRows(StoreBase):
    """Workflows and events read in bulk, for boards and pages."""

    def board_rows(self, finished_shown: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """What a board shows: every workflow not finished, and the newest
        ``finished_shown`` of each finished group (``values.FINISHED_GROUPS``:
        done, failed), oldest first; and how many workflows each finished
        group holds in all (``{"done": n, "failed": m}``)."""
        c = t.workflows.c
        finished = sorted(s for group in FINISHED_GROUPS.values() for s in group)
        order = (c.created_at, c.id)
        with self.reading() as conn:
            rows = list(
                conn.execute(sa.select(t.workflows).where(c.status.not_in(finished))).mappings()
            )
            totals = {}
            for group, statuses in FINISHED_GROUPS.items():
                where = c.status.in_(sorted(statuses))
                totals[group] = int(
                    conn.execute(sa.select(sa.func.count()).where(where)).scalar_one()
                )
                newest = (
                    sa.select(t.workflows)
                    .where(where)
                    .order_by(*(o.desc() for o in order))
                    .limit(finished_shown)
                )
                rows += conn.execute(newest).mappings()
        shaped = [workflow_dict(r) for r in rows]
        shaped.sort(key=lambda r: (r["created_at"], r["id"]))
        return shaped, totals

    def usage_by_workflow(
        self, workflow_ids: Collection[str] | None = None
    ) -> dict[str, UsageTotals]:
        """Sums of tokens and cost over the agent runs of each of ``workflow_ids``
        (None: every workflow), in one query; a workflow without runs is absent."""
        c = t.agent_runs.c
        query = sa.select(
            c.workflow_id,
            sa.func.coalesce(sa.func.sum(c.input_tokens), 0),
            sa.func.coalesce(sa.func.sum(c.output_tokens), 0),
            sa.func.coalesce(sa.func.sum(c.cost_usd), 0.0),
            sa.func.count(),
        ).group_by(c.workflow_id)
        if workflow_ids is not None and len(workflow_ids) <= _IN_LIST_MAX:
            query = query.where(c.workflow_id.in_(sorted(workflow_ids)))
        with self.reading() as conn:
            found = conn.execute(query).all()
        return {
            row[0]: UsageTotals(int(row[1]), int(row[2]), float(row[3]), int(row[4]))
            for row in found
        }

    def child_rows(self) -> list[dict[str, Any]]:
        """Every conflict child (``parent_workflow_id`` set) as ``id``, ``status`` and
        ``parent_workflow_id``, oldest first (``ix_workflows_parent``)."""
        c = t.workflows.c
        query = (
            sa.select(c.id, c.status, c.parent_workflow_id)
            .where(c.parent_workflow_id.is_not(None))
            .order_by(c.created_at, c.id)
        )
        with self.reading() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def workflow_marks(self) -> list[tuple[Any, ...]]:
        """Each workflow's ``(id, version, status, current_phase, lease_owner)``, by
        id: what changes whenever a board's card would (no JSON decoded)."""
        c = t.workflows.c
        query = sa.select(c.id, c.version, c.status, c.current_phase, c.lease_owner)
        with self.reading() as conn:
            return [tuple(r) for r in conn.execute(query.order_by(c.id))]

    def newest_events(
        self,
        workflow_id: str,
        limit: int,
        *,
        types: Collection[str] | None = None,
        without: Collection[str] = (),
        after_id: int = 0,
        before_id: int | None = None,
    ) -> list[dict[str, Any]]:
        """The newest ``limit`` events of the workflow with ``after_id`` < id <
        ``before_id``, of ``types`` when given, none of ``without``; oldest first.
        Reads those rows only, however many the workflow has."""
        e = t.events.c
        where = [e.workflow_id == workflow_id, e.id > after_id]
        if before_id is not None:
            where.append(e.id < before_id)
        if types is not None:
            where.append(e.type.in_(sorted(types)))
        if without:
            where.append(e.type.not_in(sorted(without)))
        query = sa.select(t.events).where(*where).order_by(e.id.desc()).limit(limit)
        with self.reading() as conn:
            rows = [utc_row(r) for r in conn.execute(query).mappings()]
        rows.reverse()
        return rows
