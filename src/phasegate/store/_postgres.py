"""PostgreSQL's part of the store: the engine on psycopg 3,
which errors mean "unavailable", its upsert, named locks and LISTEN/NOTIFY.

Many workers on many machines share one server, each writing transaction at
READ COMMITTED: nothing serializes writers as SQLite's ``BEGIN IMMEDIATE``
does, so a read-then-write takes a named lock (``serialize``: a transaction
advisory lock) or is one conditional statement. A reading transaction
(``Store.reading``) is REPEATABLE READ, READ ONLY: its statements see one
snapshot, as a SQLite read transaction does, and it takes no lock a writer
waits on.

The busy timeout is ``lock_timeout``: a statement waiting longer than it for
another transaction's row or advisory lock fails, and the store reports
itself unavailable (StoreUnavailable), as SQLite's ``busy_timeout`` does.

Wake-ups: a writing transaction that leaves something for other workers to
act on calls ``notify`` (``pg_notify`` on the ``phasegate`` channel, sent at
commit, dropped at rollback); a ``ListenFeed`` LISTENs on its own autocommit
connection and returns from ``wait`` the moment one arrives.
"""

from __future__ import annotations

import hashlib
import threading
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

__all__ = ["CHANNEL", "ListenFeed", "PostgresDialect", "lock_id"]

#: The channel every phasegate store notifies and listens on.
CHANNEL = "phasegate"

#: SQLSTATEs (or their two-character classes) of a server that cannot take the
#: transaction now or at all: faults of the store, not bugs of a query
#: (PostgreSQL manual, appendix A).
_UNAVAILABLE_CLASSES = {
    "08": "connection exception",
    "53": "insufficient resources (disk full, out of memory, too many connections)",
    "58": "system error (I/O)",
}
_UNAVAILABLE_STATES = {
    "57P01": "admin shutdown",
    "57P02": "crash shutdown",
    "57P03": "cannot connect now",
    "57014": "statement cancelled (statement_timeout)",
    "55P03": "lock not available (lock_timeout)",
    "40P01": "deadlock detected",
    "40001": "serialization failure",
}


def lock_id(key: str) -> int:
    """A stable signed 64-bit number for the lock named ``key`` (the same in every
    process and on every machine: ``hash()`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big", signed=True)


class PostgresDialect:
    """The Dialect of a PostgreSQL server (``_base.Dialect``), on psycopg 3.

    ``url`` is a ``postgresql+psycopg://`` URL (``store.open_store`` makes one of
    ``postgresql://`` and ``postgres://``); ``busy_timeout_s`` (seconds) becomes
    ``lock_timeout`` and bounds how long a connection is waited for.
    """

    name = "postgresql"

    def __init__(self, url: sa.URL, busy_timeout_s: float) -> None:
        self.busy_timeout_s = busy_timeout_s
        given = url.query.get("options")
        self.options = " ".join(
            part
            for part in (
                str(given) if given else "",
                f"-c lock_timeout={max(0, round(busy_timeout_s * 1000))}",
            )
            if part
        )
        self.url = url.difference_update_query(["options"])

    def connect_args(self) -> dict[str, Any]:
        # libpq's connect_timeout is whole seconds, at least 2 (a smaller one it raises).
        return {"options": self.options, "connect_timeout": max(2, round(self.busy_timeout_s))}

    def engine(self) -> sa.Engine:
        engine = sa.create_engine(
            self.url,
            connect_args=self.connect_args(),
            # A server restarted under a pool: a dead connection is noticed and
            # replaced before a transaction uses it, not reported as a fault.
            pool_pre_ping=True,
            # A worker advancing N workflows at once holds up to 2N connections (each
            # advance and its heartbeat). Connections are made only when asked for;
            # those beyond pool_size are closed when returned, and a worker at
            # --concurrency 16 would connect anew (a server process forked) for
            # most of its transactions. At most 55 either way.
            pool_size=24,
            max_overflow=31,
        )

        @sa.event.listens_for(engine, "begin")
        def _on_begin(conn: sa.Connection) -> None:
            if conn.get_execution_options().get("phasegate_reading", False):
                conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")

        return engine

    def unavailable(self, exc: BaseException) -> str | None:
        if isinstance(exc, sa.exc.TimeoutError):
            return f"no connection free within the pool's timeout: {exc}"
        orig = getattr(exc, "orig", None) or exc
        if not isinstance(orig, psycopg.Error):
            return None
        state = orig.sqlstate
        if state is None:
            # No SQLSTATE: the client's own word, e.g. connection refused or lost.
            if not isinstance(orig, psycopg.OperationalError | psycopg.InterfaceError):
                return None
            what = "connection failed or lost"
        elif state in _UNAVAILABLE_STATES:
            what = _UNAVAILABLE_STATES[state]
        elif state[:2] in _UNAVAILABLE_CLASSES:
            what = _UNAVAILABLE_CLASSES[state[:2]]
        else:
            return None
        message = " ".join(str(orig).split())
        if self.url.password:
            message = message.replace(str(self.url.password), "***")
        return f"{what}: {message}" if message else what

    def insert(self, table: sa.Table) -> Any:
        return postgresql.insert(table)

    def writing(self) -> AbstractContextManager[None]:
        return nullcontext()  # row locks: writers of different rows never wait

    def serialize(self, conn: sa.Connection, key: str) -> None:
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(lock_id(key))))

    def notify(self, conn: sa.Connection) -> None:
        conn.execute(sa.select(sa.func.pg_notify(CHANNEL, "")))

    def changes(self) -> ListenFeed:
        return ListenFeed(self.conninfo())

    def conninfo(self) -> str:
        """The libpq connection string of ``url`` (password included: never shown)."""
        u = self.url
        params: dict[str, Any] = {
            "host": u.host,
            "port": u.port,
            "user": u.username,
            "password": u.password,
            "dbname": u.database,
            **{k: v for k, v in u.query.items() if isinstance(v, str)},
            **self.connect_args(),
        }
        return psycopg.conninfo.make_conninfo(**{k: v for k, v in params.items() if v is not None})


class ListenFeed:
    """A ChangeFeed that LISTENs on ``CHANNEL`` on a connection of its own.

    A feed whose connection was lost returns True at once (look anyway: what it
    missed is unknown) and connects again on its next ``wait``; while it cannot,
    each ``wait`` sleeps out its timeout and returns True (the Protocol's rule).
    """

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._conn: psycopg.Connection[Any] | None = None
        self._connect()

    def _connect(self) -> bool:
        try:
            self._conn = psycopg.connect(self._conninfo, autocommit=True)
            self._conn.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error:
            self._drop()
            return False
        return True

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def wait(self, timeout_s: float, stop: threading.Event | None = None) -> bool:
        stop = stop or threading.Event()
        deadline = time.monotonic() + timeout_s
        if self._conn is None:
            # What changed while the feed was not listening is unknown: look anyway,
            # at once when it listens again, after the timeout while it cannot.
            if not self._connect():
                stop.wait(max(0.0, timeout_s))
            return True
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                # Slices of 0.1 s: ``stop`` is looked at between them.
                got = any(True for _ in self._conn.notifies(timeout=min(0.1, left), stop_after=1))
                if got:
                    # Those that came with it are the same news.
                    for _ in self._conn.notifies(timeout=0.0):
                        pass
                    return True
            except psycopg.Error:
                self._drop()
                return True
        return False

    def close(self) -> None:
        self._drop()
