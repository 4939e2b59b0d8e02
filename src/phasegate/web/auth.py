"""Who may use the dashboard: safe to leave open.

One token opens it: ``PHASEGATE_WEB_TOKEN``, else one made at start and
printed. A person gives it once (``/login?token=…`` or the login form) and
gets a session cookie (HttpOnly, SameSite=Strict); every state-changing
request (POST) must carry the session's CSRF token, in the form field
``csrf`` or the ``X-CSRF-Token`` header, else 403 and nothing is done. The
identity recorded for an action is the name configured for the token
(``PHASEGATE_WEB_USER``, default the OS user), never what a request claims.

A script gives the same token as ``Authorization: Bearer T`` on each request
instead: no session, no cookie, so no CSRF token either. Whoever logs in is a
``Person`` with a ``Role``: viewers see, approvers decide, admins manage people.

Sessions live in the server's memory: a restarted ``serve`` asks for the
token again, which is what a person leaving it open wants.
"""

from __future__ import annotations

import getpass
import hmac
import os
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Literal, TypedDict

from phasegate.core.contract import PhasegateError

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = [
    "CSRF_FIELD",
    "CSRF_HEADER",
    "SESSION_COOKIE",
    "SESSION_COOKIE_FLAGS",
    "TOKEN_VARIABLE",
    "MIN_TOKEN",
    "USER_VARIABLE",
    "Access",
    "Person",
    "Role",
    "Session",
    "WeakToken",
    "person_of",
]

TOKEN_VARIABLE = "PHASEGATE_WEB_TOKEN"
USER_VARIABLE = "PHASEGATE_WEB_USER"
SESSION_COOKIE = "phasegate_session"
CSRF_FIELD = "csrf"
CSRF_HEADER = "X-CSRF-Token"


class _CookieFlags(TypedDict):
    httponly: bool
    samesite: Literal["strict"]
    path: str


#: How the session cookie is set, whoever proved the person (``secure`` is per request).
SESSION_COOKIE_FLAGS: _CookieFlags = {"httponly": True, "samesite": "strict", "path": "/"}


#: The fewest characters a given token may have.
MIN_TOKEN = 16


class WeakToken(PhasegateError):
    """PHASEGATE_WEB_TOKEN is too short to stand for a person."""


class Role(StrEnum):
    """What a person may do, each role all the one before it may: viewers see,
    approvers decide (every action of ``phasegate.operations``), admins also
    manage people."""

    VIEWER = "viewer"
    APPROVER = "approver"
    ADMIN = "admin"

    def allows(self, needed: Role) -> bool:
        """Whether this role may do what ``needed`` may."""
        order = list(Role)
        return order.index(self) >= order.index(needed)


@dataclass(frozen=True)
class Person:
    """Who a request acts as: the name every action records, and the role."""

    name: str
    role: Role


@dataclass(frozen=True)
class Session:
    """A logged-in browser: its cookie value, the CSRF token its forms carry,
    and the person who logged in."""

    id: str
    csrf: str
    person: Person


class Access:
    """The token, the identity it stands for, and the sessions it opened.

    ``token``/``user`` default to ``PHASEGATE_WEB_TOKEN``/``PHASEGATE_WEB_USER``
    from ``environ``; with no token there, a random one (32 URL-safe
    characters) is made, and ``made_token`` is True so ``serve`` prints it.
    Raises WeakToken for a given token under MIN_TOKEN characters (white space
    at its ends not counted): the
    dashboard is a door to every workflow's decisions, and a short token is
    guessed.
    """

    def __init__(
        self,
        token: str | None = None,
        user: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        source = os.environ if environ is None else environ
        given = token or source.get(TOKEN_VARIABLE) or ""
        if given and len(given.strip()) < MIN_TOKEN:  # twenty spaces are no token
            raise WeakToken(
                f"{TOKEN_VARIABLE} has {len(given.strip())} characters, white space at its "
                f"ends not counted; give at least {MIN_TOKEN} "
                "(`python3 -c 'import secrets; print(secrets.token_urlsafe(24))'` makes one), "
                "or leave it unset for serve to make one"
            )
        self.made_token = not given
        self.token = given or secrets.token_urlsafe(24)
        self.user = user or source.get(USER_VARIABLE) or _os_user()
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def bearer(self, token: str) -> Person | None:
        """The person a token stands for (compared in constant time), else None."""
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            return None
        return Person(self.user, Role.ADMIN)

    def login(self, token: str) -> Session | None:
        """A new session for the person ``token`` stands for, else None."""
        person = self.bearer(token)
        return None if person is None else self.open_session(person)

    def open_session(self, person: Person) -> Session:
        """A new session for ``person``, whom something else proved (a token, a sign-on)."""
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), person)
        with self._lock:
            self._sessions[session.id] = session
        return session

    def session(self, cookie: str | None) -> Session | None:
        """The session a cookie value names, else None."""
        if not cookie:
            return None
        with self._lock:
            return self._sessions.get(cookie)

    def logout(self, cookie: str | None) -> None:
        with self._lock:
            self._sessions.pop(cookie or "", None)

    @staticmethod
    def csrf_ok(session: Session, given: str | None) -> bool:
        """Whether ``given`` is the session's CSRF token (constant time)."""
        return bool(given) and hmac.compare_digest(str(given).encode(), session.csrf.encode())


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's uid): still someone
        return f"uid {os.getuid()}"


def person_of(request: Request) -> Person:
    """The person a request acts as, set by the dashboard's guard (bearer or session)."""
    person: Person = request.state.person
    return person
