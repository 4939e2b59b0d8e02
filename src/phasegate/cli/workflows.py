"""A workflow's commands: ``run``, ``worker``, ``status``, ``show`` and a person's decisions."""

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from phasegate.cli._app import (
    AfterOption,
    AutoMergeOption,
    BranchStrategyOption,
    ByOption,
    JsonOption,
    NoAdvance,
    PriorityOption,
    ProfileOption,
    RepoOption,
    UsageError,
    app,
    console,
    err,
    open_for_reading,
    open_repo,
    open_url_for_reading,
    reading_url,
    repo_root,
    reported_errors,
    ticket_from,
    warn_if_broken,
    who,
)
from phasegate.core.priority import parse_priority
from phasegate.core.state import WorkflowState
from phasegate.proc.host import HOSTNAME_VARIABLE
from phasegate.runtime import DEFAULT_CONCURRENCY

if TYPE_CHECKING:
    from phasegate.runtime.engine import Engine


@app.command()
def run(
    ticket: Annotated[str | None, typer.Argument(help="The ticket text.")] = None,
    ticket_file: Annotated[
        Path | None, typer.Option("--ticket", help="Read the ticket from FILE.")
    ] = None,
    title: Annotated[
        str | None, typer.Option(help="Title (default: the ticket's first line).")
    ] = None,
    auto_merge: AutoMergeOption = None,
    profile: ProfileOption = None,
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
    new_project: Annotated[
        str | None,
        typer.Option(
            "--new-project",
            metavar="[OWNER/]NAME",
            help="Make a new project first: a checkout at --dir with --repo's "
            "phasegate.toml copied into its first commit (else `phasegate init`'s), and "
            'with forge.kind = "github" the repository OWNER/NAME on GitHub (OWNER: '
            "the token's user, or an organization) holding that first commit; then "
            "the workflow runs there (on GitLab, make the project yourself and run in "
            "its clone). Run again after a crash, it goes on.",
        ),
    ] = None,
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir", help="Where --new-project makes its checkout (default ./NAME; new or empty)."
        ),
    ] = None,
    public: Annotated[
        bool, typer.Option("--public", help="--new-project on GitHub: a public repository.")
    ] = False,
    no_advance: NoAdvance = False,
    by: ByOption = None,
    priority: PriorityOption = "normal",
    after: AfterOption = None,
    branch_strategy: BranchStrategyOption = None,
) -> None:
    """File a ticket and run its workflow in the foreground (Ctrl-C leaves it resumable).

    --no-advance files it only, for a running `phasegate worker` (or `serve`) to take.
    --after ID files it blocked until workflow ID completed (docs/epics.md).

    With [graph] enabled = true in phasegate.toml, planning, development and
    pr_review follow the development graph: competing plans, a read-only build
    answering with a diff, review tiers and a bounded fix loop; the draft PR
    proposal lands through the apply arm (policy auto) or waits for
    `phasegate approve ID` (policy propose).
    """
    from phasegate import operations
    from phasegate.cli.render import drive, drive_unless_taken, finish, make_engine
    from phasegate.config.cartridge import CARTRIDGE_FILE

    with reported_errors():
        ticket = ticket_from(ticket, ticket_file)
        rank = parse_priority(priority)
        chosen: WorkflowState = (
            {"branch_strategy": branch_strategy.value} if branch_strategy else {}
        )
        if (no_advance or after) and new_project is not None:
            raise UsageError("--no-advance and --after file a ticket here; --new-project there")
        if new_project is not None:
            engine, workflow_id = _start_new_project(
                new_project,
                directory,
                repo,
                public,
                lambda e, state: operations.start(
                    e,
                    ticket,
                    by=who(by),
                    title=title,
                    auto_merge=auto_merge,
                    profile=profile,
                    state={**state, **chosen},
                    priority=rank,
                )["id"],
                as_json,
            )
            drive(engine, workflow_id, as_json)
            return
        if directory is not None or public:
            raise UsageError("--dir and --public are read only with --new-project")
        root, cartridge, store = open_repo(repo)
        cartridge.require_roles(root / CARTRIDGE_FILE)  # before make_engine's sandbox notice
        engine = make_engine(root, cartridge, store, None)
        workflow_id = operations.start(
            engine,
            ticket,
            by=who(by),
            title=title,
            auto_merge=auto_merge,
            profile=profile,
            priority=rank,
            after=after or (),
            state=chosen,
        )["id"]
        filed = store.workflow_row(workflow_id)
        if no_advance or filed["status"] == "blocked":  # a worker takes it (once it may)
            finish(store, filed, as_json, driven=False)
            return
        if not as_json:
            console.print(f"workflow [bold]{workflow_id}[/bold] filed", highlight=False)
        # A running worker may claim the new workflow before this process does.
        drive_unless_taken(engine, workflow_id, as_json)


