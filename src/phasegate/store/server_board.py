"""The board of a PostgreSQL store read with psycopg alone: what ``status`` lists.

As ``sqlite_board`` does for a file, and for the same reason: SQLAlchemy's import
costs ``status`` more than its reads. The same SQL as the SQLite board's, with
psycopg's placeholders; rows in the shapes the Store returns. For a URL with a
query only phasegate reads (``busy_timeout``), a schema not at
``HEAD_REVISION`` or a server that does not answer, ``open_server_board``
returns None and the caller opens the Store, which says what is wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from phasegate.clock import Clock, SystemClock
from phasegate.store.sqlite_board import BoardUnreadable, SqliteBoard
from phasegate.store.values import HEAD_REVISION

__all__ = ["ServerBoard", "open_server_board"]

#: Seconds to wait for the server before the caller tries the Store.
CONNECT_TIMEOUT_S = 5


def open_server_board(url: str, clock: Clock | None = None) -> ServerBoard | None:
    """The board of the PostgreSQL store at ``url`` (``postgresql://`` or
    ``postgres://``, the cartridge's ``store.url``), or None when only the Store
    can read it (see the module's docstring)."""
    if not url.startswith(("postgresql://", "postgres://")) or "busy_timeout" in url:
        return None
    board = ServerBoard(url, clock or SystemClock())
    try:
        if board.revision() == HEAD_REVISION:
            return board
    except BoardUnreadable:
        pass
    board.close()
    return None


class _Row(tuple):  # type: ignore[type-arg]  # values of any column type
    """A row read by name or by place, as ``sqlite3.Row`` is."""

    names: tuple[str, ...] = ()

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return super().__getitem__(self.names.index(key))
        return super().__getitem__(key)

    def keys(self) -> list[str]:
        return list(self.names)


class ServerBoard(SqliteBoard):
    """Reads of one PostgreSQL store through one connection (``close`` it): the
    SQLite board's methods, on a server."""

    def __init__(self, url: str, clock: Clock) -> None:
        super().__init__(Path(), clock)  # a path: there is a store to read
        self.url = url
        self._server: Any = None

    def _rows(self, sql: str, parameters: Any) -> list[Any]:
        import psycopg

        try:
            if self._server is None:
                self._server = psycopg.connect(
                    self.url, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True
                )
            with self._server.cursor(row_factory=_row_factory) as cursor:
                cursor.execute(sql.replace("?", "%s"), parameters)
                return list(cursor.fetchall())
        except psycopg.Error as exc:
            raise BoardUnreadable(f"the server: {' '.join(str(exc).split())}") from None

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


def _row_factory(cursor: Any) -> Any:
    names = tuple(c.name for c in cursor.description or ())
    shaped = type("Row", (_Row,), {"names": names})

    def make(values: Sequence[Any]) -> _Row:
        return shaped(values)  # type: ignore[no-any-return]

    return make
