"""The people of the dashboard: ``phasegate users add|list|role|token|remove``.

Each person has a name, a role (viewer, approver, admin) and a personal token,
printed once when made and stored only as its SHA-256 (``phasegate.store.users``,
where the rules live: the dashboard's people page applies the same ones).
"""

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from phasegate.cli._app import (
    JsonOption,
    RepoOption,
    app,
    console,
    err,
    open_repo,
    open_url_for_reading,
    reading_url,
    reported_errors,
    shown,
)
from phasegate.store.values import USER_ROLES

users = typer.Typer(
    help="The people of the dashboard (`phasegate serve`), each with a role and a "
    "personal token: viewers see, approvers decide, admins also manage people "
    "(docs/people.md).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(users, name="users", short_help="The dashboard's people: roles, personal tokens.")

_ROLES = ", ".join(USER_ROLES)
RoleOption = Annotated[
    str,
    typer.Option(
        "--role",
        metavar="ROLE",
        help=f"One of {_ROLES}: viewers see, approvers decide, admins also manage people.",
    ),
]
NameArgument = Annotated[str, typer.Argument(metavar="NAME", help="The person's name.")]
ByOption = Annotated[
    str | None,
    typer.Option(help="Who does it, as recorded (default: your login name)."),
]


@users.command("add")
def add(
    name: NameArgument,
    role: RoleOption = "viewer",
    by: ByOption = None,
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """Add a person and print their personal token, once.

    The token logs them in to the dashboard (its login form, or
    /login?token=TOKEN), and a script sends it as `Authorization: Bearer TOKEN`.
    Only its SHA-256 is kept: a lost token is replaced with `phasegate users token NAME`.
    """
    with reported_errors():
        _root, _cartridge, store = open_repo(repo)
        row, token = store.add_user(name, role, by=_who(by))
    _said_with_token(row, token, as_json, f"added {shown(name)} as {row['role']}")


@users.command("list")
def list_users(
    removed: Annotated[
        bool, typer.Option("--removed", help="The removed people too (who removed them, when).")
    ] = False,
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """List the people, their roles and who added them (never a token)."""
    with reported_errors():
        rows = open_url_for_reading(reading_url(repo)).users(removed=removed)
    if as_json:
        print(json.dumps([_json(r) for r in rows]))
        return
    if not rows:
        console.print("no people yet; `phasegate users add NAME --role admin` adds the first")
        return
    from rich.table import Table

    table = Table("name", "role", "added by", "added", "changed", *(["removed"] if removed else []))
    for r in rows:
        changed = f"{r['changed_by']}, {_day(r['changed_at'])}" if r["changed_by"] else ""
        gone = [f"{r['removed_by']}, {_day(r['removed_at'])}" if r["removed_at"] else ""]
        table.add_row(
            shown(r["name"]),
            r["role"],
            shown(r["added_by"]),
            _day(r["added_at"]),
            shown(changed),
            *([shown(gone[0])] if removed else []),
        )
    console.print(table)


@users.command("role")
def role(
    name: NameArgument,
    new_role: Annotated[str, typer.Argument(metavar="ROLE", help=f"One of {_ROLES}.")],
    by: ByOption = None,
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """Give a person another role; their open sessions have it at their next request.

    The last admin cannot be made anything else."""
    with reported_errors():
        _root, _cartridge, store = open_repo(repo)
        row = store.set_role(name, new_role, by=_who(by))
    if as_json:
        print(json.dumps(_json(row)))
        return
    console.print(f"{shown(name)} is now {row['role']}", highlight=False)


@users.command("token")
def token(
    name: NameArgument,
    by: ByOption = None,
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """Make a person a new token and print it, once; the old one stops working at
    once, and the sessions it opened end."""
    with reported_errors():
        _root, _cartridge, store = open_repo(repo)
        row, made = store.new_token(name, by=_who(by))
    _said_with_token(row, made, as_json, f"a new token for {shown(name)}; the old one is void")


@users.command("remove")
def remove(
    name: NameArgument,
    by: ByOption = None,
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """Remove a person: their token and sessions stop working at once.

    Their past actions keep their name; the last admin cannot be removed."""
    with reported_errors():
        _root, _cartridge, store = open_repo(repo)
        row = store.remove_user(name, by=_who(by))
    if as_json:
        print(json.dumps(_json(row)))
        return
    console.print(f"removed {shown(name)} ({row['role']})", highlight=False)


def _who(by: str | None) -> str:
    from phasegate.operations import check_by, login_name

    return login_name() if by is None else check_by(by)


def _said_with_token(row: dict[str, Any], token: str, as_json: bool, what: str) -> None:
    if as_json:
        print(json.dumps({**_json(row), "token": token}))
        return
    err.print(what, highlight=False)
    # Alone on standard output: `$(phasegate users add …)` takes the token and nothing else.
    console.print(token, highlight=False, soft_wrap=True, markup=False)
    err.print(
        "shown once: only its SHA-256 is kept. Log in to `phasegate serve` with it "
        "(the login form, or /login?token=…); a script sends it as "
        "`Authorization: Bearer …`.",
        highlight=False,
    )


def _json(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in row.items()}


def _day(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if value else ""


__all__ = ["users"]
