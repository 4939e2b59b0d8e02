"""What agents may spend and what they spent: ``phasegate budget``, ``budget set``
and ``costs``.

The rules live below (``phasegate.store.budgets`` for a person's setting,
``phasegate.agents.budgets`` for which budget holds and what is left); this
module parses the command line and prints. docs/budgets.md tells the story.
"""

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from phasegate.cli._app import (
    JsonOption,
    RepoOption,
    UsageError,
    app,
    console,
    err,
    open_repo,
    print_whole,
    repo_root,
    reported_errors,
    shown,
    who,
)
from phasegate.config.store_url import CARTRIDGE_FILE
from phasegate.store.values import COST_GROUPS, STORE_SCOPE

# The cartridge's models and the store's budgets load pydantic and SQLAlchemy: imported
# where a budget command runs, so that every other command starts without them.
if TYPE_CHECKING:
    from phasegate.config.cartridge import Cartridge
    from phasegate.store import Store

budget = typer.Typer(
    help="Daily and monthly budgets, per repository and for the whole store: what "
    "agents may spend a UTC day and month before workflows pause with `budget` "
    "(docs/budgets.md). Alone, it shows every budget and what is spent against it.",
    invoke_without_command=True,
    rich_markup_mode=None,
)
app.add_typer(budget, name="budget", short_help="Daily and monthly spend budgets.")

_AMOUNT_HELP = "USD a UTC {0} (none: remove the store's {1} budget)."


