"""The board of a SQLite store read with the standard library: what ``status`` lists.

``status`` should answer like any command-line tool, and importing SQLAlchemy alone
costs it more than the rest of its work. ``open_board`` reads the workflows, their
usage, their pending proposals and their children straight from the file, in the
shapes the Store returns, while the schema is at ``HEAD_REVISION``. For anything
else (a server URL, a store still to migrate, a path it does not parse) it returns
None and the caller opens the Store; a read that fails raises ``BoardUnreadable``,
so the caller can do the same.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from phasegate.clock import Clock, SystemClock
from phasegate.config.store_url import sqlite_file
from phasegate.store.values import (
    EDGES_ORDER,
    EDGES_SQL,
    FINISHED_GROUPS,
    HEAD_REVISION,
    UsageTotals,
    edge_row,
)

#: The columns SQLAlchemy decodes (timestamps, JSON, booleans), by table; every
#: other column is read as SQLite stores it. A test checks these against the tables.
DECODED: dict[str, dict[str, str]] = {
    "workflows": {
        "created_at": "timestamp",
        "updated_at": "timestamp",
        "completed_at": "timestamp",
        "lease_expires_at": "timestamp",
        "due_at": "timestamp",
        "state": "json",
        "auto_merge": "boolean",
    },
    "proposals": {
        "decided_at": "timestamp",
        "created_at": "timestamp",
        "payload": "json",
        "evidence": "json",
        "paths": "json",
        "self_modification": "boolean",
    },
}


#: The most ids one IN list holds (SQLite allows 32,766 parameters at the most).
_IN_LIST_MAX = 500


class BoardUnreadable(Exception):
    """The file could not be read as a store at ``HEAD_REVISION``: open the Store."""


def open_board(url: str, clock: Clock | None = None) -> SqliteBoard | None:
    """The board of the SQLite store at ``url`` (``sqlite:///path``, the cartridge's
    ``store_url``), or None when only the Store can read it: not a plain SQLite file
    URL, or a file whose schema is not at ``HEAD_REVISION``. A file that does not
    exist yet is an empty board, and is not created."""
    path = _sqlite_path(url)
    if path is None:
        return None
    board = SqliteBoard(path if path.exists() else None, clock or SystemClock())
    try:
        if board.revision() == HEAD_REVISION:
            return board
    except BoardUnreadable:
        pass
    board.close()
    return None


def _sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///path[?query]`` URL; None for any other URL, an
    in-memory one, or a path with what a URL would escape."""
    path = sqlite_file(url)
    if path is None or "%" in path:
        return None
    return Path(path)