def _start_new_project(
    name: str,
    directory: Path | None,
    template: Path,
    public: bool,
    start: "Callable[[Engine, WorkflowState], str]",
    as_json: bool,
) -> "tuple[Engine, str]":
    """The new project's checkout and its workflow (phasegate.tools.new_project): an earlier
    try's workflow found in the checkout is continued, never filed again."""
    from phasegate.cli.render import make_engine
    from phasegate.config.cartridge import CARTRIDGE_FILE
    from phasegate.tools import new_project as projects

    where = (directory or Path(name.rpartition("/")[2])).resolve()
    earlier = None
    if (where / CARTRIDGE_FILE).is_file() and (where / ".git").exists():
        _root, _cartridge, store = open_repo(where)
        earlier = projects.earlier_workflow(store, name.rpartition("/")[2])
        store.close()
    project = projects.resolve(name, where, template.resolve(), private=not public, earlier=earlier)
    project.cartridge().require_roles(where / CARTRIDGE_FILE)
    root, cartridge, store = open_repo(projects.make_checkout(project))
    engine = make_engine(root, cartridge, store, None)
    workflow_id = earlier or start(engine, {"new_project": project.state()})
    if not as_json:
        what = project.repository or "a local repository"
        verb = "continued" if earlier else "filed"
        console.print(
            f"new project {what} at {root}: workflow [bold]{workflow_id}[/bold] {verb}",
            highlight=False,
        )
    return engine, workflow_id


@app.command()
def worker(
    repo: RepoOption = Path("."),
    once: Annotated[
        bool, typer.Option(help="One pass over the runnable workflows, then exit.")
    ] = False,
    poll: Annotated[
        float,
        typer.Option(
            min=0.05,
            max=3600.0,
            help="Seconds between passes at the most (0.05 to 3600): the worker wakes at "
            "once when the store changes (a decision, a new ticket, an agent's end).",
        ),
    ] = 2.0,
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency",
            "-j",
            min=1,
            help="Workflows advanced at once, each on a thread under its own lease. "
            f"Default {DEFAULT_CONCURRENCY}: agents are processes of their own, so what "
            "bounds it is how many agents (and checks) the machine runs side by side.",
        ),
    ] = DEFAULT_CONCURRENCY,
    lease_ttl: Annotated[
        float,
        typer.Option(
            "--lease-ttl",
            min=1.0,
            max=86400.0,
            help="Seconds a workflow's lease lasts unrenewed (1 to 86400; renewed every "
            "third of it): "
            "how long a worker on another machine waits before taking over the workflows "
            "of one that died. A dead worker on this machine is taken over at once; "
            f"{HOSTNAME_VARIABLE} names the machine when its host name does not tell "
            "it apart (containers). An agent or check is stopped 3/4 of it after the "
            "last renewal, so it never outlives the lease (a stopped or cut-off worker).",
        ),
    ] = 60.0,
) -> None:
    """Advance this repository's runnable workflows until stopped (Ctrl-C, SIGTERM or SIGHUP stop
    every running agent; each workflow pauses resumable, and the worker exits once all
    have stopped). With a shared store (PostgreSQL), a worker in another clone of the
    same forge repository takes over a dead worker's workflows once their leases expire.

    On a team forge it resumes a forge_unavailable pause by itself after a backoff
    (forge.auto_resume_s, forge.max_auto_resumes), and with forge.watch_in_worker =
    true it also does what `phasegate watch` does (docs/github.md)."""
    from phasegate.cli._watching import watch_in_worker
    from phasegate.cli.render import LiveProgress, graceful, make_engine, worker_notice
    from phasegate.integrations import notify

    with reported_errors():
        root, cartridge, store = open_repo(repo)
        progress = LiveProgress(quiet=False, several=True)
        engine = make_engine(root, cartridge, store, progress)
        engine.lease_ttl_s = lease_ttl
        notify.catch_up(engine)  # what a killed process left unsent
        with (
            progress,
            graceful(engine, notice=lambda: worker_notice(engine)),
            watch_in_worker(root, cartridge, engine, once=once, say=progress.line),
        ):
            engine.run_worker(once=once, poll_s=poll, concurrency=concurrency)
    if engine.shutdown.is_set():
        raise typer.Exit(130)


