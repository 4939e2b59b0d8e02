"""The store's plain values, loaded without SQLAlchemy: what ``status`` needs to
read a SQLite store by itself (``sqlite_board``) and what the Store returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

#: The newest migration's revision (``migrations/versions``): a store already there
#: opens without importing Alembic, and ``status`` reads a SQLite store there without
#: SQLAlchemy. A test checks it against Alembic's own head.
HEAD_REVISION = "0014"

#: The scope of the budget over every repository of the store (``store.budgets``).
STORE_SCOPE = "*"

#: What ``costs`` groups by (``store.budgets``).
COST_GROUPS = ("repository", "model", "role", "day", "workflow")

#: What a person of the dashboard may do, each role all the one before it may
#: (``users.role``): viewers see, approvers decide, admins also manage people.
USER_ROLES = ("viewer", "approver", "admin")

#: ``workflows.due_at`` of a workflow a webhook woke: due now, like NULL, and kept
#: due by the next wait its running advance commits (``commit_phase_result``,
#: ``schedule``), which would otherwise put its next look minutes away.
WOKEN_AT = datetime(1970, 1, 1, tzinfo=UTC)


#: The board's finished groups and the statuses in each: a workflow there moves no
#: more without a person, and a board shows only the newest of them.
FINISHED_GROUPS: dict[str, frozenset[str]] = {
    "done": frozenset({"completed", "cancelled"}),
    "failed": frozenset({"failed"}),
}


@dataclass(frozen=True)
class UsageTotals:
    """Sums over a workflow's agent runs: tokens, cost in USD, runs counted."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    runs: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


#: The edges of ``workflow_dependencies`` with the status of what each waits for, as
#: SQL both the Store (``store.dependencies``) and ``sqlite_board`` read them by.
EDGES_SQL = (
    "SELECT d.workflow_id, d.depends_on, d.kind, d.position, d.issue_repository,"
    " d.issue_number, w.status, w.title, w.issue_number AS target_issue"
    " FROM workflow_dependencies d LEFT JOIN workflows w ON w.id = d.depends_on"
)
EDGES_ORDER = " ORDER BY d.workflow_id, d.kind, d.position, d.id"


def edge_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """One edge of ``workflow_dependencies`` as ``show`` and ``status --json`` give it:
    the waiting ``workflow_id``, what it ``depends_on`` (None: the forge ``issue``
    ``owner/name#N`` has no workflow yet), ``kind`` (after, piece), a piece's
    ``position``, and the ``status``, ``title`` and ``issue_number`` of the workflow
    it waits for."""
    issue = None
    if row["issue_number"] is not None:
        issue = f"{row['issue_repository']}#{row['issue_number']}"
    return {
        "workflow_id": row["workflow_id"],
        "depends_on": row["depends_on"],
        "kind": row["kind"],
        "position": row["position"],
        "issue": issue,
        "status": row["status"],
        "title": row["title"],
        "issue_number": row["target_issue"],
    }
