"""What webhooks write: the deliveries seen, and the workflows a delivery wakes."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

import sqlalchemy as sa

from phasegate.core.contract import RUNNABLE_STATUSES
from phasegate.store import tables as t
from phasegate.store._base import StoreBase, utc
from phasegate.store.values import WOKEN_AT

__all__ = ["WebhookRows"]


class WebhookRows(StoreBase):
    """Deliveries by their body's digest (a replay is refused), and wake-ups."""

    def record_delivery(
        self,
        digest: str,
        *,
        forge: str,
        delivery: str | None,
        event: str,
        repository: str,
        keep_s: float,
    ) -> bool:
        """Record a delivery whose body has SHA-256 ``digest``; False when that body
        was recorded before (a replay). Deliveries older than ``keep_s`` seconds
        are dropped in the same transaction. Raises StoreUnavailable."""
        now = self.clock.now()
        row = {
            "digest": digest,
            "forge": forge,
            "delivery": (delivery or "")[:255] or None,
            "event": event[:64],
            "repository": repository[:255],
            "received_at": now,
        }
        deliveries = t.webhook_deliveries
        with self.transaction() as conn:
            old = deliveries.c.received_at < now - timedelta(seconds=keep_s)
            conn.execute(deliveries.delete().where(old))
            insert = self.dialect.insert(deliveries).values(**row)
            added = conn.execute(insert.on_conflict_do_nothing(index_elements=["digest"]))
        return bool(added.rowcount)

    def last_delivery_at(self, repository: str) -> datetime | None:
        """When the newest delivery for ``repository`` (owner/name) arrived, or None."""
        c = t.webhook_deliveries.c
        query = sa.select(sa.func.max(c.received_at)).where(c.repository == repository)
        with self.reading() as conn:
            return utc(conn.execute(query).scalar())

    def wake(
        self, repository: str, numbers: Iterable[int] = (), branches: Iterable[str] = ()
    ) -> list[str]:
        """Make due now the runnable workflows of ``repository`` (owner/name) whose
        issue or pull request is one of ``numbers`` or whose branch is one of
        ``branches`` (``WOKEN_AT``: a wait their running advance commits keeps them
        due), and tell the workers; their ids, sorted. Raises StoreUnavailable."""
        numbers, branches = sorted(set(numbers)), sorted(set(branches))
        if not numbers and not branches:
            return []
        c = t.workflows.c
        which = sa.and_(
            c.repository == repository,
            c.status.in_(sorted(RUNNABLE_STATUSES)),
            sa.or_(
                c.issue_number.in_(numbers), c.pr_number.in_(numbers), c.branch_name.in_(branches)
            ),
        )
        with self.transaction() as conn:
            ids = sorted(conn.execute(sa.select(c.id).where(which)).scalars())
            if ids:
                woken = t.workflows.update().where(c.id.in_(ids)).values(due_at=WOKEN_AT)
                conn.execute(woken)
                self.dialect.notify(conn)
        return ids