class SqliteBoard:
    """Reads of one SQLite store through one read-only connection (``close`` it):
    the same rows and sums as the Store's methods of the same names."""

    def __init__(self, path: Path | None, clock: Clock) -> None:
        self.path = path  # None: no store yet, so nothing to list
        self.clock = clock
        self._conn: sqlite3.Connection | None = None

    def revision(self) -> str | None:
        """The schema's revision (``HEAD_REVISION`` for an empty board)."""
        if self.path is None:
            return HEAD_REVISION
        rows = self._rows("SELECT version_num FROM alembic_version", ())
        return rows[0]["version_num"] if rows else None

    def list_workflows(self) -> list[dict[str, Any]]:
        """Every workflow row, oldest first."""
        rows = self._rows("SELECT * FROM workflows ORDER BY created_at, id", ())
        return [_decoded("workflows", r) for r in rows]

    def board_rows(self, finished_shown: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """Every workflow not finished and the newest ``finished_shown`` of each
        finished group, oldest first, and each finished group's count: the
        Store's ``board_rows``, read the same way (status by status, by index)."""
        counts = {
            status: int(n)
            for status, n in self._rows(
                "SELECT status, count(*) FROM workflows GROUP BY status", ()
            )
        }
        finished = {s for group in FINISHED_GROUPS.values() for s in group}
        open_ = sorted(set(counts) - finished)
        marks = ", ".join("?" for _ in open_)
        rows = (
            self._rows(f"SELECT * FROM workflows WHERE status IN ({marks})", open_) if open_ else []
        )
        totals: dict[str, int] = {}
        for group, statuses in FINISHED_GROUPS.items():
            totals[group] = sum(counts.get(s, 0) for s in statuses)
            found = [
                r
                for status in sorted(statuses & set(counts))
                for r in self._rows(
                    "SELECT * FROM workflows WHERE status = ?"
                    " ORDER BY created_at DESC, id DESC LIMIT ?",
                    (status, finished_shown),
                )
            ]
            found.sort(key=lambda r: (r["created_at"], r["id"]), reverse=True)
            rows += found[:finished_shown]
        shaped = [_decoded("workflows", r) for r in rows]
        shaped.sort(key=lambda r: (r["created_at"], r["id"]))
        return shaped, totals

    def child_workflows(self, parent_workflow_id: str) -> list[dict[str, Any]]:
        """The rows of the workflows forked from ``parent_workflow_id``, oldest first."""
        rows = self._rows(
            "SELECT * FROM workflows WHERE parent_workflow_id = ? ORDER BY created_at, id",
            (parent_workflow_id,),
        )
        return [_decoded("workflows", r) for r in rows]

    def usage_totals(self, workflow_id: str) -> UsageTotals:
        """Sums of tokens and cost over the workflow's agent runs."""
        rows = self._rows(
            "SELECT coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0),"
            " coalesce(sum(cost_usd), 0.0), count(*)"
            " FROM agent_runs WHERE workflow_id = ?",
            (workflow_id,),
        )
        if not rows:  # no store yet
            return UsageTotals()
        i, o, c, n = rows[0]
        return UsageTotals(int(i), int(o), float(c), int(n))

    def usage_by_workflow(
        self, workflow_ids: Collection[str] | None = None
    ) -> dict[str, UsageTotals]:
        """Sums of tokens and cost over the agent runs of each of ``workflow_ids``
        (None: every workflow), a workflow without runs absent: the Store's
        ``usage_by_workflow``."""
        sql = (
            "SELECT workflow_id, coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0),"
            " coalesce(sum(cost_usd), 0.0), count(*) FROM agent_runs"
        )
        if workflow_ids is None:
            rows = self._rows(f"{sql} GROUP BY workflow_id", ())
        else:
            ids = sorted(workflow_ids)
            rows = []
            for start in range(0, len(ids), _IN_LIST_MAX):
                part = ids[start : start + _IN_LIST_MAX]
                marks = ", ".join("?" for _ in part)
                rows += self._rows(
                    f"{sql} WHERE workflow_id IN ({marks}) GROUP BY workflow_id", part
                )
        return {w: UsageTotals(int(i), int(o), float(c), int(n)) for w, i, o, c, n in rows}

    def child_rows(self) -> list[dict[str, Any]]:
        """Every conflict child as ``id``, ``status``, ``parent_workflow_id``, oldest first."""
        rows = self._rows(
            "SELECT id, status, parent_workflow_id FROM workflows"
            " WHERE parent_workflow_id IS NOT NULL ORDER BY created_at, id",
            (),
        )
        return [dict(r) for r in rows]

    def dependencies(self, workflow_id: str) -> list[dict[str, Any]]:
        """What ``workflow_id`` waits for (``values.edge_row``), as the Store gives it."""
        rows = self._rows(f"{EDGES_SQL} WHERE d.workflow_id = ?{EDGES_ORDER}", (workflow_id,))
        return [edge_row(dict(r)) for r in rows]

    def dependency_rows(self) -> list[dict[str, Any]]:
        """Every edge (``values.edge_row``), as the Store gives them."""
        return [edge_row(dict(r)) for r in self._rows(f"{EDGES_SQL}{EDGES_ORDER}", ())]

    def proposals(
        self, status: str | None = None, workflow_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Proposal rows, oldest first; of ``status`` and ``workflow_id`` when given."""
        clauses, values = [], []
        for column, value in (("status", status), ("workflow_id", workflow_id)):
            if value is not None:
                clauses.append(f"{column} = ?")
                values.append(value)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"SELECT * FROM proposals{where} ORDER BY created_at, run_id, position"
        return [_decoded("proposals", r) for r in self._rows(sql, values)]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _rows(self, sql: str, parameters: Any) -> list[sqlite3.Row]:
        if self.path is None:
            return []
        try:
            if self._conn is None:
                uri = f"file:{quote(str(self.path))}?mode=ro"
                self._conn = sqlite3.connect(uri, uri=True, timeout=5.0)
                self._conn.row_factory = sqlite3.Row
            return self._conn.execute(sql, parameters).fetchall()
        except sqlite3.Error as exc:
            raise BoardUnreadable(f"{self.path}: {exc}") from None


def _decoded(table: str, row: Any) -> dict[str, Any]:
    """``row`` as the Store returns it: timestamps UTC-aware, JSON parsed, booleans."""
    kinds = DECODED[table]
    out: dict[str, Any] = {}
    for key, value in zip(row.keys(), row, strict=True):
        kind = kinds.get(key)
        if value is None or kind is None:
            out[key] = value
        elif kind == "timestamp":
            # SQLite keeps text; a server's driver gives a datetime already.
            when = value if isinstance(value, datetime) else datetime.fromisoformat(value)
            out[key] = when if when.tzinfo else when.replace(tzinfo=UTC)
        elif kind == "json":
            out[key] = json.loads(value) if isinstance(value, str) else value
        else:
            out[key] = bool(value)
    return out
