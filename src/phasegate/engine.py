"""The engine: ``advance()``, the worker loop, reconciliation and shutdown.

``advance(workflow_id)`` (DESIGN.md §1) claims the workflow's lease, retries
a failed cleanup of its merge (phases/cleanup.py), then repeats: load the
context, reconcile side effects a dead process left in_progress, self-heal
the worktree (not in preparation), run the phase's handler, commit its
PhaseResult through ``commit_phase_result``, until the workflow waits,
pauses, fails or completes.

A shutdown request (SIGINT/SIGTERM in the CLI) stops any running agent; the
interrupted phase raises WorkflowPaused and nothing is committed, so the
workflow resumes from its last commit and its milestones.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from phasegate.agents import binding_problems
from phasegate.agents.base import Runner
from phasegate.agents.service import AgentService
from phasegate.cartridge import CARTRIDGE_FILE, Cartridge, CartridgeError
from phasegate.clock import Clock, SystemClock
from phasegate.contract import (
    ACCEPTANCE_VERIFICATION,
    COMPLETED,
    PREPARATION,
    RUNNABLE_STATUSES,
    ContractViolation,
    EventWrite,
    MilestoneView,
    PhasegateError,
    PhaseResult,
    StaleContext,
    WorkflowContext,
    WorkflowPaused,
)
from phasegate.forge import Forge, LocalForge
from phasegate.journal import SideEffects
from phasegate.phases import PhaseDeps, cleanup, resolve_phase_handler
from phasegate.store import Store
from phasegate.workspace import GitTransient, Workspace, git

__all__ = ["Engine", "LeaseHeld"]

log = logging.getLogger(__name__)

#: Seconds between a worker's retries of failed cleanups.
CLEANUP_RETRY_S = 60.0

EventCallback = Callable[[str, str, Mapping[str, Any]], None]


class LeaseHeld(PhasegateError):
    """Another live worker holds the workflow's lease."""


class _Heartbeat(threading.Thread):
    """Renews a lease every third of its TTL until stopped."""

    def __init__(self, store: Store, workflow_id: str, owner: str, fence: int, ttl_s: float):
        super().__init__(daemon=True, name=f"lease-{workflow_id}")
        self.args = (store, workflow_id, owner, fence, ttl_s)
        self.stopped = threading.Event()

    def run(self) -> None:
        store, workflow_id, owner, fence, ttl_s = self.args
        while not self.stopped.wait(ttl_s / 3):
            if not store.renew(workflow_id, owner, fence, ttl_s):
                log.warning("lease on %s lost", workflow_id)
                return


def _merged(ctx: WorkflowContext) -> bool:
    """Whether the pull request's merge is settled (reconciliation has run by then)."""
    merge = ctx.milestone("merge_completed")
    return merge is not None and merge.status == "completed"


