"""What agents may spend and what they spent: ``phasegate budget``, ``budget set``
and ``costs``.

The rules live below (``phasegate.store.budgets`` for a person's setting,
``phasegate.agents.budgets`` for which budget holds and what is left); this
module parses the command line and prints. docs/budgets.md tells the story.
"""

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from phasegate.cli._app import (
    JsonOption,
    RepoOption,
    UsageError,
    app,
    console,
    err,
    open_repo,
    reported_errors,
    shown,
    who,
)
from phasegate.store.budgets import COST_GROUPS, STORE_SCOPE

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
            help="The repository budgeted: a clone's path, or a team forge's owner/name "
            "(default: the one --repo is in).",
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
    them, and `phasegate resume ID` carries each on.
    """
    from phasegate.agents.budgets import budget_report, repository_here

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
        here = repository_here(store, cartridge, root)
        scope = STORE_SCOPE if everyone else _scope(repository, here)
        store.set_budget(scope, amounts, by=who(by))
        report = [b for b in budget_report(store, cartridge, scope) if b.scope == scope]
        paused = store.budget_pauses(None if scope == STORE_SCOPE else scope)
    if as_json:
        print(
            json.dumps(
                {
                    "scope": scope,
                    "budgets": [b.as_dict() for b in report],
                    "paused": paused,
                    "next": f"phasegate resume {paused[0]['id']}" if paused else None,
                }
            )
        )
        return
    _print_budgets(report)
    if not paused:
        console.print(
            "no workflow is paused on a budget; `phasegate budget` shows every budget",
            highlight=False,
        )
    for row in paused:
        console.print(
            f"paused on a budget: {row['id']} {shown(row['title'])}; "
            f"`phasegate resume {row['id']}` carries it on",
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
            help="Only calls since then: 2026-12-01 (UTC), 7d, today or month (default: all).",
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
    from rich.table import Table

    table = Table(by, "USD", "input tokens", "output tokens", "calls")
    for row in [*report["rows"], {"key": "total", **report["total"]}]:
        table.add_row(*_cost_cells(row))
    console.print(table)
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


def _scope(repository: str | None, here: str) -> str:
    """The repository ``--repository`` names, as budgets name it: a clone's directory
    by the repository its workflows are of, an owner/name lower-cased."""
    if repository is None:
        return here
    path = Path(repository).expanduser()
    if path.is_dir():
        from phasegate.agents.budgets import repository_here

        root, cartridge, store = open_repo(path)
        return repository_here(store, cartridge, root)
    return repository if repository.startswith("/") else repository.lower()


def _print_budgets(report: list[Any]) -> None:
    from rich.table import Table

    table = Table("budget", "of", "period (UTC)", "spent", "limit", "left", "set in")
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
    console.print(table)


def _cost_cells(row: dict[str, Any]) -> list[str]:
    return [
        shown(row["key"]),
        f"{row['cost_usd']:.4f}",
        str(row["input_tokens"]),
        str(row["output_tokens"]),
        str(row["calls"]),
    ]


__all__ = ["budget", "costs"]
