"""The typer app and what every command shares: consoles, options, errors, the store."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup
from typer.exceptions import TyperException

from phasegate import __version__
from phasegate.core.contract import PhasegateError
from phasegate.core.terminal import visible

if TYPE_CHECKING:
    from phasegate.config.cartridge import Cartridge
    from phasegate.store import Store

# Every command's own work (the store, the cartridge, the forge, the engine) is
# imported inside it: `phasegate --help` and `phasegate status` must start in a
# fraction of a second, and most of phasegate is not needed to print either.


class _JsonErrorsGroup(TyperGroup):
    """The command group: a command line click refuses (a missing argument, an
    unknown option, a value of the wrong type) is, under ``--json``, JSON on
    stdout too (``json_error``), with click's exit code."""

    def invoke(self, ctx: Any) -> Any:
        given = [*getattr(ctx, "_protected_args", ()), *ctx.args]
        json_errors.clear()  # one command line's choice, not the last one's (tests run many)
        try:
            return super().invoke(ctx)
        except TyperException as exc:  # click's refusals of a command line
            if "--json" not in given:
                raise
            exc.show()  # type: ignore[attr-defined]
            json_error(exc.format_message(), "UsageError")
            raise typer.Exit(getattr(exc, "exit_code", 2)) from None


app = typer.Typer(
    cls=_JsonErrorsGroup,
    help="Drive coding agents through a contract-checked ticket lifecycle:\n\n"
    "preparation → planning → development → pr_review → report → wait → merge → "
    "acceptance_verification → completed.\n\nStart with `phasegate demo`, or "
    '`phasegate init` in your repository and then `phasegate run "ticket"`.\n\n'
    "With [graph] enabled = true in phasegate.toml, planning, development and pr_review "
    "follow the development graph: competing plans, a build that answers with a diff, "
    "review tiers, a bounded fix loop, and a draft PR proposal that the apply arm lands "
    "or a person approves (`phasegate demo --graph` shows one).\n\n"
    "Killed at any moment, a workflow goes on with `phasegate worker` or `phasegate resume "
    "ID`: no duplicate issue, PR, comment or merge, no unrecorded work on the base, stale "
    "git locks repaired, leftover agents and checks stopped (docs/guarantees.md).\n\n"
    "Agents and checks run under bubblewrap where it works (worktree writable, the rest "
    'read-only, phasegate\'s process and keys out of sight; `sandbox = "none"` per role '
    "turns it off, with a warning); refs and .git are restored after every agent run; "
    "secrets are redacted raw and encoded (docs/sandbox.md).\n\n"
    'On GitHub, GitLab or Gitea ([forge] kind = "github", "gitlab" or "gitea"): '
    "`phasegate watch` starts a "
    "workflow for each issue a trusted person labels `phasegate` (`phasegate import "
    "OWNER/REPO#N` by hand); "
    "CI checks are evidence; review comments send the change back; an approving review "
    "or `/phasegate merge` merges; the issue closes only after verification "
    "(docs/github.md).\n\n"
    "Many at once: `phasegate worker --concurrency N` advances N workflows side by side, "
    "woken by the store, not a poll; several workers (on several machines with "
    '[store] url = "postgresql://…") share the work, one worker per workflow '
    "(docs/workers.md).\n\n"
    "The dashboard: `phasegate serve` runs the worker and serves the board (what needs "
    "you first) and each workflow's page, live, on 127.0.0.1:8765, behind each person's "
    "token (`phasegate users add NAME --role viewer|approver|admin`; or "
    "PHASEGATE_WEB_TOKEN, or one printed at start) and CSRF; `phasegate events ID "
    "--follow` gives the same stream in a terminal. A decision (resume, feedback, "
    "approve-merge, revert, verify-override, approve, reject, cancel) has one set of "
    "rules for the CLI and the dashboard (docs/dashboard.md); scripts use its JSON API "
    "under /api with a bearer token (docs/api.md). Under --json a command prints its "
    'failure as JSON too: {"error": {"message", "kind"}}.',
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)
#: What stops the running command gently when its reader goes (``graceful`` adds
#: the engine's stop while its workflow runs).
reader_gone: list[Callable[[], None]] = []


class _PipedConsole(Console):
    """A console whose reader may go (``run ... | head``). While a workflow runs it
    then prints nothing more and stops the command gently, as a closed terminal
    does, where rich's own console would exit in the middle of an agent's run;
    before or after, with nothing in flight, it exits as rich's does."""

    def on_broken_pipe(self) -> None:
        if not reader_gone:
            super().on_broken_pipe()
        self.quiet = True
        # What is still buffered goes nowhere (a stream with no descriptor keeps it).
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.file.fileno())
        for stop in reader_gone:
            stop()


console = _PipedConsole()
err = _PipedConsole(stderr=True, soft_wrap=True)  # never fold a message a script will read

#: The signals that stop a command gently (its agents stopped, its workflow left
#: resumable): Ctrl-C, SIGTERM, and the terminal closing under it.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

RepoOption = Annotated[
    Path, typer.Option("--repo", "-C", help="The repository (default: the current directory).")
]
#: Whether the running command was given ``--json``: its errors are JSON on stdout too.
json_errors: list[bool] = []


