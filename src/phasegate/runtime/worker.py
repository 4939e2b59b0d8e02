"""The worker: passes over the runnable workflows, on threads, woken by the store.

``run_worker`` advances the runnable workflows of one engine's repository (a
store may be shared by many: ``takeover``) until shutdown
(docs/contracts/lifecycle.md: leases and fencing), up to ``concurrency`` at
once, each on a thread of its own under its own lease (agents are subprocesses:
threads only wait on them). A pass reads every runnable workflow's row in one
query, takes the leases of as many due ones as it has free threads in one
statement (``LeaseRows.claim_free``: a worker starting after a crash reclaims a
dead worker's workflows a batch at a time), and starts their advances. Between
passes it waits on the store's ChangeFeed (``Store.changes``), a thread's end or
shutdown, ``poll_s`` at most: a person's decision, a new ticket or feedback is
acted on at once.

What is due is the store's to say (``workflows.due_at``), so a restarted
worker, or another one, honours it: a pass claims only the runnable workflows
whose ``due_at`` is NULL or past, and between passes the worker sleeps until
the earliest one ahead (``poll_s`` at most). Every commit makes its workflow
due at once (a person's decision), unless it leaves it waiting on a team's
forge (pr_review for CI, wait for people): due after ``forge.poll_s`` then, the
forge's rate limit (``wait_s``; ``Engine.commit``). A look that found
nothing new and committed nothing sets the next one itself
(``LeaseRows.schedule``): on a team's forge after ``forge.poll_s``, a workflow
left runnable otherwise (a conflict child whose parent's pause is not
committed yet) after ``poll_s``. Left waiting for people on the local forge, a
workflow is due again only when its row or the local forge's pull requests
and issues change (``LeaseRows.local_forge_marker``), which the worker watches
(a restarted one looks once): an idle waiting workflow costs reads, never a
write, per pass. A pause ``forge_unavailable`` is due at its automatic resume
(``runtime.outage``): a free thread resumes and advances it; no other pause.

Shutdown (``engine.shutdown``: SIGINT/SIGTERM in the CLI) stops every running
agent; each interrupted phase pauses as a single advance's does, and
``run_worker`` returns only once every thread has ended.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from phasegate.config.cartridge import Cartridge
from phasegate.core.contract import (
    RUNNABLE_STATUSES,
    MilestoneView,
    PhasegateError,
)
from phasegate.phases import cleanup
from phasegate.proc.deadline import deadline_clock
from phasegate.runtime import DEFAULT_CONCURRENCY, outage, retention
from phasegate.runtime.due import (
    RELOOKS,
    WAITING_FOR_PEOPLE,
    Left,
    earliest,
    polling,
    waiting_for_people,
)
from phasegate.runtime.pace import ForgePace
from phasegate.store import Store, StoreUnavailable

__all__ = [
    "CLEANUP_RETRY_S",
    "DEFAULT_CONCURRENCY",
    "LeaseHeld",
    "WorkerEngine",
    "run_worker",
]

log = logging.getLogger(__name__)


class WorkerEngine(Protocol):
    """What the worker needs of the engine it drives (``runtime.engine.Engine`` is
    one): passed in, so the worker does not import the engine that starts it."""

    store: Store
    shutdown: threading.Event
    repo: Path
    repository: str | None
    cartridge: Cartridge
    owner: str
    lease_ttl_s: float

    def advance(
        self, workflow_id: str, *, claimed: int | None = None, claimed_at: float | None = None
    ) -> dict[str, Any]: ...

    def idle_at(self, workflow_id: str) -> int | None: ...

    def decide(self, workflow_id: str, decision: outage.Decision) -> dict[str, Any]: ...

    def retry_cleanup(self, workflow_id: str) -> MilestoneView | None: ...


#: Seconds between a worker's retries of failed cleanups.
CLEANUP_RETRY_S = 60.0

#: Seconds a worker waits after its store was first found unavailable before it
#: tries again; doubled at each failure in a row, up to ``OUTAGE_MAX_S``.
OUTAGE_FIRST_S = 0.5

#: The most seconds between two tries of an unavailable store (or ``poll_s``, when
#: longer): a restarted server is back within seconds.
OUTAGE_MAX_S = 4.0

#: The least seconds between two passes a store change started: the worker's own
#: commits (and heartbeats) change the store too, and must not make it spin.
MIN_PASS_S = 0.005


class LeaseHeld(PhasegateError):
    """Another live worker holds the workflow's lease."""


