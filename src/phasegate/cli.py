"""The ``phasegate`` command line (typer).

Exit codes: 0 done (completed, or waiting for a person: a merge approval in
wait, a proposal's approval in awaiting_approval); 1 the workflow
failed or paused; 2 bad input (cartridge, unknown workflow, illegal request);
130 stopped by Ctrl-C or SIGTERM (the workflow stays resumable).
"""

from __future__ import annotations

import getpass
import json
import secrets
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from phasegate import __version__, decisions
from phasegate.agents import binding_problems
from phasegate.autonomy import AutonomyPolicy, streak
from phasegate.cartridge import (
    CARTRIDGE_FILE,
    Cartridge,
    CartridgeError,
    DefaultCartridge,
    default_cartridge,
    load_cartridge,
)
from phasegate.contract import (
    AWAITING_APPROVAL,
    DEVELOPMENT,
    RUNNABLE_STATUSES,
    PhasegateError,
    PhaseResult,
)
from phasegate.doctor import Diagnosis, diagnose
from phasegate.engine import Engine, LeaseHeld
from phasegate.graph import AgentCall, Answer, GraphRules
from phasegate.harness import ProposeInterrupted, RunnerAnswers, replay_check
from phasegate.harness import propose as run_graph
from phasegate.phases import acceptance_verification
from phasegate.phases.graph_mode import CHECKS_GATE
from phasegate.profiles import MAX_REVERSIONS, AutomationProfile, decisions_of
from phasegate.report import render_report
from phasegate.store import APPLY_ARM, Store, open_store
from phasegate.store.tables import PROPOSAL_STATUSES
from phasegate.workspace import GitError, Workspace, git

app = typer.Typer(
    help="Drive coding agents through a contract-checked ticket lifecycle:\n\n"
    "preparation → planning → development → pr_review → report → wait → merge → "
    "acceptance_verification → completed.\n\nStart with `phasegate demo`, or "
    '`phasegate init` in your repository and then `phasegate run "ticket"`.\n\n'
    "With [graph] enabled = true in phasegate.toml, planning, development and pr_review "
    "follow the development graph: competing plans, a build that answers with a diff, "
    "review tiers, a bounded fix loop, and a draft PR proposal that the apply arm lands "
    "or a person approves (`phasegate demo --graph` shows one).",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)
console = Console()
err = Console(stderr=True, soft_wrap=True)  # never fold a message a script will read

RepoOption = Annotated[
    Path, typer.Option("--repo", "-C", help="The repository (default: the current directory).")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


class UsageError(PhasegateError):
    """Bad input on the command line."""


def _fail(message: str, code: int = 2) -> typer.Exit:
    # Messages quote keys, paths and agent output: "[roles.build]" is text, not markup.
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False, markup=True)
    return typer.Exit(code)


@contextmanager
def _errors() -> Iterator[None]:
    """Turn phasegate's errors into a one-line message and exit code 2."""
    try:
        yield
    except (PhasegateError, GitError) as exc:
        raise _fail(str(exc)) from None


def _repo_root(repo: Path) -> Path:
    try:
        return Path(git(["rev-parse", "--show-toplevel"], repo.resolve()))
    except (GitError, FileNotFoundError):
        raise UsageError(f"{repo.resolve()} is not inside a git repository") from None


def _open(repo: Path) -> tuple[Path, Cartridge, Store]:
    root = _repo_root(repo)
    cartridge = load_cartridge(root)
    return root, cartridge, open_store(cartridge.store_url(root))


def _open_for_reading(repo: Path) -> Store:
    """The store, even while the cartridge is broken: looking must not need it valid."""
    root = _repo_root(repo)
    try:
        return open_store(load_cartridge(root).store_url(root))
    except CartridgeError as exc:
        err.print(f"[yellow]warning:[/yellow] {escape(str(exc))}; reading the default store")
        return open_store(Cartridge().store_url(root))


# -- progress -----------------------------------------------------------------------


class _Progress:
    """Live progress while agents run: a line per step, and phase/round/elapsed on a bar."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.started = time.monotonic()
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        )
        self.task = self.progress.add_task("starting", total=None)
        self.phase = "preparation"

    def __enter__(self) -> _Progress:
        if not self.quiet:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def line(self, text: str) -> None:
        if not self.quiet:
            elapsed = time.monotonic() - self.started
            self.progress.console.print(f"[dim]{elapsed:7.1f}s[/dim] {text}", highlight=False)

    def __call__(self, workflow_id: str, type_: str, data: Mapping[str, Any]) -> None:
        if type_ == "phase_change":
            self.phase = str(data.get("phase"))
            self.line(f"[bold]{workflow_id}[/bold] → {self.phase}")
        elif type_ == "agent_started":
            desc = f"{self.phase} · round {data.get('round')} · {data.get('role')} agent running"
            self.progress.update(self.task, description=desc)
            self.line(
                f"  {data.get('role')} agent ({data.get('runner')}), round {data.get('round')}"
            )
        elif type_ == "agent_finished" and data.get("outcome") != "ok":
            self.line(
                f"  [yellow]{data.get('role')} agent: {data.get('outcome')}: "
                f"{escape(str(data.get('error'))[:200])}[/yellow]"
            )
        elif type_ == "committed":
            self.progress.update(
                self.task, description=f"{data.get('phase')} · {data.get('status')}"
            )
            if data.get("outcome") in ("failed", "pause"):
                self.line(f"  [red]{data.get('outcome')}: {escape(str(data.get('reason')))}[/red]")
            elif data.get("outcome") == "retry":
                self.line(f"  {data.get('phase')}: another round")
        elif type_ == "reversion":
            self.line(
                f"  [yellow]reverted to planning ({data.get('reversion_number')} of "
                f"{MAX_REVERSIONS}): "
                f"{escape(str(data.get('reason'))[:200])}[/yellow]"
            )
        elif type_ in ("reconciled", "worktree_healed", "paused_by_shutdown"):
            note = escape(str(data.get("note") or data.get("path")))
            self.line(f"  [cyan]{type_}: {note}[/cyan]")


@contextmanager
def _graceful(engine: Engine, what: str = "the id is printed below") -> Iterator[None]:
    """First Ctrl-C/SIGTERM: stop agents and leave the workflow resumable. Second: quit now.

    ``what`` ends the notice: where the person finds the workflow to resume."""
    hits = {"n": 0}

    def handler(signum: int, _frame: FrameType | None) -> None:
        hits["n"] += 1
        if hits["n"] > 1:
            raise KeyboardInterrupt
        err.print(
            "\n[yellow]stopping: the running agent is stopped, nothing half-committed; "
            f"`phasegate resume` continues it ({what})[/yellow]"
        )
        engine.shutdown.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _engine(repo: Path, cartridge: Cartridge, store: Store, progress: _Progress | None) -> Engine:
    return Engine(repo, cartridge, store, on_event=progress)


#: Statuses a command reports with exit code 1: the workflow stopped short.
_STOPPED = frozenset({"failed", "paused", "planning_timeout"})


def _drive(engine: Engine, workflow_id: str, as_json: bool) -> None:
    """Advance in the foreground with live progress; exit with the workflow's outcome."""
    with _Progress(quiet=as_json) as progress, _graceful(engine):
        engine.on_event = progress
        row = engine.advance(workflow_id)
    _finish(engine.store, row, as_json, interrupted=engine.shutdown.is_set())


