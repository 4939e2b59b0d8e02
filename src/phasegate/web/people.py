"""The people page: an admin lists, adds, re-roles, re-tokens and removes the
dashboard's people.

Routes (admins only: anyone else 403, nothing done; every POST carries the
session's CSRF token, as every POST of the app does)::

    GET  /people                  the people, their roles, who added them
    POST /people                  form ``name``, ``role``: a new person; the page shows
                                  their token, once
    POST /people/{name}/role      form ``role``: another role (their sessions have it
                                  from their next request)
    POST /people/{name}/token     a new token, shown once; the old one and its sessions end
    POST /people/{name}/remove    removed: their token and sessions end at once

The rules are the store's (``phasegate.store.users``), the same as ``phasegate
users``': a refusal (an unknown role, a taken name, the last admin) is the page
again with its message, 400 (no such person: 404), and nothing changed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.responses import RedirectResponse, Response

from phasegate.store import Store
from phasegate.store.users import UserNotFound, UserRefused
from phasegate.store.values import USER_ROLES
from phasegate.web.auth import Role, person_of

__all__ = ["router"]

#: How the app renders a page: the request, the template, its context, the status.
Render = Callable[[Request, str, Mapping[str, Any], int], Response]


def admins_only(request: Request) -> None:
    """Every route here: a person who is not an admin is refused, 403."""
    person = person_of(request)
    if not person.role.allows(Role.ADMIN):
        raise HTTPException(
            403, f"{person.name} is a {person.role.value}: only an admin manages people"
        )


def router(store: Store, render: Render) -> APIRouter:
    """The people routes on ``store``, pages rendered by the app's ``render``."""
    routes = APIRouter(dependencies=[Depends(admins_only)])

    def listed(
        request: Request, more: Mapping[str, Any] | None = None, code: int = 200
    ) -> Response:
        context = {"people": store.users(), "roles": USER_ROLES, **(more or {})}
        return render(request, "people.html", context, code)

    def changed(
        request: Request, act: Callable[[str], Any], then: Callable[[Any], Response]
    ) -> Response:
        """``act(by)`` with the acting person's name, then ``then`` of what it
        returns; a refusal is the page again, saying why."""
        try:
            done = act(person_of(request).name)
        except UserNotFound as exc:
            return listed(request, {"refused": str(exc)}, 404)
        except UserRefused as exc:
            return listed(request, {"refused": str(exc)}, 400)
        return then(done)

    def token_shown(request: Request, added: bool) -> Callable[[Any], Response]:
        def shown(done: tuple[Mapping[str, Any], str]) -> Response:
            row, token = done
            return listed(request, {"made": {"name": row["name"], "token": token, "added": added}})

        return shown

    def back(_done: Any) -> Response:
        return RedirectResponse("/people", 303)

    @routes.get("/people")
    def people(request: Request) -> Response:
        return listed(request)

    @routes.post("/people")
    def add(
        request: Request,
        name: Annotated[str, Form()] = "",
        role: Annotated[str, Form()] = "viewer",
    ) -> Response:
        return changed(
            request,
            lambda by: store.add_user(name.strip(), role, by=by),
            token_shown(request, added=True),
        )

    @routes.post("/people/{name}/role")
    def set_role(request: Request, name: str, role: Annotated[str, Form()] = "") -> Response:
        return changed(request, lambda by: store.set_role(name, role, by=by), back)

    @routes.post("/people/{name}/token")
    def new_token(request: Request, name: str) -> Response:
        return changed(
            request, lambda by: store.new_token(name, by=by), token_shown(request, added=False)
        )

    @routes.post("/people/{name}/remove")
    def remove(request: Request, name: str) -> Response:
        return changed(request, lambda by: store.remove_user(name, by=by), back)

    return routes
