"""The worker: passes over the runnable workflows, and the lease heartbeat.

``run_worker`` advances every runnable workflow of one engine, pass after pass,
until shutdown (DESIGN.md §1). A workflow that is only waiting on the forge (in
wait for people, or in pr_review for CI) is looked at again after
``forge.poll_s`` seconds, not on every pass: a team's forge has a rate limit;
anything that changes the workflow's row (a person's decision) makes it due at
once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from phasegate.contract import PR_REVIEW, RUNNABLE_STATUSES, PhasegateError
from phasegate.phases import cleanup
from phasegate.store import Fence, Store, StoreUnavailable

if TYPE_CHECKING:
    from phasegate.engine import Engine

__all__ = ["CLEANUP_RETRY_S", "Heartbeat", "LeaseHeld", "run_worker", "waits_on_ci"]

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


def waits_on_ci(row: Mapping[str, Any]) -> bool:
    """Whether the workflow, as ``advance`` left it, waits for the forge's CI
    (pr_review's ``wait``: phases/ci.py)."""
    return row["current_phase"] == PR_REVIEW and row["status"] == "pr_review"


def _polling(row: Mapping[str, Any]) -> bool:
    """Whether the workflow, as ``advance`` left it, only waits on the forge."""
    return row["status"] == "waiting" or waits_on_ci(row)


def run_worker(engine: Engine, *, once: bool = False, poll_s: float = 2.0) -> None:
    """Advance every runnable workflow of ``engine``, forever (or one pass with
    ``once``), ``poll_s`` seconds between passes, until ``engine.shutdown``.

    A workflow left waiting on the forge is advanced again once
    ``forge.poll_s`` passed or its row changed (its version). A pass also
    retries failed cleanups (of completed workflows too), at most every
    ``CLEANUP_RETRY_S`` seconds: what blocks one is usually a person's
    checkout, which does not go away within a poll.
    """
    store, shutdown = engine.store, engine.shutdown
    forge_poll_s = engine.cartridge.forge.poll_s if engine.cartridge.forge.kind != "local" else 0.0
    due: dict[str, tuple[int, float]] = {}  # workflow → (version left at, next look)
    cleaned_at = float("-inf")
    while not shutdown.is_set():
        advanced = set()  # advance() retried their cleanups already
        for workflow_id in store.runnable_workflow_ids(RUNNABLE_STATUSES):
            if shutdown.is_set():
                break
            if workflow_id in due and not once:
                version, at = due[workflow_id]
                if time.monotonic() < at and store.workflow_row(workflow_id)["version"] == version:
                    continue
            try:
                row = engine.advance(workflow_id)
                advanced.add(workflow_id)
            except LeaseHeld:
                continue
            due.pop(workflow_id, None)
            if forge_poll_s and _polling(row):
                due[workflow_id] = (row["version"], time.monotonic() + forge_poll_s)
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