def _repo_option(row: Mapping[str, Any]) -> str:
    """`` --repo PATH`` for a hint about a workflow whose repository is not the one
    the person is in (``demo --dir``, ``--repo``), else nothing."""
    repo = Path(str(row.get("repo_path") or "."))
    try:
        Path.cwd().resolve().relative_to(repo.resolve())
    except (ValueError, OSError):
        return f" --repo {repo}"
    return ""


def _drive_unless_taken(engine: Engine, workflow_id: str, as_json: bool) -> None:
    """``_drive``, after a person's decision was recorded: a worker that took the
    workflow on meanwhile is not an error, the workflow goes on there (exit 0)."""
    try:
        _drive(engine, workflow_id, as_json)
    except LeaseHeld:
        row = engine.store.workflow_row(workflow_id)
        if as_json:
            summary = {**_summary(engine.store, row), "taken_by_worker": True}
            console.print_json(json.dumps(summary, default=str))
        else:
            console.print(
                f"workflow {workflow_id} was taken on by a worker meanwhile and goes on there; "
                f"`phasegate show {workflow_id}`",
                highlight=False,
            )


def _finish(
    store: Store,
    row: Mapping[str, Any],
    as_json: bool,
    interrupted: bool = False,
    driven: bool = True,
) -> None:
    """Print the outcome and exit with its code (module docstring).

    ``driven``: the workflow was just advanced in the foreground, so a runnable
    status other than waiting means it stopped early (another process moved it).
    """
    summary = _summary(store, row)
    approved = row["state"].get("merge_approved")
    at = _repo_option(row)
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
        color = {"completed": "green", "waiting": "cyan", AWAITING_APPROVAL: "cyan"}.get(
            status, "red"
        )
        console.print(
            f"workflow [bold]{row['id']}[/bold]: {row['current_phase']} · "
            f"[{color}]{status}[/{color}]",
            highlight=False,
        )
        if row.get("error"):
            console.print(f"  reason: {escape(row['error'])}", highlight=False)
        if status == "waiting" and not approved:
            console.print(
                f"  next: `phasegate approve-merge {row['id']}{at}` or "
                f'`phasegate feedback {row["id"]} "..."{at}`',
                highlight=False,
            )
        elif status == AWAITING_APPROVAL:
            awaited = summary["awaiting_proposal"]
            if awaited:
                console.print(
                    f"  next: `phasegate proposals{at}` shows its evidence; `phasegate approve "
                    f"{awaited}{at}` or `phasegate reject {awaited} --reason TEXT{at}`",
                    highlight=False,
                )
            else:  # decided, and the process died before the workflow moved on
                console.print(f"  next: `phasegate resume {row['id']}{at}`", highlight=False)
        elif stopped_early:
            console.print(
                "  stopped before finishing: another process changed the workflow; "
                f"`phasegate show {row['id']}`",
                highlight=False,
            )
        elif status in _STOPPED or interrupted:
            console.print(
                f"  next: `phasegate show {row['id']}{at}`, "
                f"then `phasegate resume {row['id']}{at}`",
                highlight=False,
            )
    if interrupted:
        raise typer.Exit(130)
    if row["status"] in _STOPPED or stopped_early:
        raise typer.Exit(1)


def _summary(store: Store, row: Mapping[str, Any]) -> dict[str, Any]:
    usage = store.usage_totals(row["id"])
    awaited = None
    if row["status"] == AWAITING_APPROVAL:
        waiting = [
            p
            for p in store.proposals(status="proposed", workflow_id=row["id"])
            if p["kind"] == "draft_pr_create"
        ]
        awaited = waiting[-1]["id"] if waiting else None
    return {
        "id": row["id"],
        "title": row["title"],
        "current_phase": row["current_phase"],
        "status": row["status"],
        "error": row.get("error"),
        # the proposal a person's approve/reject moves the workflow on with, if any
        "awaiting_proposal": awaited,
        "dev_round": row["dev_round"],
        "profile": AutomationProfile.from_state(row["state"]).name,
        "reversion_count": int(row["state"].get("reversion_count") or 0),
        "issue_number": row["issue_number"],
        "pr_number": row["pr_number"],
        "branch_name": row["branch_name"],
        "merge_sha": row["merge_sha"],
        "verification_status": row["state"].get("verification_status"),
        "verified_by": row["state"].get("verified_by"),
        "tokens": usage.tokens,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cost_usd": round(usage.cost_usd, 6),
        "agent_runs": usage.runs,
        "created_at": _iso(row["created_at"]),
        "updated_at": _iso(row["updated_at"]),
        "completed_at": _iso(row.get("completed_at")),
    }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


# -- commands -----------------------------------------------------------------------


