"""Proposals and the human gate (docs/contracts/autonomy.md: the human gate).

``propose``, ``proposals``, ``approve``, ``reject``, ``replay``.
"""

import contextlib
import json
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from phasegate.cli._app import (
    STOP_SIGNALS,
    ByOption,
    JsonOption,
    NoAdvance,
    RepoOption,
    UsageError,
    app,
    console,
    err,
    open_for_reading,
    open_repo,
    print_whole,
    reported_errors,
    shown,
    ticket_from,
    who,
)
from phasegate.store import PROPOSAL_STATUSES

if TYPE_CHECKING:
    from phasegate.graph import AgentCall, Answer


@contextmanager
def _stop_on_signal(cancel: threading.Event) -> Iterator[None]:
    """First Ctrl-C/SIGTERM: stop the running agent, record nothing. Second: quit now."""
    hits = {"n": 0}

    def handler(signum: int, _frame: FrameType | None) -> None:
        hits["n"] += 1
        if hits["n"] > 1:
            raise KeyboardInterrupt
        # A closed terminal (SIGHUP) takes no line: the stop goes on without it.
        with contextlib.suppress(OSError):
            err.print(
                "\n[yellow]stopping: the running agent is stopped; nothing is recorded[/yellow]"
            )
        cancel.set()

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _proposal_json(row: Mapping[str, Any]) -> dict[str, Any]:
    from phasegate.summary import iso

    return {k: (iso(v) if isinstance(v, datetime) else v) for k, v in row.items()}


def _print_checks(proposal_id: str, data: Mapping[str, Any]) -> None:
    if not data.get("applied"):
        line = f"[red]the patch does not apply: {shown(str(data.get('error', '')))[:300]}[/red]"
    else:
        results = data.get("results") or []
        failed = [r["command"] for r in results if not r.get("passed")]
        line = (
            f"[red]failed: {shown(', '.join(failed))}[/red]"
            if failed
            else f"[green]{len(results)} passed[/green]"
        )
    console.print(f"  checks of {proposal_id}: {line}", highlight=False)


def _print_proposals(rows: list[dict[str, Any]]) -> None:
    """The proposals' table: no cell is cut but a long title, piped as on a terminal."""
    table = Table()
    for header in ("id", "kind", "title", "mode", "status", "attempts", "decided_by"):
        if header == "title":
            table.add_column(header, overflow="fold")
        else:
            table.add_column(header, no_wrap=True)
    for r in rows:
        title = r["title"] if len(r["title"]) <= 40 else r["title"][:39] + "…"
        mode = f"{r['mode']} (self_modification)" if r["self_modification"] else r["mode"]
        table.add_row(
            r["id"],
            r["kind"],
            shown(title),
            mode,
            r["status"],
            str(r["attempts"]),
            shown(r["decided_by"] or ""),
        )
    print_whole(table)


