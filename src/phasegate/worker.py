"""The worker: passes over the runnable workflows, and the lease heartbeat.

``run_worker`` advances every runnable workflow of one engine, pass after pass,
until shutdown (DESIGN.md §1).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from phasegate.contract import RUNNABLE_STATUSES, PhasegateError
from phasegate.phases import cleanup
from phasegate.store import Fence, Store, StoreUnavailable

if TYPE_CHECKING:
    from phasegate.engine import Engine

__all__ = ["CLEANUP_RETRY_S", "Heartbeat", "LeaseHeld", "run_worker"]

log = logging.getLogger(__name__)

#: Seconds between a worker's retries of failed cleanups.
CLEANUP_RETRY_S = 60.0


class LeaseHeld(PhasegateError):
    """Another live worker holds the workflow's lease."""


class Heartbeat(threading.Thread):
    """Renews ``fence``'s lease every third of its TTL until stopped.

    A renewal that raises (the store locked past its busy timeout, full) is
    logged and tried again sooner, never the end of the thread; the lease is
    lost, and ``fence.lost`` set, when a renewal finds it taken over or when
    no renewal succeeded for a whole TTL (another worker may claim it).
    """

    def __init__(self, store: Store, fence: Fence, ttl_s: float) -> None:
        super().__init__(daemon=True, name=f"lease-{fence.workflow_id}")
        self.store = store
        self.fence = fence
        self.ttl_s = ttl_s
        self.stopped = threading.Event()
        self.failures = 0  # renewals that raised, for the log and the tests
        self.last_fault: StoreUnavailable | None = None  # the last renewal's store fault

    def run(self) -> None:
        fence, interval = self.fence, self.ttl_s / 3
        renewed_at = time.monotonic()
        wait = interval
        while not self.stopped.wait(wait):
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
                    fence.lost.set()
                    return
                log.warning("lease on %s not renewed, retrying: %s", fence.workflow_id, exc)
                wait = interval / 4
                continue
            if not held:
                log.error("lease on %s was taken over; this worker stops", fence.workflow_id)
                fence.lost.set()
                return
            renewed_at, wait = time.monotonic(), interval


def run_worker(engine: Engine, *, once: bool = False, poll_s: float = 2.0) -> None:
    """Advance every runnable workflow of ``engine``, forever (or one pass with
    ``once``), ``poll_s`` seconds between passes, until ``engine.shutdown``.

    A pass also
    retries failed cleanups (of completed workflows too), at most every
    ``CLEANUP_RETRY_S`` seconds: what blocks one is usually a person's
    checkout, which does not go away within a poll.
    """
    store, shutdown = engine.store, engine.shutdown
    cleaned_at = float("-inf")
    while not shutdown.is_set():
        advanced = set()  # advance() retried their cleanups already
        for workflow_id in store.runnable_workflow_ids(RUNNABLE_STATUSES):
            if shutdown.is_set():
                break
            try:
                engine.advance(workflow_id)
                advanced.add(workflow_id)
            except LeaseHeld:
                continue
        if once or time.monotonic() - cleaned_at >= CLEANUP_RETRY_S:
            cleaned_at = time.monotonic()
            for workflow_id in store.workflow_ids_with_milestone(cleanup.KIND, "failed"):
                if shutdown.is_set():
                    break
                if workflow_id in advanced:
                    continue
                try:
                    engine.retry_cleanup(workflow_id)
                except LeaseHeld:
                    continue
        if once:
            return
        shutdown.wait(poll_s)
