"""``phasegate demo``: a sample project run to completed by scripted agents."""

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from phasegate.cli._app import (
    JsonOption,
    ProfileOption,
    UsageError,
    app,
    console,
    open_repo,
    reported_errors,
)
from phasegate.core.terminal import visible


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
    from phasegate.cli.detail import print_detail
    from phasegate.cli.render import LiveProgress, finish, graceful, make_engine
    from phasegate.config.cartridge import Cartridge, CartridgeError
    from phasegate.core.report import render_report
    from phasegate.integrations import notify
    from phasegate.operations import login_name
    from phasegate.summary import workflow_detail
    from phasegate.tools.demo import DEMO_TICKET, DEMO_TITLE, make_sample_project

    with reported_errors():
        if profile is not None:  # a name the sample's cartridge knows, before any file
            if not profile.strip():
                raise CartridgeError("--profile: the profile name is empty")
            Cartridge().profile(profile)
        target = directory or Path(tempfile.mkdtemp(prefix="phasegate-demo-")) / "calc"
        if target.exists() and not target.is_dir():
            raise UsageError(f"{target} is a file; --dir takes a new or empty directory")
        if target.exists() and any(target.iterdir()):
            raise UsageError(f"{target} is not empty; choose a new --dir")
        repo = make_sample_project(target, graph=graph)
        if not as_json:
            console.print(f"sample project: {repo}", highlight=False)
        root, cartridge, store = open_repo(repo)
        engine = make_engine(root, cartridge, store, None)
        # Started by the person running it, as `phasegate run` records it: the
        # board's card says so.
        workflow_id = engine.start(
            DEMO_TITLE, DEMO_TICKET, profile=profile, state={"started_by": login_name()}
        )
        with LiveProgress(quiet=as_json) as progress, graceful(engine):
            notify.set_on_event(engine, progress)  # keeps the engine's notifier
            row = engine.advance(workflow_id)
    if not as_json:
        print_detail(workflow_detail(store, workflow_id))
        report = row["state"].get("report")
        if report:
            console.print(
                visible(render_report(report, report.get("content_language", "en"))),
                highlight=False,
                markup=False,
            )
        me = _invocation()
        graph_run = row["state"].get("graph_run") if graph else None
        if graph_run:
            console.print(
                f"development graph run {graph_run}: try "
                f"`{me} proposals --repo {repo}` and "
                f"`{me} replay {graph_run} --repo {repo}`",
                highlight=False,
            )
        console.print(
            f"state kept in {repo / '.phasegate'}; try `{me} show {workflow_id} --repo {repo}`",
            highlight=False,
            soft_wrap=True,  # a command to paste: never folded
        )
    finish(store, row, as_json, interrupted=engine.shutdown.is_set())


def _invocation() -> str:
    """How this shell calls phasegate: ``phasegate`` when PATH finds this very
    program, else the absolute path of the one it was started by (``.venv/bin/phasegate``
    right after the README's set-up), so a hint printed for a person works as given,
    in any directory."""
    argv0 = Path(sys.argv[0])
    if argv0.name != "phasegate":
        return "phasegate"  # run through python -m or a test: PATH's name is the best guess
    found = shutil.which("phasegate")
    if found and Path(found).resolve() == argv0.resolve():
        return "phasegate"
    return os.path.abspath(argv0)
