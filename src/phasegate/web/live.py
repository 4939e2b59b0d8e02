"""Live events: the store's event rows as they are committed.

A workflow's stream sends each event row as one server-sent event: ``id`` the
row's id, ``event`` its type, ``data`` the row as JSON (``id``, ``type``,
``data``, ``created_at``), redacted. A client that reconnects with
``Last-Event-ID`` gets the rows after that id and no other: no gap, no
repeat. After each batch comes one ``changed`` event without an id (so it
leaves the client's last id alone): the page's htmx elements re-read their
fragment on it. A batch of QUIET events only (an agent's output lines, a few a
second while it runs) has none: the page appends those rows itself, and
re-reading the whole fragment twice a second would be the polling SSE is here
to avoid.

What wakes a stream is ``Store.changes()`` (another connection committed),
not a timer over the whole page: the feed is made before the first read, so
a commit between the read and the wait is not missed.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from typing import Any

import anyio
from sse_starlette import ServerSentEvent

from phasegate.core.redaction import redact
from phasegate.store import Store, StoreUnavailable

log = logging.getLogger(__name__)

__all__ = [
    "CHANGED",
    "LEASE",
    "QUIET",
    "WAIT_S",
    "event_json",
    "event_rows",
    "follow_rows",
    "stream",
]

#: The event a page's elements re-read their fragment on.
CHANGED = "changed"
#: A workflow's worker took it or let it go: no row, but its buttons change.
LEASE = "lease"
#: Events after which no ``changed`` is sent: the page shows them without re-reading.
QUIET = frozenset({"agent_output"})
#: Seconds one wait on the change feed lasts at the most: how soon a stream that
#: nothing woke looks at its stop flag and its client again.
WAIT_S = 5.0


def event_json(row: dict[str, Any], secrets: list[str]) -> str:
    """An event row as the JSON a stream and ``phasegate events --json`` send:
    ``{"id", "workflow_id", "type", "data", "created_at"}`` (ISO 8601 UTC), every
    secret value redacted."""
    created = row.get("created_at")
    shaped = {
        "id": row["id"],
        "workflow_id": row.get("workflow_id"),
        "type": row["type"],
        "data": row.get("data") or {},
        "created_at": created.isoformat() if isinstance(created, datetime) else created,
    }
    return redact(json.dumps(shaped, default=str, sort_keys=True), secrets)


def event_rows(store: Store, workflow_id: str, after_id: int) -> list[dict[str, Any]]:
    """The workflow's event rows with an id above ``after_id``, oldest first."""
    return store.events(workflow_id, after_id)


def follow_rows(
    store: Store, workflow_id: str, after_id: int, stop: threading.Event
) -> Iterator[dict[str, Any]]:
    """Every event row after ``after_id`` and then each one as it is committed,
    until ``stop`` is set (``phasegate events --follow``): woken by the store's
    change feed, each row once, in id order."""
    feed = store.changes()
    try:
        last = after_id
        while True:
            for row in store.events(workflow_id, last):
                last = row["id"]
                yield row
            if stop.is_set():
                return
            feed.wait(WAIT_S, stop)
    finally:
        feed.close()


async def stream(
    store: Store,
    batch: Callable[[int], list[tuple[int | None, str, str]]],
    after_id: int,
    stop: threading.Event,
    disconnected: Callable[[], Any],
) -> AsyncIterator[ServerSentEvent]:
    """Server-sent events: ``batch(last_id)`` gives the ``(id, event, data)`` to
    send after ``last_id`` (the rows, or a board's fragment marker), sent each
    time the store changes, then a ``changed`` event (unless all were QUIET); until ``stop`` (the
    server's shutdown) or the client goes (``await disconnected()`` true). A
    store found unavailable is waited out, the stream kept open."""
    feed = store.changes()
    try:
        last = after_id
        while not stop.is_set():
            try:
                sent = await anyio.to_thread.run_sync(batch, last)
            except StoreUnavailable as exc:
                # As the worker does: one line, a wait, then a look again; the client
                # keeps its connection and its place (a restarted PostgreSQL, a lock).
                log.warning("live events wait for the store: %s", exc)
                await anyio.to_thread.run_sync(stop.wait, WAIT_S)
                continue
            for event_id, event, data in sent:
                if event_id is not None:
                    last = event_id
                shown_id = None if event_id is None else str(event_id)
                yield ServerSentEvent(data=data, event=event, id=shown_id)
            if any(event not in QUIET for _id, event, _data in sent):
                yield ServerSentEvent(data="", event=CHANGED)
            while not stop.is_set() and not await disconnected():
                if await anyio.to_thread.run_sync(feed.wait, WAIT_S, stop):
                    break
            if await disconnected():
                return
    finally:
        # The wait ran to its end before a cancellation reached here (the thread
        # is not abandoned), so nothing else uses the feed now.
        feed.close()
