"""SQLite's part of the store: the pragmas every connection gets and how a
transaction begins.

Durable and lock-light (DESIGN.md §6): WAL, ``synchronous=FULL`` (a committed
phase survives a power cut, not only a process crash), a busy timeout, foreign
keys on; a writing transaction is ``BEGIN IMMEDIATE`` (two writers never
deadlock upgrading a read lock), a reading one (``Store.reading``) a deferred
``BEGIN``, which takes no write lock and in WAL mode never waits for a writer.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

#: Seconds a writing transaction waits for another's write lock before the
#: store reports itself unavailable (StoreUnavailable).
DEFAULT_BUSY_TIMEOUT_S = 30.0


def _sqlite_engine(url: sa.URL, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> sa.Engine:
    engine = sa.create_engine(url, connect_args={"timeout": busy_timeout_s})
    busy_ms = max(0, round(busy_timeout_s * 1000))

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Autocommit at the driver level so SQLAlchemy's begin() below owns
        # the transaction and can make it IMMEDIATE.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        reading = conn.get_execution_options().get("phasegate_reading", False)
        conn.exec_driver_sql("BEGIN" if reading else "BEGIN IMMEDIATE")

    return engine
