"""The engine: ``advance()``, reconciliation and shutdown (the worker loop and the
lease heartbeat are in ``phasegate.runtime.worker``).

``advance(workflow_id)`` (docs/contracts/lifecycle.md: advancing a workflow)
claims the workflow's lease, retries a failed cleanup of its merge
(phases/cleanup.py), then repeats: load the context, reconcile side effects a
dead process left in_progress, self-heal the worktree (not in preparation),
run the phase's handler, commit its PhaseResult through
``commit_phase_result``, until the workflow waits, pauses, fails or completes.
A workflow another clone of the same forge repository started (its worker
died) is first moved to this clone, and one of another repository refused
(``phasegate.runtime.takeover``).

A shutdown request (SIGINT/SIGTERM in the CLI) stops any running agent; the
interrupted phase raises WorkflowPaused and nothing is committed, so the
workflow resumes from its last commit and its milestones.

Fencing (docs/contracts/lifecycle.md: leases and fencing): the lease's ``Fence``
is checked before every agent start and journaled side effect and is part of the
commit's WHERE; a heartbeat that finds the lease taken over (or expired
unrenewed) marks it lost, and the advance stops at once without another write.
Its agents and checks run under the lease's deadline
(``phasegate.proc.deadline``); one stopped by it while the lease is still held
pauses the phase (event ``self_fenced``). A store that is unavailable (locked
past its busy timeout, full) is retried within ``store_retry_delays_s``; then
the workflow is paused with the reason, or, when even that cannot be written,
left in its last committed state and StoreUnavailable raised.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from phasegate.agents.base import Runner
from phasegate.agents.env import cartridge_secrets, redact
from phasegate.agents.service import AgentService
from phasegate.clock import Clock, SystemClock
from phasegate.config.cartridge import Cartridge
from phasegate.core.contract import (
    COMPLETED,
    RUNNABLE_STATUSES,
    WAIT,
    ContractViolation,
    EventWrite,
    MilestoneView,
    PhaseResult,
    StaleContext,
    WorkflowContext,
    WorkflowPaused,
)
from phasegate.core.state import WorkflowState
from phasegate.forge import Forge
from phasegate.forge.base import ForgeError
from phasegate.forge.factory import make_forge
from phasegate.git.command import withhold_from_git
from phasegate.git.workspace import Workspace
from phasegate.journal import SideEffects
from phasegate.phases import PhaseDeps, cleanup, resolve_phase_handler
from phasegate.proc.deadline import LeaseDeadline, current_deadline, deadline_clock, governing
from phasegate.proc.host import host_name
from phasegate.runtime.due import wait_s
from phasegate.runtime.faults import fault_result
from phasegate.runtime.healing import self_heal
from phasegate.runtime.heartbeat import Heartbeat
from phasegate.runtime.labels import StatusLabels
from phasegate.runtime.outage import labelled_status, recording, scheduled
from phasegate.runtime.starting import filing
from phasegate.runtime.takeover import ForeignWorkflow, forge_repository, take_over
from phasegate.runtime.worker import DEFAULT_CONCURRENCY, LeaseHeld, run_worker
from phasegate.store import Fence, FenceLost, Store, StoreUnavailable

__all__ = ["Engine", "ForeignWorkflow", "LeaseHeld"]

log = logging.getLogger(__name__)

EventCallback = Callable[[str, str, Mapping[str, Any]], None]


class _StoreGaveUp(Exception):
    """The commit's retries are spent and not even a pause could be written: the
    step must not be retried as a whole (its phase would run again for nothing)."""

    def __init__(self, fault: StoreUnavailable) -> None:
        super().__init__(str(fault))
        self.fault = fault


class Engine:
    """Advances the workflows of one repository.

    ``runners`` overrides role bindings (tests); ``on_event(workflow_id, type,
    data)`` sees every event as it happens, for progress display.
    ``store_retry_delays_s`` are the waits (seconds) between tries of a step
    whose store was unavailable: one more try than delays.
    """

    def __init__(
        self,
        repo: Path,
        cartridge: Cartridge,
        store: Store,
        *,
        forge: Forge | None = None,
        workspace: Workspace | None = None,
        runners: Mapping[str, Runner] | None = None,
        clock: Clock | None = None,
        on_event: EventCallback | None = None,
        lease_ttl_s: float = 60.0,
        store_retry_delays_s: Sequence[float] = (0.5, 1.0, 2.0),
    ) -> None:
        self.repo = repo.resolve()
        self.cartridge = cartridge
        self.store = store
        self.workspace = workspace or Workspace()
        hidden = cartridge_secrets(cartridge)
        withhold_from_git(hidden)  # a filter git runs sees no role's key
        self.forge = forge or make_forge(cartridge, self.repo, store, self.workspace, hidden)
        # Whose workflows this engine runs (takeover.py): its forge repository's, from
        # any clone, and its own path's.
        self.repository = forge_repository(cartridge, self.forge)
        self.clock = clock or SystemClock()
        self.shutdown = threading.Event()
        self.on_event = on_event
        self.lease_ttl_s = lease_ttl_s
        self.store_retry_delays_s = tuple(store_retry_delays_s)
        self.labels = StatusLabels(self.forge)
        self.owner = f"{host_name()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.agents = AgentService(store, cartridge, self.repo, self.shutdown, runners, self._emit)
        # The lease each workflow is advanced (or decided) under, while it is:
        # what deps_for hands the journal and what the agent service checks.
        self.fences: dict[str, Fence] = self.agents.fences
        self._holding = threading.Lock()  # guards the check-and-reserve of _hold
        self._claiming: set[str] = set()  # workflows a thread of this engine is claiming

    # -- starting ---------------------------------------------------------------

    def start(
        self,
        title: str,
        ticket: str,
        *,
        auto_merge: bool | None = None,
        profile: str | None = None,
        issue: tuple[str, int] | None = None,
        state: WorkflowState | None = None,
        priority: int = 0,
        after: Sequence[str] = (),
        after_issues: Sequence[tuple[str, int]] = (),
    ) -> str:
        """File a new workflow in preparation, claimed in ``priority``'s order; returns its id.

        ``issue`` (``owner/name``, number): the workflow is for that existing forge
        issue, at most one per issue (``Store.create_workflow``: raises IssueTaken);
        ``state`` is added to the workflow's state (a trigger's ticket snapshot);
        ``after``, ``after_issues``: the workflows and forge issues it waits for.

        ``profile`` names its automation profile (default: ``workflow.profile``, else
        ``review``); the workflow keeps it in ``state["profile"]``. auto_merge: the
        ``auto_merge`` argument, else the default of a profile named here (a person's choice
        for this run beats the file), else an explicit ``workflow.auto_merge``, else the
        cartridge profile's default.

        Checks first what would otherwise fail only after an issue and a branch exist: the
        profile, the base branch, and every role's runner (a scripted file that does not
        load). Raises CartridgeError naming the key, or PhasegateError.
        """
        filed = filing(
            self.cartridge,
            self.repo,
            self.workspace,
            self.agents,
            profile=profile,
            auto_merge=auto_merge,
            state=state,
        )
        self.workspace.exclude(self.repo, ".phasegate/")
        # A key pasted into a ticket (or an issue) reaches neither the store nor a prompt.
        hidden = cartridge_secrets(self.cartridge)
        return self.store.create_workflow(
            title=redact(title, hidden),
            ticket=redact(ticket, hidden),
            repo_path=str(self.repo),
            base_branch=filed.base_branch,
            auto_merge=filed.auto_merge,
            content_language=self.cartridge.workflow.content_language,
            state=filed.state,
            issue=issue,
            repository=self.repository,
            priority=priority,
            after=after,
            after_issues=after_issues,
        )

    # -- events -----------------------------------------------------------------

    def _emit(self, workflow_id: str, event: EventWrite) -> None:
        self.store.add_event(workflow_id, event)
        self._notify(workflow_id, event.type, event.data)

    def _notify(self, workflow_id: str, type_: str, data: Mapping[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(workflow_id, type_, data)

    # -- advancing --------------------------------------------------------------

    def deps_for(self, ctx: WorkflowContext) -> PhaseDeps:
        return PhaseDeps(
            store=self.store,
            cartridge=self.cartridge,
            forge=self.forge,
            workspace=self.workspace,
            agents=self.agents,
            effects=SideEffects(
                self.store,
                self.forge,
                self.workspace,
                ctx.id,
                Path(ctx.repo_path),
                fence=self.fences.get(ctx.id),
            ),
            clock=self.clock,
            shutdown=self.shutdown,
        )

    def commit(
        self, ctx: WorkflowContext, result: PhaseResult, *, resting: bool = True
    ) -> dict[str, Any]:
        """Commit ``result`` through the single commit path and report it to on_event.

        Under the workflow's fence while it is advanced or decided here: raises
        FenceLost (nothing written) once another worker took the lease over. A wait
        on a team's forge is due again after ``forge.poll_s`` (``workflows.due_at``), a
        forge pause after its automatic resume's wait (``runtime.outage.scheduled``).
        ``resting``: the workflow stays where this leaves it (its label follows).
        """
        due_in_s = wait_s(self.cartridge) if result.outcome == "wait" else 0.0
        result, due_in_s = scheduled(self.cartridge.forge, ctx, result, due_in_s)
        fence = self.fences.get(ctx.id)
        row = self.store.commit_phase_result(ctx, result, fence=fence, due_in_s=due_in_s or None)
        rests = resting or result.outcome in ("pause", "failed")
        shown = labelled_status(row)
        self.labels.show(row["id"], row.get("issue_number"), shown, resting=rests)
        for event in result.events:
            self._notify(ctx.id, event.type, event.data)
        said = {"outcome": result.outcome, "phase": row["current_phase"]}
        self._notify(
            ctx.id, "committed", {**said, "status": row["status"], "reason": result.reason}
        )
        return row

    def decide(
        self, workflow_id: str, decision: Callable[[WorkflowContext], PhaseResult]
    ) -> dict[str, Any]:
        """Commit a person's decision (resume, feedback, approval, override).

        Under the workflow's lease, like a phase: while another live process
        advances the workflow the decision is refused (LeaseHeld) and nothing
        changes, so a running phase's result is never thrown away.
        """
        self._hold(
            workflow_id,
            None,
            f"workflow {workflow_id} is being advanced by another process; "
            "wait until it stops (or stop it), then try again",
        )
        try:
            ctx = self.store.load_context(workflow_id)
            return self.commit(ctx, decision(ctx))
        finally:
            self._let_go(workflow_id)

    def _hold(self, workflow_id: str, claimed: int | None, refusal: str) -> Fence:
        """Take the workflow's lease for one of this engine's threads (``claimed``: the
        fence a bulk claim already took, ``LeaseRows.claim_free``) and return its Fence.

        At most one thread of an engine holds a workflow: its threads share the
        owner, which a claim treats as free (and would fence the other thread
        out), so the engine's own holds are told apart here, under a lock.
        Raises LeaseHeld with ``refusal`` when another thread of this engine or
        another live process holds it; StoreUnavailable, WorkflowNotFound.
        """
        with self._holding:
            if workflow_id in self.fences or workflow_id in self._claiming:
                raise LeaseHeld(refusal)
            self._claiming.add(workflow_id)
        try:
            if claimed is None:
                claimed = self.store.claim(workflow_id, self.owner, self.lease_ttl_s)
            if claimed is None:
                raise LeaseHeld(refusal)
            fence = Fence(self.store, workflow_id, self.owner, claimed)
            self.fences[workflow_id] = fence
            return fence
        finally:
            with self._holding:
                self._claiming.discard(workflow_id)

    def _let_go(self, workflow_id: str) -> None:
        """End this engine's hold on the workflow (``_hold``) and release its lease."""
        self.fences.pop(workflow_id, None)
        self._release(workflow_id)

    def _release(self, workflow_id: str) -> None:
        try:
            self.store.release(workflow_id, self.owner)
        except StoreUnavailable as exc:
            # The lease then ends by expiry (or with this process): nothing is lost.
            log.warning("lease on %s not released: %s", workflow_id, exc)

    def advance(
        self,
        workflow_id: str,
        *,
        max_steps: int = 200,
        claimed: int | None = None,
        claimed_at: float | None = None,
    ) -> dict[str, Any]:
        """Run the workflow until it waits, pauses, fails, completes or shutdown is asked.

        Stops at once, committing nothing more, when the lease is lost to
        another worker (FenceLost, logged), or raises StoreUnavailable when it
        was lost because the store stayed unavailable for a whole lease TTL.
        ``claimed``: the fence of the lease the worker already took for it (a
        bulk claim, ``LeaseRows.claim_free``) and ``claimed_at``, when it was sent
        (``deadline_clock()`` seconds; default now). Returns the workflow's row. Raises
        WorkflowNotFound; LeaseHeld when another live worker (or another thread
        of this engine) is advancing it; ForeignWorkflow (nothing run) when it is
        another repository's (``phasegate.runtime.takeover``);
        StoreUnavailable when the store stayed unavailable past the retries and
        even the pause could not be written (the workflow is as last committed).
        """
        asked = deadline_clock()
        fence = self._hold(
            workflow_id, claimed, f"workflow {workflow_id} is being advanced by another worker"
        )
        sent_at = claimed_at if claimed is not None and claimed_at is not None else asked
        deadline = LeaseDeadline(self.lease_ttl_s, sent_at, fence.lost)
        heartbeat = Heartbeat(self.store, fence, self.lease_ttl_s, deadline)
        heartbeat.start()
        try:
            # One read for the label, the cleanup and the first step: the lease is
            # held, so nothing else writes the workflow until this advance commits.
            ctx: WorkflowContext | None
            ctx = self.store.load_context(workflow_id)
            # A process killed between a commit and its label left the label stale.
            self.labels.show(ctx.id, ctx.issue_number, ctx.status, resting=True)
            if self._retry_cleanup(workflow_id, ctx) is not None:
                ctx = None  # the cleanup wrote a milestone: the first step reads again
            for _ in range(max_steps):
                if fence.lost.is_set():
                    raise FenceLost(f"workflow {workflow_id}: the lease was lost")
                with governing(deadline), recording(self.store, workflow_id, self.on_event):
                    stopped = self.shutdown.is_set() or not self._step(workflow_id, ctx)
                ctx = None
                if stopped and not self._advance_child(workflow_id):
                    break
            # Where it rests now, under the lease still: its label follows it.
            row = self.store.workflow_row(workflow_id)
            self.labels.show(
                workflow_id, row.get("issue_number"), labelled_status(row), resting=True
            )
        except (FenceLost, StoreUnavailable) as exc:
            if not isinstance(exc, FenceLost) and not fence.lost.is_set():
                raise  # a step's store fault while the lease still holds
            log.error("advance of %s stopped: %s", workflow_id, exc)
            # Nobody took the workflow over, so its lease ran out unrenewed: say so, not
            # "another process changed it" (a step may find that before the heartbeat).
            if not self._taken_over(fence):
                fault = fence.unrenewed or heartbeat.last_fault
                raise StoreUnavailable(
                    fault.where if fault else self.store.where,
                    f"{fault.reason if fault else 'the lease could not be renewed'} "
                    f"(for longer than the {self.lease_ttl_s:g} s lease; "
                    f"workflow {workflow_id} is as last committed)",
                ) from None
        finally:
            heartbeat.stopped.set()
            deadline.close()
            self._let_go(workflow_id)
        return self.store.workflow_row(workflow_id)

    def idle_at(self, workflow_id: str) -> int | None:
        """The workflow's version when it only waits for people with nothing new, else
        None (advance it): in wait, nothing in progress to reconcile, its label set
        by this engine, and the wait phase's look (reads only: docs/contracts/lifecycle.md,
        wait) finds nothing. Reads only and takes no lease, so an idle waiting workflow
        costs no write, on any forge. Raises WorkflowNotFound.
        """
        ctx = self.store.load_context(workflow_id)
        if ctx.current_phase != WAIT or ctx.status != "waiting":
            return None
        if any(m.status == "in_progress" for m in ctx.milestones):
            return None
        if ctx.issue_number and not self.labels.current(ctx.id, ctx.status):
            return None  # a process killed before its label left it stale: advance sets it
        try:
            result = resolve_phase_handler(WAIT)(ctx, self.deps_for(ctx))
        except ForgeError:
            return None  # advance pauses on it with the reason
        if result.outcome != "wait" or result.milestones or result.state or result.updates:
            return None
        return ctx.version

    def _advance_child(self, workflow_id: str) -> bool:
        """Advance the child the workflow paused for (a conflict fork, phases/conflict.py)
        here and now; True when the child's end woke the workflow (go on with it)."""
        row = self.store.workflow_row(workflow_id)
        child = row["state"].get("conflict_child")
        if not child or row["status"] != "paused" or self.shutdown.is_set():
            return False
        try:
            self.advance(child)
        except LeaseHeld:
            return False  # a worker has it; its end wakes this workflow there
        return self.store.workflow_row(workflow_id)["status"] in RUNNABLE_STATUSES

    def _taken_over(self, fence: Fence) -> bool:
        """Whether another claim moved the workflow's fence past ``fence`` (reads only:
        they go on while the store is write-locked)."""
        try:
            row = self.store.workflow_row(fence.workflow_id)
        except StoreUnavailable:
            return False
        return bool(row["fence"] != fence.value)

    def retry_cleanup(self, workflow_id: str) -> MilestoneView | None:
        """Retry the workflow's failed cleanup under its lease (phases/cleanup.py).

        Returns its settled milestone (``cleanup``, ``pr_closed``), or None. Raises
        LeaseHeld while another live process advances it, WorkflowNotFound."""
        self._hold(
            workflow_id, None, f"workflow {workflow_id} is being advanced by another process"
        )
        try:
            return self._retry_cleanup(workflow_id)
        finally:
            self._let_go(workflow_id)

    def _retry_cleanup(
        self, workflow_id: str, ctx: WorkflowContext | None = None
    ) -> MilestoneView | None:
        ctx = ctx or self.store.load_context(workflow_id)
        settled = cleanup.retry(ctx, self.deps_for(ctx))
        if settled is not None:
            self._notify(
                workflow_id, "cleanup_retried", {"status": settled.status, "note": settled.summary}
            )
        return settled

    def _step(self, workflow_id: str, ctx: WorkflowContext | None = None) -> bool:
        """Run the current phase once and commit. True when the workflow should go on.
        ``ctx``: the workflow as just read under this lease (None: read it).

        A step whose store is unavailable is tried again after each of
        ``store_retry_delays_s`` (reloading the context: the phase re-enters as
        after a crash), then given up (``_store_gave_up``).
        """
        delays = iter(self.store_retry_delays_s)
        while True:
            try:
                return self._try_step(workflow_id, ctx)
            except _StoreGaveUp as gave_up:  # the commit's own retries are spent
                raise gave_up.fault from None
            except StoreUnavailable as exc:
                delay = next(delays, None)
                if delay is None or self.shutdown.is_set():
                    return self._store_gave_up(workflow_id, exc)
                log.warning("%s: %s; trying again in %.1f s", workflow_id, exc, delay)
                self.shutdown.wait(delay)
                ctx = None  # reloaded: the phase re-enters as after a crash

    def _try_step(self, workflow_id: str, loaded: WorkflowContext | None = None) -> bool:
        ctx = loaded or self.store.load_context(workflow_id)
        if ctx.status not in RUNNABLE_STATUSES:
            return False
        fence = self.fences.get(workflow_id)
        if fence is not None:
            # Before reconciliation, which stops agents it takes for orphans: a
            # stale worker must not stop the live agent of the one that took over.
            fence.check()
        if ctx.repo_path != str(self.repo):  # another clone's, or another repository's
            moved = take_over(self, ctx, self._commit_retrying, self._emit)
            if moved is None:
                return False
            ctx = moved
        deps = self.deps_for(ctx)
        try:
            notes = deps.effects.reconcile()
            for note in notes:
                self._emit(ctx.id, EventWrite("reconciled", {"note": note}))
            if notes:
                ctx = self.store.load_context(workflow_id)
            healed = self_heal(ctx, deps, lambda event: self._emit(ctx.id, event))
            result = healed or resolve_phase_handler(ctx.current_phase)(ctx, deps)
        except WorkflowPaused as exc:
            if fence is not None:
                fence.check()  # taken over meanwhile: the rows are the new holder's
            deadline = current_deadline()
            fenced = deadline is not None and deadline.fenced.is_set()
            self._emit(
                ctx.id,
                EventWrite(
                    "self_fenced" if fenced else "paused_by_shutdown",
                    {"phase": ctx.current_phase, "note": str(exc)},
                ),
            )
            return False
        except (FenceLost, StoreUnavailable):
            raise  # not the phase's failure: the worker's, or the store's
        except Exception as exc:  # a phase must never crash the engine half-committed
            result = fault_result(ctx.current_phase, ctx.id, exc)

        if result.outcome == "wait" and not (result.milestones or result.state or result.updates):
            return False  # nothing new while waiting: no write on every poll
        row = self._commit_retrying(ctx, result)
        if row is None:
            return False
        return result.outcome in ("completed", "retry") and row["current_phase"] != COMPLETED

    def _commit_retrying(self, ctx: WorkflowContext, result: PhaseResult) -> dict[str, Any] | None:
        """Commit the phase's result, trying again while the store is unavailable.

        The commit is one transaction checked against ``ctx.version``: a try
        that failed wrote nothing, and one that did commit makes the next
        StaleContext, never a second write. None when the step must stop.
        """
        delays = iter(self.store_retry_delays_s)
        while True:
            try:
                return self.commit(ctx, result, resting=False)
            except StaleContext as exc:
                log.warning("%s", exc)
                return None
            except ContractViolation as exc:
                log.error("phase %s returned an illegal result: %s", ctx.current_phase, exc)
                result = PhaseResult("failed", reason=f"contract violation: {exc}")
            except StoreUnavailable as exc:
                delay = next(delays, None)
                if delay is None or self.shutdown.is_set():
                    try:
                        self._store_gave_up(ctx.id, exc)
                    except StoreUnavailable as fault:
                        raise _StoreGaveUp(fault) from None
                    return None
                log.warning("%s: commit: %s; trying again in %.1f s", ctx.id, exc, delay)
                self.shutdown.wait(delay)

    def _store_gave_up(self, workflow_id: str, exc: StoreUnavailable) -> bool:
        """Leave the workflow resumable after the store stayed unavailable: paused
        with the reason when the store takes that write; else as last committed,
        and StoreUnavailable raised for the caller (the CLI's one-line error)."""
        reason = f"store unavailable: {exc.reason} ({exc.where}); resume once it can be written"
        try:
            ctx = self.store.load_context(workflow_id)
            self.commit(ctx, PhaseResult("pause", reason=reason))
        except StaleContext as stale:
            log.warning("%s", stale)
        except StoreUnavailable as again:
            log.error("%s: %s; left as last committed", workflow_id, again)
            raise exc from again
        log.error("%s paused: %s", workflow_id, reason)
        return False

    # -- the worker -------------------------------------------------------------

    def run_worker(
        self, *, once: bool = False, poll_s: float = 2.0, concurrency: int = DEFAULT_CONCURRENCY
    ) -> None:
        """Advance the runnable workflows, ``concurrency`` at once, forever (or each
        once with ``once``): ``phasegate.runtime.worker.run_worker``."""
        run_worker(self, once=once, poll_s=poll_s, concurrency=concurrency)
