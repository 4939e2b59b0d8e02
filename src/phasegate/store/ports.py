"""The port ranges reserved for workflows' worktrees: reserved once, never overlapping, released.

A range belongs to its workflow, not to the worker that reserved it: a worker
that crashes leaves it with the workflow, and whichever worker carries the
workflow on uses the same ports. Reservations are serialized across every
worker sharing the store (``Dialect.serialize``), so two never overlap.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa

from phasegate.core.contract import ENDED_STATUSES, EventWrite, PhasegateError
from phasegate.store import tables as t
from phasegate.store._base import StoreBase

__all__ = ["RESERVED_EVENT", "PortRows", "PortsUnavailable", "release"]

#: The event a new reservation adds to its workflow's stream: ``{"base", "count", "host"}``.
RESERVED_EVENT = "ports_reserved"


class PortsUnavailable(PhasegateError):
    """No range of the ports asked for is free, in the store and on this machine;
    the message names ``landing_areas.ports``."""


class PortRows(StoreBase):
    """``port_reservations``: one range per workflow."""

    def reserve_ports(
        self,
        workflow_id: str,
        count: int,
        *,
        host: str,
        free: Callable[[int, int], bool],
        span: tuple[int, int],
    ) -> tuple[int, int]:
        """The workflow's range ``(base, count)``: the one it holds when it has
        ``count`` ports, else the lowest range in ``span`` (``[first, end)``) that
        overlaps no live reservation and that ``free(base, count)`` (a bind test
        on ``host``, this machine) finds free, reserved now.

        A new range is a ``ports_reserved`` event of the workflow, in the same
        transaction. Ranges of ended or deleted workflows are released in it
        too, so a workflow that ended outside the commit path frees its ports.
        Raises PortsUnavailable, StoreUnavailable.
        """
        reservations, workflows = t.port_reservations.c, t.workflows.c
        with self.transaction() as conn:
            self.dialect.serialize(conn, "port_reservations")
            held = conn.execute(
                sa.select(reservations.base, reservations.port_count).where(
                    reservations.workflow_id == workflow_id
                )
            ).first()
            if held is not None and held.port_count == count:
                return int(held.base), int(held.port_count)
            live = sa.select(workflows.id).where(workflows.status.not_in(sorted(ENDED_STATUSES)))
            conn.execute(
                t.port_reservations.delete().where(
                    sa.or_(
                        reservations.workflow_id == workflow_id,
                        reservations.workflow_id.not_in(live),
                    )
                )
            )
            taken = sorted(
                (int(r.base), int(r.port_count))
                for r in conn.execute(sa.select(reservations.base, reservations.port_count))
            )
            base = _first_free(taken, count, span, free)
            if base is None:
                raise PortsUnavailable(
                    f"landing_areas.ports: no range of {count} free ports in "
                    f"{span[0]}-{span[1] - 1} ({len(taken)} held by live workflows; "
                    "the rest are in use on this machine)"
                )
            conn.execute(
                t.port_reservations.insert().values(
                    workflow_id=workflow_id,
                    base=base,
                    port_count=count,
                    host=host[:255],
                    reserved_at=self.clock.now(),
                )
            )
            said = {"base": base, "count": count, "host": host}
            self.write_event(conn, workflow_id, EventWrite(RESERVED_EVENT, said))
        return base, count

    def release_ports(self, workflow_id: str) -> bool:
        """Release the workflow's range; whether it held one. Raises StoreUnavailable."""
        with self.transaction() as conn:
            return release(conn, workflow_id)

    def reserved_ports(self, workflow_id: str) -> tuple[int, int] | None:
        """The workflow's range ``(base, count)``, or None."""
        c = t.port_reservations.c
        with self.reading() as conn:
            row = conn.execute(
                sa.select(c.base, c.port_count).where(c.workflow_id == workflow_id)
            ).first()
        return None if row is None else (int(row.base), int(row.port_count))


def release(conn: sa.Connection, workflow_id: str) -> bool:
    """Release the workflow's range in the caller's transaction (the commit that ends
    the workflow uses it); whether it held one."""
    reserved = t.port_reservations.c.workflow_id == workflow_id
    return bool(conn.execute(t.port_reservations.delete().where(reserved)).rowcount)


def _first_free(
    taken: list[tuple[int, int]],
    count: int,
    span: tuple[int, int],
    free: Callable[[int, int], bool],
) -> int | None:
    """The lowest base in ``span`` whose ``count`` ports overlap no range of
    ``taken`` (sorted by base) and pass ``free``; None when there is none."""
    base, end = span
    while base + count <= end:
        clash = next((b + n for b, n in taken if b < base + count and base < b + n), None)
        if clash is not None:
            base = clash  # past the range in the way
        elif free(base, count):
            return base
        else:
            base += count  # something on the machine holds a port of it
    return None