#: The newest finished workflows (done, failed: each) ``status`` lists without --all.
STATUS_FINISHED_SHOWN = 20


@app.command()
def status(
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
    every: Annotated[
        bool,
        typer.Option(
            "--all",
            help=f"List every finished workflow (default: the newest {STATUS_FINISHED_SHOWN} "
            "completed or cancelled, and failed; --json lists them all).",
        ),
    ] = False,
) -> None:
    """List workflows: phase, status, worker, cost.

    Every workflow not finished and the newest finished ones (--all: every one):
    phase, status, the worker holding it (while one does), profile, tokens and cost."""
    from phasegate.cli.status_table import hidden_note, pieces_in_place, status_table, unheld_note

    with reported_errors():
        rows, totals = _board(repo, None if every or as_json else STATUS_FINISHED_SHOWN)
    rows = pieces_in_place(rows)
    if as_json:
        # Plain: rich's JSON highlighting costs more than the rest of a big store's status.
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    table = status_table(rows, console.width)
    console.print(table if rows else 'no workflows yet; `phasegate run "ticket"` files one')
    for note in (hidden_note(rows, totals), unheld_note(rows)):
        if note:
            console.print(note, highlight=False, soft_wrap=True)  # its commands are to paste


def _board(
    repo: Path, finished_shown: int | None = None
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Every workflow's summary (only the newest ``finished_shown`` finished ones of
    each group when given), and how many workflows each finished group holds.
    A store is read without SQLAlchemy (a SQLite file with sqlite3, a server with
    psycopg), and found from the cartridge's TOML alone: SQLAlchemy and the
    cartridge's models would cost `status` more than the rest of its work. The
    cartridge is validated only when its text is not one a workflow started
    under, so a broken one is still named."""
    from phasegate.config.store_url import checkout_cartridge_sha, checkout_store_url
    from phasegate.store.server_board import open_server_board
    from phasegate.store.sqlite_board import BoardUnreadable, open_board

    root = repo_root(repo)
    # None: a [store] url only the validated cartridge can read
    url = checkout_store_url(root)
    found = None
    board = None if url is None else (open_board(url) or open_server_board(url))
    if board is not None:
        try:
            found = _listed(board, finished_shown)
        except BoardUnreadable:
            pass  # the Store reads it, or says what is wrong with it
        finally:
            board.close()
    if found is None:
        store = open_url_for_reading(url or reading_url(root))  # reading_url validates
        found = _listed(store, finished_shown)
    rows, totals = found
    if url is not None:  # not validated on the way: is it a text some workflow started under?
        sha = checkout_cartridge_sha(root)
        if sha is None or all(r["cartridge_sha"] != sha for r in rows):
            warn_if_broken(root, "the store it names" if sha else "the default store")
    return rows, totals


def _listed(source: Any, finished_shown: int | None) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The summaries of ``source``'s workflows (a Store or a board, read before it
    is closed) and the finished groups' counts (none counted when every row is
    listed)."""
    from phasegate.summary import workflow_summaries

    if finished_shown is None:
        return workflow_summaries(source, source.list_workflows()), {}
    rows, totals = source.board_rows(finished_shown)
    return workflow_summaries(source, rows), totals


