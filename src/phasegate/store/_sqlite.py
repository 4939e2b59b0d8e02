"""SQLite's part of the store: the pragmas every connection gets, how a
transaction begins, which errors mean "unavailable", its upsert, and wake-ups.

Durable and lock-light: WAL, ``synchronous=FULL`` (a committed
phase survives a power cut, not only a process crash), a busy timeout, foreign
keys on; a writing transaction is ``BEGIN IMMEDIATE`` (two writers never
deadlock upgrading a read lock, and writers are serialized, so ``serialize``
has nothing to add), and a process's threads queue for it on a lock of the
file's (``writing``), a reading one (``Store.reading``) a deferred ``BEGIN``,
which takes no write lock and in WAL mode never waits for a writer.

Wake-ups: ``PRAGMA data_version`` changes on a connection once any other
connection (of this process or another) committed; reading it touches only
the WAL index in shared memory, so a feed can look every few milliseconds.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

#: Seconds a writing transaction waits for another's write lock before the
#: store reports itself unavailable (StoreUnavailable).
DEFAULT_BUSY_TIMEOUT_S = 30.0

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
    # A damaged or foreign file: nothing phasegate writes can mend it, but it is the
    # store's state, not a bug, and the message names the file.
    "file is not a database",
    "database disk image is malformed",
)

#: Seconds between a ChangeFeed's looks at ``PRAGMA data_version``: a wake-up comes
#: 5 ms late on average, and an idle worker's looks cost about 1.5 % of a core.
FEED_LOOK_S = 0.01


#: One lock per database file (its real path) for every store of this process on it.
_WRITERS: dict[str, threading.RLock] = {}
_WRITERS_LOCK = threading.Lock()


def _writer(path: str) -> threading.RLock:
    key = os.path.realpath(path)
    with _WRITERS_LOCK:
        return _WRITERS.setdefault(key, threading.RLock())


class SqliteDialect:
    """The Dialect of a SQLite file (``_base.Dialect``)."""

    name = "sqlite"

    def __init__(self, url: sa.URL, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> None:
        self.url = url
        self.busy_timeout_s = busy_timeout_s
        in_memory = url.database in (None, "", ":memory:")
        # An in-memory store is one connection per thread, each its own database.
        self._writer = None if in_memory else _writer(url.database or "")

    def engine(self) -> sa.Engine:
        in_memory = self.url.database in (None, "", ":memory:")
        engine = sa.create_engine(
            self.url,
            connect_args={"timeout": self.busy_timeout_s},
            # A worker advancing N workflows at once holds up to 2N connections of a
            # file (each advance and its heartbeat), more while writers wait out a
            # lock: the pool must not be what fails first. Overflow connections close
            # when returned. (An in-memory store is one connection per thread.)
            **({} if in_memory else {"pool_size": 5, "max_overflow": 100}),
        )
        busy_ms = max(0, round(self.busy_timeout_s * 1000))

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
            # On the driver's connection: the statement needs none of
            # SQLAlchemy's execution machinery, which cost a sixth of a commit.
            driver = conn.connection.driver_connection
            assert driver is not None  # a connection in a transaction has its sqlite3 one
            driver.execute("BEGIN" if reading else "BEGIN IMMEDIATE")

        return engine

    def unavailable(self, exc: BaseException) -> str | None:
        if isinstance(exc, sa.exc.TimeoutError):
            return f"no connection free within the pool's timeout: {exc}"
        if not isinstance(exc, sa.exc.DatabaseError | sqlite3.DatabaseError):
            return None
        reason = str(getattr(exc, "orig", None) or exc).strip()
        return reason if any(words in reason.lower() for words in _UNAVAILABLE) else None

    def insert(self, table: sa.Table) -> Any:
        return sqlite.insert(table)

    @contextmanager
    def writing(self) -> Iterator[None]:
        # SQLite's busy handler sleeps in growing steps (up to 100 ms) and looks
        # again only then: a writer waiting on another thread of this process
        # would wake long after the lock came free, and 16 threads of a worker
        # spent more time asleep in it than writing. On this lock they queue
        # and the next goes the moment the last commits; other processes still
        # meet in the busy handler. (Re-entrant: a writing transaction begun
        # inside another waits in SQLite, as it did before, not here forever.)
        lock = self._writer
        if lock is None:
            yield
            return
        if not lock.acquire(timeout=max(0.0, self.busy_timeout_s)):
            raise sqlite3.OperationalError("database is locked")
        try:
            yield
        finally:
            lock.release()

    def serialize(self, conn: sa.Connection, key: str) -> None:
        return None  # BEGIN IMMEDIATE: one writing transaction at a time already

    def notify(self, conn: sa.Connection) -> None:
        return None  # every commit moves the other connections' data_version

    def changes(self) -> DataVersionFeed:
        return DataVersionFeed(self.url.database or "")


class DataVersionFeed:
    """A ChangeFeed that looks at ``PRAGMA data_version`` every ``look_s`` seconds,
    on a connection of its own (an in-memory store has nothing to watch: it only
    sleeps out the timeout)."""

    def __init__(self, path: str, look_s: float = FEED_LOOK_S) -> None:
        self.look_s = look_s
        self._conn: sqlite3.Connection | None = None
        self._seen: int | None = None
        if path and path != ":memory:":
            try:
                self._conn = sqlite3.connect(path, timeout=0, check_same_thread=False)
                self._seen = self._version()
            except sqlite3.Error:
                self._conn = None

    def _version(self) -> int | None:
        if self._conn is None:
            return None
        try:
            return int(self._conn.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.Error:
            return None

    def wait(self, timeout_s: float, stop: threading.Event | None = None) -> bool:
        stop = stop or threading.Event()
        deadline = time.monotonic() + timeout_s
        while True:
            version = self._version()
            if version is None and self._conn is not None:
                stop.wait(max(0.0, deadline - time.monotonic()))
                return True  # cannot look: the caller looks at the store itself
            if version is not None and version != self._seen:
                self._seen = version
                return True
            left = deadline - time.monotonic()
            if left <= 0 or stop.is_set():
                return False
            if stop.wait(min(self.look_s, left)):
                return False

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
