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

#: The most ids one IN list holds (SQLite allows 32,766 parameters at the most).
_IN_LIST_MAX = 500


class BoardRows(StoreBase):
    """Workflows and events read in bulk, for boards and pages."""

    def board_rows(self, finished_shown: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """What a board shows: every workflow not finished, and the newest
        ``finished_shown`` of each finished group (``values.FINISHED_GROUPS``:
        done, failed), oldest first; and how many workflows each finished
        group holds in all (``{"done": n, "failed": m}``)."""
        c = t.workflows.c
        by_status = sa.select(c.status, sa.func.count()).group_by(c.status)
        newest = (
            sa.select(t.workflows)
            .where(c.status == sa.bindparam("status"))
            .order_by(c.created_at.desc(), c.id.desc())
            .limit(finished_shown)
        )
        with self.reading() as conn:
            # Status by status, each one range of an index (ix_workflows_due and
            # ix_workflows_status_created): never the whole table's JSON.
            counts = {status: int(n) for status, n in conn.execute(by_status)}
            finished = {s for group in FINISHED_GROUPS.values() for s in group}
            open_ = sorted(set(counts) - finished)
            rows = list(conn.execute(sa.select(t.workflows).where(c.status.in_(open_))).mappings())
            totals = {}
            for group, statuses in FINISHED_GROUPS.items():
                totals[group] = sum(counts.get(s, 0) for s in statuses)
                found = [
                    r
                    for status in sorted(statuses & set(counts))
                    for r in conn.execute(newest, {"status": status}).mappings()
                ]
                found.sort(key=lambda r: (r["created_at"], r["id"]), reverse=True)
                rows += found[:finished_shown]
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
        with self.reading() as conn:
            if workflow_ids is None:
                found = conn.execute(query).all()
            else:
                ids = sorted(workflow_ids)
                found = [
                    row
                    for start in range(0, len(ids), _IN_LIST_MAX)
                    for row in conn.execute(
                        query.where(c.workflow_id.in_(ids[start : start + _IN_LIST_MAX]))
                    )
                ]
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
        with self.reading() as conn:
            if types is None or without:
                present = conn.execute(
                    sa.select(e.type).where(e.workflow_id == workflow_id).group_by(e.type)
                ).scalars()
                types = {kind for kind in present if types is None or kind in types}
            # One type at a time: each is one range of ix_events_workflow_type, in id
            # order. Asked for several at once, the planners walk the workflow's every
            # event by id instead, its agent output included (tens of thousands).
            rows: list[Any] = []
            for kind in sorted(set(types) - set(without)):
                where = [e.workflow_id == workflow_id, e.type == kind, e.id > after_id]
                if before_id is not None:
                    where.append(e.id < before_id)
                query = sa.select(t.events).where(*where).order_by(e.id.desc()).limit(limit)
                rows += conn.execute(query).mappings()
        rows.sort(key=lambda r: r["id"])
        return [utc_row(r) for r in rows[-limit:]] if limit > 0 else []
