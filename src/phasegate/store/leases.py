"""Leases: which worker advances a workflow, until when, under which fence."""

from __future__ import annotations

import os
from datetime import timedelta

import sqlalchemy as sa

from phasegate.contract import WorkflowNotFound
from phasegate.store import tables as t
from phasegate.store._base import StoreBase, _utc


class LeaseRows(StoreBase):
    """A workflow's lease: owner, expiry and fencing counter."""

    def claim(self, workflow_id: str, owner: str, ttl_s: float) -> int | None:
        """Take the workflow's lease for ``ttl_s`` seconds; returns the new fence or None.

        A lease is free when it has no owner, has expired, or belongs to
        ``owner`` already. A holder on this host whose process is gone (a
        SIGKILLed worker) no longer holds it, so a restart need not wait.
        """
        now = self.clock.now()
        c = t.workflows.c
        with self.transaction() as conn:
            row = conn.execute(
                sa.select(c.lease_owner, c.lease_expires_at, c.fence).where(c.id == workflow_id)
            ).first()
            if row is None:
                raise WorkflowNotFound(workflow_id)
            holder, expires, fence = row[0], _utc(row[1]), row[2]
            free = holder is None or holder == owner or expires is None or expires <= now
            if not free and not _holder_alive(holder):
                free = True
            if not free:
                return None
            conn.execute(
                t.workflows.update()
                .where(c.id == workflow_id)
                .values(
                    lease_owner=owner,
                    lease_expires_at=now + timedelta(seconds=ttl_s),
                    fence=fence + 1,
                )
            )
            return fence + 1

    def renew(self, workflow_id: str, owner: str, fence: int, ttl_s: float) -> bool:
        c = t.workflows.c
        with self.transaction() as conn:
            return bool(
                conn.execute(
                    t.workflows.update()
                    .where(c.id == workflow_id, c.lease_owner == owner, c.fence == fence)
                    .values(lease_expires_at=self.clock.now() + timedelta(seconds=ttl_s))
                ).rowcount
            )

    def release(self, workflow_id: str, owner: str) -> None:
        c = t.workflows.c
        with self.transaction() as conn:
            conn.execute(
                t.workflows.update()
                .where(c.id == workflow_id, c.lease_owner == owner)
                .values(lease_owner=None, lease_expires_at=None)
            )


def _holder_alive(holder: str) -> bool:
    """Whether the lease holder ``host:pid:...`` may still be running.

    Only a holder on this host can be checked; any other is assumed alive
    until its lease expires.
    """
    parts = holder.split(":")
    if len(parts) < 2 or parts[0] != os.uname().nodename or not parts[1].isdigit():
        return True
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
