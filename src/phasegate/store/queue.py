"""The queue's rows: workflows' priorities, the caps a person set, and agent slots
held across workers.

An agent slot is a store-backed semaphore (docs/queues.md). A call counts
against up to three caps (its model provider's, its runner's, its
repository's); ``acquire_slots`` takes one row for each, in one writing
transaction that first counts the rows held under each cap and the calls
waiting ahead (a waiting call has rows too, marked ``waiting``: free slots go
to the larger priority first, then to the call waiting longer). The count and the
insert are one step for every worker sharing the store: on PostgreSQL a
transaction advisory lock (``Dialect.serialize``) orders them, on SQLite the
single writer (``BEGIN IMMEDIATE``) does. A row holds its slot until it is
released, its ``expires_at`` (the workflow's lease expiry, renewed with the
lease: ``LeaseRows.renew``) passes, or its holder is a process of this host
that is gone (``holder_alive``): a SIGKILLed worker's slots come back within
its lease, at once on its own host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from phasegate.core.contract import EventWrite, WorkflowNotFound
from phasegate.proc.host import holder_alive
from phasegate.store import tables as t
from phasegate.store._base import StoreBase, utc, utc_row

__all__ = ["QueueRows", "SlotNeed"]

_s = t.agent_slots.c
_w = t.workflows.c

#: The one lock every acquisition takes on PostgreSQL: the count and the insert of
#: two workers never interleave (calls last seconds: the lock is held for one of
#: their transactions, milliseconds).
_SLOTS_LOCK = "phasegate:agent_slots"


#: The slot rows as a count reads them: held or waiting, by whom, until when.
_SLOTS_HELD = sa.select(
    _s.scope,
    _s.key,
    _s.call_id,
    _s.holder,
    _s.expires_at,
    _s.waiting,
    _s.priority,
    _s.acquired_at,
    _s.cap,
)


@dataclass(frozen=True)
class SlotNeed:
    """One cap a call counts against: its ``scope`` (provider, runner or repository),
    the ``key`` within it (``anthropic``, ``claude-code``, ``owner/name``) and the
    ``cap`` (the most calls of that key at once, at least 1)."""

    scope: str
    key: str
    cap: int

    def as_dict(self) -> dict[str, Any]:
        return {"scope": self.scope, "key": self.key, "cap": self.cap}


class QueueRows(StoreBase):
    """Priorities, the store's caps and the agent slots held now."""

    # -- priorities -----------------------------------------------------------------

    def set_priority(self, workflow_id: str, priority: int, event: EventWrite) -> dict[str, Any]:
        """Set the workflow's ``priority`` and add ``event`` (a person's decision) in one
        transaction; returns the row. The workflow's version is not moved: a priority
        orders claims only, and a waiting workflow's look is not made due by it.
        Other workers are told (a free thread may claim by it now). Raises
        WorkflowNotFound, StoreUnavailable."""
        with self.transaction() as conn:
            changed = conn.execute(
                t.workflows.update().where(_w.id == workflow_id).values(priority=priority)
            ).rowcount
            if not changed:
                raise WorkflowNotFound(workflow_id)
            self.write_event(conn, workflow_id, event)
            self.dialect.notify(conn)
        with self.reading() as conn:
            row = conn.execute(sa.select(t.workflows).where(_w.id == workflow_id)).mappings().one()
        return utc_row(row)

    def queue_facts(self, workflow_id: str) -> tuple[str, int]:
        """What the workflow's calls are queued by: the key its repository cap is
        counted by (its team forge repository, ``owner/name``, else the path of the
        clone it was started in) and its priority. Raises WorkflowNotFound."""
        with self.reading() as conn:
            row = conn.execute(
                sa.select(_w.repository, _w.repo_path, _w.priority).where(_w.id == workflow_id)
            ).first()
        if row is None:
            raise WorkflowNotFound(workflow_id)
        return str(row[0] or row[1]), int(row[2] or 0)

    # -- the store's caps -----------------------------------------------------------

    def queue_caps(self) -> dict[tuple[str, str], int]:
        """The caps a person set in the store: (scope, key) → the most calls at once."""
        c = t.queue_caps.c
        with self.reading() as conn:
            rows = conn.execute(sa.select(c.scope, c.key, c.cap)).all()
        return {(str(r[0]), str(r[1])): int(r[2]) for r in rows}

    def queue_cap_rows(self) -> list[dict[str, Any]]:
        """The store's caps as rows (scope, key, cap, set_by, set_at), by scope and key."""
        c = t.queue_caps.c
        with self.reading() as conn:
            rows = conn.execute(sa.select(t.queue_caps).order_by(c.scope, c.key)).mappings()
            return [utc_row(r) for r in rows]

    def set_queue_cap(self, scope: str, key: str, cap: int | None, by: str) -> bool:
        """Set (``cap``) or remove (None) the store's cap on ``scope``'s ``key``; a
        waiting call looks again (``Dialect.notify``). Returns False when there was
        no cap to remove (nothing changed). Raises StoreUnavailable."""
        c = t.queue_caps.c
        with self.transaction() as conn:
            if cap is None:
                gone = conn.execute(t.queue_caps.delete().where(c.scope == scope, c.key == key))
                if not gone.rowcount:
                    return False
            else:
                now = self.clock.now()
                conn.execute(
                    self.dialect.insert(t.queue_caps)
                    .values(scope=scope, key=key, cap=cap, set_by=by, set_at=now)
                    .on_conflict_do_update(
                        index_elements=["scope", "key"],
                        set_={"cap": cap, "set_by": by, "set_at": now},
                    )
                )
            self.dialect.notify(conn)
        return True

    # -- slots ----------------------------------------------------------------------

    def acquire_slots(
        self,
        needs: Sequence[SlotNeed],
        *,
        call_id: str,
        holder: str,
        workflow_id: str,
        role: str,
        ttl_s: float,
        priority: int = 0,
    ) -> SlotNeed | None:
        """Take one slot under each of ``needs`` for the call ``call_id``, all or none;
        None when taken, else the first need it must wait for (nothing taken).

        A need must wait when its cap's live slots are all held, or when the free
        ones go to calls waiting ahead of this one: waiting calls of a larger
        ``priority`` (the workflow's) first, then those waiting longer. A call
        that must wait is recorded waiting (a row per need, ``waiting``), so the
        calls after it see it; it stays so until it takes its slots or
        ``release_slots``. Held and waiting rows expire with the workflow's lease
        when ``holder`` holds it (its ``lease_expires_at``; renewed with it), else
        ``ttl_s`` seconds from now; rows that expired or whose holder is gone
        (``holder_alive``) are deleted first. A look that finds nothing changed
        for a call already waiting reads only. Raises StoreUnavailable."""
        if not needs:
            return None
        blocked, waiting = self._blocked(needs, call_id, priority, write=None)
        if blocked is not None and waiting:
            return blocked
        with self.transaction() as conn:
            self.dialect.serialize(conn, _SLOTS_LOCK)
            # Read under the lock, the moments of the calls that take slots follow their order.
            now = self.clock.now()
            blocked, waiting = self._blocked(needs, call_id, priority, write=conn)
            if blocked is not None and waiting:
                return blocked
            lease = conn.execute(
                sa.select(_w.lease_expires_at).where(_w.id == workflow_id, _w.lease_owner == holder)
            ).scalar()
            expires = utc(lease)
            if expires is None or expires <= now:
                expires = now + timedelta(seconds=ttl_s)
            conn.execute(t.agent_slots.delete().where(_s.call_id == call_id))
            conn.execute(
                t.agent_slots.insert(),
                [
                    {
                        "scope": n.scope,
                        "key": n.key,
                        "call_id": call_id,
                        "holder": holder,
                        "workflow_id": workflow_id,
                        "role": role,
                        "acquired_at": now,
                        "expires_at": expires,
                        "waiting": blocked is not None,
                        "priority": priority,
                        "cap": n.cap,
                    }
                    for n in needs
                ],
            )
        return blocked

    def _blocked(
        self,
        needs: Sequence[SlotNeed],
        call_id: str,
        priority: int,
        *,
        write: sa.Connection | None,
    ) -> tuple[SlotNeed | None, bool]:
        """The first of ``needs`` the call must wait for, else None; and whether the
        call is recorded waiting already. With ``write`` (a writing transaction),
        the dead rows are deleted first.

        The calls waiting ahead of this one (``_ahead``) are served first, in
        their order: each that would get all its slots from what is free is
        counted as holding them. One that must wait for another cap anyway
        keeps nothing from the calls behind it."""
        now = self.clock.now()
        if write is None:
            with self.reading() as conn:
                rows = conn.execute(_SLOTS_HELD).all()
        else:
            rows = write.execute(_SLOTS_HELD).all()
        gone = {h for h in {r.holder for r in rows} if not holder_alive(h)}
        if write is not None:
            write.execute(
                t.agent_slots.delete().where(
                    sa.or_(_s.expires_at <= now, _s.holder.in_(sorted(gone)))
                )
            )
        live = [r for r in rows if r.holder not in gone and (utc(r.expires_at) or now) > now]
        own = [r for r in live if r.call_id == call_id and r.waiting]
        # A call not waiting yet ranks after every call waiting now at its priority.
        rank = (-priority, utc(own[0].acquired_at) if own else now, call_id)
        taken: dict[tuple[str, str], int] = {}
        ahead: dict[tuple[Any, ...], list[Any]] = {}
        for r in live:
            if r.call_id == call_id:
                continue
            if not r.waiting:
                taken[(r.scope, r.key)] = taken.get((r.scope, r.key), 0) + 1
                continue
            place = (-r.priority, utc(r.acquired_at), r.call_id)
            if place < rank:
                ahead.setdefault(place, []).append(r)
        for place in sorted(ahead):
            waiter = ahead[place]
            if all(taken.get((r.scope, r.key), 0) < r.cap for r in waiter):
                for r in waiter:
                    taken[(r.scope, r.key)] = taken.get((r.scope, r.key), 0) + 1
        blocked = next((n for n in needs if taken.get((n.scope, n.key), 0) >= n.cap), None)
        return blocked, bool(own)

    def release_slots(self, call_id: str) -> None:
        """Give back every slot of the call ``call_id``, and end its wait if it waits;
        waiting calls are told (``Dialect.notify``). Raises StoreUnavailable."""
        with self.transaction() as conn:
            released = conn.execute(t.agent_slots.delete().where(_s.call_id == call_id)).rowcount
            if released:
                self.dialect.notify(conn)

    def slot_rows(self) -> list[dict[str, Any]]:
        """Every slot row (live or not yet cleaned; held, or ``waiting`` for one since
        ``acquired_at``), oldest first, with a ``live`` flag: unexpired and its holder
        not a gone process of this host."""
        now = self.clock.now()
        with self.reading() as conn:
            rows = [
                utc_row(r)
                for r in conn.execute(sa.select(t.agent_slots).order_by(_s.id)).mappings()
            ]
        for row in rows:
            row["live"] = row["expires_at"] > now and holder_alive(row["holder"])
        return rows

    def queued_rows(self, statuses: Sequence[str]) -> list[dict[str, Any]]:
        """The workflows whose status is in ``statuses`` in the order workers claim them
        (priority, larger first, then oldest): id, title, status, phase, priority,
        lease owner and expiry, created_at."""
        query = (
            sa.select(
                _w.id,
                _w.title,
                _w.status,
                _w.current_phase,
                _w.priority,
                _w.lease_owner,
                _w.lease_expires_at,
                _w.repository,
                _w.repo_path,
                _w.created_at,
            )
            .where(_w.status.in_(sorted(statuses)))
            .order_by(_w.priority.desc(), _w.created_at, _w.id)
        )
        with self.reading() as conn:
            return [utc_row(r) for r in conn.execute(query).mappings()]
