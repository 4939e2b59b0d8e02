"""Who may use the dashboard: safe to leave open.

A person logs in with a token: their personal one (``phasegate users add``,
kept in the store as its SHA-256, with their role), or ``PHASEGATE_WEB_TOKEN``,
which stands for ``PHASEGATE_WEB_USER`` (default the OS user) as an admin.
With neither (no token in the environment, nobody in the store) one is made
at start and printed. A person gives it once (``/login?token=…`` or the login
form) and gets a session cookie (HttpOnly, SameSite=Strict); every
state-changing request (POST) must carry the session's CSRF token, in the
form field ``csrf`` or the ``X-CSRF-Token`` header, else 403 and nothing is
done. The identity recorded for an action is the token's person, never what
a request claims.

A script gives the same token as ``Authorization: Bearer T`` on each request
instead: no session, no cookie, so no CSRF token either. Whoever logs in is a
``Person`` with a ``Role``: viewers see, approvers decide, admins manage people.
A session opened with a personal token looks its person up on each request:
removed, or given a new token, it ends at once; given another role, it has
that role from the next request on.

Sessions live in the server's memory: a restarted ``serve`` asks for the
token again, which is what a person leaving it open wants.
"""

from __future__ import annotations

import getpass
import hmac
import os
import secrets
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from phasegate.core.contract import PhasegateError
from phasegate.store.users import TOKEN_PREFIX, token_digest

if TYPE_CHECKING:
    from starlette.requests import Request

    from phasegate.store import Store

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
    "stream_ended",
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
    and the person who logged in. ``proof``: the SHA-256 of the personal token
    it was opened with (looked up again on each request), else None."""

    id: str
    csrf: str
    person: Person
    proof: str | None = None


class Access:
    """The tokens, the identities they stand for, and the sessions they opened.

    ``token``/``user`` default to ``PHASEGATE_WEB_TOKEN``/``PHASEGATE_WEB_USER``
    from ``environ``; the token stands for that user as an admin. ``store``: the
    people (``phasegate users``) whose personal tokens open it too, each with
    their role. With no token given and nobody in ``store``, a random one (32
    URL-safe characters) is made, and ``made_token`` is True so ``serve`` prints
    it; with people in the store and no token given, ``token`` is None.
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
        store: Store | None = None,
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
        self.store = store
        self.made_token = not given and not (store is not None and store.has_users())
        self.token: str | None = given or (secrets.token_urlsafe(24) if self.made_token else None)
        self.user = user or source.get(USER_VARIABLE) or _os_user()
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def bearer(self, token: str) -> Person | None:
        """The person a token stands for (compared in constant time), else None."""
        proved = self._proved(token)
        return None if proved is None else proved[0]

    def login(self, token: str) -> Session | None:
        """A new session for the person ``token`` stands for, else None."""
        proved = self._proved(token)
        if proved is None:
            return None
        person, proof = proved
        return self.open_session(person, proof=proof)

    def _proved(self, token: str) -> tuple[Person, str | None] | None:
        """The person ``token`` stands for and, for a personal token, its digest."""
        if self.token and hmac.compare_digest(token.encode(), self.token.encode()):
            return Person(self.user, Role.ADMIN), None
        if self.store is None or not token.startswith(TOKEN_PREFIX):
            return None
        digest = token_digest(token)
        row = self.store.user_for_digest(digest)
        return None if row is None else (_person(row), digest)

    def open_session(self, person: Person, *, proof: str | None = None) -> Session:
        """A new session for ``person``, whom something else proved (a token, a
        sign-on); ``proof``: the digest of the personal token that did (``Session``)."""
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), person, proof)
        with self._lock:
            self._sessions[session.id] = session
        return session

    def session(self, cookie: str | None) -> Session | None:
        """The session a cookie value names, else None. One opened with a personal
        token has its person as the store has them now: none when removed or
        given a new token (the session ends), their role as it is now."""
        if not cookie:
            return None
        with self._lock:
            found = self._sessions.get(cookie)
        if found is None or found.proof is None or self.store is None:
            return found
        row = self.store.user_for_digest(found.proof)
        with self._lock:
            if row is None:
                self._sessions.pop(cookie, None)
                return None
            if _person(row) != found.person:
                found = replace(found, person=_person(row))
                self._sessions[cookie] = found
        return found

    def logout(self, cookie: str | None) -> None:
        with self._lock:
            self._sessions.pop(cookie or "", None)

    @staticmethod
    def csrf_ok(session: Session, given: str | None) -> bool:
        """Whether ``given`` is the session's CSRF token (constant time)."""
        return bool(given) and hmac.compare_digest(str(given).encode(), session.csrf.encode())


def person_of(request: Request) -> Person:
    """The person a request acts as, set by the app's guard (bearer or session)."""
    person: Person = request.state.person
    return person


def stream_ended(access: Access, request: Request) -> Callable[[], Awaitable[bool]]:
    """What a live stream asks between its waits: whether its client went, or the
    person it was opened for no longer gets in (removed, or given a new token),
    so their open page stops hearing at once too."""
    from starlette.concurrency import run_in_threadpool

    async def ended() -> bool:
        if await request.is_disconnected():
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            return await run_in_threadpool(access.bearer, token.strip()) is None
        cookie = request.cookies.get(SESSION_COOKIE)
        return await run_in_threadpool(access.session, cookie) is None

    return ended


def _person(row: Mapping[str, Any]) -> Person:
    return Person(str(row["name"]), Role(row["role"]))


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's uid): still someone
        return f"uid {os.getuid()}"
