"""A person's resume and cancel of a workflow that waits for others (docs/epics.md).

``phasegate.operations`` calls these from ``resume`` and ``cancel``:

- ``resume`` of a parent in ``pieces`` whose pieces failed or were cancelled stops
  waiting for those (``resume_parent``); with none, it is refused.
- ``resume`` of a ``blocked`` workflow drops what it waits for that has not completed;
  ``unfinished`` says what, so a front end prints it.
- ``cancel`` of a parent in ``pieces`` cancels its pieces not ended yet, each under its
  own rules (``cancel_pieces``): a piece a worker advances now is reported, not failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from phasegate.core.contract import CANCELLED, ContractViolation, EventWrite, PhasegateError
from phasegate.runtime.worker import LeaseHeld
from phasegate.store import Store

__all__ = ["cancel_pieces", "resume_parent", "unfinished"]


def unfinished(store: Store, workflow_id: str) -> list[dict[str, Any]]:
    """What the workflow waits for that has not completed (``after`` edges):
    ``{"id", "issue", "status"}`` each (``id`` None for a forge issue with no
    workflow yet): what a resume of a blocked workflow drops."""
    return [
        {"id": e["depends_on"], "issue": e["issue"], "status": e["status"]}
        for e in store.dependencies(workflow_id)
        if e["kind"] == "after" and e["status"] != "completed"
    ]


def resume_parent(
    store: Store, workflow_id: str, event: EventWrite, why: str
) -> list[dict[str, Any]]:
    """Let the epic's parent ``workflow_id`` (status ``pieces``) go on without its
    pieces that failed or were cancelled (``Store.drop_ended_pieces``, with the
    person's decision ``event`` beside); it completes once the pieces left complete, at once
    when they all have. Returns the dropped pieces (``{"id", "status"}``). Raises
    ContractViolation (``why``, the refusal) when no piece ended without completing,
    WorkflowNotFound."""
    dropped = store.drop_ended_pieces(workflow_id, (event,))
    if not dropped:
        raise ContractViolation(why)
    return [{"id": e["depends_on"], "status": e["status"]} for e in dropped]


def cancel_pieces(
    store: Store, parent_id: str, cancel: Callable[[str], Any]
) -> tuple[list[str], list[dict[str, str]]]:
    """Cancel each piece of the epic ``parent_id`` that has not ended, by ``cancel(id)``
    (``operations.cancel``: the piece's own rules). Returns the ids cancelled and the
    pieces not cancelled (``{"id", "reason", "next"}``: a worker advances it now, or
    it ended meanwhile), in their places' order; never raises for one piece."""
    done: list[str] = []
    left: list[dict[str, str]] = []
    for edge in store.dependencies(parent_id):
        piece = edge["depends_on"]
        if edge["kind"] != "piece" or piece is None:
            continue
        if edge["status"] in ("completed", CANCELLED):
            continue
        try:
            cancel(piece)
        except LeaseHeld as held:
            left.append({"id": piece, "reason": str(held), "next": f"phasegate cancel {piece}"})
        except PhasegateError as refused:  # completed meanwhile: nothing to cancel
            left.append({"id": piece, "reason": str(refused), "next": f"phasegate show {piece}"})
        else:
            done.append(piece)
    return done, left
