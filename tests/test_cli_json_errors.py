"""Every command under ``--json`` fails in JSON too: ``{"error": {"message", "kind"}}``
on stdout with the exit code it has without ``--json``, a refused command line
(a missing argument, an unknown option) included.

The commands are read from the Typer app itself, so a command that gains
``--json`` is checked without a change here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.core import TyperArgument, TyperGroup, TyperOption

from phasegate.cli import app

from conftest import phasegate_cli

UNKNOWN = "0badf00d"


def json_commands() -> dict[str, Any]:
    """The app's commands that take ``--json``, by name."""
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    return {
        name: command
        for name, command in group.commands.items()
        if any("--json" in getattr(p, "opts", ()) for p in command.params)
    }


def failing_args(command: Any, repo: Path) -> list[str]:
    """A command line of ``command`` that fails: an unknown id for each required
    argument, a word for each required option, and ``repo`` (not a repository
    when the command needs no id) for its ``--repo``; demo gets a directory that
    is a file."""
    args: list[str] = []
    for param in command.params:
        if isinstance(param, TyperArgument) and param.required:
            args.append(UNKNOWN)
        elif isinstance(param, TyperOption) and param.required:
            args += [param.opts[0], "confirmed" if param.name == "verdict" else "because"]
    names = {p.name for p in command.params}
    if "repo" in names:
        args += ["--repo", str(repo)]
    elif "directory" in names:
        args += ["--dir", str(repo / "README.md")]
    return [*args, "--json"]


def json_failure(done: Any) -> dict[str, Any]:
    """The error a failed command printed on stdout under ``--json``."""
    assert done.returncode not in (0, None), (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    printed = json.loads(done.stdout)
    error: dict[str, Any] = printed["error"]
    assert error["message"] and error["kind"], printed
    return error


def test_the_commands_with_json_are_found() -> None:
    found = json_commands()
    assert {"status", "show", "approve-merge", "cancel", "approve", "events", "demo"} <= set(found)


@pytest.mark.parametrize("name", sorted(json_commands()))
def test_every_json_command_prints_its_failure_as_json_with_its_exit_code(
    name: str, happy_repo: Path, tmp_path: Path
) -> None:
    command = json_commands()[name]
    needs_id = any(isinstance(p, TyperArgument) and p.required for p in command.params)
    # With an id: an unknown one in a real repository; without: no repository at all.
    nowhere = tmp_path / "not-a-repository"
    nowhere.mkdir()
    repo = happy_repo if needs_id else nowhere
    if name == "demo":
        repo = happy_repo
    args = failing_args(command, repo)
    done = phasegate_cli(name, *args)
    error = json_failure(done)
    # the message the terminal is told (doctor tells its list on stdout), the exit
    # code it has without --json
    if name != "doctor":
        assert error["message"].split("\n")[0][:40] in " ".join(done.stderr.split())
    plain = phasegate_cli(name, *[a for a in args if a != "--json"])
    assert plain.returncode == done.returncode
    if needs_id and name not in ("demo", "backup"):  # backup's argument is a file
        assert UNKNOWN in error["message"], error


def test_an_unknown_workflow_is_a_json_error_naming_its_kind(happy_repo: Path) -> None:
    done = phasegate_cli("show", UNKNOWN, "--json", "--repo", str(happy_repo))
    assert done.returncode == 2
    error = json_failure(done)
    assert error["kind"] == "WorkflowNotFound"
    assert error["message"].startswith(f"no workflow with id '{UNKNOWN}'")


@pytest.mark.parametrize(
    "args",
    [
        ["show", "--json"],
        ["status", "--json", "--no-such-option"],
        ["events", "x", "--json", "--after", "soon"],
    ],
    ids=["missing-argument", "unknown-option", "wrong-type"],
)
def test_a_refused_command_line_under_json_is_a_json_usage_error(args: list[str]) -> None:
    done = phasegate_cli(*args)
    assert done.returncode == 2
    error = json_failure(done)
    assert error["kind"] == "UsageError"
    assert "Usage:" in done.stderr  # a person still reads click's usage on stderr
    assert phasegate_cli(*[a for a in args if a != "--json"]).stdout == ""
