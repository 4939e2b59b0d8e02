"""The figures ``/metrics`` shows, read from the store when it is scraped.

Read from the rows every worker writes, not counted in one process's memory,
so a dashboard beside several workers on a shared store reports all of them.
Each figure is one grouped query served by an index; the phase durations read
the ``phase_change`` events (``ix_events_type``), the only figure that grows with
the history: a scraper keeps a ``PhaseTally`` and reads only the newer ones.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from phasegate.store import tables as t
from phasegate.store._base import StoreBase, utc

#: The upper bounds (seconds) of the agent duration histogram's buckets.
AGENT_BUCKETS_S = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)

#: The events that tell how workflows met their forge's faults (``summary.FORGE_FAULT_EVENTS``).
FORGE_FAULTS = ("forge_retry", "forge_auto_resume", "comment_dropped")


@dataclass
class PhaseTally:
    """The phase durations summed so far, kept between scrapes by whoever scrapes:
    each scrape reads only the ``phase_change`` events after ``last_id``. A phase
    change is never deleted (``prune`` keeps them), so the sums stay right."""

    last_id: int = 0
    #: workflow -> (the phase it is in, when it entered it)
    entered: dict[str, tuple[str, datetime]] = field(default_factory=dict)
    #: phase -> [phases timed, seconds]
    totals: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class Figures:
    """One scrape's figures. Keys are label tuples, values counts, seconds, tokens
    or USD as named."""

    #: (status, phase) -> workflows
    workflows: dict[tuple[str, str], int] = field(default_factory=dict)
    #: workflows a worker would take now: runnable, due, no live lease
    queue_depth: int = 0
    #: role -> agents running now (a live lease, its newest agent event a start)
    agents_running: dict[str, int] = field(default_factory=dict)
    #: leased workflows in development whose build agent finished: their checks run
    checks_running: int = 0
    #: "held" / "expired" -> leases
    leases: dict[str, int] = field(default_factory=dict)
    #: distinct lease holders (workers) with a live lease
    lease_holders: int = 0
    #: phase -> (phases timed, seconds in all): each phase entered and left
    phase_seconds: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: (role, runner) -> (cumulative counts per AGENT_BUCKETS_S bound, count, seconds)
    agent_seconds: dict[tuple[str, str], tuple[list[int], int, float]] = field(default_factory=dict)
    #: (role, runner, outcome) -> agent runs
    agent_runs: dict[tuple[str, str, str], int] = field(default_factory=dict)
    #: (role, runner, model) -> (input tokens, output tokens, USD); model "" when
    #: the runner chose its own
    usage: dict[tuple[str, str, str], tuple[int, int, float]] = field(default_factory=dict)
    #: event type (FORGE_FAULTS) -> events; a forge_retry is one failed forge call
    forge_faults: dict[str, int] = field(default_factory=dict)
    #: (kind, status) -> journaled side effects (issues, pull requests, comments, merges)
    effects: dict[tuple[str, str], int] = field(default_factory=dict)


class FigureRows(StoreBase):
    """What ``/metrics`` reads."""

    def figures(
        self,
        now: datetime,
        runnable: Collection[str],
        needs_you: Collection[str],
        phases: PhaseTally | None = None,
    ) -> Figures:
        """Every figure, read in one snapshot at ``now``. ``runnable``: the statuses a
        worker advances; ``needs_you``: those among them that wait for a person
        (not queued); ``phases``: the tally of the phase durations so far, brought
        up to date here (None: summed from the first event). Raises
        StoreUnavailable."""
        w = t.workflows.c
        out = Figures()
        with self.reading() as conn:
            for status, phase, n in conn.execute(
                sa.select(w.status, w.current_phase, sa.func.count()).group_by(
                    w.status, w.current_phase
                )
            ):
                out.workflows[(status, phase)] = int(n)
            live = sa.and_(w.lease_owner.is_not(None), w.lease_expires_at > now)
            queued = sorted(set(runnable) - set(needs_you))
            out.queue_depth = int(
                conn.execute(
                    sa.select(sa.func.count()).where(
                        w.status.in_(queued),
                        sa.or_(w.due_at.is_(None), w.due_at <= now),
                        sa.not_(live),
                    )
                ).scalar_one()
            )
            held = conn.execute(
                sa.select(w.id, w.current_phase, w.lease_owner, w.lease_expires_at).where(
                    w.lease_owner.is_not(None)
                )
            ).all()
            live_rows = [r for r in held if (utc(r.lease_expires_at) or now) > now]
            out.leases = {"held": len(live_rows), "expired": len(held) - len(live_rows)}
            out.lease_holders = len({r.lease_owner for r in live_rows})
            self._agents_now(conn, live_rows, out)
            self._phase_seconds(conn, out, PhaseTally() if phases is None else phases)
            self._agent_figures(conn, out)
            e = t.events.c
            for kind, n in conn.execute(
                sa.select(e.type, sa.func.count()).where(e.type.in_(FORGE_FAULTS)).group_by(e.type)
            ):
                out.forge_faults[kind] = int(n)
            # A pruned workflow's faults are counted in its summary (store.prune): a
            # counter must not go down because old rows went.
            for (data,) in conn.execute(sa.select(e.data).where(e.type == "events_pruned")):
                for kind, n in ((data or {}).get("events") or {}).items():
                    if kind in FORGE_FAULTS:
                        out.forge_faults[kind] = out.forge_faults.get(kind, 0) + int(n)
            m = t.milestones.c
            for kind, status, n in conn.execute(
                sa.select(m.kind, m.status, sa.func.count()).group_by(m.kind, m.status)
            ):
                out.effects[(kind, status)] = int(n)
        return out

    @staticmethod
    def _agents_now(conn: sa.Connection, live_rows: list[Any], out: Figures) -> None:
        """Agents and checks running: per workflow under a live lease, its newest
        agent event (``ix_events_workflow_type``)."""
        e = t.events.c
        for row in live_rows:
            newest = conn.execute(
                sa.select(e.type, e.data)
                .where(e.workflow_id == row.id, e.type.in_(("agent_started", "agent_finished")))
                .order_by(e.id.desc())
                .limit(1)
            ).first()
            if newest is None:
                continue
            data = newest.data or {}
            if newest.type == "agent_started":
                role = str(data.get("role"))
                out.agents_running[role] = out.agents_running.get(role, 0) + 1
            elif row.current_phase == "development" and data.get("role") == "build":
                out.checks_running += 1

    @staticmethod
    def _phase_seconds(conn: sa.Connection, out: Figures, tally: PhaseTally) -> None:
        """Each phase's time from its ``phase_change`` to the workflow's next one: the
        events after ``tally.last_id`` added to ``tally``, in id order
        (``ix_events_type``, no sort)."""
        e = t.events.c
        rows = conn.execute(
            sa.select(e.id, e.workflow_id, e.data, e.created_at)
            .where(e.type == "phase_change", e.id > tally.last_id)
            .order_by(e.id)
        )
        for event_id, workflow_id, data, at in rows:
            at = utc(at) or at
            before = tally.entered.get(workflow_id)
            if before is not None:
                entry = tally.totals.setdefault(before[0], [0, 0.0])
                entry[0] += 1
                entry[1] += max(0.0, (at - before[1]).total_seconds())
            tally.entered[workflow_id] = (str((data or {}).get("phase")), at)
            tally.last_id = event_id
        out.phase_seconds = {p: (int(c), s) for p, (c, s) in tally.totals.items()}

    @staticmethod
    def _agent_figures(conn: sa.Connection, out: Figures) -> None:
        a = t.agent_runs.c
        buckets = [
            sa.func.sum(sa.case((a.duration_s <= bound, 1), else_=0)) for bound in AGENT_BUCKETS_S
        ]
        for role, runner, n, seconds, *counts in conn.execute(
            sa.select(
                a.role,
                a.runner,
                sa.func.count(),
                sa.func.coalesce(sa.func.sum(a.duration_s), 0.0),
                *buckets,
            ).group_by(a.role, a.runner)
        ):
            out.agent_seconds[(role, runner)] = ([int(c or 0) for c in counts], int(n), seconds)
        for role, runner, model, tokens_in, tokens_out, usd in conn.execute(
            sa.select(
                a.role,
                a.runner,
                a.model,
                sa.func.coalesce(sa.func.sum(a.input_tokens), 0),
                sa.func.coalesce(sa.func.sum(a.output_tokens), 0),
                sa.func.coalesce(sa.func.sum(a.cost_usd), 0.0),
            ).group_by(a.role, a.runner, a.model)
        ):
            out.usage[(role, runner, model)] = (int(tokens_in), int(tokens_out), float(usd))
        for role, runner, outcome, n in conn.execute(
            sa.select(a.role, a.runner, a.outcome, sa.func.count()).group_by(
                a.role, a.runner, a.outcome
            )
        ):
            out.agent_runs[(role, runner, outcome)] = int(n)