def run_worker(
    engine: WorkerEngine,
    *,
    once: bool = False,
    poll_s: float = 2.0,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> None:
    """Advance the runnable workflows of ``engine``, up to ``concurrency`` at once,
    forever (or, with ``once``, each once), until ``engine.shutdown``; this
    module's docstring says what is due, and when a pass runs (``poll_s``
    seconds apart at the most).

    A pass also retries failed cleanups (of completed workflows too, and a
    cancelled workflow's pull request the forge failed to close) and retires
    worktrees past their retention (``runtime.retention.expire``), at most
    every ``CLEANUP_RETRY_S`` seconds: what blocks one is usually a person's
    checkout, which does not go away within a poll. It then releases too the
    workflows whose dependencies all completed without a commit releasing them
    (``Store.release_ready``; also at start). Returns once every thread
    ended; re-raises the first error an advance raised other than LeaseHeld and
    StoreUnavailable, after asking the other threads to stop (``engine.shutdown``)
    and waiting for them. A store found unavailable (a PostgreSQL restart, SQLite
    locked past its busy timeout) by a pass, a cleanup or an advance is one
    warning line, and the worker tries again after ``OUTAGE_FIRST_S`` seconds,
    doubling to ``max(poll_s, OUTAGE_MAX_S)``: the workflows are as last
    committed, and go on once the store is back.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    _Worker(engine, once, poll_s, concurrency).run()


class _Worker:
    """``run_worker``'s state: the threads running, how each workflow was left."""

    def __init__(self, engine: WorkerEngine, once: bool, poll_s: float, concurrency: int) -> None:
        self.engine = engine
        self.store = engine.store
        self.shutdown = engine.shutdown
        self.once = once
        self.poll_s = poll_s
        self.concurrency = concurrency
        # Only this repository's workflows, from any clone of its forge repository
        # (a shared store: takeover.py), read through the store's index.
        self.mine = {"repo_path": str(engine.repo), "repository": engine.repository}
        forge = self.forge_settings = engine.cartridge.forge
        self.local_forge = forge.kind == "local"
        self.pace = ForgePace(engine.cartridge, engine.store, engine.repository)
        self.running: dict[str, threading.Thread] = {}
        self.left: dict[str, Left] = {}
        self.advanced: set[str] = set()  # advance() retried their cleanups already
        self.seen: set[str] = set()  # with once: dispatched in this one pass
        self.errors: list[BaseException] = []
        #: What the last read of the rows left due (``_pass``): to claim, waiting, marker.
        self.backlog: tuple[list[str], list[str], tuple[int, int] | None] | None = None
        #: The earliest ``due_at`` ahead that the last look ahead found or a thread wrote
        #: since: what the worker sleeps until (``_wait``), ``poll_s`` at most. ``scheduled``:
        #: the earliest a thread wrote while a look ahead ran, which it may not have seen.
        self.next_due: datetime | None = None
        #: When the last rereading pass read the due rows: what it saw nothing due after.
        self.read_at = engine.store.clock.now()
        self.scheduled: datetime | None = None
        #: Workflows whose advance the store's outage ended: their leases, which advance
        #: could not release then, are released by the next pass the store takes.
        self.unreleased: set[str] = set()
        #: The newest version a rereading pass saw of a workflow it skipped because
        #: its thread was running: a change its thread may not have seen.
        self.skipped: dict[str, int] = {}
        #: A thread ended that a change skipped by a pass may have come too late for:
        #: the next pass reads the rows again (``_changed_behind``).
        self.stale = False
        self.outage_s = 0.0  # the wait before the next try of an unavailable store; 0: none
        self.ended = threading.Event()  # a thread ended: a slot is free, a row was left
        self.lock = threading.Lock()  # running, left, advanced, errors, across threads

    def run(self) -> None:
        feed = self.store.changes()
        if not self.once:
            # run() ends only at shutdown then, and this relay with it.
            threading.Thread(target=self._relay_shutdown, daemon=True, name="shutdown").start()
        cleaned_at = float("-inf")
        self._riding_out(self._free_gone_leases)
        reread = True
        try:
            while not self.shutdown.is_set() and not self.errors:
                self.ended.clear()
                dispatched = self._riding_out(self._pass, reread or self.once)
                if dispatched is None:  # the store is unavailable: waited, try again
                    reread = True
                    continue
                if self.once:
                    with self.lock:
                        idle = not self.running
                    if not dispatched and idle:  # every one advanced once
                        self._retry_cleanups()
                        break
                    if not dispatched:
                        self.ended.wait(self.poll_s)
                    continue
                if time.monotonic() - cleaned_at >= CLEANUP_RETRY_S:
                    cleaned_at = time.monotonic()
                    self._riding_out(self._retry_cleanups)
                    self._riding_out(self._release_ready)
                reread = self._wait(feed) or self._take_stale()
        finally:
            self._join()
            feed.close()
        if self.errors:
            raise self.errors[0]

    def _free_gone_leases(self) -> None:
        freed = self.store.free_gone_leases()
        if freed:
            log.info("%d leases of gone workers of this host released", freed)
        self._release_ready()

    def _release_ready(self) -> None:
        """Release the workflows whose dependencies all completed though no commit
        released them (``Store.release_ready``): at start, then with the cleanups."""
        for workflow_id in self.store.release_ready():
            log.info("workflow %s: what it waited for completed; it runs now", workflow_id)

    def _riding_out(self, step: Any, *args: Any) -> Any:
        """``step(*args)``'s value; None, after one warning line and a wait (``_outage``),
        when it raised StoreUnavailable: a worker outlives a store's restart."""
        try:
            value = step(*args)
        except StoreUnavailable as exc:
            self._outage(exc)
            self.shutdown.wait(self.outage_s)
            return None
        if self.outage_s:
            log.warning("the store is available again; the worker goes on")
            self.outage_s = 0.0
        return value

    def _outage(self, exc: StoreUnavailable) -> None:
        """Log a store fault as one line and lengthen the wait before the next try:
        ``OUTAGE_FIRST_S`` doubling to ``max(poll_s, OUTAGE_MAX_S)``."""
        with self.lock:
            self.outage_s = min(
                max(self.poll_s, OUTAGE_MAX_S), max(OUTAGE_FIRST_S, self.outage_s * 2)
            )
            wait = self.outage_s
        log.warning("%s; trying again in %.1f s", exc, wait)

    def _relay_shutdown(self) -> None:
        self.shutdown.wait()
        self.ended.set()

    def _wait(self, feed: Any) -> bool:
        """Until a thread ends, shutdown, or (with a thread free) the store changes or
        the earliest scheduled workflow is due (``MIN_PASS_S`` at least); ``poll_s`` at
        most. A pass a change starts comes ``MIN_PASS_S`` after the last. True when
        the next pass must read the rows again (the store changed, or the wait ran
        out); False when only a thread ended (the backlog goes on)."""
        started = time.monotonic()
        with self.lock:
            full = len(self.running) >= self.concurrency
            due = self.next_due
        if full:
            return not self.ended.wait(self.poll_s)
        timeout = self.poll_s
        if due is not None:
            until = (due - self.store.clock.now()).total_seconds()
            timeout = min(timeout, max(MIN_PASS_S, until))
        if feed.wait(timeout, stop=self.ended):
            left = MIN_PASS_S - (time.monotonic() - started)
            if left > 0:
                self.shutdown.wait(left)
            return True
        return not self.ended.is_set()

    def _take_stale(self) -> bool:
        with self.lock:
            stale, self.stale = self.stale, False
        return stale

    def _pass(self, reread: bool) -> bool:
        """Start the advances of the due workflows, as many as threads are free; True
        when one was started. ``reread``: read the rows again, else go on with
        the due ones the last read left over (a thread ended, nothing changed:
        1,000 waiting workflows are read once, not once per thread's end)."""
        with self.lock:
            free = self.concurrency - len(self.running)
        if free <= 0:
            return False
        with self.lock:
            unreleased = [i for i in self.unreleased if i not in self.running]
        for workflow_id in unreleased:
            self.store.release(workflow_id, self.engine.owner)
            with self.lock:
                self.unreleased.discard(workflow_id)
        fresh = reread or self.backlog is None
        backlog = self._due() if fresh or self.backlog is None else self.backlog
        self.backlog = backlog
        due, waiting, forge = backlog
        if self.shutdown.is_set():
            return False
        with self.lock:
            due = [i for i in due if i not in self.running]
            waiting = [i for i in waiting if i not in self.running]
        started: list[str] = []
        if due:
            sent_at = deadline_clock()  # what the agents' deadline counts from
            taken = self.store.claim_free(
                due, self.engine.owner, self.engine.lease_ttl_s, limit=free, scheduled=self.once
            )
            for workflow_id in due:  # by priority, then oldest, as listed
                if workflow_id in taken:
                    self._start(workflow_id, (taken[workflow_id], sent_at), forge)
                    started.append(workflow_id)
            due = [i for i in due if i not in taken]
        for workflow_id in waiting[: max(0, free - len(started))]:
            self._start(workflow_id, None, forge)
            started.append(workflow_id)
        self.backlog = (due, [i for i in waiting if i not in started], forge)
        if fresh and len(started) < free:  # the rest are listed again by the next reread
            for workflow_id, version in self._due_pauses()[: free - len(started)]:
                self._start(workflow_id, None, forge, resume=version)
                started.append(workflow_id)
        if fresh and not self.once:
            self._look_ahead()  # after the advances started: a wake-up waits for no read
        return bool(started)

    def _look_ahead(self) -> None:
        """Read when the earliest workflow scheduled for later is due (``next_due``).

        Later means after the moment this pass read the due rows (``read_at``), not
        now: one that came due since then was in neither read, and must wake the
        next pass rather than wait out ``poll_s``."""
        with self.lock:
            self.scheduled = None
        statuses = RUNNABLE_STATUSES | {"paused"}  # a forge pause is due at its resume
        ahead = self.store.next_due_at(statuses, self.read_at, **self.mine)
        with self.lock:
            self.next_due = earliest(ahead, self.scheduled)

    def _due(self) -> tuple[list[str], list[str], tuple[int, int] | None]:
        """The workflows due now, by priority then oldest: those to claim, those waiting for
        people (looked at without a lease first), and the local forge's marker.
        With ``once``, every runnable one, due or scheduled for later."""
        forge = self.store.local_forge_marker() if self.local_forge else None
        now = self.read_at = self.store.clock.now()
        due, waiting = [], []
        due_by = None if self.once else now
        rows = self.store.lease_rows(RUNNABLE_STATUSES, due_by=due_by, **self.mine)
        with self.lock:
            for row in rows:
                workflow_id = row["id"]
                if workflow_id in self.running:
                    self.skipped[workflow_id] = row["version"]
                    continue
                if workflow_id in self.seen:
                    continue
                left = self.left.get(workflow_id)
                if (
                    left is not None
                    and left.watched
                    and not self.once
                    and row["version"] == left.version
                    and forge == left.forge
                ):
                    continue
                if waiting_for_people(row):
                    waiting.append(workflow_id)
                else:
                    due.append(workflow_id)
        return due, waiting, forge

    def _due_pauses(self) -> list[tuple[str, int]]:
        """The forge pauses due to be resumed, with no thread of theirs: (id, version)."""
        due = self.store.due_pauses(outage.FORGE_PAUSE, self.store.clock.now(), **self.mine)
        with self.lock:
            return [(i, v) for i, v in due if i not in self.running and i not in self.seen]

    def _start(
        self,
        workflow_id: str,
        claim: tuple[int, float] | None,
        forge: tuple[int, int] | None,
        resume: int | None = None,
    ) -> None:
        thread = threading.Thread(
            target=self._advance,
            args=(workflow_id, claim, forge, resume),
            daemon=True,
            name=f"advance-{workflow_id}",
        )
        with self.lock:
            self.running[workflow_id] = thread
            if self.once:
                self.seen.add(workflow_id)
        thread.start()

    def _advance(
        self,
        workflow_id: str,
        claim: tuple[int, float] | None,
        forge: tuple[int, int] | None,
        resume: int | None = None,
    ) -> None:
        """Advance the workflow under the lease ``claim`` took (its fence, and when the
        claim was sent: ``Engine.advance``'s ``claimed`` and ``claimed_at``; None: a
        waiting one, looked at without a lease first and advanced, under a claim of
        its own, only when its wait has something new: ``Engine.idle_at``). With
        ``resume`` (the version its forge pause was found due at) it is resumed
        first (``runtime.outage.resume``), and advanced only if it was."""
        left = None
        try:
            # A forge call's retry is the workflow's event in a look too (advance nests its own).
            with outage.recording(self.store, workflow_id):
                if resume is not None and not outage.resume(
                    self.engine.decide, self.forge_settings, workflow_id, resume
                ):
                    return  # a person or another worker moved it on meanwhile
                waiting = claim is None and resume is None
                idle = self.engine.idle_at(workflow_id) if waiting else None
                if idle is None:
                    left = self._advance_until_idle(workflow_id, claim, forge)
                else:
                    left = self._left_at(
                        workflow_id, {"version": idle, **WAITING_FOR_PEOPLE}, forge
                    )
        except LeaseHeld:
            pass  # this engine's own decide or cleanup holds it: looked at again next pass
        except StoreUnavailable as exc:
            # The workflow is as last committed (advance paused or left it): the
            # passes look at it again once the store is back.
            self._outage(exc)
            with self.lock:
                self.unreleased.add(workflow_id)
        except BaseException as exc:  # ends the worker, once every thread stopped
            log.exception("advance of %s raised", workflow_id)
            with self.lock:
                self.errors.append(exc)
            self.shutdown.set()
        finally:
            with self.lock:
                self.running.pop(workflow_id, None)
                self.advanced.add(workflow_id)
                if left is None:
                    self.left.pop(workflow_id, None)
                else:
                    self.left[workflow_id] = left
                self.stale |= self._changed_behind(workflow_id, left)
            self.ended.set()

    def _changed_behind(self, workflow_id: str, left: Left | None) -> bool:
        """Whether a pass skipped the workflow while its thread ran and saw a version
        newer than the one the thread left it at: a decision committed after the
        thread's last read, whose own pass came while the thread still ran. Without a
        reread it would wait for the next change, or ``poll_s``. (Called under
        ``lock``.)"""
        seen = self.skipped.pop(workflow_id, None)
        return seen is not None and (left is None or seen > left.version)

    def _advance_until_idle(
        self, workflow_id: str, claim: tuple[int, float] | None, forge: tuple[int, int] | None
    ) -> Left | None:
        """Advance the workflow; when it is left waiting, how a look (``Engine.idle_at``)
        finds it, advancing it again while the look finds something new.

        advance reads the row it returns after letting the lease go: a decision
        committed in between is in that row's version, and a waiting workflow is
        due again only when its version moves, so that decision would wait for
        the next change. A look reads the version before it looks: what comes
        after moves it. (A change to a workflow while its thread runs is skipped
        by the passes; one the thread came too late to see is read again as the
        thread ends: ``_changed_behind``.)
        """
        for _ in range(RELOOKS):
            fence, sent_at = claim or (None, None)
            row = self.engine.advance(workflow_id, claimed=fence, claimed_at=sent_at)
            claim = None
            if not waiting_for_people(row) or self.shutdown.is_set():
                return self._left_at(workflow_id, row, forge)
            idle = self.engine.idle_at(workflow_id)
            if idle is not None:
                # The advance's commit may have scheduled the look just taken: kept.
                due = row.get("due_at") if idle == row["version"] else None
                return self._left_at(
                    workflow_id, {"version": idle, "due_at": due, **WAITING_FOR_PEOPLE}, forge
                )
        # Still something new after as many advances: looked at again after poll_s.
        self._schedule(workflow_id, row, self.poll_s)
        return Left(row["version"], forge, watched=False)

    def _left_at(
        self, workflow_id: str, row: Mapping[str, Any], forge: tuple[int, int] | None
    ) -> Left | None:
        """How the advance left the workflow (``row``: as last read), its next look
        scheduled in the store when that is a matter of time; None: not runnable, or
        shutdown."""
        if row["status"] not in RUNNABLE_STATUSES or self.shutdown.is_set():
            return None
        forge_wait_s = self.pace.wait_s()
        if forge_wait_s and polling(row):
            self._schedule(workflow_id, row, forge_wait_s)
        elif waiting_for_people(row):
            return Left(row["version"], forge, watched=True)
        else:
            self._schedule(workflow_id, row, self.poll_s)
        return Left(row["version"], forge, watched=False)

    def _schedule(self, workflow_id: str, row: Mapping[str, Any], due_in_s: float) -> None:
        """Make the workflow, left at ``row``, due ``due_in_s`` seconds from now in the
        store (``LeaseRows.schedule``), unless a commit of its advance already made it
        due later; and wake for it then."""
        due = row.get("due_at")
        if due is None or due <= self.store.clock.now():
            due = self.store.schedule(workflow_id, row["version"], due_in_s)
        if due is not None:
            with self.lock:
                self.next_due = earliest(self.next_due, due)
                self.scheduled = earliest(self.scheduled, due)

    def _retry_cleanups(self) -> None:
        waiting = [
            workflow_id
            for kind in cleanup.KINDS
            for workflow_id in self.store.workflow_ids_with_milestone(kind, "failed", **self.mine)
        ]
        for workflow_id in dict.fromkeys(waiting):
            if self.shutdown.is_set():
                return
            with self.lock:
                if workflow_id in self.advanced or workflow_id in self.running:
                    continue
            try:
                self.engine.retry_cleanup(workflow_id)
            except LeaseHeld:
                continue
        with self.lock:
            self.advanced.clear()
        # Failed and cancelled workflows' worktrees past landing_areas.keep_*_days.
        retention.expire(self.engine, self.store.clock.now(), busy=LeaseHeld)

    def _join(self) -> None:
        while True:
            with self.lock:
                threads = list(self.running.values())
            if not threads:
                return
            for thread in threads:
                thread.join()
