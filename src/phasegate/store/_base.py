"""What every part of the Store shares: the engine, the clock, transactions,
the schema's migrations, events written inside a transaction."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from phasegate.clock import Clock
from phasegate.contract import EventWrite
from phasegate.store import tables as t

_MIGRATIONS = Path(__file__).parent / "migrations"


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
        """Bring the schema to ``revision`` (default: the newest; migrations are append-only)."""
        config = Config()
        config.set_main_option("script_location", str(_MIGRATIONS))
        with self.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, revision)

    @contextmanager
    def transaction(self) -> Iterator[sa.Connection]:
        with self.engine.begin() as conn:
            yield conn

    def close(self) -> None:
        self.engine.dispose()

    def _workflow_rows(
        self, table: sa.Table, workflow_id: str, *where: sa.ColumnElement[bool]
    ) -> list[dict[str, Any]]:
        """``table``'s rows of one workflow, oldest first, timestamps UTC-aware."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(table)
                .where(table.c.workflow_id == workflow_id, *where)
                .order_by(table.c.id)
            ).mappings()
            return [
                {k: _utc(v) if isinstance(v, datetime) else v for k, v in r.items()} for r in rows
            ]

    def _add_event(self, conn: sa.Connection, workflow_id: str, event: EventWrite) -> None:
        conn.execute(
            t.events.insert().values(
                workflow_id=workflow_id,
                type=event.type,
                data=dict(event.data),
                created_at=self.clock.now(),
            )
        )
