"""What every part of the Store shares: the engine, the clock, transactions
(writing and reading), the schema's migrations, events written inside a
transaction, and the store's own errors.

Errors::

    PhasegateError
     ├── StoreUnavailable   the store is locked past its busy timeout, full,
     │                      failing I/O, or its server is gone: nothing of the
     │                      transaction was written
     └── FenceLost          the lease this worker advanced under was taken over:
                            it must not start an agent, run a side effect, commit
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa

from phasegate.clock import Clock
from phasegate.core.contract import EventWrite, PhasegateError
from phasegate.store import tables as t
from phasegate.store.values import HEAD_REVISION

_MIGRATIONS = Path(__file__).parent / "migrations"


class StoreUnavailable(PhasegateError):
    """The store cannot take the transaction: locked past its busy timeout, the
    disk full, I/O failing, or (PostgreSQL) the server refused, gone or out of
    connections. The transaction was rolled back, so nothing of it was written;
    trying again later may succeed. ``where`` is the file or the URL without its
    password; ``reason`` the database's message (``Dialect.unavailable``).
    """

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"the store {where} is unavailable: {reason}")
        self.where = where
        self.reason = reason


class FenceLost(PhasegateError):
    """Another worker took over the workflow's lease (or it expired unrenewed):
    this worker's fence is stale and it must stop without another write."""


class ChangeFeed(Protocol):
    """Wake-ups, not polls: tells a waiting worker that the store changed.

    One per waiting thread; ``Dialect.changes`` makes it. SQLite's watches
    ``PRAGMA data_version`` (``_sqlite``), PostgreSQL's LISTENs (``_postgres``).
    """

    def wait(self, timeout_s: float, stop: threading.Event | None = None) -> bool:
        """Block until another connection committed a change since the last call
        (or since the feed was made), ``timeout_s`` seconds pass, or ``stop`` is set.
        True when a change was seen. Never raises for the store's faults: a feed
        that cannot look sleeps out its timeout and returns True (look anyway)."""
        ...

    def close(self) -> None: ...


class Dialect(Protocol):
    """What differs between the databases, and only that: how the engine is made,
    which errors mean "unavailable", upserts, named locks, wake-ups.

    ``_sqlite.SqliteDialect`` and ``_postgres.PostgresDialect`` implement it; the
    rest of the Store is the same SQL on both.
    """

    name: str

    def engine(self) -> sa.Engine:
        """A new engine on this database, every connection set up as the store needs."""
        ...

    def unavailable(self, exc: BaseException) -> str | None:
        """The reason to report when ``exc`` (a DBAPI or SQLAlchemy error) means the
        store cannot take a transaction now or at all (locked past the busy
        timeout, full, I/O failing, server gone), else None (a bug: re-raised)."""
        ...

    def insert(self, table: sa.Table) -> Any:
        """``INSERT`` into ``table`` with this database's ``on_conflict_do_update`` /
        ``on_conflict_do_nothing`` (an upsert in one statement)."""
        ...

    def writing(self) -> AbstractContextManager[None]:
        """Held around every writing transaction, from before it begins until after it
        ends: SQLite's queues a process's threads for the file's write lock
        (PostgreSQL's does nothing). Raises the database's own "locked" error
        when the wait passes the busy timeout."""
        ...

    def serialize(self, conn: sa.Connection, key: str) -> None:
        """Hold the lock named ``key`` until ``conn``'s transaction ends: two writing
        transactions serializing on one key never interleave (a read-then-insert,
        such as "one workflow per issue", stays whole). SQLite serializes every
        writing transaction already (BEGIN IMMEDIATE): nothing to do there."""
        ...

    def notify(self, conn: sa.Connection) -> None:
        """Tell the other workers' ChangeFeeds, once ``conn``'s transaction commits,
        that there is something to act on (SQLite: nothing, data_version tells)."""
        ...

    def changes(self) -> ChangeFeed:
        """A new ChangeFeed on this store."""
        ...


def utc(value: datetime | None) -> datetime | None:
    """``value`` as an aware UTC datetime (None stays None)."""
    # SQLite hands back naive datetimes; everything we write is UTC.
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def utc_row(row: Mapping[Any, Any]) -> dict[str, Any]:
    """``row`` with each datetime made aware (``utc``)."""
    return {k: utc(v) if isinstance(v, datetime) else v for k, v in row.items()}


def _current_revision(conn: sa.Connection) -> str | None:
    """The schema's revision as Alembic recorded it in ``alembic_version``, or None
    for a store not migrated yet (Alembic's ``MigrationContext`` reads the same)."""
    if not sa.inspect(conn).has_table("alembic_version"):
        return None
    return conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()


