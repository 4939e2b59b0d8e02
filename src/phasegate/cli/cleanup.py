"""``phasegate cleanup``: what finished workflows leave behind, removed (docs/worktrees.md)."""

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from phasegate.cli._app import (
    ByOption,
    JsonOption,
    RepoOption,
    UsageError,
    app,
    console,
    open_repo,
    reported_errors,
    shown,
    who,
)


@app.command()
def cleanup(
    workflow_id: Annotated[
        str | None, typer.Argument(metavar="ID", help="One workflow (default: every one).")
    ] = None,
    everything: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Also remove now the worktree and local branch of every failed and "
            "cancelled workflow (with ID: that one), whatever its age.",
        ),
    ] = False,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Do not ask before --all removes anything.")
    ] = False,
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
    by: ByOption = None,
) -> None:
    """Retry removing a merged workflow's worktree and branch, when that failed, and
    apply the worktree retention.

    Without ID: every workflow whose cleanup failed. The merge itself is not
    touched: it landed and stays recorded. Failed and cancelled workflows'
    worktrees and local branches go once landing_areas.keep_failed_days /
    keep_cancelled_days have passed since they ended; with --all they go now,
    after a confirmation (--yes skips it; --json needs it). A team's forge
    keeps every branch phasegate pushed; commits never pushed (and the local
    forge's branches) go with the local branch, and --all lists them first.
    Without a terminal to ask on, --all needs --yes (exit 2); answering no
    removes nothing and exits 0.
    A running, paused or waiting workflow is never touched. Exit 0 when
    nothing is left to clean up, 1 when a cleanup still fails (git's reason is
    printed) or another process holds the workflow.
    """
    from phasegate import operations
    from phasegate.cli.render import make_engine
    from phasegate.runtime.retention import candidates

    with reported_errors():
        if everything and as_json and not yes:
            raise UsageError("cleanup --all --json asks no question: add --yes")
        if everything and not yes and not sys.stdin.isatty():
            raise UsageError("cleanup --all asks first, and there is no terminal to ask: add --yes")
        root, cartridge, store = open_repo(repo)
        engine = make_engine(root, cartridge, store, None)
        person = who(by)
        outcomes = operations.cleanup(engine, workflow_id, by=person)
        retired = operations.expire_worktrees(engine)
        if everything:
            found = [r for r in candidates(engine) if workflow_id in (None, r.id)]
            if found and not yes and not _confirmed(found):
                console.print("nothing removed (answered no)", highlight=False)
                raise typer.Exit(0)  # a choice, not a failure
            retired += operations.retire_worktrees(engine, {r.id for r in found}, by=person)
    outcomes += [_outcome(r) for r in retired]
    if as_json:
        console.print_json(json.dumps(outcomes))
    else:
        _print(outcomes, everything, team_forge=cartridge.forge.kind != "local")
    if any(o["cleanup"] in ("failed", "busy") for o in outcomes):
        raise typer.Exit(1)


#: A retirement's outcome (``runtime.retention.retire``) as a cleanup's.
_AS_CLEANUP = {"completed": "retired", "skipped": "none"}


def _outcome(retired: dict[str, Any]) -> dict[str, Any]:
    """A retirement as one more cleanup outcome: ``{"id", "cleanup", "retried",
    "reason", "retired"}``, cleanup ``retired`` (or ``failed``, ``busy``, ``none``)
    and ``retired`` what was there (status, worktree, branch, commits, unpushed)."""
    detail = {k: v for k, v in retired.items() if k not in ("id", "retired", "reason")}
    return {
        "id": retired["id"],
        "cleanup": _AS_CLEANUP.get(retired["retired"], retired["retired"]),
        "retried": retired["retired"] == "completed",
        "reason": retired["reason"],
        "retired": detail,
    }


def _confirmed(found: list[Any]) -> bool:
    console.print(
        f"cleanup --all removes the worktree and local branch of {len(found)} workflow(s):",
        highlight=False,
    )
    for r in found:
        lost = f", [yellow]{r.commits} commit(s) never pushed[/yellow]" if r.unpushed else ""
        where = r.worktree or "(no worktree)"
        console.print(
            f"  {r.id} ({r.status}): {where}, branch {r.branch or '-'}{lost}", highlight=False
        )
    return typer.confirm("Remove them?", default=False)


def _print(outcomes: list[dict[str, Any]], everything: bool, *, team_forge: bool) -> None:
    if not outcomes:
        said = "no failed cleanup" + (", no failed or cancelled worktree" if everything else "")
        console.print(f"{said}; nothing to do", highlight=False)
    for o in outcomes:
        retired = o.get("retired")
        if o["cleanup"] == "retired":
            what = "worktree and local branch removed"
            if retired and retired["unpushed"]:
                back = f"git branch {retired['branch']} {retired['head']}"
                what += (
                    f"; its {retired['commits']} commit(s) never pushed: `{back}` "
                    "brings them back until git prunes them"
                )
        elif o["cleanup"] == "completed":
            what = "worktree and branch removed" if o["retried"] else "done already"
        elif o["cleanup"] == "none":
            what = shown(str(o["reason"] or "nothing to do (not merged yet)"))
        else:
            what = f"[red]{o['cleanup']}[/red]: {shown(str(o['reason']))}"
        status = f" ({retired['status']})" if retired else ""
        console.print(f"workflow [bold]{o['id']}[/bold]{status}: cleanup {what}", highlight=False)
    # On the local forge the branch removed was the only one: nothing to make it again from.
    if team_forge and any(o["cleanup"] == "retired" for o in outcomes):
        console.print(
            "a team's forge keeps the branches phasegate pushed: "
            "`phasegate resume ID` makes a failed workflow's worktree again from one",
            highlight=False,
        )
