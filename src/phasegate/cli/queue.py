"""The queue's commands: ``phasegate priority`` and ``phasegate queue show|cap|uncap``.

Each parses its input, calls ``phasegate.operations`` (the queue's actions
live in ``phasegate.actions.queue``) and renders what it returns; docs/queues.md
says how priorities and caps work.
"""

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from phasegate.cli._app import (
    ByOption,
    JsonOption,
    RepoOption,
    app,
    console,
    open_repo,
    reported_errors,
    shown,
    who,
)

queue = typer.Typer(
    help="The queue: which runnable workflow workers claim next (priority, then age), "
    "the agent calls holding slots now, and the caps on calls at once per model "
    "provider, runner and repository, held across every worker sharing the store "
    "(docs/queues.md).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(queue, name="queue", short_help="The queue: claim order, slots held, caps.")

ScopeArgument = Annotated[
    str, typer.Argument(metavar="SCOPE", help="provider, runner or repository.")
]
KeyArgument = Annotated[
    str,
    typer.Argument(
        metavar="NAME",
        help="The provider (anthropic, openai, command, ...), runner (claude-code, ...) or "
        "repository (owner/name, or a clone's path); * for each one not named.",
    ),
]


#: A negative number given as a positional value (``priority ID -5``, ``queue cap ... -1``)
#: reaches the command as that value instead of being read as an unknown option; a
#: misspelt option then arrives as an extra argument, which is still refused.
NUMBERS_AS_VALUES = {"ignore_unknown_options": True}


def _print(value: Any) -> None:
    print(json.dumps(value, default=str))


@app.command(context_settings=NUMBERS_AS_VALUES)
def priority(
    workflow_id: Annotated[str, typer.Argument(metavar="ID")],
    value: Annotated[
        str,
        typer.Argument(
            metavar="PRIORITY",
            help="high, normal, low, or an integer from -100 to 100 (larger is claimed first).",
        ),
    ],
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
    by: ByOption = None,
) -> None:
    """Change a workflow's priority: workers claim runnable workflows by priority
    (larger first), then oldest first. A call already running is not moved."""
    from phasegate import operations
    from phasegate.core.priority import priority_name

    with reported_errors():
        _root, _cartridge, store = open_repo(repo)
        row = operations.set_priority(store, workflow_id, value, by=who(by))
    given = int(row["priority"])
    if as_json:
        _print(
            {
                "id": row["id"],
                "priority": given,
                "priority_name": priority_name(given),
                "changed": row["changed"],
            }
        )
        return
    done = "now has" if row["changed"] else "already has"
    console.print(
        f"{row['id']} {done} priority {priority_name(given)}"
        + ("" if row["changed"] else "; nothing recorded")
        + (
            "; it is claimed in that order once what it waits for completes"
            if row["status"] in ("blocked", "pieces")
            else "; `phasegate queue show` lists the claim order"
        ),
        highlight=False,
    )


@queue.command("show")
def show(repo: RepoOption = Path("."), as_json: JsonOption = False) -> None:
    """The runnable workflows in the order workers claim them, the agent calls holding
    slots now and those waiting for one (in the order they get it), and the caps
    (the cartridge's [queue] and the store's own)."""
    from phasegate import operations
    from phasegate.actions.queue import in_use

    with reported_errors():
        _root, cartridge, store = open_repo(repo)
        view = operations.queue_view(store, cartridge)
    if as_json:
        _print(view)
        return
    from rich.table import Table

    advancing = [row for row in view["queued"] if row["held_by"]]
    unclaimed = [row for row in view["queued"] if not row["held_by"] and not row["for_person"]]
    for_people = [row for row in view["queued"] if not row["held_by"] and row["for_person"]]
    if advancing:
        console.print("advanced by a worker now:", highlight=False)
        table = Table("id", "priority", "status", "phase", "worker", "title")
        for row in advancing:
            table.add_row(
                row["id"],
                row["priority_name"],
                row["status"],
                row["current_phase"],
                shown(str(row["held_by"])),
                shown(str(row["title"])[:50]),
            )
        console.print(table)
    if unclaimed:
        console.print("waiting to be claimed, in the order workers claim them:", highlight=False)
        table = Table("#", "id", "priority", "status", "phase", "title")
        for n, row in enumerate(unclaimed, start=1):
            table.add_row(
                str(n),
                row["id"],
                row["priority_name"],
                row["status"],
                row["current_phase"],
                shown(str(row["title"])[:50]),
            )
        console.print(table)
    if for_people:
        # A worker looks at these for a person's decision; it has no work to claim.
        console.print("waiting for a person (approve-merge, feedback):", highlight=False)
        table = Table("id", "priority", "phase", "title")
        for row in for_people:
            table.add_row(
                row["id"],
                row["priority_name"],
                row["current_phase"],
                shown(str(row["title"])[:50]),
            )
        console.print(table)
    if not view["queued"]:
        console.print("nothing queued: no runnable workflow", highlight=False)
    counted = in_use(view)
    caps = _caps_lines(view, counted)
    console.print(
        f"{len(view['slots'])} agent call(s) holding slots now, "
        f"{len(view['waiting'])} waiting for one"
        + (":\n  " + "\n  ".join(caps) if caps else "; no cap set"),
        highlight=False,
    )
    for kind, calls in (("holding", view["slots"]), ("waiting", view["waiting"])):
        for call in calls:
            console.print(f"  {kind}: {_call_line(call)}", highlight=False)
    console.print("next: `phasegate priority ID high` moves one up", highlight=False)


def _call_line(call: dict[str, Any]) -> str:
    """One agent call of ``queue_view``'s ``slots`` or ``waiting``, on one line."""
    caps = ", ".join(f"{scope} {shown(key)}" for scope, key in sorted(call["caps"].items()))
    return (
        f"{call['workflow_id']} ({call['role']}, priority {call['priority']}) "
        f"on {caps or 'no cap'}, worker {shown(call['holder'])}, since {str(call['since'])[:19]}"
    )


def _caps_lines(view: dict[str, Any], counted: dict[tuple[str, str], int]) -> list[str]:
    lines = []
    own = view["cartridge_caps"] or {}
    for scope, field in (
        ("provider", "max_calls_per_provider"),
        ("runner", "max_calls_per_runner"),
    ):
        for key, cap in sorted((own.get(field) or {}).items()):
            lines.append(f"{scope} {key}: {counted.get((scope, key), 0)} of {cap} (cartridge)")
    if own.get("max_calls_per_repository") is not None:
        held = sum(n for (scope, _), n in counted.items() if scope == "repository")
        lines.append(f"this repository: {held} of {own['max_calls_per_repository']} (cartridge)")
    for row in view["store_caps"]:
        scope, key = row["scope"], row["key"]
        lines.append(
            f"{scope} {key}: {counted.get((scope, key), 0)} of {row['cap']} "
            f"(store, set by {shown(row['set_by'])})"
        )
    return lines


@queue.command("cap", context_settings=NUMBERS_AS_VALUES)
def cap(
    scope: ScopeArgument,
    key: KeyArgument,
    calls: Annotated[int, typer.Argument(metavar="N", help="The most calls at once (1 or more).")],
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
    by: ByOption = None,
) -> None:
    """Cap the agent calls at once for a provider, runner or repository in the shared
    store: every worker on the store holds it. With a cartridge's cap on the same
    name, the smaller holds."""
    from phasegate import operations

    with reported_errors():
        _root, _cartridge, store = open_repo(repo)
        row = operations.set_queue_cap(store, scope, key, calls, by=who(by))
    if as_json:
        _print(row)
        return
    console.print(
        f"{row['scope']} {shown(row['key'])}: at most {row['cap']} call(s) at once, across "
        "every worker on this store; `phasegate queue show` shows the slots held",
        highlight=False,
    )


@queue.command("uncap")
def uncap(
    scope: ScopeArgument,
    key: KeyArgument,
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
    by: ByOption = None,
) -> None:
    """Remove the shared store's cap on a provider, runner or repository (a cartridge's
    own cap still holds)."""
    from phasegate import operations

    with reported_errors():
        _root, _cartridge, store = open_repo(repo)
        row = operations.clear_queue_cap(store, scope, key, by=who(by))
    if as_json:
        _print(row)
        return
    if not row["removed"]:
        console.print(
            f"no cap on {row['scope']} {shown(row['key'])} in the store; nothing changed; "
            "`phasegate queue show` lists the caps",
            highlight=False,
        )
        return
    console.print(
        f"{row['scope']} {shown(row['key'])}: no cap in the store; "
        "`phasegate queue show` lists what still holds",
        highlight=False,
    )


__all__ = ["queue"]
