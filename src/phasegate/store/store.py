"""The Store: every SQL statement phasegate runs, and the single commit path.

SQLite (the embedded default) runs in WAL mode with a busy timeout, foreign
keys on and ``BEGIN IMMEDIATE`` transactions, so two processes never deadlock
on a read lock upgraded to a write. The schema comes from Alembic migrations
(``migrations/``), applied when the store is opened.

``Store`` is assembled from one part per responsibility, each in its module:
workflows, milestones, events and the commit path (``workflows``), leases
(``leases``), agent runs and sessions (``agent_runs``), the local forge's rows
(``forge_rows``), the development graph's runs and proposals (``graph_runs``).
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from phasegate.clock import Clock, SystemClock
from phasegate.store._sqlite import _sqlite_engine
from phasegate.store.agent_runs import AgentRunRecord, AgentRunRows, UsageTotals
from phasegate.store.forge_rows import ForgeRows
from phasegate.store.graph_runs import APPLY_ARM, VERDICTS, GraphRows
from phasegate.store.leases import LeaseRows
from phasegate.store.workflows import UPDATABLE_COLUMNS, WorkflowRows, commit_phase_result

__all__ = [
    "APPLY_ARM",
    "UPDATABLE_COLUMNS",
    "VERDICTS",
    "AgentRunRecord",
    "Store",
    "UsageTotals",
    "commit_phase_result",
    "open_store",
]


class Store(WorkflowRows, LeaseRows, AgentRunRows, ForgeRows, GraphRows):
    """All SQL behind one class. Methods are small transactions of their own."""


def open_store(url: str, clock: Clock | None = None) -> Store:
    """Open (and migrate) the store at ``url``: ``sqlite:///path`` or a PostgreSQL URL.

    A SQLite file's parent directory is created when missing.
    """
    if url.startswith("sqlite"):
        db_path = sa.engine.make_url(url).database
        if db_path and db_path != ":memory:":
            Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        engine = _sqlite_engine(url)
    else:
        engine = sa.create_engine(url, pool_pre_ping=True)
    store = Store(engine, clock or SystemClock())
    store.migrate()
    return store
