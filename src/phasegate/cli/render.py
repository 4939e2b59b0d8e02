"""How the CLI shows workflows: live progress, outcomes and exit codes, ``show``'s detail."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from phasegate.cli._app import STOP_SIGNALS, console, err, reader_gone, repo_option, shown
from phasegate.cli.status_table import status_table  # noqa: F401  (render's, for the commands)
from phasegate.core.contract import AWAITING_APPROVAL, PIECES, RUNNABLE_STATUSES, WAITING_ON_OTHERS
from phasegate.core.profiles import MAX_REVERSIONS

if TYPE_CHECKING:
    from phasegate.config.cartridge import Cartridge
    from phasegate.core.contract import WorkflowContext
    from phasegate.runtime.engine import Engine
    from phasegate.store import Store


class LiveProgress:
    """Live progress while agents run: a line per step, and phase/round/elapsed on a bar.

    ``several``: the lines are of several workflows at once (a worker, ``watch``),
    so each names its workflow."""

    def __init__(self, quiet: bool, *, several: bool = False) -> None:
        self.quiet = quiet
        self.several = several
        self.started = time.monotonic()
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        )
        self.task = self.progress.add_task("starting", total=None)
        self.phases: dict[str, str] = {}  # each workflow's phase, as its last move said

    def __enter__(self) -> LiveProgress:
        if not self.quiet:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def line(self, text: str) -> None:
        if not self.quiet:
            elapsed = time.monotonic() - self.started
            self.progress.console.print(f"[dim]{elapsed:7.1f}s[/dim] {text}", highlight=False)

    def _step(self, workflow_id: str, text: str) -> None:
        """A line under the workflow's last move: indented, or named among several."""
        self.line(f"  {workflow_id}: {text}" if self.several else f"  {text}")

    def _bar(self, workflow_id: str, text: str) -> None:
        who = f"{workflow_id} · " if self.several else ""
        self.progress.update(self.task, description=who + text)

    def __call__(self, workflow_id: str, type_: str, data: Mapping[str, Any]) -> None:
        phase = self.phases.get(workflow_id, "preparation")
        if type_ == "phase_change":
            if phase == "merge" and data.get("phase") == "completed":
                return  # the merge's word for UI consumers: acceptance verification follows
            self.phases[workflow_id] = str(data.get("phase"))
            self.line(f"[bold]{workflow_id}[/bold] → {data.get('phase')}")
        elif type_ == "agent_started":
            role, round_ = data.get("role"), data.get("round")
            if data.get("pass"):  # a later review of the same round's change
                round_ = f"{round_}, pass {data['pass']}"
            self._bar(workflow_id, f"{phase} · round {round_} · {role} agent running")
            self._step(workflow_id, f"{role} agent ({data.get('runner')}), round {round_}")
        elif type_ == "agent_waiting":  # agents/slots.py: a cap on calls at once is reached
            cap = f"{data.get('scope')} {data.get('key')}: {data.get('cap')} at once"
            self._step(workflow_id, f"{data.get('role')} agent waits for a slot ({cap})")
        elif type_ == "agent_finished" and data.get("outcome") != "ok":
            self._step(
                workflow_id,
                f"[yellow]{data.get('role')} agent: {data.get('outcome')}: "
                f"{shown(str(data.get('error'))[:200])}[/yellow]",
            )
        elif type_ == "committed":
            self._bar(workflow_id, f"{data.get('phase')} · {data.get('status')}")
            outcome = data.get("outcome")
            if outcome in ("failed", "pause"):
                said = data.get("status") if data.get("status") == "cancelled" else outcome
                self._step(workflow_id, f"[red]{said}: {shown(str(data.get('reason')))}[/red]")
            elif outcome == "retry":
                self._step(workflow_id, f"{data.get('phase')}: another round")
            elif outcome == "wait" and data.get("phase") == "pr_review":
                # Committed only at the first look at a head that CI has not finished.
                self._step(
                    workflow_id, f"waiting for CI (`phasegate show {workflow_id}` lists the checks)"
                )
        elif type_ == "reversion":
            self._step(
                workflow_id,
                f"[yellow]reverted to planning ({data.get('reversion_number')} of "
                f"{MAX_REVERSIONS}): {shown(str(data.get('reason'))[:200])}[/yellow]",
            )
        elif type_ == "cleanup_retried":
            color = "green" if data.get("status") == "completed" else "yellow"
            note = shown(str(data.get("note"))[:200])
            self._step(
                workflow_id, f"[{color}]cleanup retried: {data.get('status')}: {note}[/{color}]"
            )
        elif type_ in ("forge_retry", "forge_auto_resume", "comment_dropped"):
            from phasegate.summary import forge_fault_text

            said = shown(forge_fault_text({**data, "type": type_}))
            self._step(workflow_id, f"[yellow]forge: {said}[/yellow]")
        elif type_ in ("reconciled", "worktree_healed", "paused_by_shutdown", "self_fenced"):
            note = shown(str(data.get("note") or data.get("path")))
            self._step(workflow_id, f"[cyan]{type_}: {note}[/cyan]")