def json_chosen(value: bool) -> bool:
    if value:
        json_errors.append(True)
    return value


JsonOption = Annotated[
    bool,
    typer.Option(
        "--json",
        callback=json_chosen,
        help='Print JSON for scripts; a failure too: {"error": {"message", "kind"}}, '
        "on stdout, with the same exit code.",
    ),
]


ByOption = Annotated[
    str | None,
    typer.Option(
        "--by",
        help="Who acts, recorded with the decision (default: your login name).",
        show_default=False,
    ),
]


def who(by: str | None) -> str:
    """The person a command acts as: ``--by``, else the login name
    (``phasegate.operations.login_name``)."""
    from phasegate.operations import login_name

    return login_name() if by is None else by


def json_error(message: str, kind: str) -> None:
    """A failure as a script reads it under ``--json``: ``{"error": {"message",
    "kind"}}`` (``kind``: the error's name, UsageError for a command line refused),
    one line on stdout."""
    sys.stdout.write(json.dumps({"error": {"message": message, "kind": kind}}) + "\n")
    sys.stdout.flush()


class UsageError(PhasegateError):
    """Bad input on the command line."""


def print_whole(table: Any) -> None:
    """``table`` on stdout: fitted to a terminal, and as wide as it needs when piped,
    where no width is known and a script or a file reads every cell whole."""
    if console.is_terminal:
        console.print(table)
        return
    needs = Console(width=10_000).measure(table).maximum
    # rich caps a print's width at its console's: a wider table needs a console of its own.
    wide = Console(file=console.file, width=max(console.width, needs), no_color=console.no_color)
    wide.print(table)


def shown(text: str) -> str:
    """``text`` (a ticket's, an agent's, git's) ready for ``console.print``: control
    characters as visible escapes (``phasegate.core.terminal.visible``), markup escaped."""
    return escape(visible(text))


def repo_option(row: Mapping[str, Any]) -> str:
    """`` --repo PATH`` for a hint about a workflow (a row or summary with its
    ``repo_path``) whose repository is not the one the person is in (``demo
    --dir``, ``--repo``), else nothing."""
    repo = Path(str(row.get("repo_path") or "."))
    try:
        Path.cwd().resolve().relative_to(repo.resolve())
    except (ValueError, OSError):
        return f" --repo {shlex.quote(str(repo))}"  # pasted as printed, spaces too
    return ""


def _fail(message: str, code: int = 2, kind: str = "PhasegateError") -> typer.Exit:
    # Messages quote keys, paths and agent output: "[roles.build]" is text, not markup.
    err.print(f"[red]error:[/red] {shown(message)}", highlight=False, markup=True)
    if json_errors:
        json_error(message, kind)
    return typer.Exit(code)


@contextmanager
def reported_errors() -> Iterator[None]:
    """Turn phasegate's errors into a one-line message (and under ``--json`` the
    same as JSON on stdout, ``json_error``): exit code 1 when the store could not
    be written (a workflow stays as last committed; ``resume`` continues it), else
    2 (bad input)."""
    try:
        yield
    except PhasegateError as exc:  # GitError and StoreUnavailable are PhasegateErrors
        from phasegate.store import StoreUnavailable

        if isinstance(exc, StoreUnavailable):
            resumable = "`phasegate resume ID` continues a workflow"
            said = f"{exc}; nothing was half-written ({resumable})"
            raise _fail(said, 1, type(exc).__name__) from None
        raise _fail(str(exc), kind=type(exc).__name__) from None


def repo_root(repo: Path) -> Path:
    """The repository ``repo`` is in: inside a linked worktree (a workflow's, under
    ``.phasegate/worktrees/``, or a person's), the main checkout that owns it, where
    the cartridge and the store are."""
    from phasegate.git.command import GitError, git

    if repo.exists() and not repo.is_dir():
        raise UsageError(f"{repo} is a file: --repo takes the repository's directory")
    try:
        found = git(
            ["rev-parse", "--show-toplevel", "--path-format=absolute", "--git-common-dir"],
            repo.resolve(),
        ).splitlines()
        top, common = Path(found[0]), Path(found[1])
    except (GitError, FileNotFoundError, NotADirectoryError) as exc:
        from phasegate.tools.doctor import not_a_repository

        raise UsageError(not_a_repository(repo.resolve(), exc)) from None
    if common.name == ".git" and common.parent != top and (common.parent / ".git").is_dir():
        return common.parent
    return top


def open_repo(repo: Path) -> tuple[Path, Cartridge, Store]:
    """The repository, the cartridge its workflows run under (the committed one,
    ``load_committed_cartridge``: a note on stderr says when the checkout's
    differs or is not committed) and its store."""
    from phasegate.git.committed import load_committed_cartridge
    from phasegate.store import open_store

    root = repo_root(repo)
    cartridge, note = load_committed_cartridge(root)
    if note:
        err.print(f"[yellow]note:[/yellow] {shown(note)}", highlight=False)
    return root, cartridge, closed_with_command(open_store(cartridge.store_url(root)))