def _version(value: bool) -> None:
    if value:
        console.print(f"phasegate {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """phasegate"""


@app.command(short_help="Write phasegate.toml, from what it finds.")
def init(
    repo: RepoOption = Path("."),
    force: Annotated[bool, typer.Option(help="Overwrite an existing cartridge.")] = False,
) -> None:
    """Write phasegate.toml, with roles and checks chosen from what it finds.

    Roles: the claude-code runner when `claude` is on PATH, else codex when
    `codex` is, else the api runner when ANTHROPIC_API_KEY or OPENAI_API_KEY is
    set, else commented examples. The base branch and the checks (pytest, npm
    test, cargo test, go test, make test) come from the repository.
    """
    with _errors():
        root = _repo_root(repo)
        path = root / CARTRIDGE_FILE
        if path.exists() and not force:
            raise UsageError(f"{path} exists; use --force to overwrite")
        chosen = default_cartridge(root)
        path.write_text(chosen.text, encoding="utf-8")
        Workspace().exclude(root, ".phasegate/")
        load_cartridge(root)
    console.print(f"wrote {path}", highlight=False)
    _print_chosen(chosen)


def _print_chosen(chosen: DefaultCartridge) -> None:
    def say(label: str, text: str) -> None:
        console.print(f"  {label}: {escape(text)}", highlight=False)

    if chosen.runner is None:
        say("roles", "none bound (no agent CLI found, no model key set)")
    else:
        how = [f"every role on the {chosen.runner} runner"]
        if chosen.executable:
            how.append(f"{chosen.executable}")
        if chosen.model:
            how.append(f"model {chosen.model}")
        how.append(
            f"api_key_env = {chosen.api_key_env}" if chosen.api_key_env else "no api_key_env"
        )
        say("roles", ", ".join(how))
    say("base branch", f"{chosen.base_branch} ({chosen.base_branch_why})")
    if chosen.checks:
        for check in chosen.checks:
            say("check", f"{check.command}  ({check.why})")
    else:
        say("checks", "none found")
    for note in chosen.notes:
        console.print(f"  [yellow]note:[/yellow] {escape(note)}", highlight=False)
    if chosen.runner is None:
        console.print(
            f"next: bind the roles in {CARTRIDGE_FILE}, then `phasegate doctor`", highlight=False
        )
    else:
        console.print(
            'next: `phasegate doctor`, `phasegate dry-run "a small ticket"` (offline, '
            'a scripted model), then `phasegate run "your ticket"`',
            highlight=False,
        )


@app.command(short_help="Check what a run needs; list what is missing.")
def doctor(repo: RepoOption = Path("."), as_json: JsonOption = False) -> None:
    """Check agent CLIs, model keys, git and the cartridge: is a run ready?

    What a run needs: agent CLIs, model keys, git, the cartridge and its roles.

    Lists the agent CLIs found on PATH (claude, codex, and every executable
    the cartridge names) with their versions, which model keys are set (never
    their values), the git version, whether the cartridge is valid, what each
    role is bound to, and what is missing. Exit code 0 when everything a run
    needs is there, 1 when something is missing.
    """
    found = diagnose(repo)
    if as_json:
        console.print_json(json.dumps(found.as_dict()))
    else:
        _print_diagnosis(found)
    if not found.ok:
        raise typer.Exit(1)


def _print_diagnosis(found: Diagnosis) -> None:
    def line(mark: str, text: str) -> None:
        console.print(f"  {mark} {escape(text)}", highlight=False)

    yes, no = "[green]✓[/green]", "[red]✗[/red]"
    console.print(
        f"phasegate {found.phasegate} · git {found.git or 'not found'} · "
        f"repo {found.repo or 'none'}",
        highlight=False,
    )
    console.print("[bold]agent CLIs[/bold]")
    for cli in found.agent_clis:
        if cli.path is None:
            line("[dim]−[/dim]", f"{cli.name}: not found")
        else:
            where = cli.path if cli.path == cli.name else f"{cli.name}: {cli.path}"
            line(yes if cli.version else no, f"{where}  {cli.version or cli.error}")
    console.print("[bold]model keys[/bold] (whether set; values are never shown)")
    is_set = [name for name, ok in found.keys.items() if ok]
    unset = [name for name, ok in found.keys.items() if not ok]
    line(yes if is_set else "[dim]−[/dim]", "set: " + (", ".join(is_set) or "none"))
    line("[dim]−[/dim]", "not set: " + (", ".join(unset) or "none"))
    cart = found.cartridge
    if cart["path"]:
        state = "valid" if cart["valid"] else ("invalid" if cart["found"] else "not found")
        console.print(f"[bold]cartridge[/bold] {escape(cart['path'])}: {state}", highlight=False)
    if found.roles:
        console.print("[bold]roles[/bold]")
    for role in found.roles:
        if not role.bound:
            line(no, f"{role.role}: not bound")
        elif role.error:
            line(no, f"{role.role}: {role.error}")
        else:
            parts = [role.runner or "?"]
            if role.model:
                parts.append(f"model {role.model}")
            if role.executable and role.executable != role.resolved:
                parts.append(f"{role.executable} → {role.resolved or 'NOT FOUND'}")
            elif role.executable:
                parts.append(role.executable)
            if role.api_key_env:
                parts.append(f"{role.api_key_env} {'set' if role.api_key_set else 'NOT SET'}")
            problem = (role.executable and not role.resolved and role.runner != "command") or (
                role.api_key_env and not role.api_key_set
            )
            line(no if problem else yes, f"{role.role}: " + " · ".join(parts))
    line(
        yes if found.litellm else "[dim]−[/dim]",
        f"litellm {'installed' if found.litellm else 'not installed'} (for api roles)",
    )
    for warning in found.warnings:
        line("[yellow]![/yellow]", warning)
    if found.missing:
        console.print(f"[red]missing ({len(found.missing)})[/red]")
        for item in found.missing:
            line(no, item)
    else:
        console.print("[green]ready[/green]: everything a run needs is there")


def _ticket_from(ticket: str | None, ticket_file: Path | None) -> str:
    if (ticket is None) == (ticket_file is None):
        raise UsageError("give the ticket text or --ticket FILE (one of them)")
    if ticket_file is not None:
        try:
            ticket = ticket_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read {ticket_file}: {exc}") from None
    assert ticket is not None
    if not ticket.strip():
        raise UsageError("the ticket is empty")
    return ticket


@app.command(
    "dry-run",
    short_help="Run a workflow offline, on a throwaway clone.",
    epilog="The script format, and what the dry run keeps and replaces: README.md, "
    "section 'Dry run'.",
)
def dry_run(
    ticket: Annotated[str | None, typer.Argument(help="The ticket text.")] = None,
    ticket_file: Annotated[
        Path | None, typer.Option("--ticket", help="Read the ticket from FILE.")
    ] = None,
    script: Annotated[
        Path | None,
        typer.Option(help="The model's turns per role, a TOML file (default: built-in)."),
    ] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the temporary clone (and its state) afterwards.")
    ] = False,
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """Run a whole workflow offline: a scripted model, a throwaway clone.

    Every claude-code, codex and api role keeps its runner, executable, tools
    and permissions but talks to a local scripted model server (base_url and a
    dummy key are replaced); command and scripted roles run as they are. The
    work happens in a local clone (git clone --local --no-hardlinks) in a
    temporary directory with its own store, and merges there without asking:
    the repository is never touched.

    The script is TOML, one table per role (plan, plan_review, build, review,
    verification) or per phrase of a prompt (tried first), each with steps,
    one per model turn:

    \b
        [review]
        steps = [{ text = "Needs a test.\\nVERDICT: request_changes" }]
        ["review round 2"]
        steps = [{ text = "VERDICT: approve" }]
        [build]
        steps = [
          { tools = [{ name = "Write", input = { file_path = "{cwd}/a.txt", content = "a" } }] },
          { text = "Wrote a.txt." },
        ]

    A step has text, tools ([{name, input}]: Write/Edit/Read/Bash for Claude
    Code, {cwd} being its working directory; exec_command {cmd} for Codex),
    status (an HTTP error), input_tokens, output_tokens, delay_s, hang. Roles
    left out answer acceptably: a plan, VERDICT: approve, a build writing
    phasegate-dry-run.txt, VERDICT: confirmed.

    In graph mode ([graph] enabled = true) the roles' scripts are picked by the
    development graph's prompts and every role is read-only: the built-in build
    answers with a unified diff, the bound graph roles (scope_epic,
    plan_alternative, plan_arbitrate, plan_adversary, review_adversary,
    arbitrate) answer acceptably, and the draft PR is landed without asking.
    """
    from phasegate.dryrun import dry_run_workspace, load_script

    with _errors():
        text = _ticket_from(ticket, ticket_file)
        root = _repo_root(repo)
        cartridge = load_cartridge(root)
        cartridge.require_roles(root / CARTRIDGE_FILE)
        steps = load_script(script) if script is not None else None
        with dry_run_workspace(root, cartridge, steps, keep=keep) as dry:
            store = open_store(dry.cartridge.store_url(dry.clone))
            try:
                engine = _engine(dry.clone, dry.cartridge, store, None)
                if not as_json:
                    console.print(
                        f"dry run on a clone of {root}: {dry.clone}\n"
                        f"  scripted model at {dry.server.url} for: "
                        f"{', '.join(dry.offline_roles) or 'no role'}"
                        + (
                            f"; as they are: {', '.join(dry.as_is_roles)}"
                            if dry.as_is_roles
                            else ""
                        ),
                        highlight=False,
                    )
                workflow_id = engine.start(_title_of(text), text, auto_merge=True)
                with _Progress(quiet=as_json) as progress, _graceful(engine):
                    engine.on_event = progress
                    engine.advance(workflow_id)
                detail = _detail(store, workflow_id)
            finally:
                store.close()
            requests = dry.model_requests()
            clone = str(dry.clone)
    info = {
        "repo": str(root),
        "clone": clone,
        "kept": keep,
        "script": str(script) if script else None,
        "model_requests": requests,
        "offline_roles": dry.offline_roles,
        "as_is_roles": dry.as_is_roles,
    }
    summary = detail["workflow"]
    if as_json:
        console.print_json(json.dumps({"dry_run": info, **detail}, default=str))
    else:
        console.print()
        _print_detail(detail)
        color = "green" if summary["status"] in ("completed", "waiting") else "red"
        console.print(
            f"\ndry run: {summary['current_phase']} · [{color}]{summary['status']}[/{color}] · "
            f"{requests} model request(s) answered by the script",
            highlight=False,
        )
        if summary["error"]:
            console.print(f"  reason: {escape(summary['error'])}", highlight=False)
        where = f"kept in {clone}" if keep else "removed (--keep keeps it)"
        console.print(f"  {root} was not touched; the clone was {where}", highlight=False)
    if engine.shutdown.is_set():
        raise typer.Exit(130)
    if summary["status"] in _STOPPED:
        raise typer.Exit(1)


ProfileOption = Annotated[
    str | None,
    typer.Option(
        "--profile",
        help="The automation profile: manual, review, trusted, auto, ci, full-auto or a "
        "[profiles.NAME] of the cartridge (default: workflow.profile, else review).",
    ),
]


def _title_of(ticket: str) -> str:
    first = next((line.strip() for line in ticket.splitlines() if line.strip()), "untitled")
    return first.lstrip("#").strip()[:120]


@app.command()
def run(
    ticket: Annotated[str | None, typer.Argument(help="The ticket text.")] = None,
    ticket_file: Annotated[
        Path | None, typer.Option("--ticket", help="Read the ticket from FILE.")
    ] = None,
    title: Annotated[
        str | None, typer.Option(help="Title (default: the ticket's first line).")
    ] = None,
    auto_merge: Annotated[
        bool | None,
        typer.Option(
            "--auto-merge/--no-auto-merge",
            help="Override workflow.auto_merge and the profile's default.",
        ),
    ] = None,
    profile: ProfileOption = None,
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """File a ticket and run its workflow in the foreground (Ctrl-C leaves it resumable).

    With [graph] enabled = true in phasegate.toml, planning, development and
    pr_review follow the development graph: competing plans, a read-only build
    answering with a diff, review tiers and a bounded fix loop; the draft PR
    proposal lands through the apply arm (policy auto) or waits for
    `phasegate approve ID` (policy propose).
    """
    with _errors():
        ticket = _ticket_from(ticket, ticket_file)
        root, cartridge, store = _open(repo)
        cartridge.require_roles(root / CARTRIDGE_FILE)
        engine = _engine(root, cartridge, store, None)
        workflow_id = engine.start(
            title or _title_of(ticket), ticket, auto_merge=auto_merge, profile=profile
        )
        if not as_json:
            console.print(f"workflow [bold]{workflow_id}[/bold] filed", highlight=False)
        _drive(engine, workflow_id, as_json)


@app.command()
def worker(
    repo: RepoOption = Path("."),
    once: Annotated[
        bool, typer.Option(help="One pass over the runnable workflows, then exit.")
    ] = False,
    poll: Annotated[float, typer.Option(help="Seconds between passes.")] = 2.0,
) -> None:
    """Advance every runnable workflow until stopped (SIGTERM/Ctrl-C stop it cleanly)."""
    with _errors():
        root, cartridge, store = _open(repo)
        progress = _Progress(quiet=False)
        engine = _engine(root, cartridge, store, progress)
        with progress, _graceful(engine, "`phasegate status` lists the workflows"):
            engine.run_worker(once=once, poll_s=poll)
    if engine.shutdown.is_set():
        raise typer.Exit(130)


@app.command()
def status(repo: RepoOption = Path("."), as_json: JsonOption = False) -> None:
    """Every workflow: phase, status, profile, tokens and cost."""
    with _errors():
        store = _open_for_reading(repo)
        rows = [_summary(store, r) for r in store.list_workflows()]
    if as_json:
        console.print_json(json.dumps(rows))
        return
    table = Table(
        "id", "title", "phase", "status", "profile", "tokens", "cost (USD)", "updated (UTC)"
    )
    for r in rows:
        title = r["title"] if len(r["title"]) <= 40 else r["title"][:39] + "…"
        table.add_row(
            r["id"],
            escape(title),
            r["current_phase"],
            r["status"],
            r["profile"],
            str(r["tokens"]),
            f"{r['cost_usd']:.4f}",
            (r["updated_at"] or "")[:19],
        )
    console.print(table if rows else 'no workflows yet; `phasegate run "ticket"` files one')


@app.command()
def show(
    workflow_id: Annotated[str, typer.Argument(metavar="ID")],
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """One workflow: its phase timeline with milestones, agent runs and the reason it stopped."""
    with _errors():
        store = _open_for_reading(repo)
        detail = _detail(store, workflow_id)
    if as_json:
        console.print_json(json.dumps(detail, default=str))
        return
    _print_detail(detail)


def _detail(store: Store, workflow_id: str) -> dict[str, Any]:
    """What ``show`` prints: summary, phase timeline, milestones, agent runs, report."""
    row = store.workflow_row(workflow_id)
    milestones = store.milestone_rows(workflow_id)
    phases = [e for e in store.events(workflow_id) if e["type"] == "phase_change"]
    runs = store.agent_runs(workflow_id)
    return {
        "workflow": _summary(store, row),
        "timeline": [
            {"phase": e["data"].get("phase"), "at": _iso(e["created_at"])} for e in phases
        ],
        "milestones": [
            {k: (_iso(v) if isinstance(v, datetime) else v) for k, v in m.items()}
            for m in milestones
        ],
        "agent_runs": [
            {k: (_iso(v) if isinstance(v, datetime) else v) for k, v in r.items()} for r in runs
        ],
        "report": row["state"].get("report"),
        "decisions": decisions_of(row["state"]),
    }


def _print_detail(detail: Mapping[str, Any]) -> None:
    s = detail["workflow"]
    console.print(f"[bold]{s['id']}[/bold] {escape(s['title'])}", highlight=False)
    console.print(
        f"  {s['current_phase']} · {s['status']} · dev round {s['dev_round']} · "
        f"issue #{s['issue_number']} · "
        + (f"PR #{s['pr_number']} · " if s["pr_number"] else "no PR yet · ")
        + f"{s['tokens']} tokens · "
        f"${s['cost_usd']:.4f} · profile {s['profile']}",
        highlight=False,
    )
    if s["error"]:
        console.print(f"  [red]reason: {escape(s['error'])}[/red]", highlight=False)
    _print_timeline(detail["milestones"])
    _print_decisions(detail["decisions"])
    runs = detail["agent_runs"]
    if runs:
        agents = Table(
            "role",
            "runner",
            "round",
            "outcome",
            "tokens",
            "USD",
            "s",
            "error",
            box=None,
            pad_edge=False,
        )
        for r in runs:
            agents.add_row(
                r["role"],
                r["runner"],
                str(r["round"]),
                r["outcome"],
                str(r["input_tokens"] + r["output_tokens"]),
                f"{r['cost_usd']:.4f}",
                f"{r['duration_s']:.1f}",
                escape((r["error"] or "")[:60]),
            )
        console.print()
        console.print(agents)
    if detail["report"] and s["status"] == "waiting":  # what a person approves or answers
        console.print()
        console.print(
            render_report(detail["report"], detail["report"].get("content_language", "en")),
            highlight=False,
            markup=False,
        )


def _print_decisions(records: list[dict[str, Any]]) -> None:
    """The decision records (reversions, spec 003), oldest first."""
    if not records:
        return
    console.print("[bold]decisions[/bold]")
    for d in records:
        how = "automatic" if d.get("automatic") else "by a person"
        console.print(
            f"  {d['type']} {d['reversion_number']}: {d['source_phase']} → {d['target_phase']}"
            f" · {d['timestamp']} · {how}",
            highlight=False,
        )
        reason = " ".join(str(d["reason"]).split())
        console.print(f"    [dim]{escape(reason[:300])}[/dim]", highlight=False)


_MARKS = {
    "completed": "[green]✓[/green]",
    "failed": "[red]✗[/red]",
    "in_progress": "[yellow]…[/yellow]",
    "cancelled": "[dim]−[/dim]",
}


def _print_timeline(milestones: list[dict[str, Any]]) -> None:
    """Milestones grouped under the phase they belong to, in the order they happened."""
    phase = None
    for m in milestones:
        if m["kind"] == "agent_process":  # process bookkeeping; the agent table says it better
            continue
        if m["phase"] != phase:
            phase = m["phase"]
            console.print(f"[bold]{phase}[/bold]  [dim]{(m['created_at'] or '')[11:19]}[/dim]")
        where = "".join(
            f" {label}{value}" for label, value in (("r", m["round"]), ("a", m["attempt"])) if value
        )
        summary = escape((m["summary"] or "").splitlines()[0][:80]) if m["summary"] else ""
        console.print(
            f"  {_MARKS.get(m['status'], m['status'])} {m['kind']}{where}  [dim]{summary}[/dim]",
            highlight=False,
        )


def _manual(
    repo: Path,
    workflow_id: str,
    decide: Callable[[Engine, Any], PhaseResult],
    advance: bool,
    as_json: bool,
    announce_reversion: bool = False,
) -> None:
    """Commit a person's decision through the single commit path, then (optionally) advance.

    With ``announce_reversion`` the reversion just recorded is confirmed on
    stderr before the workflow moves on (its exit code is the run's).
    """
    with _errors():
        root, cartridge, store = _open(repo)
        engine = _engine(root, cartridge, store, None)
        row = engine.decide(workflow_id, lambda ctx: decide(engine, ctx))
        if announce_reversion:
            recorded = row["state"]["decisions"][-1]
            err.print(
                f"reverted {row['id']} from {recorded['source_phase']} to "
                f"{recorded['target_phase']} (reversion {recorded['reversion_number']} of 3)",
                highlight=False,
            )
        if advance:
            _drive_unless_taken(engine, workflow_id, as_json)
        else:
            _finish(store, store.workflow_row(workflow_id), as_json, driven=False)


NoAdvance = Annotated[
    bool, typer.Option("--no-advance", help="Record only; let a worker advance it.")
]


@app.command()
def resume(
    workflow_id: Annotated[str, typer.Argument(metavar="ID")],
    repo: RepoOption = Path("."),
    no_advance: NoAdvance = False,
    as_json: JsonOption = False,
) -> None:
    """Resume a failed, paused or interrupted workflow from its current phase."""
    _manual(repo, workflow_id, lambda _e, ctx: decisions.resume(ctx), not no_advance, as_json)


@app.command()
def feedback(
    workflow_id: Annotated[str, typer.Argument(metavar="ID")],
    text: Annotated[str, typer.Argument(help="What the agents should change.")],
    repo: RepoOption = Path("."),
    no_advance: NoAdvance = False,
    as_json: JsonOption = False,
) -> None:
    """Send feedback: a waiting workflow goes back to development with it."""
    _manual(
        repo, workflow_id, lambda _e, ctx: decisions.feedback(ctx, text), not no_advance, as_json
    )


@app.command("approve-merge")
def approve_merge(
    workflow_id: Annotated[str, typer.Argument(metavar="ID")],
    by: Annotated[str, typer.Option(help="Who approves.")] = "cli",
    repo: RepoOption = Path("."),
    no_advance: NoAdvance = False,
    as_json: JsonOption = False,
) -> None:
    """Allow a waiting workflow (phase wait, after its report) to merge its pull request."""
    _manual(
        repo, workflow_id, lambda _e, ctx: decisions.approve_merge(ctx, by), not no_advance, as_json
    )


@app.command()
def revert(
    workflow_id: Annotated[str, typer.Argument(metavar="ID")],
    reason: Annotated[str, typer.Option(help="Why the plan must change (the next plan reads it).")],
    to_phase: Annotated[
        str, typer.Option("--to-phase", help="planning (spec 003's strategize).")
    ] = "planning",
    repo: RepoOption = Path("."),
    no_advance: NoAdvance = False,
    as_json: JsonOption = False,
) -> None:
    """Send a workflow back to planning with a reason (at most 3 reversions per workflow).

    Then runs it in the foreground, like resume (--no-advance: record only).

    From development, pr_review, report, wait or a merge not yet done; the
    profile's thresholds do not apply, the loop guard does. The worktree,
    branch, milestones and agent sessions are kept; the reason is the next
    plan's input and a decision record `phasegate show` lists.
    """
    _manual(
        repo,
        workflow_id,
        lambda e, ctx: decisions.revert(ctx, to_phase, reason, e.clock.now()),
        not no_advance,
        as_json,
        announce_reversion=True,
    )


@app.command("verify-override")
def verify_override(
    workflow_id: Annotated[str, typer.Argument(metavar="ID")],
    verdict: Annotated[str, typer.Option(help="confirmed or rejected.")],
    by: Annotated[str, typer.Option(help="Who decides (recorded as verified_by).")],
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """A person's acceptance verdict; confirmed closes the issue and completes the workflow."""

    def decide(engine: Engine, ctx: Any) -> PhaseResult:
        return acceptance_verification.override(ctx, engine.deps_for(ctx), verdict, by)

    _manual(repo, workflow_id, decide, False, as_json)


# -- proposals and the human gate (spec 002) ------------------------------------------------


def _person() -> str:
    """Who decides when --by is not given: the login name."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "cli"


@contextmanager
def _stop_on_signal(cancel: threading.Event) -> Iterator[None]:
    """First Ctrl-C/SIGTERM: stop the running agent, record nothing. Second: quit now."""
    hits = {"n": 0}

    def handler(signum: int, _frame: FrameType | None) -> None:
        hits["n"] += 1
        if hits["n"] > 1:
            raise KeyboardInterrupt
        err.print("\n[yellow]stopping: the running agent is stopped; nothing is recorded[/yellow]")
        cancel.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _proposal_json(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (_iso(v) if isinstance(v, datetime) else v) for k, v in row.items()}


def _print_checks(proposal_id: str, data: Mapping[str, Any]) -> None:
    if not data.get("applied"):
        line = f"[red]the patch does not apply: {escape(str(data.get('error', '')))[:300]}[/red]"
    else:
        results = data.get("results") or []
        failed = [r["command"] for r in results if not r.get("passed")]
        line = (
            f"[red]failed: {escape(', '.join(failed))}[/red]"
            if failed
            else f"[green]{len(results)} passed[/green]"
        )
    console.print(f"  checks of {proposal_id}: {line}", highlight=False)


def _print_proposals(rows: list[dict[str, Any]]) -> None:
    table = Table("id", "kind", "title", "mode", "status", "attempts", "decided_by")
    for r in rows:
        title = r["title"] if len(r["title"]) <= 40 else r["title"][:39] + "…"
        mode = f"{r['mode']} (self_modification)" if r["self_modification"] else r["mode"]
        table.add_row(
            r["id"],
            r["kind"],
            escape(title),
            mode,
            r["status"],
            str(r["attempts"]),
            escape(r["decided_by"] or ""),
        )
    console.print(table)


@app.command(short_help="Run the graph on a ticket; record its proposals.")
def propose(
    ticket: Annotated[str | None, typer.Argument(help="The ticket text.")] = None,
    ticket_file: Annotated[
        Path | None, typer.Option("--ticket", help="Read the ticket from FILE.")
    ] = None,
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """Run the development graph (spec 002) on a ticket; record the run and its proposals.

    The roles the cartridge binds (plan, build, review; scope_epic,
    plan_alternative, plan_arbitrate, plan_adversary, review_adversary and
    arbitrate when bound) run read-only in the repository's checkout; build
    answers with a diff. Before anything is gated, each draft PR's diff is
    applied in a scratch worktree of HEAD (your checkout is left alone) and
    landing_areas.checks run there; their results are the proposal's `checks`
    evidence. The run is recorded whole,
    every agent call and answer included (`phasegate replay RUN` re-runs it
    offline), and each proposal gets the mode the [autonomy] policy gives it:
    propose (a person decides: `phasegate approve/reject ID`) or auto.
    Exit 0 with proposals, 1 when the run proposed nothing.
    """
    started = time.monotonic()

    def heard(call: AgentCall, answer: Answer | None) -> None:
        if as_json:
            return
        elapsed = f"[dim]{time.monotonic() - started:7.1f}s[/dim]"
        if answer is None:
            err.print(f"{elapsed} {call.node}: {call.role} agent running", highlight=False)
        elif not answer.ok:
            err.print(
                f"{elapsed} [yellow]{call.node}: {call.role}: {answer.error_kind}: "
                f"{escape((answer.error or '')[:200])}[/yellow]",
                highlight=False,
            )

    with _errors():
        text = _ticket_from(ticket, ticket_file)
        root, cartridge, store = _open(repo)
        rules = GraphRules.from_cartridge(cartridge)  # names a required role left unbound
        problems = [
            problem
            for role in sorted(rules.bound_roles)
            for problem in binding_problems(role, cartridge.role(role))
        ]
        if problems:
            raise CartridgeError(f"{CARTRIDGE_FILE}: " + "; ".join(problems))
        Workspace().exclude(root, ".phasegate/")
        run_id = secrets.token_hex(4)
        cancel = threading.Event()
        answers = RunnerAnswers(cartridge, root, run_id, cancel=cancel, on_call=heard)
        try:
            with _stop_on_signal(cancel):
                record, rows = run_graph(
                    store,
                    cartridge,
                    answers,
                    ticket=text,
                    run_id=run_id,
                    date=store.clock.now().date().isoformat(),
                    repo=root,
                    cancel=cancel,
                )
        except ProposeInterrupted as exc:
            err.print(f"[yellow]{escape(str(exc))}[/yellow]", highlight=False)
            raise typer.Exit(130) from None
    loop = record["fix_loop"]
    summary = {
        "run_id": run_id,
        "date": record["date"],
        "stopped": record["stopped"],
        "fix_loop": {k: loop[k] for k in ("attempts", "fix_attempts", "stop", "approved_attempt")},
        "usage": record["usage"],
        "calls": len(record["calls"]),
        "proposals": [_proposal_json(r) for r in rows],
    }
    if as_json:
        console.print_json(json.dumps(summary, default=str))
    else:
        usage = record["usage"]
        console.print(
            f"run [bold]{run_id}[/bold] · {len(record['calls'])} agent call(s) · "
            f"{usage['input_tokens'] + usage['output_tokens']} tokens · "
            f"${usage['cost_usd']:.4f} · build attempts {loop['attempts']}",
            highlight=False,
        )
        if record["stopped"]:
            stop = record["stopped"]
            console.print(
                f"  stopped at {stop['node']}: {stop['reason']}: {escape(stop['detail'])}",
                highlight=False,
            )
        if loop["stop"]:
            console.print(f"  fix loop stopped: {loop['stop']}", highlight=False)
        for r in rows:
            for e in r["evidence"]:
                if e["kind"] == "checks":
                    _print_checks(r["id"], e["data"])
        if rows:
            _print_proposals(rows)
            console.print(
                "next: `phasegate approve ID` or `phasegate reject ID --reason TEXT`; "
                f"`phasegate replay {run_id}` re-runs it offline",
                highlight=False,
            )
        else:
            console.print("  no proposals", highlight=False)
    if not rows:
        raise typer.Exit(1)


@app.command(short_help="List proposals: kind, mode, status, who decided.")
def proposals(
    status: Annotated[
        str | None,
        typer.Option(help=f"Only proposals in this status: {', '.join(PROPOSAL_STATUSES)}."),
    ] = None,
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """The proposals recorded runs emitted, oldest first, and where each stands.

    mode is what the autonomy policy decided when the proposal was recorded:
    propose (a person approves or rejects it) or auto (the apply arm may take
    it). status: proposed, approved, rejected, applied, superseded (a later run of its
    workflow was recorded before anyone decided it).
    """
    with _errors():
        if status is not None and status not in PROPOSAL_STATUSES:
            raise UsageError(f"--status {status!r}: expected one of {', '.join(PROPOSAL_STATUSES)}")
        store = _open_for_reading(repo)
        rows = store.proposals(status=status)
    if as_json:
        console.print_json(json.dumps([_proposal_json(r) for r in rows], default=str))
        return
    if rows:
        _print_proposals(rows)
    elif status is not None:
        console.print(f"no proposals with status {status}")
    else:
        console.print('no proposals; `phasegate propose "ticket"` runs the graph on one')


def _awaiting(store: Store, proposal: Mapping[str, Any]) -> str | None:
    """The workflow paused in development for this proposal's run, if any."""
    workflow_id = proposal.get("workflow_id")
    if not workflow_id:
        return None
    row = store.workflow_row(str(workflow_id))
    if row["current_phase"] != DEVELOPMENT or row["status"] != AWAITING_APPROVAL:
        return None
    return str(workflow_id) if row["state"].get("graph_run") == proposal["run_id"] else None


def _gate(
    repo: Path,
    proposal_id: str,
    verdict: str,
    by: str | None,
    reason: str | None,
    as_json: bool,
    advance: bool = True,
) -> None:
    """Record a person's decision on a proposal, who and when, and say where its kind stands.

    A workflow paused for the proposal (graph mode) is resumed, and advanced
    in the foreground unless ``advance`` is False: an approval lands the
    patch, a rejection starts a new run told why.
    """
    with _errors():
        who = _person() if by is None else by.strip()
        if not who:
            raise UsageError("--by needs a name")
        if who in (APPLY_ARM, CHECKS_GATE):
            raise UsageError(f"--by {who!r} names phasegate's own gate; give a person's name")
        if reason is not None and not reason.strip():
            raise UsageError("--reason is empty; say why")
        root, cartridge, store = _open(repo)
        found = store.proposal(proposal_id)
        profile = None
        # Only a workflow's draft PR gates it; its other proposals (scope's
        # item_create) are decided whenever, and move nothing.
        gating = bool(found["workflow_id"]) and found["kind"] == "draft_pr_create"
        if found["workflow_id"]:
            owner = store.workflow_row(str(found["workflow_id"]))
            profile = AutomationProfile.from_state(owner["state"])
            if gating and found["status"] == "proposed" and _awaiting(store, found) is None:
                # left behind by a revert or a new run: not work to land
                raise UsageError(
                    f"proposal {proposal_id} is from run {found['run_id']} of workflow "
                    f"{owner['id']}, which is not waiting for it (it is in "
                    f"{owner['current_phase']} · {owner['status']}); nothing recorded"
                )
        if gating and found["status"] == verdict and _awaiting(store, found) is not None:
            row = found  # decided before, then the process died before the workflow moved
        elif gating and found["status"] == verdict and owner["status"] in RUNNABLE_STATUSES:
            raise UsageError(
                f"proposal {proposal_id} was {verdict} already by {found['decided_by']}; "
                f"workflow {owner['id']} is in {owner['current_phase']} · {owner['status']}: "
                f"`phasegate resume {owner['id']}` (or a worker) goes on with it"
            )
        else:
            row = store.decide_proposal(proposal_id, verdict, who, reason)
        policy = AutonomyPolicy.from_cartridge(cartridge, profile)
        clean = streak(row["kind"], store.gate_history(row["kind"]))
        workflow_id = _awaiting(store, row) if gating else None
        engine = _engine(root, cartridge, store, None)
        if workflow_id is not None:
            engine.decide(workflow_id, decisions.resume)
    if as_json:
        payload: dict[str, Any] = {**_proposal_json(row), "streak": clean}
        stopped = False
        if workflow_id is not None:
            if advance:
                with _errors():
                    try:
                        with _graceful(engine):
                            engine.advance(workflow_id)
                    except LeaseHeld:  # the decision stands; a worker goes on with it
                        payload["taken_by_worker"] = True
                payload.update(_proposal_json(store.proposal(row["id"])))  # applied by now?
            state = store.workflow_row(workflow_id)
            payload["workflow"] = {k: state[k] for k in ("id", "current_phase", "status", "error")}
            stopped = state["status"] in _STOPPED
        console.print_json(json.dumps(payload, default=str))
        if engine.shutdown.is_set():
            raise typer.Exit(130)
        if stopped:
            raise typer.Exit(1)
        return
    if workflow_id is None:
        what = "nothing is applied by this command"
    elif not advance:
        what = (
            f"workflow {workflow_id} can go on: `phasegate worker` (or `phasegate resume "
            f"{workflow_id}`) " + ("lands it" if verdict == "approved" else "starts a new run")
        )
    elif verdict == "approved":
        what = f"workflow {workflow_id} resumes: the apply arm lands it"
    else:
        what = f"workflow {workflow_id} resumes: a new run is told why"
    when = f"at {_iso(row['decided_at'])}"
    if row is found:
        when += " (recorded before; the workflow had not moved on)"
    console.print(
        f"proposal [bold]{row['id']}[/bold] ({row['kind']}) {verdict} by "
        f"{escape(str(row['decided_by']))} {when}; {what}",
        highlight=False,
    )
    if policy.mode_of(row["kind"]) == "auto":
        where = "its policy is auto"
    elif policy.graduation_streak == 0:
        where = "it never graduates (graduation_streak = 0)"
    elif clean >= policy.graduation_streak:
        where = "it has graduated: its next clean proposal is auto"
    else:
        where = f"it graduates to auto at {policy.graduation_streak}"
    console.print(
        f"  {row['kind']}: {clean} clean first-attempt approval(s) in a row; {where}",
        highlight=False,
    )
    if workflow_id is not None:
        if advance:
            _drive_unless_taken(engine, workflow_id, False)
        else:
            _finish(store, store.workflow_row(workflow_id), False, driven=False)


@app.command(short_help="Approve a proposal (the human gate).")
def approve(
    proposal_id: Annotated[str, typer.Argument(metavar="ID")],
    by: Annotated[str | None, typer.Option(help="Who approves (default: your login name).")] = None,
    repo: RepoOption = Path("."),
    no_advance: NoAdvance = False,
    as_json: JsonOption = False,
) -> None:
    """Approve a proposal: records who and when. A decided proposal is not decided again.

    A workflow paused for it (graph mode) resumes and runs in the foreground:
    the apply arm commits the patch and the pull request is opened
    (--no-advance: record only; a worker takes it).
    """
    _gate(repo, proposal_id, "approved", by, None, as_json, not no_advance)


@app.command(short_help="Reject a proposal, saying why (the human gate).")
def reject(
    proposal_id: Annotated[str, typer.Argument(metavar="ID")],
    reason: Annotated[str, typer.Option(help="Why it is rejected.")],
    by: Annotated[str | None, typer.Option(help="Who rejects (default: your login name).")] = None,
    repo: RepoOption = Path("."),
    no_advance: NoAdvance = False,
    as_json: JsonOption = False,
) -> None:
    """Reject a proposal: records who, when and why; its kind's streak starts again.

    A workflow paused for it (graph mode) resumes with a new graph run whose
    ticket says why the change was rejected (--no-advance: record only).
    """
    _gate(repo, proposal_id, "rejected", by, reason, as_json, not no_advance)


@app.command(short_help="Re-run a recorded run offline; compare its proposals.")
def replay(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID")],
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """Re-run a recorded run from its recorded answers, without any agent.

    The graph is pure, so the replay's proposals must be the recorded ones,
    byte for byte (canonical JSON). Prints `identical` (exit 0) or the first
    difference (exit 1).
    """
    with _errors():
        store = _open_for_reading(repo)
        record = store.run(run_id)["record"]
    check = replay_check(record)
    if as_json:
        console.print_json(
            json.dumps(
                {
                    "run_id": run_id,
                    "identical": check.identical,
                    "difference": check.difference,
                    "proposals": len(check.recorded),
                    "calls": len(record.get("calls") or []),
                }
            )
        )
    elif check.identical:
        console.print(
            f"identical: {len(check.recorded)} proposal(s) from "
            f"{len(record.get('calls') or [])} recorded call(s)",
            highlight=False,
        )
    else:
        console.print(f"different: {escape(str(check.difference))}", highlight=False)
    if not check.identical:
        raise typer.Exit(1)


@app.command()
def demo(
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir", help="Keep the sample project and its state here (default: a temp dir)."
        ),
    ] = None,
    profile: ProfileOption = None,
    graph: Annotated[
        bool,
        typer.Option(
            "--graph",
            help="Run the ticket through the development graph: competing plans, a plan "
            "adversary, a build answering with a diff, review and review adversary.",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Make a sample Python project, file a ticket and run it to completed with scripted agents.

    The demo's cartridge uses the auto profile; `--profile review` (or manual,
    trusted) stops it at wait for `phasegate approve-merge`.

    `--graph`: the cartridge says `[graph] enabled = true`, and planning,
    development and pr_review follow the development graph; its draft PR is a
    proposal the apply arm lands (`--profile review` stops it in development
    for `phasegate approve ID`). `phasegate proposals` and `phasegate replay
    RUN_ID` then show the run.
    """
    from phasegate.demo import DEMO_TICKET, DEMO_TITLE, make_sample_project

    with _errors():
        if profile is not None:  # a name the sample's cartridge knows, before any file
            if not profile.strip():
                raise CartridgeError("--profile: the profile name is empty")
            Cartridge().profile(profile)
        target = directory or Path(tempfile.mkdtemp(prefix="phasegate-demo-")) / "calc"
        if target.exists() and any(target.iterdir()):
            raise UsageError(f"{target} is not empty; choose a new --dir")
        repo = make_sample_project(target, graph=graph)
        if not as_json:
            console.print(f"sample project: {repo}", highlight=False)
        root, cartridge, store = _open(repo)
        engine = _engine(root, cartridge, store, None)
        workflow_id = engine.start(DEMO_TITLE, DEMO_TICKET, profile=profile)
        with _Progress(quiet=as_json) as progress, _graceful(engine):
            engine.on_event = progress
            row = engine.advance(workflow_id)
    if not as_json:
        show(workflow_id, repo=repo, as_json=False)
        report = row["state"].get("report")
        if report:
            console.print(
                render_report(report, report.get("content_language", "en")),
                highlight=False,
                markup=False,
            )
        graph_run = row["state"].get("graph_run") if graph else None
        if graph_run:
            console.print(
                f"development graph run {graph_run}: try "
                f"`phasegate proposals --repo {repo}` and "
                f"`phasegate replay {graph_run} --repo {repo}`",
                highlight=False,
            )
        console.print(
            f"state kept in {repo / '.phasegate'}; try "
            f"`phasegate show {workflow_id} --repo {repo}`",
            highlight=False,
        )
    _finish(store, row, as_json, interrupted=engine.shutdown.is_set())


def main() -> None:
    app()
