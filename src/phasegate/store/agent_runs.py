"""Agent calls and provider sessions: what each call cost and which session it continued."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from phasegate.store import tables as t
from phasegate.store._base import StoreBase
from phasegate.store.values import UsageTotals


@dataclass(frozen=True)
class AgentRunRecord:
    """One finished agent call, as recorded in ``agent_runs``."""

    workflow_id: str
    phase: str
    role: str
    session_line: str
    runner: str
    round: int
    attempt: int
    outcome: str
    error_kind: str | None = None
    error: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    duration_s: float = 0.0
    session_id: str | None = None
    #: The model its binding names; empty when the runner chooses its own.
    model: str = ""
    #: When its process started (UTC), once it held its slots (agents/slots.py).
    started_at: datetime | None = None


class AgentRunRows(StoreBase):
    """Agent calls and provider sessions."""

    def record_agent_run(self, run: AgentRunRecord) -> None:
        """Append one agent call; usage is summed per workflow, never overwritten."""
        with self.transaction() as conn:
            conn.execute(
                t.agent_runs.insert().values(
                    **{k: getattr(run, k) for k in AgentRunRecord.__dataclass_fields__},
                    created_at=self.clock.now(),
                )
            )

    def agent_runs(self, workflow_id: str) -> list[dict[str, Any]]:
        """The workflow's agent calls, oldest first."""
        return self._workflow_rows(t.agent_runs, workflow_id)

    def count_agent_runs(self, workflow_id: str, role: str) -> int:
        """How many calls of ``role`` this workflow has finished."""
        with self.reading() as conn:
            return int(
                conn.execute(
                    sa.select(sa.func.count())
                    .select_from(t.agent_runs)
                    .where(t.agent_runs.c.workflow_id == workflow_id, t.agent_runs.c.role == role)
                ).scalar_one()
            )

    def usage_totals(self, workflow_id: str, role: str | None = None) -> UsageTotals:
        """Sums of tokens and cost over the workflow's agent runs (of ``role`` only, if given)."""
        c = t.agent_runs.c
        query = sa.select(
            sa.func.coalesce(sa.func.sum(c.input_tokens), 0),
            sa.func.coalesce(sa.func.sum(c.output_tokens), 0),
            sa.func.coalesce(sa.func.sum(c.cost_usd), 0.0),
            sa.func.count(),
        ).where(c.workflow_id == workflow_id)
        if role is not None:
            query = query.where(c.role == role)
        with self.reading() as conn:
            row = conn.execute(query).one()
        return UsageTotals(int(row[0]), int(row[1]), float(row[2]), int(row[3]))

    def provider_session(self, workflow_id: str, session_line: str) -> str | None:
        """The provider session id bound to a session line, if any."""
        c = t.provider_sessions.c
        with self.reading() as conn:
            return conn.execute(
                sa.select(c.session_id).where(
                    c.workflow_id == workflow_id, c.session_line == session_line
                )
            ).scalar()

    def bind_provider_session(
        self, workflow_id: str, session_line: str, runner: str, session_id: str
    ) -> None:
        """Bind (or rebind) the one provider session of a session line: one upsert on
        the line's unique key, so two binds racing leave one row (the later's)."""
        now = self.clock.now()
        insert = self.dialect.insert(t.provider_sessions).values(
            workflow_id=workflow_id,
            session_line=session_line,
            runner=runner,
            session_id=session_id,
            created_at=now,
            updated_at=now,
        )
        with self.transaction() as conn:
            conn.execute(
                insert.on_conflict_do_update(
                    index_elements=["workflow_id", "session_line"],
                    set_={"runner": runner, "session_id": session_id, "updated_at": now},
                )
            )