@app.command(short_help="Run the graph on a ticket; record its proposals.")
def propose(
    ticket: Annotated[str | None, typer.Argument(help="The ticket text.")] = None,
    ticket_file: Annotated[
        Path | None, typer.Option("--ticket", help="Read the ticket from FILE.")
    ] = None,
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """Run the development graph on a ticket; record the run and its proposals.

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
    import secrets

    from phasegate.agents import binding_problems
    from phasegate.config.cartridge import CARTRIDGE_FILE, CartridgeError
    from phasegate.git.workspace import Workspace
    from phasegate.graph import GraphRules
    from phasegate.phases.graph_mode.harness import ProposeInterrupted, RunnerAnswers
    from phasegate.phases.graph_mode.harness import propose as run_graph

    started = time.monotonic()

    def heard(call: "AgentCall", answer: "Answer | None") -> None:
        if as_json:
            return
        elapsed = f"[dim]{time.monotonic() - started:7.1f}s[/dim]"
        if answer is None:
            err.print(f"{elapsed} {call.node}: {call.role} agent running", highlight=False)
        elif not answer.ok:
            err.print(
                f"{elapsed} [yellow]{call.node}: {call.role}: {answer.error_kind}: "
                f"{shown((answer.error or '')[:200])}[/yellow]",
                highlight=False,
            )

    with reported_errors():
        text = ticket_from(ticket, ticket_file)
        root, cartridge, store = open_repo(repo)
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
            err.print(f"[yellow]{shown(str(exc))}[/yellow]", highlight=False)
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
                f"  stopped at {stop['node']}: {stop['reason']}: {shown(stop['detail'])}",
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
    with reported_errors():
        if status is not None and status not in PROPOSAL_STATUSES:
            raise UsageError(f"--status {status!r}: expected one of {', '.join(PROPOSAL_STATUSES)}")
        store = open_for_reading(repo)
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


def _gate(
    repo: Path,
    proposal_id: str,
    verdict: str,
    by: str | None,
    reason: str | None,
    as_json: bool,
    advance: bool = True,
) -> None:
    """Record a person's decision on a proposal (``operations.approve``/``reject``),
    who and when, and say where its kind stands.

    A workflow paused for the proposal (graph mode) is resumed, and advanced
    in the foreground unless ``advance`` is False: an approval lands the
    patch, a rejection starts a new run told why. Rejected pieces (item_create)
    pause their workflow with the reason instead: nothing is advanced, exit 0.
    """
    from phasegate import operations
    from phasegate.cli.render import STOPPED, drive_unless_taken, finish, graceful, make_engine
    from phasegate.runtime.engine import LeaseHeld
    from phasegate.summary import iso

    with reported_errors():
        root, cartridge, store = open_repo(repo)
        engine = make_engine(root, cartridge, store, None)
        person = who(by)
        if verdict == "approved":
            outcome = operations.approve(engine, proposal_id, by=person)
        else:
            outcome = operations.reject(engine, proposal_id, reason or "", by=person)
    row, workflow_id = outcome.proposal, outcome.workflow_id
    clean, policy = outcome.streak, outcome.policy
    # Rejected pieces paused their workflow with the reason: a decision, nothing to drive.
    turned_down = verdict == "rejected" and row["kind"] == "item_create"
    if turned_down:
        advance = False
    if as_json:
        payload: dict[str, Any] = {**_proposal_json(row), "streak": clean}
        stopped = False
        if workflow_id is not None:
            if advance:
                with reported_errors():
                    try:
                        with graceful(engine):
                            engine.advance(workflow_id)
                    except LeaseHeld:  # the decision stands; a worker goes on with it
                        payload["taken_by_worker"] = True
                payload.update(_proposal_json(store.proposal(row["id"])))  # applied by now?
            state = store.workflow_row(workflow_id)
            payload["workflow"] = {k: state[k] for k in ("id", "current_phase", "status", "error")}
            stopped = state["status"] in STOPPED and not turned_down
        console.print_json(json.dumps(payload, default=str))
        if engine.shutdown.is_set():
            raise typer.Exit(130)
        if stopped:
            raise typer.Exit(1)
        return
    if workflow_id is None:
        what = "nothing is applied by this command"
    elif turned_down:
        what = (
            f"workflow {workflow_id} pauses with your reason; `phasegate resume {workflow_id}` "
            "scopes it again, told why"
        )
    elif not advance:
        what = (
            f"workflow {workflow_id} can go on: `phasegate worker` (or `phasegate resume "
            f"{workflow_id}`) " + ("lands it" if verdict == "approved" else "starts a new run")
        )
    elif verdict == "approved" and row["kind"] == "item_create":
        what = f"workflow {workflow_id} resumes: its pieces are filed as tickets (docs/epics.md)"
    elif verdict == "approved":
        what = f"workflow {workflow_id} resumes: the apply arm lands it"
    else:
        what = f"workflow {workflow_id} resumes: a new run is told why"
    when = f"at {iso(row['decided_at'])}"
    if outcome.recorded_before:
        when += " (recorded before; the workflow had not moved on)"
    console.print(
        f"proposal [bold]{row['id']}[/bold] ({row['kind']}) {verdict} by "
        f"{shown(str(row['decided_by']))} {when}; {what}",
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
    if workflow_id is not None and not turned_down:
        if advance:
            drive_unless_taken(engine, workflow_id, False)
        else:
            finish(store, store.workflow_row(workflow_id), False, driven=False)


@app.command(short_help="Approve a proposal (the human gate).")
def approve(
    proposal_id: Annotated[str, typer.Argument(metavar="ID")],
    by: ByOption = None,
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
    by: ByOption = None,
    repo: RepoOption = Path("."),
    no_advance: NoAdvance = False,
    as_json: JsonOption = False,
) -> None:
    """Reject a proposal: records who, when and why; its kind's streak starts again.

    A workflow paused for its draft PR (graph mode) resumes with a new graph run
    whose ticket says why the change was rejected (--no-advance: record only); one
    paused for its pieces (item_create) pauses with the reason, and `resume` scopes
    it again, told why (exit 0 either way).
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
    from phasegate.phases.graph_mode.harness import replay_check

    with reported_errors():
        store = open_for_reading(repo)
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
        console.print(f"different: {shown(str(check.difference))}", highlight=False)
    if not check.identical:
        raise typer.Exit(1)
