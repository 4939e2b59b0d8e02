"""``phasegate diff``: a workflow's change, as git prints it, its file list, or JSON."""

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from phasegate.cli._app import JsonOption, RepoOption, app, err, open_repo, reported_errors, shown

if TYPE_CHECKING:
    from phasegate.git.diffs import DiffFile

#: ANSI colors of a diff on a terminal, as ``git diff`` has them.
_COLORS = {"add": "\x1b[32m", "del": "\x1b[31m", "hunk": "\x1b[36m", "file": "\x1b[1m"}
_RESET = "\x1b[0m"


@app.command()
def diff(
    workflow_id: Annotated[str, typer.Argument(metavar="ID")],
    stat: Annotated[
        bool, typer.Option("--stat", help="Only the files changed, with lines added and removed.")
    ] = False,
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """A workflow's change: its branch against its base while it is open, its merge
    commit once merged (after its branch is deleted too). A workflow another
    clone built is fetched from the forge into refs/phasegate/ (never into your
    branches), or on the local forge read in that clone. Colored on a terminal,
    plain when piped (a patch `git apply` takes). Exit 1 when the change cannot be
    read (the message says what to fetch)."""
    from phasegate.agents.env import cartridge_secrets
    from phasegate.changes import workflow_change
    from phasegate.core.redaction import redact
    from phasegate.runtime.engine import Engine

    with reported_errors():
        root, cartridge, store = open_repo(repo)
        try:
            change = workflow_change(Engine(root, cartridge, store), workflow_id)
        finally:
            store.close()
    secrets = cartridge_secrets(cartridge)
    out = sys.stdout
    if change.missing:
        err.print(f"[red]error:[/red] {shown(change.missing)}", highlight=False)
        if as_json:  # the error every command prints, and what it is about
            missing = {"kind": "ChangeMissing", "message": change.missing}
            failed = {"error": missing, "workflow": workflow_id, "missing": change.missing}
            out.write(redact(json.dumps(failed), secrets) + "\n")
        raise typer.Exit(1)
    if as_json:
        read = change.as_dict()
        if stat:  # the files with their counts, without their lines
            read["files"] = [{k: v for k, v in f.items() if k != "lines"} for f in read["files"]]
        out.write(redact(json.dumps(read, indent=2), secrets) + "\n")
        return
    tty = out.isatty()
    if stat:
        _print_stat(change.files, change.added, change.removed, tty)
    else:
        text = redact(change.text, secrets)
        out.write(_colored(text) if tty else text)
    err.print(f"{workflow_id}: {shown(change.source)}", highlight=False)


def _print_stat(files: "list[DiffFile]", added: int, removed: int, tty: bool) -> None:
    """One line a file (``path  +N -M  status``), then the totals."""
    from phasegate.core.terminal import visible

    width = max((len(f.path) for f in files), default=0)
    for f in files:
        status = "" if f.status == "modified" else f"  {f.status}"
        if f.old_path:
            status += f" from {visible(f.old_path)}"
        plus, minus = f"+{f.added}", f"-{f.removed}"
        if tty:
            plus = f"{_COLORS['add']}{plus}{_RESET}"
            minus = f"{_COLORS['del']}{minus}{_RESET}"
        sys.stdout.write(f"{visible(f.path).ljust(width)}  {plus} {minus}{status}\n")
    files_word = "file" if len(files) == 1 else "files"
    sys.stdout.write(f"{len(files)} {files_word} changed, +{added} -{removed}\n")


def _colored(text: str) -> str:
    """``text`` (a unified diff) with its lines colored as git colors them, each
    control character shown as its escape: an agent's file cannot drive the terminal."""
    from phasegate.core.terminal import visible

    lines = []
    for line in text.split("\n"):
        kind = (
            "file"
            if line.startswith(("diff --git", "--- ", "+++ "))
            else "add"
            if line.startswith("+")
            else "del"
            if line.startswith("-")
            else "hunk"
            if line.startswith("@@")
            else None
        )
        shown_line = visible(line)
        lines.append(f"{_COLORS[kind]}{shown_line}{_RESET}" if kind else shown_line)
    return "\n".join(lines)