@contextmanager
def graceful(
    engine: Engine,
    then: str = "`phasegate resume ID` continues it (the id is printed below)",
    notice: Callable[[], str] | None = None,
) -> Iterator[None]:
    """First Ctrl-C, SIGTERM or SIGHUP (``STOP_SIGNALS``), or the output's reader
    gone (``reader_gone``): stop agents and leave the workflow resumable. Second
    signal: quit now.

    ``then`` says what continues the workflow, in the notice: a second Ctrl-C quits
    at once, before the summary, and leaves only the notice standing;
    ``notice``, when given, makes the whole notice at the moment of the signal."""
    hits = {"n": 0}

    def handler(signum: int, _frame: FrameType | None) -> None:
        hits["n"] += 1
        if hits["n"] > 1:
            raise KeyboardInterrupt
        text = (
            notice()
            if notice is not None
            else (
                f"stopping: the running agent or check is stopped, nothing half-committed; {then}"
            )
        )
        # A closed terminal (SIGHUP) takes no line: the stop goes on without it.
        with contextlib.suppress(OSError):
            err.print(f"\n[yellow]{text}[/yellow]")
        engine.shutdown.set()

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    reader_gone.append(engine.shutdown.set)
    try:
        yield
    finally:
        reader_gone.remove(engine.shutdown.set)
        for s, h in previous.items():
            signal.signal(s, h)


def worker_notice(engine: Engine) -> str:
    """What a worker's first Ctrl-C/SIGTERM stops: the workflows it holds, or nothing."""
    held = sorted(engine.fences)
    if not held:
        return "stopping the worker: no workflow was running"
    return (
        f"stopping the worker: {len(held)} running workflow(s) ({', '.join(held)}) stop "
        "their agents and stay in their phase, nothing half-committed; the next worker "
        "or `phasegate resume ID` carries each on (`phasegate status` lists them)"
    )


def make_engine(
    repo: Path,
    cartridge: Cartridge,
    store: Store,
    progress: LiveProgress | None,
    *,
    notifying: bool = True,
) -> Engine:
    from phasegate.integrations import notify
    from phasegate.proc.sandbox import start_confined
    from phasegate.runtime.engine import Engine

    # Before any agent runs: a "bwrap" that cannot work is exit 2; unconfined is loud.
    start_confined(cartridge, lambda text: err.print(f"[bold red]{shown(text)}[/bold red]"))
    engine = Engine(repo, cartridge, store, on_event=progress)
    if notifying:  # a workflow this process leaves needing a person says so
        notify.attach(engine)
    return engine


#: Statuses a command reports with exit code 1: the workflow stopped short.
STOPPED = frozenset({"failed", "paused", "planning_timeout"})


def drive(
    engine: Engine, workflow_id: str, as_json: bool, extra: Mapping[str, Any] | None = None
) -> None:
    """Advance in the foreground with live progress; exit with the workflow's outcome
    (``extra``: what the action that preceded it adds to the JSON, as ``finish``)."""
    from phasegate.integrations import notify
    from phasegate.runtime import outage
    from phasegate.runtime.due import waits_on_ci

    at = repo_option({"repo_path": engine.repo})  # the engine's repository: no read
    then = f"`phasegate resume {workflow_id}{at}` continues it"
    with LiveProgress(quiet=as_json) as progress, graceful(engine, then=then):
        notify.set_on_event(engine, progress)  # keeps the engine's notifier
        row = engine.advance(workflow_id)
        # CI runs on the forge: the foreground run waits for it, and for a forge pause's
        # automatic resume (Ctrl-C leaves the workflow resumable, and a worker would
        # look at it just the same).
        while not engine.shutdown.is_set():
            resume_in = outage.resume_in_s(engine.store, row)
            wait = engine.cartridge.forge.poll_s if waits_on_ci(row) else resume_in
            if wait is None or engine.shutdown.wait(wait):
                break
            forge = engine.cartridge.forge
            if resume_in is not None and not outage.resume(
                engine.decide, forge, workflow_id, row["version"]
            ):
                break
            row = engine.advance(workflow_id)
    finish(engine.store, row, as_json, interrupted=engine.shutdown.is_set(), extra=extra)


def drive_unless_taken(
    engine: Engine, workflow_id: str, as_json: bool, extra: Mapping[str, Any] | None = None
) -> None:
    """``drive``, after the workflow was filed or a person's decision recorded: a
    worker that took the workflow on meanwhile is not an error, the workflow goes
    on there (exit 0; the holder named ``host:pid``, in JSON ``worker``)."""
    from phasegate.runtime.engine import LeaseHeld
    from phasegate.summary import lease_holder, workflow_summary

    try:
        drive(engine, workflow_id, as_json, extra)
    except LeaseHeld:
        row = engine.store.workflow_row(workflow_id)
        worker = lease_holder(engine.store, row).get("worker")
        # An owner is host:pid:token (Engine.owner); a person knows a process by host:pid.
        where = ":".join(str(worker).split(":")[:2]) if worker else None
        if as_json:
            summary = {**workflow_summary(engine.store, row), **(extra or {})}
            summary["taken_by_worker"] = True
            summary.setdefault("worker", where)
            console.print_json(json.dumps(summary, default=str))
        else:
            by = f" ({where})" if where else ""
            console.print(
                f"workflow {workflow_id} was taken on by a worker{by} meanwhile and goes on "
                f"there; `phasegate show {workflow_id}`",
                highlight=False,
            )


