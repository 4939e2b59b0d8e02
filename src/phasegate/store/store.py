"""The Store: every SQL statement phasegate runs, and the single commit path.

SQLite (the embedded default) runs in WAL mode with ``synchronous=FULL``, a
busy timeout, foreign keys on, ``BEGIN IMMEDIATE`` for writing transactions
(two processes never deadlock on a read lock upgraded to a write) and a plain
deferred ``BEGIN`` for reading ones, which take no write lock (``_sqlite``).
PostgreSQL (``store.url = "postgresql://..."``, psycopg 3) is the same SQL at
READ COMMITTED, read-then-writes held whole by named locks and row locks
(``_postgres``). The schema comes from Alembic migrations (``migrations/``),
applied when the store is opened, on both.

``Store`` is assembled from one part per responsibility, each in its module:
workflows, milestones and events (``workflows``), the commit path (``commit``), leases
(``leases``), agent runs and sessions (``agent_runs``), the local forge's rows
(``forge_rows``), the development graph's runs and proposals (``graph_runs``), the
webhook deliveries seen and the workflows they wake (``webhooks``), who waits for
whom (``dependencies``), the people of the dashboard (``users``), budgets and what
agents spent (``budgets``), priorities, caps and agent slots (``queue``), reads of
many workflows and events at once (``board``), what ``/metrics`` shows
(``figures``), pruning finished workflows' events (``prune``), and the port ranges
worktrees hold (``ports``).
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from phasegate.clock import Clock, SystemClock
from phasegate.core.contract import PhasegateError
from phasegate.store._base import Dialect, FenceLost, StoreUnavailable
from phasegate.store._sqlite import DEFAULT_BUSY_TIMEOUT_S, SqliteDialect
from phasegate.store.agent_runs import AgentRunRecord, AgentRunRows
from phasegate.store.board import BoardRows
from phasegate.store.budgets import BudgetRows
from phasegate.store.dependencies import DependencyRows
from phasegate.store.figures import FigureRows
from phasegate.store.forge_rows import ForgeRows
from phasegate.store.graph_runs import APPLY_ARM, VERDICTS, GraphRows
from phasegate.store.leases import Fence, LeaseRows
from phasegate.store.ports import PortRows, PortsUnavailable
from phasegate.store.prune import PruneRows
from phasegate.store.queue import QueueRows, SlotNeed
from phasegate.store.users import UserRows
from phasegate.store.values import UsageTotals
from phasegate.store.webhooks import WebhookRows
from phasegate.store.workflows import UPDATABLE_COLUMNS, WorkflowRows, commit_phase_result

__all__ = [
    "APPLY_ARM",
    "UPDATABLE_COLUMNS",
    "VERDICTS",
    "DEFAULT_BUSY_TIMEOUT_S",
    "AgentRunRecord",
    "Fence",
    "FenceLost",
    "PortsUnavailable",
    "SlotNeed",
    "Store",
    "StoreUnavailable",
    "StoreUrlUnsupported",
    "UsageTotals",
    "commit_phase_result",
    "open_store",
    "store_server_problem",
    "store_url_problem",
]


class StoreUrlUnsupported(PhasegateError):
    """``store.url`` names a database this version cannot open (neither SQLite nor
    PostgreSQL), or is no database URL at all."""


class Store(
    WorkflowRows,
    DependencyRows,
    LeaseRows,
    AgentRunRows,
    ForgeRows,
    GraphRows,
    WebhookRows,
    BoardRows,
    FigureRows,
    PruneRows,
    UserRows,
    BudgetRows,
    PortRows,
    QueueRows,
):
    """All SQL behind one class. Methods are small transactions of their own."""


def open_store(
    url: str, clock: Clock | None = None, *, busy_timeout_s: float | None = None
) -> Store:
    """Open (and migrate) the store at ``url`` (the cartridge's ``store.url``):
    ``sqlite:///path`` (a SQLite file's parent directory is created when missing)
    or ``postgresql://user:password@host:port/db`` (``postgres://`` too; psycopg 3).

    ``busy_timeout_s`` (seconds; default ``DEFAULT_BUSY_TIMEOUT_S``, or the URL's
    ``?busy_timeout=`` query) is how long a write waits for another's lock
    before StoreUnavailable (PostgreSQL: ``lock_timeout``). Raises
    StoreUrlUnsupported for any other database, naming ``store.url``;
    StoreUnavailable when the store cannot be opened or migrated (locked, full,
    unreadable, the server refused or is gone), its message without the password.
    """
    dialect = make_dialect(url, busy_timeout_s)
    store = Store(dialect.engine(), clock or SystemClock(), dialect)
    try:
        store.migrate()
    except BaseException:
        store.close()
        raise
    return store


def make_dialect(url: str, busy_timeout_s: float | None = None) -> Dialect:
    """The Dialect of ``store.url`` (see ``open_store``), its schema untouched. A
    SQLite file's parent directory is created. Raises StoreUrlUnsupported."""
    parsed = _parse_url(url)
    query_timeout = parsed.query.get("busy_timeout")
    if query_timeout is not None:
        parsed = parsed.difference_update_query(["busy_timeout"])
        if busy_timeout_s is None:
            busy_timeout_s = _seconds(str(query_timeout), parsed)
    timeout = DEFAULT_BUSY_TIMEOUT_S if busy_timeout_s is None else busy_timeout_s
    if parsed.get_backend_name() == "postgresql":
        # psycopg and its dialect load only for a server: a SQLite store never needs them.
        import psycopg

        from phasegate.store._postgres import PostgresDialect

        dialect = PostgresDialect(parsed.set(drivername="postgresql+psycopg"), timeout)
        try:
            dialect.conninfo()  # libpq's own check of the URL's query: options it knows
        except psycopg.ProgrammingError as exc:
            raise StoreUrlUnsupported(
                f"store.url: {str(exc).strip()} in {_shown(parsed)}"
            ) from None
        return dialect
    db_path = parsed.database
    if db_path and db_path != ":memory:":
        Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    return SqliteDialect(parsed, timeout)


def store_url_problem(url: str) -> str | None:
    """Why ``store.url`` cannot be opened by this version, or None when it can."""
    try:
        _parse_url(url)
    except StoreUrlUnsupported as exc:
        return str(exc)
    return None


def store_server_problem(url: str) -> str | None:
    """Why the server ``store.url`` names does not answer (PostgreSQL: one connection,
    nothing read or migrated; the password not shown), or None when it does, or
    when the store is a SQLite file (opened when used). What ``doctor`` asks."""
    try:
        if _parse_url(url).get_backend_name() != "postgresql":
            return None  # a SQLite file, whose directory is not made here
        dialect = make_dialect(url, busy_timeout_s=5.0)
    except StoreUrlUnsupported as exc:
        return str(exc)
    from phasegate.store._postgres import PostgresDialect

    assert isinstance(dialect, PostgresDialect)
    engine = dialect.engine()
    try:
        with engine.connect():
            return None
    except Exception as exc:
        reason = dialect.unavailable(exc)
        if reason is None:
            raise
        return f"store.url: the server does not answer: {reason}"
    finally:
        engine.dispose()


def _parse_url(url: str) -> sa.URL:
    given = url
    # libpq's and Heroku's spelling; SQLAlchemy knows only "postgresql".
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError):  # ValueError: a port that is no number
        raise StoreUrlUnsupported(
            "store.url: it is not a database URL (the password, if any, not shown); use "
            "sqlite:///path/to/state.db or postgresql://user:password@host:5432/db"
        ) from None
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise StoreUrlUnsupported(
            f"store.url: {backend} is not a supported store; use sqlite:///path/to/state.db "
            f"or postgresql://user:password@host/db, not {_shown(parsed)}"
        )
    if backend == "postgresql" and parsed.drivername not in ("postgresql", "postgresql+psycopg"):
        raise StoreUrlUnsupported(
            f"store.url: the {parsed.drivername} driver is not supported; "
            f"write postgresql://... (psycopg 3), not {_shown(parsed)}"
        )
    if backend == "postgresql" and not (parsed.host or parsed.database or parsed.query):
        # libpq would try its default socket as the login user's database: never meant.
        shown = _shown(parsed)  # the password hidden, the scheme as written
        if given.startswith("postgres://"):
            shown = "postgres://" + shown.split("://", 1)[1]
        raise StoreUrlUnsupported(
            f"store.url: {shown} names no server and no database; "
            "write postgresql://user:password@host:5432/db"
        )
    return parsed


def _shown(url: sa.URL) -> str:
    return url.render_as_string(hide_password=True)


#: The longest ``?busy_timeout=`` (seconds) a store.url may ask for: an hour's wait
#: for a lock is a stuck store, not a busy one.
MAX_BUSY_TIMEOUT_S = 3600.0


def _seconds(value: str, url: sa.URL) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= MAX_BUSY_TIMEOUT_S:  # NaN too
        raise StoreUrlUnsupported(
            f"store.url: busy_timeout={value!r} in {_shown(url)} is not a number of seconds "
            f"from 0 to {MAX_BUSY_TIMEOUT_S:g}"
        )
    return seconds