@budget.callback()
def show(
    ctx: typer.Context,
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """Show every budget and what is spent against it this UTC day and month."""
    if ctx.invoked_subcommand is not None:
        return
    from phasegate.agents.budgets import budget_report, repository_here

    with reported_errors():
        root, cartridge, store = open_repo(repo)
        here = repository_here(store, cartridge, root)
        report = budget_report(store, cartridge, here)
    if as_json:
        print(json.dumps({"repository": here, "budgets": [b.as_dict() for b in report]}))
        return
    if not report:
        console.print(
            "no budget set; `phasegate budget set --daily USD` budgets this repository, "
            "`--all` the whole store",
            highlight=False,
        )
        return
    _print_budgets(report)
    if any(b.reached for b in report):
        err.print(
            "a budget is spent: its workflows pause with `budget`; raise it with "
            "`phasegate budget set`, then `phasegate resume ID`",
            highlight=False,
        )
    else:
        console.print(
            "`phasegate budget set --daily USD` changes one; `phasegate costs` shows the spend",
            highlight=False,
        )


@budget.command("set")
def set_budget(
    daily: Annotated[
        str | None, typer.Option("--daily", metavar="USD", help=_AMOUNT_HELP.format("day", "daily"))
    ] = None,
    monthly: Annotated[
        str | None,
        typer.Option("--monthly", metavar="USD", help=_AMOUNT_HELP.format("month", "monthly")),
    ] = None,
    repository: Annotated[
        str | None,
        typer.Option(
            "--repository",
            metavar="PATH",
            help="The repository budgeted (default: the one --repo is in): this clone, a "
            "clone sharing this store, or a team forge's owner/name or a path whose "
            "workflows this store holds; any other is refused (docs/budgets.md).",
        ),
    ] = None,
    everyone: Annotated[
        bool, typer.Option("--all", help="Budget the whole store, every repository together.")
    ] = False,
    by: Annotated[
        str | None, typer.Option("--by", help="Who sets it, as recorded (default: login name).")
    ] = None,
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """Set a repository's (or with --all the whole store's) daily and monthly budget.

    A budget set here wins over the cartridge's [limits] daily_budget_usd and
    monthly_budget_usd, and takes effect at the next agent call of every
    worker. Workflows already paused on a budget stay paused: the command lists
    them, each with `phasegate resume ID`, or with the budget still spent that
    keeps it paused and the command that raises that one.
    """
    from phasegate.agents.budgets import budget_report, repository_here, still_spent

    with reported_errors():
        if repository is not None and everyone:
            raise UsageError("give --repository or --all, not both")
        amounts = {
            kind: _amount(kind, given)
            for kind, given in (("daily", daily), ("monthly", monthly))
            if given is not None
        }
        if not amounts:
            raise UsageError("say what to set: --daily USD, --monthly USD, or both")
        root, cartridge, store = open_repo(repo)
        scope = STORE_SCOPE if everyone else _scope(repository, root, cartridge, store)
        store.set_budget(scope, amounts, by=who(by))
        here = repository_here(store, cartridge, root)
        report = [
            b
            for b in budget_report(store, cartridge if scope == here else None, scope)
            if b.scope == scope
        ]
        paused = store.budget_pauses(None if scope == STORE_SCOPE else scope)
        for row in paused:
            # Another budget may still be spent: resuming would only pause it again.
            blocking = still_spent(
                store, cartridge if row["repository"] == here else None, row["repository"]
            )
            row["blocked_by"] = [b.as_dict() for b in blocking]
            row["next"] = blocking[0].raise_command if blocking else f"phasegate resume {row['id']}"
    if as_json:
        print(
            json.dumps(
                {
                    "scope": scope,
                    "budgets": [b.as_dict() for b in report],
                    "paused": paused,
                    "next": paused[0]["next"] if paused else None,
                }
            )
        )
        return
    whose = "the whole store" if scope == STORE_SCOPE else shown(scope)
    if report:
        _print_budgets(report)
    else:
        console.print(
            f"{whose} has no daily or monthly budget now: its agents spend up to the other "
            "caps only; `phasegate budget` shows every budget",
            highlight=False,
        )
    if not paused:
        console.print(
            "no workflow is paused on a budget; `phasegate budget` shows every budget",
            highlight=False,
        )
    for row in paused:
        first = f"paused on a budget: {row['id']} {shown(row['title'])}; "
        if not row["blocked_by"]:
            console.print(f"{first}`{row['next']}` carries it on", highlight=False)
            continue
        still = " and ".join(
            f"{_what(b)} (${b['spent_usd']:.4f} of ${b['limit_usd']:.4f})"
            for b in row["blocked_by"]
        )
        verb = "is" if len(row["blocked_by"]) == 1 else "are"
        console.print(
            f"{first}{still} {verb} still spent: `{shown(row['next'])}` first, "
            f"then `phasegate resume {row['id']}`",
            highlight=False,
        )


@app.command()
def costs(
    by: Annotated[
        str,
        typer.Option("--by", metavar="GROUP", help=f"Group by {', '.join(COST_GROUPS)}."),
    ] = "repository",
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            metavar="DATE",
            help="Only calls since then: 2026-12-01 (from 00:00 UTC), 7d (whole UTC days: "
            "today and the 6 before), today or month (default: all).",
        ),
    ] = None,
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """What agents spent: USD, tokens and calls, grouped by repository, model,
    role, UTC day or workflow, over every workflow of the store."""
    from phasegate.agents.budgets import costs_report, since_of

    with reported_errors():
        _root, _cartridge, store = open_repo(repo)
        report = costs_report(store, by, since_of(since, store.clock.now()))
    if as_json:
        print(json.dumps(report))
        return
    if not report["rows"]:
        console.print("no agent calls yet in that time; `phasegate run` starts a workflow")
        return
    table = _table(by, "USD", "input tokens", "output tokens", "calls")
    for row in [*report["rows"], {"key": "total", **report["total"]}]:
        table.add_row(*_cost_cells(row))
    print_whole(table)
    console.print(
        "`phasegate budget` shows the budgets; `phasegate budget set --daily USD` sets one",
        highlight=False,
    )


def _amount(kind: str, given: str) -> float | None:
    if given.strip().lower() == "none":
        return None
    try:
        return float(given)
    except ValueError:
        raise UsageError(f"--{kind} takes an amount in USD (or none), not {given!r}") from None


#: A team forge's repository name: owner/name, or group/subgroup/name on GitLab.
_FORGE_NAME = re.compile(r"^[\w.-]+(/[\w.-]+)+$")


def _scope(repository: str | None, root: Path, cartridge: "Cartridge", store: "Store") -> str:
    """The repository ``--repository`` names, as budgets name it (the one ``root`` is
    when None): this one, or one whose workflows this store holds (a clone sharing
    the store, a team forge's owner/name lower-cased). Raises BudgetRefused for
    any other: its budget would sit in a store its workflows never read."""
    from phasegate.agents.budgets import repository_here
    from phasegate.store.budgets import BudgetRefused

    here = repository_here(store, cartridge, root)
    if repository is None:
        return here
    path = Path(repository).expanduser()
    if path.is_dir():
        other = repo_root(path)
        if other == root:
            return here
        shared = _cartridge_sharing(other, cartridge.store_url(root))
        if shared is not None:
            return repository_here(store, shared, other)
        named = str(other)
        if store.holds_repository(named):
            return store.repository_at(named) or named
    elif _FORGE_NAME.match(repository) and not repository.startswith("."):
        named = repository.lower()
        if named == here or store.holds_repository(named):
            return named
    else:
        named = str(path.absolute())
        if store.holds_repository(named):
            return store.repository_at(named) or named
    raise BudgetRefused(_not_held(repository, root, cartridge))


def _cartridge_sharing(other: Path, url: str) -> "Cartridge | None":
    """The cartridge of the clone at ``other`` when it names the store at ``url`` (a
    shared one: PostgreSQL, or one SQLite file), else None."""
    from phasegate.config.cartridge import CartridgeError, load_cartridge

    try:
        found = load_cartridge(other)
    except CartridgeError:
        return None
    return found if found.store_url(other) == url else None


def _not_held(repository: str, root: Path, cartridge: "Cartridge") -> str:
    """Why a budget of ``repository`` is not set in ``root``'s store, and what to do."""
    whose = (
        f"the store of {root} (.phasegate/state.db)"
        if cartridge.store.url is None
        else f"the store [store] url names in {root}'s {CARTRIDGE_FILE}"
    )
    path = Path(repository).expanduser()
    there = (
        f"`phasegate budget set ... -C {path.absolute()}`"
        if path.is_dir()
        else "`phasegate budget set` in that clone"
    )
    return (
        f"{repository} is neither this repository nor one whose workflows this store holds "
        f"(this is {whose}; each clone has its own store unless one is shared), so its "
        f"workflows would never read the budget: run {there}, or give the clones one "
        "shared store ([store] url; docs/budgets.md, One store or one per clone)"
    )


def _what(budget: dict[str, Any]) -> str:
    """``the monthly budget of the whole store`` for a ``Budget.as_dict``."""
    whose = "the whole store" if budget["scope"] == STORE_SCOPE else shown(budget["scope"])
    return f"the {budget['kind']} budget of {whose}"


def _print_budgets(report: list[Any]) -> None:
    table = _table("budget", "of", "period (UTC)", "spent", "limit", "left", "set in")
    for b in report:
        table.add_row(
            b.kind,
            "the whole store" if b.scope == STORE_SCOPE else shown(b.scope),
            b.period,
            f"${b.spent_usd:.4f}",
            f"${b.limit_usd:.4f}",
            "[red]spent[/red]" if b.reached else f"${b.left_usd:.4f}",
            "the store" if b.source == "store" else "the cartridge",
        )
    print_whole(table)


def _table(*headers: str) -> Any:
    """A table whose cells are never cut: a path or a period too long folds."""
    from rich.table import Table

    table = Table()
    for header in headers:
        table.add_column(header, no_wrap=True, overflow="fold")
    return table


def _cost_cells(row: dict[str, Any]) -> list[str]:
    return [
        shown(row["key"]),
        f"{row['cost_usd']:.4f}",
        str(row["input_tokens"]),
        str(row["output_tokens"]),
        str(row["calls"]),
    ]


__all__ = ["budget", "costs"]