def finish(
    store: Store,
    row: Mapping[str, Any],
    as_json: bool,
    interrupted: bool = False,
    driven: bool = True,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Print the outcome and exit with its code (module docstring).

    ``extra``: keys the JSON carries beside the workflow's summary (what a person's
    action did besides: a resume's ``dropped``, a cancel's ``pieces_cancelled``).

    ``driven``: the workflow was just advanced in the foreground, so a runnable
    status other than waiting means it stopped early (another process moved it).
    """
    from phasegate.summary import workflow_summary

    summary = {**workflow_summary(store, row), **(extra or {})}
    approved = row["state"].get("merge_approved")
    at = repo_option(row)
    stopped_early = (
        driven
        and not interrupted
        and row["status"] in RUNNABLE_STATUSES
        and row["status"] != "waiting"
    )
    if as_json:
        console.print_json(json.dumps(summary, default=str))
    else:
        status = row["status"]
        shades = {"completed": "green", "waiting": "cyan", AWAITING_APPROVAL: "cyan"}
        color = shades.get(status, "yellow" if status in WAITING_ON_OTHERS else "red")
        console.print(
            f"workflow [bold]{row['id']}[/bold]: {row['current_phase']} · "
            f"[{color}]{status}[/{color}]",
            highlight=False,
        )
        if summary["error"]:
            console.print(f"  reason: {shown(summary['error'])}", highlight=False)
        # A next: line is commands to paste: never folded (soft_wrap), even in a pipe.
        if status == "waiting" and not approved:
            console.print(
                f"  next: `phasegate approve-merge {row['id']}{at}` or "
                f'`phasegate feedback {row["id"]} "..."{at}`',
                highlight=False,
                soft_wrap=True,
            )
        elif status == AWAITING_APPROVAL:
            awaited = summary["awaiting_proposal"]
            if awaited:
                console.print(
                    f"  next: `phasegate proposals{at}` shows its evidence; `phasegate approve "
                    f"{awaited}{at}` or `phasegate reject {awaited} --reason TEXT{at}`",
                    highlight=False,
                    soft_wrap=True,
                )
            else:  # decided, and the process died before the workflow moved on
                console.print(
                    f"  next: `phasegate resume {row['id']}{at}`", highlight=False, soft_wrap=True
                )
        elif status in WAITING_ON_OTHERS:
            started = (
                "runs its pieces, and it completes after its last one"
                if status == PIECES
                else "starts it once what it waits for has merged and verified"
            )
            console.print(
                f"  next: a `phasegate worker{at}` {started}; `phasegate show {row['id']}{at}` "
                "lists them",
                highlight=False,
                soft_wrap=True,
            )
        elif stopped_early:
            console.print(
                "  stopped before finishing: another process changed the workflow; "
                f"`phasegate show {row['id']}`",
                highlight=False,
                soft_wrap=True,
            )
        elif status in STOPPED or interrupted:
            hint = next_hint(store.load_context(row["id"]), at)
            console.print(f"  next: {hint}", highlight=False, soft_wrap=True)
    if interrupted:
        raise typer.Exit(130)
    if row["status"] in STOPPED or stopped_early:
        raise typer.Exit(1)


def next_hint(ctx: WorkflowContext, at: str = "") -> str:
    """The commands a stopped or interrupted workflow's ``next:`` line names: those
    of the actions that apply to it (``phasegate.operations.actions``), the one a
    person most likely wants first; ``at``: ``repo_option``'s `` --repo PATH``."""
    from phasegate.operations import actions

    offered = actions(ctx)
    wid = ctx.id
    show = f"`phasegate show {wid}{at}`"
    if "verify_override" in offered:
        decide = (
            f"`phasegate verify-override {wid} --verdict confirmed{at}` or "
            f"`phasegate verify-override {wid} --verdict rejected --reason TEXT{at}`"
        )
        if ctx.state.get("verification_status") in ("rejected", "indeterminate"):
            # the verifier said its word: verifying again says it again; a person decides
            return f"{show}, then {decide}"
        return f"{show}, then `phasegate resume {wid}{at}` (verifies again), or {decide}"
    if "resume" in offered:
        return f"{show}, then `phasegate resume {wid}{at}`"
    if "cleanup" in offered:
        return f"{show}, then `phasegate cleanup {wid}{at}`"
    return show
