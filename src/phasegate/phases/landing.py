"""Preparing a new worktree as a developer's checkout: its ignored files brought, its setup run.

Run once per new worktree: by preparation, which makes it, and by the self-heal
(``runtime.healing``), which makes it again (docs/worktrees.md). Each
preparation is a ``worktree_setup`` milestone, written ``in_progress`` before
anything is brought or run and settled after, one row per worktree made (its
``generation``). A row left ``in_progress`` by a crash is cancelled by the
reconciliation, and a failed one stays failed; either way the preparation is
still owed (``owed``), so the next advance runs it again, never skips it.

The setup runs as the checks do (``PhaseDeps.run_checks``): supervised and
journaled as a ``check_process``, confined by ``landing_areas.sandbox`` and
``network``, with the checks' environment and the workflow's ports, its
output redacted and cut to its tail. Its result is a ``worktree_setup``
event. A setup that fails, times out or cannot start pauses the workflow with
a reason naming ``landing_areas.setup`` and the output's tail; a resume runs
it again.
"""

from __future__ import annotations

from pathlib import Path

from phasegate.agents.env import cartridge_secrets, check_env
from phasegate.core.contract import EventWrite, MilestoneWrite, PhaseResult, WorkflowContext
from phasegate.git.checks import CheckResult, CheckUnstartable
from phasegate.git.worktree_files import bring_files
from phasegate.journal import ProcessJournal
from phasegate.phases.deps import PhaseDeps
from phasegate.proc.process import start_ticks
from phasegate.proc.sandbox import check_confinement

__all__ = ["FILES_EVENT", "KIND", "SETUP_EVENT", "owed", "prepare", "prepare_checkout"]

#: The milestone of one worktree's preparation.
KIND = "worktree_setup"
#: The event saying which files were copied, linked and skipped.
FILES_EVENT = "worktree_files"
#: The event holding the setup's result and output.
SETUP_EVENT = "worktree_setup"
#: Characters of the setup's output a pause's reason quotes (its end).
_REASON_TAIL = 1200


def owed(ctx: WorkflowContext, deps: PhaseDeps) -> bool:
    """Whether the worktree's preparation is still to run: the cartridge prepares
    worktrees and the newest ``worktree_setup`` is missing or not completed."""
    if not deps.cartridge.landing_areas.prepares:
        return False
    last = ctx.milestone(KIND)
    return last is None or last.status != "completed"


def prepare(
    ctx: WorkflowContext, deps: PhaseDeps, worktree: Path, phase: str, *, new: bool = False
) -> PhaseResult | None:
    """Prepare ``worktree`` when it is owed (``owed``) or ``new`` (just made again
    by the self-heal): bring the ``copy`` and ``link`` entries, then run
    ``setup``. Returns None when prepared (or nothing is to be done), a pause
    naming ``landing_areas.setup`` when the setup failed. Raises WorkflowPaused
    (shutdown, the lease's deadline), FenceLost, GitError and OSError (a copy
    that failed: the engine fails the phase, and a resume tries again)."""
    areas = deps.cartridge.landing_areas
    if not areas.prepares or not (new or owed(ctx, deps)):
        return None
    rows = ctx.milestones_of(KIND)
    last = rows[-1] if rows else None
    generation = len(rows) + 1
    if last is not None and last.status != "completed" and not new:
        generation = int(last.data.get("generation") or len(rows))  # the owed one, again
    fence = deps.effects.fence
    if fence is not None:
        fence.check()
    row = deps.store.write_milestone(
        ctx.id,
        phase,
        MilestoneWrite(
            KIND,
            status="in_progress",
            key=f"g{generation}",
            summary=f"preparing {worktree}",
            data={"generation": generation, "path": str(worktree)},
        ),
    )
    brought = bring_files(Path(ctx.repo_path), worktree, areas.copy_files, areas.link)
    deps.store.add_event(ctx.id, EventWrite(FILES_EVENT, brought.as_dict()))
    data = {"generation": generation, "path": str(worktree), "files": brought.summary()}
    if not areas.setup:
        deps.store.settle_milestone(row, "completed", summary=brought.summary(), data=data)
        return None
    try:
        result = _run_setup(ctx, deps, worktree, phase, areas.setup)
    except CheckUnstartable as exc:
        result = CheckResult(areas.setup, None, 0.0, str(exc))
    said = {**result.as_dict(), "generation": generation}
    deps.store.add_event(ctx.id, EventWrite(SETUP_EVENT, said))
    verb = _verb(result, areas.setup_timeout)
    took = "" if result.timed_out else f" in {result.duration_s:.1f} s"  # the verb says
    summary = f"landing_areas.setup {verb}{took}; {brought.summary()}"
    status = "completed" if result.passed else "failed"
    deps.store.settle_milestone(row, status, summary=summary, data={**data, "setup": said})
    if result.passed:
        return None
    tail = result.output.strip()[-_REASON_TAIL:] or "(no output)"
    return PhaseResult(
        "pause",
        reason=(
            f"landing_areas.setup {verb} in {worktree}: {tail}\n"
            "fix the setup command or what it needs, then `phasegate resume` runs it again"
        ),
    )


def prepare_checkout(
    ctx: WorkflowContext, deps: PhaseDeps, checkout: Path, phase: str, what: str
) -> CheckResult | None:
    """Prepare a short-lived ``checkout`` (``what`` names it: ``merge commit``) as a
    worktree is, so its checks see what the worktree's saw: the ``copy`` and
    ``link`` entries brought, then ``setup`` run once. Both are events
    (``worktree_files``, ``worktree_setup``) carrying ``checkout``; no milestone.
    Returns the setup's result (None without a setup): the caller counts a
    failed one as a failed check. Raises as ``prepare`` does."""
    areas = deps.cartridge.landing_areas
    if not areas.prepares:
        return None
    brought = bring_files(Path(ctx.repo_path), checkout, areas.copy_files, areas.link)
    deps.store.add_event(ctx.id, EventWrite(FILES_EVENT, {**brought.as_dict(), "checkout": what}))
    if not areas.setup:
        return None
    try:
        result = _run_setup(ctx, deps, checkout, phase, areas.setup)
    except CheckUnstartable as exc:
        result = CheckResult(areas.setup, None, 0.0, str(exc))
    deps.store.add_event(ctx.id, EventWrite(SETUP_EVENT, {**result.as_dict(), "checkout": what}))
    return result


def _verb(result: CheckResult, timeout_s: float) -> str:
    if result.passed:
        return "passed"
    if result.timed_out:
        return f"timed out after {timeout_s:g} s (landing_areas.setup_timeout)"
    if result.exit_code is None:
        return "could not start"
    return f"failed (exit {result.exit_code})"


def _run_setup(
    ctx: WorkflowContext, deps: PhaseDeps, worktree: Path, phase: str, command: str
) -> CheckResult:
    """The setup ``command`` run in ``worktree`` as a check runs (``PhaseDeps.run_checks``)."""
    areas = deps.cartridge.landing_areas
    journal = ProcessJournal(deps.store, ctx.id, fence=deps.effects.fence)
    with journal.spawning(phase, "check_process") as spawned:
        (result,) = deps.workspace.run_checks(
            [command],
            worktree,
            areas.setup_timeout,
            deps.shutdown,
            env={**check_env(areas.pass_env), **deps.port_env()},
            secrets=cartridge_secrets(deps.cartridge),
            confinement=check_confinement(areas.sandbox, network=areas.network),
            on_spawn=lambda _command, pid: spawned(
                pid, "landing_areas.setup", f"setup.{pid}.{start_ticks(pid)}"
            ),
            key="landing_areas.setup",
        )
    return result