class Engine:
    """Advances the workflows of one repository.

    ``runners`` overrides role bindings (tests); ``on_event(workflow_id, type,
    data)`` sees every event as it happens, for progress display.
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
    ) -> None:
        self.repo = repo.resolve()
        self.cartridge = cartridge
        self.store = store
        self.workspace = workspace or Workspace()
        self.forge = forge or LocalForge(store, self.repo, self.workspace)
        self.clock = clock or SystemClock()
        self.shutdown = threading.Event()
        self.on_event = on_event
        self.lease_ttl_s = lease_ttl_s
        self.owner = f"{os.uname().nodename}:{os.getpid()}:{secrets.token_hex(3)}"
        self.agents = AgentService(store, cartridge, self.repo, self.shutdown, runners, self._emit)

    # -- starting ---------------------------------------------------------------

    def start(
        self,
        title: str,
        ticket: str,
        *,
        auto_merge: bool | None = None,
        profile: str | None = None,
    ) -> str:
        """File a new workflow in preparation; returns its id.

        ``profile`` names its automation profile (default: ``workflow.profile``,
        else ``review``); the workflow keeps it in ``state["profile"]``.
        auto_merge: the ``auto_merge`` argument, else the default of a profile
        named here (a person's choice for this run beats the file), else an
        explicit ``workflow.auto_merge``, else the cartridge profile's default.

        Checks first what would otherwise fail only after an issue and a branch
        exist: the profile, the base branch, and every role's runner (a scripted
        file that does not load). Raises CartridgeError naming the key, or
        PhasegateError.
        """
        settings = self.cartridge.workflow
        if profile is not None and not profile.strip():
            raise CartridgeError("--profile: the profile name is empty")
        chosen = self.cartridge.profile(profile)
        if git(["rev-parse", "--verify", "-q", "HEAD"], self.repo, check=False) == "":
            raise PhasegateError(f"{self.repo} has no commits yet; commit something first")
        base = settings.base_branch or git(["symbolic-ref", "--short", "HEAD"], self.repo)
        if not self.workspace.branch_exists(self.repo, base):
            raise CartridgeError(
                f"{CARTRIDGE_FILE}: workflow.base_branch: {base!r} is not a branch of {self.repo}"
            )
        problems = []
        self.cartridge.require_roles()
        for role in self.cartridge.workflow_roles():
            binding = getattr(self.cartridge.roles, role)
            if binding is not None:
                problems += binding_problems(role, binding)
                self.agents.runner(role)
        if problems:
            raise CartridgeError(f"{CARTRIDGE_FILE}: " + "; ".join(problems))
        self.workspace.exclude(self.repo, ".phasegate/")
        return self.store.create_workflow(
            title=title,
            ticket=ticket,
            repo_path=str(self.repo),
            base_branch=base,
            auto_merge=(
                auto_merge
                if auto_merge is not None
                else chosen.auto_merge
                if profile is not None
                else self.cartridge.auto_merge_for(chosen)
            ),
            content_language=settings.content_language,
            # kept per workflow: flipping [graph] enabled never strands one midway
            state={"profile": chosen.as_state(), "graph_mode": self.cartridge.graph.enabled},
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
                self.store, self.forge, self.workspace, ctx.id, Path(ctx.repo_path)
            ),
            clock=self.clock,
            shutdown=self.shutdown,
        )

    def commit(self, ctx: WorkflowContext, result: PhaseResult) -> dict[str, Any]:
        """Commit ``result`` through the single commit path and report it to on_event."""
        row = self.store.commit_phase_result(ctx, result)
        for event in result.events:
            self._notify(ctx.id, event.type, event.data)
        self._notify(
            ctx.id,
            "committed",
            {
                "outcome": result.outcome,
                "phase": row["current_phase"],
                "status": row["status"],
                "reason": result.reason,
            },
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
        if self.store.claim(workflow_id, self.owner, self.lease_ttl_s) is None:
            raise LeaseHeld(
                f"workflow {workflow_id} is being advanced by another process; "
                "wait until it stops (or stop it), then try again"
            )
        try:
            ctx = self.store.load_context(workflow_id)
            return self.commit(ctx, decision(ctx))
        finally:
            self.store.release(workflow_id, self.owner)

    def advance(self, workflow_id: str, *, max_steps: int = 200) -> dict[str, Any]:
        """Run the workflow until it waits, pauses, fails, completes or shutdown is asked.

        Returns the workflow's row. Raises WorkflowNotFound, or LeaseHeld when
        another live worker is advancing it.
        """
        fence = self.store.claim(workflow_id, self.owner, self.lease_ttl_s)
        if fence is None:
            raise LeaseHeld(f"workflow {workflow_id} is being advanced by another worker")
        heartbeat = _Heartbeat(self.store, workflow_id, self.owner, fence, self.lease_ttl_s)
        heartbeat.start()
        try:
            self._retry_cleanup(workflow_id)
            for _ in range(max_steps):
                if self.shutdown.is_set() or not self._step(workflow_id):
                    break
        finally:
            heartbeat.stopped.set()
            self.store.release(workflow_id, self.owner)
        return self.store.workflow_row(workflow_id)

    def retry_cleanup(self, workflow_id: str) -> MilestoneView | None:
        """Retry the workflow's failed cleanup under its lease (phases/cleanup.py).

        Returns the settled ``cleanup`` milestone, or None when none was
        waiting. Raises LeaseHeld while another live process advances it,
        WorkflowNotFound for an unknown id.
        """
        if self.store.claim(workflow_id, self.owner, self.lease_ttl_s) is None:
            raise LeaseHeld(f"workflow {workflow_id} is being advanced by another process")
        try:
            return self._retry_cleanup(workflow_id)
        finally:
            self.store.release(workflow_id, self.owner)

    def _retry_cleanup(self, workflow_id: str) -> MilestoneView | None:
        settled = cleanup.retry(self.store, self.workspace, workflow_id)
        if settled is not None:
            self._notify(
                workflow_id, "cleanup_retried", {"status": settled.status, "note": settled.summary}
            )
        return settled

    def _step(self, workflow_id: str) -> bool:
        """Run the current phase once and commit. True when the workflow should go on."""
        ctx = self.store.load_context(workflow_id)
        if ctx.status not in RUNNABLE_STATUSES:
            return False
        deps = self.deps_for(ctx)
        try:
            notes = deps.effects.reconcile()
            for note in notes:
                self._emit(ctx.id, EventWrite("reconciled", {"note": note}))
            if notes:
                ctx = self.store.load_context(workflow_id)
            healed = self._self_heal(ctx, deps)
            result = healed or resolve_phase_handler(ctx.current_phase)(ctx, deps)
        except WorkflowPaused as exc:
            self._emit(
                ctx.id,
                EventWrite("paused_by_shutdown", {"phase": ctx.current_phase, "note": str(exc)}),
            )
            return False
        except GitTransient as exc:  # git kept failing on a lock: resume retries
            log.warning("phase %s of %s paused: %s", ctx.current_phase, ctx.id, exc)
            result = PhaseResult("pause", reason=f"{ctx.current_phase}: {exc}")
        except Exception as exc:  # a phase must never crash the engine half-committed
            if isinstance(exc, PhasegateError):  # expected: its message says it all
                log.warning("phase %s of %s: %s", ctx.current_phase, ctx.id, exc)
            else:
                log.exception("phase %s of %s raised", ctx.current_phase, ctx.id)
            result = PhaseResult(
                "failed", reason=f"{ctx.current_phase}: {type(exc).__name__}: {exc}"
            )

        if result.outcome == "wait" and not (result.milestones or result.state or result.updates):
            return False  # nothing new while waiting: no write on every poll
        try:
            row = self.commit(ctx, result)
        except StaleContext as exc:
            log.warning("%s", exc)
            return False
        except ContractViolation as exc:
            log.error("phase %s returned an illegal result: %s", ctx.current_phase, exc)
            row = self.commit(ctx, PhaseResult("failed", reason=f"contract violation: {exc}"))
        return result.outcome in ("completed", "retry") and row["current_phase"] != COMPLETED

    def _self_heal(self, ctx: WorkflowContext, deps: PhaseDeps) -> PhaseResult | None:
        """Re-create a missing or broken worktree from its branch.

        Not in preparation, which creates it, nor in acceptance_verification,
        which works on a temporary checkout of the merge commit after merge
        removed the worktree and the branch; nor once ``merge_completed`` is
        settled, since merge removes both right after merging and a process
        killed before merge committed must find them gone, not broken.

        First, always, clears what killed git processes left in the
        repository (``Workspace.repair``: stale locks, a killed add's locked
        worktree), so no phase trusts or sticks on it.

        Returns a failed result when the branch itself is gone: a phase must
        never run against the wrong checkout.
        """
        for note in deps.workspace.repair(Path(ctx.repo_path)):
            self._emit(ctx.id, EventWrite("git_repaired", {"note": note}))
        if (
            ctx.current_phase in (PREPARATION, ACCEPTANCE_VERIFICATION)
            or not ctx.worktree_path
            or not ctx.branch_name
            or ctx.state.get("worktree_removed")
            or _merged(ctx)
        ):
            return None
        path = Path(ctx.worktree_path)
        if deps.workspace.is_healthy(path, ctx.branch_name):
            return None
        repo = Path(ctx.repo_path)
        if not deps.workspace.branch_exists(repo, ctx.branch_name):
            return PhaseResult(
                "failed", reason=f"branch {ctx.branch_name} is gone; cannot heal the worktree"
            )
        deps.workspace.ensure_worktree(repo, ctx.branch_name, path)
        self._emit(ctx.id, EventWrite("worktree_healed", {"path": str(path)}))
        return None

    # -- the worker -------------------------------------------------------------

    def run_worker(self, *, once: bool = False, poll_s: float = 2.0) -> None:
        """Advance every runnable workflow, forever (or one pass with ``once``).

        A pass also retries failed cleanups (of completed workflows too), at
        most every ``CLEANUP_RETRY_S`` seconds: what blocks one is usually a
        person's checkout, which does not go away within a poll.
        """
        cleaned_at = float("-inf")
        while not self.shutdown.is_set():
            advanced = set()  # advance() retried their cleanups already
            for workflow_id in self.store.runnable_workflow_ids(RUNNABLE_STATUSES):
                if self.shutdown.is_set():
                    break
                try:
                    self.advance(workflow_id)
                    advanced.add(workflow_id)
                except LeaseHeld:
                    continue
            if once or time.monotonic() - cleaned_at >= CLEANUP_RETRY_S:
                cleaned_at = time.monotonic()
                for workflow_id in self.store.workflow_ids_with_milestone(cleanup.KIND, "failed"):
                    if self.shutdown.is_set():
                        break
                    if workflow_id in advanced:
                        continue
                    try:
                        self.retry_cleanup(workflow_id)
                    except LeaseHeld:
                        continue
            if once:
                return
            self.shutdown.wait(poll_s)
