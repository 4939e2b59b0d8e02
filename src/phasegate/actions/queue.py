"""A person's queue actions: a workflow's priority, the shared store's caps on agent
calls, and what the queue holds now.

``phasegate.operations`` re-exports them, so the CLI and the dashboard share
their rules (docs/queues.md). Errors: ActionRefused for input that does not
fit (nothing recorded), WorkflowNotFound, StoreUnavailable.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from phasegate.config.agents import RUNNERS
from phasegate.config.cartridge import Cartridge
from phasegate.core.contract import RUNNABLE_STATUSES, EventWrite
from phasegate.core.inputs import ActionRefused, check_by
from phasegate.core.priority import check_priority, parse_priority, priority_name
from phasegate.store import Store
from phasegate.store.tables import SLOT_SCOPES

__all__ = [
    "MAX_CAP",
    "SLOT_SCOPES",
    "clear_queue_cap",
    "in_use",
    "queue_view",
    "set_priority",
    "set_queue_cap",
]

#: The largest cap a person may set: more calls at once than any machine runs.
MAX_CAP = 10_000

#: The statuses a priority no longer orders anything in.
_FINISHED = frozenset({"completed", "cancelled"})


def set_priority(store: Store, workflow_id: str, priority: int | str, *, by: str) -> dict[str, Any]:
    """Give the workflow ``priority`` (an integer, or ``high``/``normal``/``low``:
    ``core.priority``), recorded as a ``decision`` event ``{"action": "priority",
    "by", "priority", "was"}``; returns its row with ``changed`` (False, and nothing
    recorded, when it had that priority already). Workers claim by it from their
    next pass; an agent call already running or waiting is not moved. Raises
    ActionRefused (the priority, ``by``, a finished workflow), WorkflowNotFound."""
    check_by(by)
    row = store.workflow_row(workflow_id)
    value = parse_priority(priority) if isinstance(priority, str) else check_priority(priority)
    if row["status"] in _FINISHED:
        raise ActionRefused(f"workflow {workflow_id} is {row['status']}: nothing queues it now")
    was = int(row.get("priority") or 0)
    if value == was:
        return {**row, "changed": False}
    event = EventWrite("decision", {"action": "priority", "by": by, "priority": value, "was": was})
    return {**store.set_priority(workflow_id, value, event), "changed": True}


def _checked_cap(scope: str, key: str) -> tuple[str, str]:
    if scope not in SLOT_SCOPES:
        raise ActionRefused(f"scope {scope!r}: give one of {', '.join(SLOT_SCOPES)}")
    key = key.strip()
    if scope != "repository":
        key = key.lower()  # provider and runner names are lower-case (config.queue)
    if not key or len(key) > 255 or not key.isprintable():
        raise ActionRefused(
            f"{scope} {key!r}: name one (up to 255 printable characters), or * for each"
        )
    if scope == "runner" and key != "*" and key not in RUNNERS:
        raise ActionRefused(f"runner {key!r} is no runner: give one of {', '.join(RUNNERS)}, or *")
    if scope == "provider" and "/" in key:
        raise ActionRefused(
            f"provider {key!r}: a provider is the part of a model's name before its first / "
            f"(give {key.split('/', 1)[0]!r})"
        )
    return scope, key


def set_queue_cap(store: Store, scope: str, key: str, cap: int, *, by: str) -> dict[str, Any]:
    """Set the shared store's cap on ``scope`` (provider, runner or repository) ``key``
    (``anthropic``, ``claude-code``, ``owner/name`` or a clone's path; ``*``: each
    one not named) to ``cap`` calls at once, for every worker sharing the store
    (with a cartridge's cap on the same, the smaller holds). Returns the cap's row.
    Raises ActionRefused (the scope, the key, a cap outside 1 to MAX_CAP, ``by``)."""
    check_by(by)
    scope, key = _checked_cap(scope, key)
    if isinstance(cap, bool) or not 1 <= cap <= MAX_CAP:
        raise ActionRefused(f"cap {cap}: give a number of calls at once from 1 to {MAX_CAP}")
    store.set_queue_cap(scope, key, cap, by)
    return {"scope": scope, "key": key, "cap": cap, "set_by": by}


def clear_queue_cap(store: Store, scope: str, key: str, *, by: str) -> dict[str, Any]:
    """Remove the shared store's cap on ``scope`` ``key`` (a cartridge's cap still
    holds). Returns ``{"scope", "key", "cap": None, "set_by", "removed"}``:
    ``removed`` is False when the store had no such cap (nothing changed). Raises
    ActionRefused."""
    check_by(by)
    scope, key = _checked_cap(scope, key)
    removed = store.set_queue_cap(scope, key, None, by)
    return {"scope": scope, "key": key, "cap": None, "set_by": by, "removed": removed}


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def queue_view(store: Store, cartridge: Cartridge | None = None) -> dict[str, Any]:
    """What the queue holds now: ``queued`` (the runnable workflows in the order
    workers claim them: priority, larger first, then oldest; each with ``priority``,
    its ``priority_name``, ``held_by``: the worker advancing it now under an
    unexpired lease, else None, and ``for_person``: it waits for a person's
    decision, which a worker only looks for), ``slots`` (the agent calls holding slots now, one
    entry a call: workflow, role, holder, since, expires, the caps it counts
    against), ``waiting`` (the calls waiting for a slot, in the order they get
    one: larger priority, then waiting longer; each as a ``slots`` entry, ``since``
    when it waits), ``store_caps`` (the caps a person set in the store) and
    ``cartridge_caps`` (``[queue]`` of ``cartridge``, when given)."""
    now = store.clock.now()
    queued = [
        {
            **{k: _iso(v) for k, v in row.items()},
            "priority_name": priority_name(int(row["priority"] or 0)),
            "held_by": row["lease_owner"]
            if row["lease_owner"] and row["lease_expires_at"] and row["lease_expires_at"] > now
            else None,
            "for_person": row["status"] == "waiting",
        }
        for row in store.queued_rows(sorted(RUNNABLE_STATUSES))
    ]
    calls: dict[str, dict[str, Any]] = {}
    waits: dict[str, dict[str, Any]] = {}
    for slot in store.slot_rows():
        if not slot["live"]:
            continue
        call = (waits if slot["waiting"] else calls).setdefault(
            slot["call_id"],
            {
                "workflow_id": slot["workflow_id"],
                "role": slot["role"],
                "holder": slot["holder"],
                "since": _iso(slot["acquired_at"]),
                "expires_at": _iso(slot["expires_at"]),
                "priority": int(slot["priority"]),
                "caps": {},
            },
        )
        call["caps"][slot["scope"]] = slot["key"]
    queue = cartridge.queue if cartridge is not None else None
    return {
        "queued": queued,
        "slots": list(calls.values()),
        # in the order the free slots go to them: larger priority, then waiting longer
        "waiting": sorted(waits.values(), key=lambda w: (-w["priority"], w["since"])),
        "store_caps": [{k: _iso(v) for k, v in row.items()} for row in store.queue_cap_rows()],
        "cartridge_caps": None
        if queue is None
        else {
            "max_calls_per_provider": dict(queue.max_calls_per_provider),
            "max_calls_per_runner": dict(queue.max_calls_per_runner),
            "max_calls_per_repository": queue.max_calls_per_repository,
        },
    }


def in_use(view: Mapping[str, Any]) -> dict[tuple[str, str], int]:
    """How many calls hold a slot under each (scope, key) in ``view`` (``queue_view``)."""
    counted: dict[tuple[str, str], int] = {}
    for call in view["slots"]:
        for scope, key in call["caps"].items():
            counted[(scope, key)] = counted.get((scope, key), 0) + 1
    return counted