def _has_any_table(conn: sa.Connection, metadata: sa.MetaData) -> bool:
    """Whether any of ``metadata``'s tables is in the store's schema already."""
    inspector = sa.inspect(conn)
    return any(inspector.has_table(name) for name in metadata.tables)


#: Alembic's record of the schema's revision, as its own ``upgrade`` makes it.
_ALEMBIC_VERSION = sa.Table(
    "alembic_version",
    sa.MetaData(),
    sa.Column("version_num", sa.String(32), nullable=False),
    sa.PrimaryKeyConstraint("version_num", name="alembic_version_pkc"),
)


def _create_at_head(conn: sa.Connection) -> None:
    """Make a new store's tables at the newest revision in one step, recorded as
    Alembic records it, so a later version's migrations start from there.

    The tables module is the schema the migrations end at (tests/test_store.py
    compares the two on both databases). Alembic's import and its steps one by
    one cost a new store more than the rest of the command that opens it.
    """
    t.metadata.create_all(conn)
    _ALEMBIC_VERSION.create(conn)
    conn.execute(_ALEMBIC_VERSION.insert().values(version_num=HEAD_REVISION))


class StoreBase:
    """The engine and clock every part of the Store works through."""

    def __init__(self, engine: sa.Engine, clock: Clock, dialect: Dialect) -> None:
        self.engine = engine
        self.clock = clock
        self.dialect = dialect

    # -- schema -----------------------------------------------------------------

    def migrate(self, revision: str = "head") -> None:
        """Bring the schema to ``revision`` (default: the newest; migrations are append-only).

        A schema already at the newest revision is only read: opening the store
        to look (``status``) takes no write lock while a worker writes.
        """
        if revision == "head":
            with self.reading() as conn:
                if _current_revision(conn) == HEAD_REVISION:
                    return
        with self.transaction() as conn:
            # Workers starting together on one server: one migrates, the others
            # wait here and then find the schema at head.
            self.dialect.serialize(conn, "phasegate:migrate")
            if revision == "head":
                current = _current_revision(conn)
                if current == HEAD_REVISION:
                    return
                if current is None and not _has_any_table(conn, t.metadata):
                    _create_at_head(conn)
                    return
            from alembic import command  # only when there is something to migrate
            from alembic.config import Config

            config = Config()
            config.set_main_option("script_location", str(_MIGRATIONS))
            config.attributes["connection"] = conn
            command.upgrade(config, revision)

    @contextmanager
    def transaction(self) -> Iterator[sa.Connection]:
        """One writing transaction (``BEGIN IMMEDIATE`` on SQLite), committed on exit.

        Raises StoreUnavailable (rolled back, nothing written) when the store is
        locked past its busy timeout, full or failing I/O.
        """
        with self.faults(), self.dialect.writing(), self.engine.begin() as conn:
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
        """Turn the database's unavailable-store errors (``Dialect.unavailable``) into
        StoreUnavailable; any other error is a bug and passes through."""
        try:
            yield
        except Exception as exc:
            reason = self.dialect.unavailable(exc)
            if reason is None:
                raise
            raise StoreUnavailable(self.where, reason) from exc

    def changes(self) -> ChangeFeed:
        """A ChangeFeed on this store: what a waiting worker blocks on."""
        return self.dialect.changes()

    @property
    def where(self) -> str:
        """The store's file (SQLite) or its URL without a password."""
        url = self.engine.url
        if url.get_backend_name() == "sqlite":
            return url.database or ":memory:"
        # As the user writes it (postgresql://), not with the driver SQLAlchemy was given.
        return url.set(drivername=url.get_backend_name()).render_as_string(hide_password=True)

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
        return [utc_row(r) for r in rows]

    def write_event(self, conn: sa.Connection, workflow_id: str, event: EventWrite) -> None:
        """Insert ``event`` of ``workflow_id`` in the caller's transaction ``conn``."""
        conn.execute(INSERT_EVENT, event_params(workflow_id, event, self.clock.now()))


#: One event row, built once; executed with ``event_params`` (or a list of them).
INSERT_EVENT = t.events.insert()


def event_params(workflow_id: str, event: EventWrite, now: datetime) -> dict[str, Any]:
    """The parameters of ``INSERT_EVENT`` for ``event`` of ``workflow_id`` at ``now``."""
    return {
        "workflow_id": workflow_id,
        "type": event.type,
        "data": dict(event.data),
        "created_at": now,
    }