def open_for_reading(repo: Path) -> Store:
    """The store, even while the cartridge is broken: looking must not need it valid."""
    return open_url_for_reading(reading_url(repo))


def reading_url(repo: Path) -> str:
    """The store's URL, even while the cartridge is broken (a warning says so, and
    names the default store read instead)."""
    from phasegate.config.cartridge import Cartridge, CartridgeError, load_cartridge

    root = repo_root(repo)
    try:
        return load_cartridge(root).store_url(root)
    except CartridgeError as exc:
        err.print(f"[yellow]warning:[/yellow] {shown(str(exc))}; reading the default store")
        return Cartridge().store_url(root)


def warn_if_broken(root: Path, reading: str) -> None:
    """A warning on stderr naming what is wrong with ``root``'s cartridge, if anything,
    and what is read meanwhile (``reading``)."""
    from phasegate.config.cartridge import CartridgeError, load_cartridge

    try:
        load_cartridge(root)
    except CartridgeError as exc:
        err.print(f"[yellow]warning:[/yellow] {shown(str(exc))}; reading {reading}")


def open_url_for_reading(url: str) -> Store:
    """The store at ``url`` (``reading_url``), not created when it is a SQLite file
    that does not exist yet."""
    from phasegate.store import open_store

    return closed_with_command(open_store(_nothing_to_read_yet(url) or url))


def closed_with_command(store: Store) -> Store:
    """``store``, closed when the command that opened it ends (``main_callback``):
    its connections go back to the server at once, even when the app runs inside
    another program."""
    _opened.append(store)
    return store


#: The stores the running command opened, closed as it ends (``main_callback``).
_opened: list[Store] = []


def _close_opened() -> None:
    while _opened:
        _opened.pop().close()


def _nothing_to_read_yet(url: str) -> str | None:
    """An empty in-memory store's URL when ``url`` names a SQLite file that does not
    exist yet: looking (``status``, ``show``) must not create it in the repository."""
    if not url.startswith("sqlite"):
        return None
    import sqlalchemy as sa

    database = sa.engine.make_url(url).database
    if database and database != ":memory:" and not Path(database).exists():
        return "sqlite://"
    return None


# -- progress -----------------------------------------------------------------------


# -- commands -----------------------------------------------------------------------


def _version(value: bool) -> None:
    if value:
        console.print(f"phasegate {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    context: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """phasegate"""
    context.call_on_close(_close_opened)


def ticket_from(ticket: str | None, ticket_file: Path | None) -> str:
    from phasegate.operations import MAX_TICKET_BYTES, check_ticket

    if (ticket is None) == (ticket_file is None):
        raise UsageError("give the ticket text or --ticket FILE (one of them)")
    if ticket_file is not None:
        try:
            with ticket_file.open("rb") as handle:  # /dev/zero must not fill the memory
                raw = handle.read(MAX_TICKET_BYTES + 1)
            ticket = raw.decode("utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read {ticket_file}: {exc}") from None
        except UnicodeDecodeError as exc:
            if exc.start < MAX_TICKET_BYTES:
                raise UsageError(f"{ticket_file}: not UTF-8 text (byte {exc.start})") from None
            ticket = raw.decode("utf-8", "replace")  # cut inside a character: too big anyway
    assert ticket is not None
    return check_ticket(ticket)


AutoMergeOption = Annotated[
    bool | None,
    typer.Option(
        "--auto-merge/--no-auto-merge",
        help="Override workflow.auto_merge and the profile's default.",
    ),
]
ProfileOption = Annotated[
    str | None,
    typer.Option(
        "--profile",
        help="The automation profile: manual, review, trusted, auto, ci, full-auto or a "
        "[profiles.NAME] of the cartridge (default: workflow.profile, else review).",
    ),
]


AfterOption = Annotated[
    list[str] | None,
    typer.Option(
        "--after",
        metavar="ID",
        help="Start only once workflow ID has merged and verified (repeatable); "
        "until then it is blocked and a worker starts it.",
    ),
]


class BranchStrategy(StrEnum):
    """``--branch-strategy``'s choices (``workflow.branch_strategy``): click checks them."""

    ticket = "ticket"
    epic = "epic"


BranchStrategyOption = Annotated[
    BranchStrategy | None,
    typer.Option(
        "--branch-strategy",
        case_sensitive=False,
        help="How an epic's pieces branch: ticket (each from the base) or epic (all on one "
        "branch phasegate/epic-ID the epic merges at the end); default: "
        "workflow.branch_strategy.",
    ),
]


def title_of(ticket: str) -> str:
    """``phasegate.operations.title_of``, imported when a title is made."""
    from phasegate.operations import title_of

    return title_of(ticket)


PriorityOption = Annotated[
    str,
    typer.Option(
        "--priority",
        metavar="PRIORITY",
        help="high, normal, low or an integer from -100 to 100: workers claim larger "
        "first, then oldest (`phasegate priority ID P` changes it later; docs/queues.md).",
    ),
]
NoAdvance = Annotated[
    bool, typer.Option("--no-advance", help="Record only; let a worker advance it.")
]
