"""The lease heartbeat: a thread that renews a workflow's lease while it advances."""

from __future__ import annotations

import logging
import threading
import time

from phasegate.proc.deadline import LeaseDeadline, deadline_clock
from phasegate.store import Fence, Store, StoreUnavailable

__all__ = ["Heartbeat"]

# The worker's logger: a person reads a lost lease in the worker's log.
log = logging.getLogger("phasegate.runtime.worker")


class Heartbeat(threading.Thread):
    """Renews ``fence``'s lease every third of its TTL until stopped, and moves the
    ``deadline`` of the agents and checks started under it on after each renewal.

    A renewal that raises (the store locked past its busy timeout, full) is
    logged and tried again sooner, never the end of the thread; the lease is
    lost, and ``fence.lost`` set, when a renewal finds it taken over or when
    no renewal succeeded for a whole TTL (another worker may claim it). A lost
    lease ends the deadline: the supervisors stop every agent and check
    running under it at once (``phasegate.proc.deadline``).
    """

    def __init__(
        self, store: Store, fence: Fence, ttl_s: float, deadline: LeaseDeadline | None = None
    ) -> None:
        super().__init__(daemon=True, name=f"lease-{fence.workflow_id}")
        self.store = store
        self.fence = fence
        self.ttl_s = ttl_s
        self.deadline = deadline
        self.stopped = threading.Event()
        self.failures = 0  # renewals that raised, for the log and the tests
        self.last_fault: StoreUnavailable | None = None  # the last renewal's store fault

    def run(self) -> None:
        fence, interval = self.fence, self.ttl_s / 3
        renewed_at = time.monotonic()
        wait = interval
        while not self.stopped.wait(wait):
            sent_at = deadline_clock()  # the lease runs a whole TTL from a moment after
            try:
                held = self.store.renew(fence.workflow_id, fence.owner, fence.value, self.ttl_s)
            except Exception as exc:  # the thread must outlive any failed renewal
                self.failures += 1
                if isinstance(exc, StoreUnavailable):
                    self.last_fault = exc
                if time.monotonic() - renewed_at >= self.ttl_s:
                    log.error("lease on %s expired unrenewed: %s", fence.workflow_id, exc)
                    if isinstance(exc, StoreUnavailable):
                        fence.unrenewed = exc
                    self._lost()
                    return
                log.warning("lease on %s not renewed, retrying: %s", fence.workflow_id, exc)
                wait = interval / 4
                continue
            if not held:
                log.error(
                    "lease on %s was taken over; this worker stops its agents and checks",
                    fence.workflow_id,
                )
                self._lost()
                return
            if self.deadline is not None:
                self.deadline.extend(sent_at)
            renewed_at, wait = time.monotonic(), interval

    def _lost(self) -> None:
        self.fence.lost.set()
        if self.deadline is not None:
            self.deadline.end()
