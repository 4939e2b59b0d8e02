"""Workflows started from the forge's issues: ``watch`` and ``import``.

A skin over ``phasegate.integrations.triggers``: only a person with write, maintain or admin
permission starts a workflow (a label) or puts words in its ticket (a comment).
``phasegate worker`` watches too when the cartridge says ``forge.watch_in_worker
= true`` (``cli._watching``).
"""

from pathlib import Path
from typing import Annotated

import typer

from phasegate.cli._app import (
    AutoMergeOption,
    ByOption,
    JsonOption,
    NoAdvance,
    ProfileOption,
    RepoOption,
    UsageError,
    app,
    console,
    err,
    json_chosen,
    open_repo,
    reported_errors,
    who,
)


@app.command()
def watch(
    repo: RepoOption = Path("."),
    once: Annotated[bool, typer.Option(help="One look at the labelled issues, then exit.")] = False,
    interval: Annotated[
        float | None,
        typer.Option(
            help="Seconds between looks (default: forge.poll_s; forge.webhook_poll_s "
            "while webhooks arrive).",
            min=0.1,
        ),
    ] = None,
    work: Annotated[
        bool,
        typer.Option(
            help="Also advance the workflows here, as `phasegate worker` does (default: "
            "only start them; a worker advances them)."
        ),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            callback=json_chosen,
            help="Print one JSON object a line per start, ignore or command "
            '(with --once, {"event": "nothing", ...} when there was none).',
        ),
    ] = False,
) -> None:
    """Start a workflow for each open issue labelled with forge.trigger_label
    (default "phasegate") by a person with write, maintain or admin permission.

    A label by anyone else starts nothing and is reported once. The ticket is
    the issue's title and body and the comments of people with write access,
    as they are at that moment; other people's comments never reach an agent.
    One workflow per issue, however many watchers run: an issue carrying a
    phasegate: status label (phasegate:cancelled too) has or had a workflow,
    maybe in another checkout, and is passed over until a person removes that
    label. Each look also applies the /phasegate resume, cancel and verify
    commands people with write access typed on waiting workflows. A label put
    on again by someone trusted is seen once the untrusted label was taken off
    first. Needs a team forge: forge.kind = "github", "gitlab" (a merge
    request's note, a Developer's label) or "gitea" (Gitea or Forgejo).
    Ctrl-C/SIGTERM stop it cleanly.
    """
    from phasegate.cli._watching import github_repository, reporter, unavailable, watching
    from phasegate.cli.render import LiveProgress, graceful, make_engine
    from phasegate.config.cartridge import CARTRIDGE_FILE
    from phasegate.integrations.triggers import Watcher, watch_forever
    from phasegate.operations import MAX_TICKET_BYTES
    from phasegate.runtime.pace import ForgePace

    with reported_errors():
        root, cartridge, store = open_repo(repo)
        repository = github_repository("watch", root, cartridge)
        cartridge.require_roles(root / CARTRIDGE_FILE)
        progress = LiveProgress(quiet=as_json or not work, several=True)
        engine = make_engine(root, cartridge, store, progress if work else None)
        watcher = Watcher(engine, repository, max_ticket_bytes=MAX_TICKET_BYTES)
        say = progress.line if work else _say
        report = reporter(as_json, say)
        pace = ForgePace(cartridge, store, repository)
        every = interval if interval is not None else pace.wait_s
        if not as_json:
            shown = f"{interval:g}s" if interval is not None else f"{pace.wait_s():g}s"
            err.print(
                f"watching {watcher.repository} for the label {watcher.label!r}"
                + ("" if once else f" every {shown} (Ctrl-C stops)"),
                highlight=False,
            )
        with graceful(
            engine, "`phasegate status` lists the workflows `phasegate resume ID` continues"
        ):
            if work:
                with (
                    progress,
                    watching(engine, watcher, once=once, interval_s=every, report=report, say=say),
                ):
                    engine.run_worker(once=once)
            elif once:
                for result in watcher.watch_once():
                    report(result)
            if once:
                report.nothing(watcher)
            else:
                watch_forever(watcher, engine.shutdown, every, report, unavailable(say))
    if engine.shutdown.is_set():
        raise typer.Exit(130)


def _say(text: str) -> None:
    console.print(text, highlight=False)


@app.command("import")
def import_issue(
    issue: Annotated[
        str,
        typer.Argument(
            metavar="OWNER/REPO#N",
            help="The issue: OWNER/REPO#N (GitLab: GROUP/…/NAME#N), #N or N.",
        ),
    ],
    by: ByOption = None,
    auto_merge: AutoMergeOption = None,
    profile: ProfileOption = None,
    repo: RepoOption = Path("."),
    no_advance: NoAdvance = False,
    as_json: JsonOption = False,
) -> None:
    """Start a workflow from an existing issue of the cartridge's repository,
    whatever its labels, and run it in the foreground like `run`.

    The ticket is the issue's title and body and the comments of people with
    write, maintain or admin permission; other people's comments never reach
    an agent. An issue that has a workflow already is refused, naming it, and
    so is a pull request's number. Needs a team forge: forge.kind = "github" or
    "gitlab" (GROUP/…/NAME#N there).
    """
    from phasegate.cli._watching import github_repository, ticket_note
    from phasegate.cli.render import drive, finish, make_engine
    from phasegate.config.cartridge import CARTRIDGE_FILE
    from phasegate.integrations.triggers import parse_issue_ref, start_from_issue
    from phasegate.operations import MAX_TICKET_BYTES

    with reported_errors():
        ref = parse_issue_ref(issue)
        root, cartridge, store = open_repo(repo)
        repository = github_repository("import", root, cartridge)
        if ref.repository is not None and ref.repository.lower() != repository.lower():
            raise UsageError(
                f"{ref.repository}#{ref.number} is not in this cartridge's repository "
                f"{repository} (forge.repository in {CARTRIDGE_FILE}, or the origin remote)"
            )
        cartridge.require_roles(root / CARTRIDGE_FILE)
        engine = make_engine(root, cartridge, store, None)
        workflow_id, snapshot = start_from_issue(
            engine,
            repository,
            ref.number,
            by=who(by),
            trigger="import",
            max_ticket_bytes=MAX_TICKET_BYTES,
            auto_merge=auto_merge,
            profile=profile,
        )
        if not as_json:
            console.print(
                f"workflow [bold]{workflow_id}[/bold] filed from {snapshot.source} "
                f"({ticket_note(snapshot)})",
                highlight=False,
            )
        if no_advance:
            finish(store, store.workflow_row(workflow_id), as_json, driven=False)
        else:
            drive(engine, workflow_id, as_json)