@app.command()
def show(
    workflow_id: Annotated[str, typer.Argument(metavar="ID")],
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """One workflow: its phase timeline with milestones, agent runs and the reason it stopped."""
    from phasegate.cli.detail import print_detail
    from phasegate.summary import workflow_detail

    with reported_errors():
        store = open_for_reading(repo)
        try:
            detail = workflow_detail(store, workflow_id)
        finally:
            store.close()
    if as_json:
        console.print_json(json.dumps(detail, default=str))
        return
    print_detail(detail)


def _manual(
    repo: Path,
    workflow_id: str,
    act: "Callable[[Engine], dict[str, Any]]",
    advance: bool,
    as_json: bool,
    announce_reversion: bool = False,
) -> None:
    """Run a person's action (``phasegate.operations``), then (optionally) advance.

    With ``announce_reversion`` the reversion just recorded is confirmed on
    stderr before the workflow moves on (its exit code is the run's).
    """
    from phasegate.cli.render import drive_unless_taken, finish, make_engine

    with reported_errors():
        root, cartridge, store = open_repo(repo)
        engine = make_engine(root, cartridge, store, None)
        row = act(engine)
        besides = ("dropped", "pieces_cancelled", "pieces_not_cancelled")
        extra: dict[str, Any] = {k: row[k] for k in besides if k in row}
        if not as_json:
            for line in _besides(extra):
                console.print(line, highlight=False, soft_wrap=True)
        if announce_reversion:
            recorded = row["state"]["decisions"][-1]
            err.print(
                f"reverted {row['id']} from {recorded['source_phase']} to "
                f"{recorded['target_phase']} (reversion {recorded['reversion_number']} of 3)",
                highlight=False,
            )
        if advance:
            drive_unless_taken(engine, workflow_id, as_json, extra)
        else:
            finish(store, store.workflow_row(workflow_id), as_json, driven=False, extra=extra)


def _besides(extra: "dict[str, Any]") -> list[str]:
    """The lines saying what a resume or a cancel did besides: what it stopped waiting
    for, the pieces it cancelled, and those it could not (with the command to retry)."""
    lines = [
        f"dropped: waiting for {d['id'] or d.get('issue')} ({d['status'] or 'no workflow yet'})"
        for d in extra.get("dropped", ())
    ]
    if extra.get("pieces_cancelled"):
        lines.append(f"pieces cancelled: {', '.join(extra['pieces_cancelled'])}")
    lines += [
        f"piece {p['id']} not cancelled: {p['reason']}; then `{p['next']}`"
        for p in extra.get("pieces_not_cancelled", ())
    ]
    return lines


@app.command()
def resume(
    workflow_id: Annotated[str, typer.Argument(metavar="ID")],
    repo: RepoOption = Path("."),
    no_advance: NoAdvance = False,
    as_json: JsonOption = False,
    by: ByOption = None,
) -> None:
    """Resume a failed, paused or interrupted workflow from its current phase.

    After a crash (a killed worker, a power cut) `phasegate worker` or resume
    carries it on: side effects a dead process began are looked up, never
    repeated; what a killed agent left uncommitted is discarded (recorded as
    attempt_discarded); stale git locks and half-made worktrees are repaired;
    leftover agent and check processes are stopped. docs/guarantees.md says what holds.
    A blocked workflow goes on without what it waits for, an epic's parent without
    its pieces that failed or were cancelled; both print what they dropped.
    """
    from phasegate import operations

    person = who(by)
    _manual(
        repo,
        workflow_id,
        lambda e: operations.resume(e, workflow_id, by=person),
        not no_advance,
        as_json,
    )


@app.command()
def feedback(
    workflow_id: Annotated[str, typer.Argument(metavar="ID")],
    text: Annotated[str, typer.Argument(help="What the agents should change.")],
    repo: RepoOption = Path("."),
    no_advance: NoAdvance = False,
    as_json: JsonOption = False,
    by: ByOption = None,
) -> None:
    """Send feedback: a waiting workflow goes back to development with it; a paused,
    failed or timed-out one goes on in its phase with it in the next prompt.

    A build that adds nothing for the feedback pauses the workflow with reason
    feedback_unchanged (`resume` builds again and goes on; new feedback says
    more). The round's report quotes the feedback and lists the files and lines
    changed since the last report.
    """
    from phasegate import operations

    person = who(by)
    _manual(
        repo,
        workflow_id,
        lambda e: operations.feedback(e, workflow_id, text, by=person),
        not no_advance,
        as_json,
    )


@app.command("approve-merge")
def approve_merge(
    workflow_id: Annotated[str, typer.Argument(metavar="ID")],
    by: ByOption = None,
    repo: RepoOption = Path("."),
    no_advance: NoAdvance = False,
    as_json: JsonOption = False,
) -> None:
    """Allow a waiting workflow (phase wait, after its report) to merge its pull request.

    This is also how a merge the gate held goes on, whatever the profile: a change
    to a protected path (the cartridge, CI files, what the checks run) or an agent's
    violation this round. `phasegate show ID` says what is held and shows the diff.
    """
    from phasegate import operations

    _manual(
        repo,
        workflow_id,
        lambda e: operations.approve_merge(e, workflow_id, by=who(by)),
        not no_advance,
        as_json,
    )


@app.command()
def revert(
    workflow_id: Annotated[str, typer.Argument(metavar="ID")],
    reason: Annotated[str, typer.Option(help="Why the plan must change (the next plan reads it).")],
    to_phase: Annotated[
        str, typer.Option("--to-phase", help="planning (or strategize, its other name).")
    ] = "planning",
    repo: RepoOption = Path("."),
    no_advance: NoAdvance = False,
    as_json: JsonOption = False,
    by: ByOption = None,
) -> None:
    """Send a workflow back to planning with a reason (at most 3 reversions per workflow).

    Then runs it in the foreground, like resume (--no-advance: record only).

    From development, pr_review, report, wait or a merge not yet done; the
    profile's thresholds do not apply, the loop guard does. The worktree,
    branch, milestones and agent sessions are kept; the reason is the next
    plan's input and a decision record `phasegate show` lists.
    """
    from phasegate import operations

    person = who(by)
    _manual(
        repo,
        workflow_id,
        lambda e: operations.revert(e, workflow_id, reason, by=person, to_phase=to_phase),
        not no_advance,
        as_json,
        announce_reversion=True,
    )


@app.command("verify-override")
def verify_override(
    workflow_id: Annotated[str, typer.Argument(metavar="ID")],
    verdict: Annotated[str, typer.Option(help="confirmed or rejected.")],
    by: ByOption = None,
    reason: Annotated[str, typer.Option(help="Why it is rejected (commented on the issue).")] = "",
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """A person's acceptance verdict; confirmed closes the issue and completes the workflow."""
    from phasegate import operations

    _manual(
        repo,
        workflow_id,
        lambda e: operations.verify_override(e, workflow_id, verdict, by=who(by), reason=reason),
        False,
        as_json,
    )


@app.command()
def cancel(
    workflow_id: Annotated[str, typer.Argument(metavar="ID")],
    by: ByOption = None,
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """Cancel a workflow that is not completed: status cancelled, for good.

    Its forge issue and pull request, worktree and branch are left as they are
    (the worktree and branch until landing_areas.keep_cancelled_days, or
    `phasegate cleanup --all`).
    Refused (exit 2, nothing changed) while a worker advances it: stop that
    worker first (its agents stop, the workflow pauses), then cancel. An epic's
    parent cancels its pieces not completed too, and lists them (docs/epics.md).
    """
    from phasegate import operations

    person = who(by)
    _manual(
        repo, workflow_id, lambda e: operations.cancel(e, workflow_id, by=person), False, as_json
    )
