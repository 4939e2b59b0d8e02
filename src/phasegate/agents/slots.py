"""Agent slots: before an agent call runs it takes a slot under every cap it counts
against, the slots shared by every worker on the store.

A call counts against its model provider's cap, its runner's and its
repository's (``[queue]`` in the cartridge, and the caps a person set in the
shared store: for one scope and key the smaller holds; docs/queues.md). The
slots are rows of the store (``store.queue``), so every worker sharing it
counts the same calls. A call that finds a cap reached waits where it is:
its workflow keeps its lease (the heartbeat renews it, and the slots it will
hold with it), an ``agent_waiting`` event says what it waits for, and it
looks again when the store tells of a change (a slot given back notifies) or
after ``queue.slot_poll_s`` seconds. Free slots go to the waiting calls of
the larger workflow priority first, then to those waiting longer
(``Store.acquire_slots``). Shutdown ends the wait (the phase pauses,
resumable), and so does a lost lease. Slots are given back as the call's
process ends, before its answer is parsed or recorded.

Why wait rather than let the workflow go: a workflow released while it waits
would be claimed again at once by some worker, which would find the same cap
reached; waiting holds one worker thread, which ``--concurrency`` bounds.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from phasegate.config.cartridge import Cartridge
from phasegate.config.queue import provider_of
from phasegate.core.contract import EventWrite, WorkflowPaused
from phasegate.proc.host import host_name
from phasegate.store import Fence, SlotNeed, Store, StoreUnavailable

__all__ = ["SLOT_WAIT_EVENT", "CallSlots", "HeldSlots", "slot_needs"]

log = logging.getLogger(__name__)

#: The event a call that waits for a slot writes once: {"role", "phase", "scope", "key", "cap"}.
SLOT_WAIT_EVENT = "agent_waiting"

#: The least seconds between two looks of a waiting call: on SQLite every commit of
#: any worker (a heartbeat, an event) wakes it, and most change nothing it waits for.
MIN_LOOK_S = 0.05

#: Seconds a slot lasts past a call's timeout when no lease holds its workflow (an
#: advance that is not a worker's): nothing renews it then.
UNLEASED_MARGIN_S = 60.0


@dataclass(frozen=True)
class HeldSlots:
    """The slots a call holds (none when no cap applies) and when it got them (UTC):
    its process starts after that moment (``agent_runs.started_at``)."""

    needs: tuple[SlotNeed, ...]
    since: datetime


def slot_needs(
    cartridge: Cartridge,
    role: str,
    store_caps: Mapping[tuple[str, str], int],
    repository: Callable[[], str],
) -> list[SlotNeed]:
    """The caps a call of ``role`` counts against: its provider's (``provider_of``), its
    runner's and its repository's (``repository()``, asked only when some cap on
    repositories is set), each the smaller of the cartridge's ``[queue]`` cap and
    ``store_caps`` (the store's: (scope, key) → cap; key ``*`` for each one not
    named); a scope with neither is not counted."""
    queue = cartridge.queue
    binding = cartridge.role(role)

    def smallest(scope: str, key: str, own: int | None) -> SlotNeed | None:
        stored = store_caps.get((scope, key), store_caps.get((scope, "*")))
        caps = [c for c in (own, stored) if c is not None]
        return SlotNeed(scope, key, min(caps)) if caps else None

    provider = provider_of(binding)
    runner = binding.runner
    found = [
        smallest(
            "provider",
            provider,
            queue.max_calls_per_provider.get(provider, queue.max_calls_per_provider.get("*")),
        ),
        smallest(
            "runner",
            runner,
            queue.max_calls_per_runner.get(runner, queue.max_calls_per_runner.get("*")),
        ),
    ]
    if queue.max_calls_per_repository is not None or any(
        scope == "repository" for scope, _ in store_caps
    ):
        found.append(smallest("repository", repository(), queue.max_calls_per_repository))
    return [need for need in found if need is not None]


class CallSlots:
    """Takes and gives back the slots of one engine's agent calls (``held``).

    ``fences`` is the agent service's (workflow → the lease it is advanced
    under): a slot's holder is that lease's owner, and its expiry the lease's.
    ``emit`` writes an event of a workflow; ``cancel`` is the engine's shutdown.
    """

    def __init__(
        self,
        store: Store,
        cartridge: Cartridge,
        cancel: threading.Event,
        emit: Callable[[str, EventWrite], None],
        fences: Mapping[str, Fence],
    ) -> None:
        self.store = store
        self.cartridge = cartridge
        self.cancel = cancel
        self.emit = emit
        self.fences = fences
        # Who holds a slot outside any lease: this process (holder_alive finds it gone).
        self.owner = f"{host_name()}:{os.getpid()}:slots"

    @contextmanager
    def held(
        self, workflow_id: str, role: str, phase: str, started: EventWrite
    ) -> Iterator[HeldSlots]:
        """Wait for a slot under each cap a call of ``role`` counts against, write
        ``started`` (the ``agent_started`` event) once they are taken, and give them
        back when the block ends, however it ends.

        Raises WorkflowPaused when shutdown ends the wait, FenceLost when the
        workflow's lease is lost meanwhile, StoreUnavailable from the store."""
        stored = self.store.queue_caps()
        queue = self.cartridge.queue
        capped = queue.max_calls_per_provider or queue.max_calls_per_runner
        needs: list[SlotNeed] = []
        priority = 0
        if stored or capped or queue.max_calls_per_repository is not None:
            repository, priority = self.store.queue_facts(workflow_id)
            needs = slot_needs(self.cartridge, role, stored, lambda: repository)
        call_id = secrets.token_hex(8)
        try:
            if needs:
                self._take(needs, call_id, workflow_id, role, phase, priority)
            # The moment is read before the event is written: that write may wait on
            # the store, and calls that took their slots later must not seem earlier.
            since = self.store.clock.now()
            self.emit(workflow_id, started)
            yield HeldSlots(tuple(needs), since)
        finally:
            if needs:
                self._give_back(call_id)

    def _take(
        self,
        needs: list[SlotNeed],
        call_id: str,
        workflow_id: str,
        role: str,
        phase: str,
        priority: int,
    ) -> None:
        fence = self.fences.get(workflow_id)
        holder = fence.owner if fence is not None else self.owner
        ttl_s = self.cartridge.role(role).timeout + UNLEASED_MARGIN_S

        def take() -> SlotNeed | None:
            return self.store.acquire_slots(
                needs,
                call_id=call_id,
                holder=holder,
                workflow_id=workflow_id,
                role=role,
                ttl_s=ttl_s,
                priority=priority,
            )

        blocked = take()
        if blocked is None:
            return
        self.emit(
            workflow_id,
            EventWrite(SLOT_WAIT_EVENT, {"role": role, "phase": phase, **blocked.as_dict()}),
        )
        log.info(
            "%s: the %s agent waits for a slot (%s %s: %d at once)",
            workflow_id,
            role,
            blocked.scope,
            blocked.key,
            blocked.cap,
        )
        poll_s = self.cartridge.queue.slot_poll_s
        feed = self.store.changes()
        try:
            while blocked is not None:
                looked = time.monotonic()
                if fence is not None and fence.lost.is_set():
                    fence.check()  # raises FenceLost: the workflow is another worker's now
                feed.wait(poll_s, stop=self.cancel)
                self.cancel.wait(max(0.0, MIN_LOOK_S - (time.monotonic() - looked)))
                if self.cancel.is_set():
                    raise WorkflowPaused(
                        f"shutdown while the {role} agent waited for a slot "
                        f"({blocked.scope} {blocked.key}: {blocked.cap} at once)"
                    )
                blocked = take()
        finally:
            feed.close()

    def _give_back(self, call_id: str) -> None:
        try:
            self.store.release_slots(call_id)
        except StoreUnavailable as exc:
            # The slots then end with the lease they were renewed with: nothing is lost.
            log.warning("agent slots of call %s not given back: %s", call_id, exc)
