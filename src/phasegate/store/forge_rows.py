"""The local forge's rows: issues, pull requests and comments kept in the store."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from phasegate.store import tables as t
from phasegate.store._base import StoreBase


class ForgeRows(StoreBase):
    """Issues, pull requests and comments of the local forge."""

    def forge_next_number(self, conn: sa.Connection, repo: str) -> int:
        """The repository's next issue/PR number, held for ``conn``'s transaction:
        a second writer numbering in ``repo`` waits until this one commits (on
        PostgreSQL's READ COMMITTED two would otherwise read one maximum)."""
        # Issues and pull requests share one number space, as on GitHub.
        self.dialect.serialize(conn, f"forge-number:{repo}")
        highest = 0
        for table in (t.forge_issues, t.forge_pull_requests):
            value = conn.execute(
                sa.select(sa.func.max(table.c.number)).where(table.c.repo == repo)
            ).scalar()
            highest = max(highest, value or 0)
        return highest + 1

    def forge_insert(self, table: sa.Table, repo: str, **values: Any) -> int:
        """Insert an issue or pull request with the repo's next number; returns it."""
        with self.transaction() as conn:
            number = self.forge_next_number(conn, repo)
            conn.execute(
                table.insert().values(
                    repo=repo, number=number, created_at=self.clock.now(), **values
                )
            )
        return number

    def forge_rows(self, table: sa.Table, repo: str, **where: Any) -> list[dict[str, Any]]:
        with self.reading() as conn:
            query = sa.select(table).where(table.c.repo == repo)
            for key, value in where.items():
                query = query.where(table.c[key] == value)
            return [dict(r) for r in conn.execute(query.order_by(table.c.id)).mappings()]

    def forge_update(self, table: sa.Table, repo: str, number: int, **values: Any) -> None:
        with self.transaction() as conn:
            conn.execute(
                table.update()
                .where(table.c.repo == repo, table.c.number == number)
                .values(**values)
            )

    def forge_add_comment(self, repo: str, issue_number: int, body: str, marker: str | None) -> int:
        with self.transaction() as conn:
            key = conn.execute(
                t.forge_comments.insert().values(
                    repo=repo,
                    issue_number=issue_number,
                    body=body,
                    marker=marker,
                    created_at=self.clock.now(),
                )
            ).inserted_primary_key
            assert key is not None  # an INSERT of one row always has its key
            return int(key[0])
