"""What every part of the Store shares: the engine, the clock, transactions
(writing and reading), the schema's migrations, events written inside a
transaction, and the store's own errors.

Errors::

    PhasegateError
     ├── StoreUnavailable   the store is locked past its busy timeout, full, or
     │                      failing I/O: nothing of the transaction was written
     └── FenceLost          the lease this worker advanced under was taken over:
                            it must not start an agent, run a side effect, commit
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from phasegate.clock import Clock
from phasegate.contract import EventWrite, PhasegateError
from phasegate.store import tables as t

_MIGRATIONS = Path(__file__).parent / "migrations"

#: SQLite's words for a store that cannot take a transaction now (locked past the
#: busy timeout) or at all (full disk, failing I/O): faults of the store, not bugs
#: of a query, and the only OperationalErrors turned into StoreUnavailable.
_UNAVAILABLE = (
    "database is locked",
    "database table is locked",
    "database or disk is full",
    "disk i/o error",
    "unable to open database file",
    "attempt to write a readonly database",
)


class StoreUnavailable(PhasegateError):
    """The store cannot take the transaction: locked past its busy timeout, the
    disk full, or I/O failing. The transaction was rolled back, so nothing of it
    was written; trying again later may succeed. ``reason`` is SQLite's message.
    """

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"the store {where} is unavailable: {reason}")
        self.where = where
        self.reason = reason


class FenceLost(PhasegateError):
    """Another worker took over the workflow's lease (or it expired unrenewed):
    this worker's fence is stale and it must stop without another write."""


def _utc(value: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; everything we write is UTC.
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def _utc_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _utc(v) if isinstance(v, datetime) else v for k, v in row.items()}


class StoreBase:
    """The engine and clock every part of the Store works through."""

    def __init__(self, engine: sa.Engine, clock: Clock) -> None:
        self.engine = engine
        self.clock = clock

    # -- schema -----------------------------------------------------------------

    def migrate(self, revision: str = "head") -> None:
        """Bring the schema to ``revision`` (default: the newest; migrations are append-only).

        A schema already at the newest revision is only read: opening the store
        to look (``status``) takes no write lock while a worker writes.
        """
        config = Config()
        config.set_main_option("script_location", str(_MIGRATIONS))
        if revision == "head":
            head = ScriptDirectory.from_config(config).get_current_head()
            with self.reading() as conn:
                if MigrationContext.configure(conn).get_current_revision() == head:
                    return
        with self.transaction() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, revision)

    @contextmanager
    def transaction(self) -> Iterator[sa.Connection]:
        """One writing transaction (``BEGIN IMMEDIATE`` on SQLite), committed on exit.

        Raises StoreUnavailable (rolled back, nothing written) when the store is
        locked past its busy timeout, full or failing I/O.
        """
        with self.faults(), self.engine.begin() as conn:
            yield conn

    @contextmanager
    def reading(self) -> Iterator[sa.Connection]:
        """One read-only transaction: on SQLite a deferred ``BEGIN``, which takes no
        write lock, so reads go on while another process writes (WAL).

        Raises StoreUnavailable as ``transaction`` does.
        """
        with self.faults(), self.engine.connect() as conn:
            conn.execution_options(phasegate_reading=True)
            yield conn

    @contextmanager
    def faults(self) -> Iterator[None]:
        """Turn SQLite's unavailable-store errors (``_UNAVAILABLE``) into StoreUnavailable."""
        try:
            yield
        except (sa.exc.OperationalError, sqlite3.OperationalError) as exc:
            orig = getattr(exc, "orig", None) or exc
            reason = str(orig).strip()
            if not any(words in reason.lower() for words in _UNAVAILABLE):
                raise
            raise StoreUnavailable(self.where, reason) from exc

    @property
    def where(self) -> str:
        """The store's file (SQLite) or its URL without a password."""
        url = self.engine.url
        if url.get_backend_name() == "sqlite":
            return url.database or ":memory:"
        return url.render_as_string(hide_password=True)

    def close(self) -> None:
        self.engine.dispose()

    def _workflow_rows(
        self,
        table: sa.Table,
        workflow_id: str,
        *where: sa.ColumnElement[bool],
        conn: sa.Connection | None = None,
    ) -> list[dict[str, Any]]:
        """``table``'s rows of one workflow, oldest first, timestamps UTC-aware;
        read in ``conn``'s transaction when given (one snapshot), else in its own."""
        if conn is None:
            with self.reading() as own:
                return self._workflow_rows(table, workflow_id, *where, conn=own)
        rows = conn.execute(
            sa.select(table).where(table.c.workflow_id == workflow_id, *where).order_by(table.c.id)
        ).mappings()
        return [_utc_row(r) for r in rows]

    def _add_event(self, conn: sa.Connection, workflow_id: str, event: EventWrite) -> None:
        conn.execute(
            t.events.insert().values(
                workflow_id=workflow_id,
                type=event.type,
                data=dict(event.data),
                created_at=self.clock.now(),
            )
        )
