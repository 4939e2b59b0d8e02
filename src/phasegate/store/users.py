"""People of the dashboard: their names, roles and hashed tokens, and the rules on them.

A person's token is ``TOKEN_PREFIX`` and 43 URL-safe characters (256 random
bits), returned once when it is made and stored only as its SHA-256: a
stolen store opens nothing. A 256-bit random token needs no slow hash, as a
password would; it is looked up by its digest and compared in constant time.

The rules live here, in the transaction that applies them, so the command
line and the dashboard refuse alike: a name is taken once (among people not
removed), a role is one of ``USER_ROLES``, and the last admin is neither
removed nor made anything else. A removed person's row stays, without a
token, so who added and removed whom stays readable; adding the name again
makes that row a person again.

Errors::

    PhasegateError
     └── UserRefused       an unknown role, a taken or unfit name, the last admin
          └── UserNotFound no person of that name (or removed)
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

import sqlalchemy as sa

from phasegate.core.contract import PhasegateError
from phasegate.core.inputs import MAX_NAME_CHARS
from phasegate.store import tables as t
from phasegate.store._base import StoreBase, utc_row
from phasegate.store.values import USER_ROLES

__all__ = [
    "MAX_NAME",
    "TOKEN_PREFIX",
    "UserNotFound",
    "UserRefused",
    "UserRows",
    "check_role",
    "token_digest",
]

#: What every person's token starts with: a secret scanner, or a person reading a
#: script, tells it from other tokens.
TOKEN_PREFIX = "pgu_"

#: The longest name, in characters (``users.name``): the one ``--by`` is held to too.
MAX_NAME = MAX_NAME_CHARS

_c = t.users.c
_ROLE_CHOICE = f"{', '.join(USER_ROLES[:-1])} or {USER_ROLES[-1]}"
_ACTIVE = _c.removed_at.is_(None)
#: What a person's row shows; never the token's digest.
_SHOWN = [
    _c.name, _c.role, _c.added_by, _c.added_at, _c.changed_by, _c.changed_at,
    _c.removed_by, _c.removed_at,
]  # fmt: skip


class UserRefused(PhasegateError):
    """A change to the people refused by its rules; the message names the value."""


class UserNotFound(UserRefused):
    """No person of that name, or one removed."""


def check_role(role: str) -> str:
    """``role`` when it is one of ``USER_ROLES``; raises UserRefused naming it."""
    if role not in USER_ROLES:
        raise UserRefused(f"there is no role {role!r}: give {_ROLE_CHOICE}")
    return role


def token_digest(token: str) -> str:
    """The SHA-256 (hex) a token is stored and looked up as."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _new_token() -> tuple[str, str]:
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return token, token_digest(token)


def _check_name(name: str) -> str:
    if not name or name != name.strip():
        raise UserRefused(f"the name {name!r} is empty or has white space at its ends")
    if len(name) > MAX_NAME:
        raise UserRefused(f"the name {name!r} has {len(name)} characters; at most {MAX_NAME}")
    if not name.isprintable() or "/" in name:
        raise UserRefused(f"the name {name!r} holds a slash or a control character")
    return name


class UserRows(StoreBase):
    """The people table: add, list, change a role, a new token, remove, look up a token."""

    def add_user(self, name: str, role: str, *, by: str) -> tuple[dict[str, Any], str]:
        """Add a person named ``name`` with ``role``, recorded as added by ``by``;
        the row (``users``) and the token, which is never shown again. A removed
        person's name may be taken again. Raises UserRefused (an unknown role, a
        name in use or unfit) and StoreUnavailable."""
        _check_name(name)
        check_role(role)
        token, digest = _new_token()
        now = self.clock.now()
        fresh = {"role": role, "token_hash": digest, "added_by": by, "added_at": now}
        cleared = {"changed_by": None, "changed_at": None, "removed_by": None, "removed_at": None}
        with self.transaction() as conn:
            self.dialect.serialize(conn, "phasegate:users")
            found = conn.execute(sa.select(_c.removed_at).where(_c.name == name)).first()
            if found is None:
                conn.execute(t.users.insert().values(name=name, **fresh))
            elif found.removed_at is None:
                raise UserRefused(f"there is already a person named {name!r}")
            else:
                conn.execute(t.users.update().where(_c.name == name).values(**fresh, **cleared))
            row = self._shown(conn, name)
        return row, token

    def users(self, *, removed: bool = False) -> list[dict[str, Any]]:
        """Every person, by name (``removed``: the removed ones too); no token's digest."""
        query = sa.select(*_SHOWN).order_by(_c.name)
        if not removed:
            query = query.where(_ACTIVE)
        with self.reading() as conn:
            return [utc_row(r) for r in conn.execute(query).mappings()]

    def user(self, name: str) -> dict[str, Any]:
        """The person named ``name``. Raises UserNotFound (none, or removed)."""
        with self.reading() as conn:
            return self._shown(conn, name)

    def has_users(self) -> bool:
        """Whether anyone (not removed) is a person of the dashboard."""
        with self.reading() as conn:
            return conn.execute(sa.select(_c.id).where(_ACTIVE).limit(1)).first() is not None

    def set_role(self, name: str, role: str, *, by: str) -> dict[str, Any]:
        """Give the person named ``name`` ``role``; their row. Raises UserNotFound,
        UserRefused (an unknown role, the last admin made something else)."""
        check_role(role)
        with self.transaction() as conn:
            self.dialect.serialize(conn, "phasegate:users")
            before = self._shown(conn, name)
            if before["role"] == "admin" and role != "admin":
                self._not_the_last_admin(conn, name, f"made {role}")
            changed = {"role": role, "changed_by": by, "changed_at": self.clock.now()}
            conn.execute(t.users.update().where(_c.name == name).values(**changed))
            return self._shown(conn, name)

    def new_token(self, name: str, *, by: str) -> tuple[dict[str, Any], str]:
        """A new token for the person named ``name``; the old one opens nothing
        from now on. Their row and the token. Raises UserNotFound."""
        token, digest = _new_token()
        with self.transaction() as conn:
            self._shown(conn, name)
            changed = {"token_hash": digest, "changed_by": by, "changed_at": self.clock.now()}
            conn.execute(t.users.update().where(_c.name == name).values(**changed))
            return self._shown(conn, name), token

    def remove_user(self, name: str, *, by: str) -> dict[str, Any]:
        """Remove the person named ``name``: their token opens nothing from now on;
        the row stays, marked removed. Raises UserNotFound, UserRefused (the last
        admin)."""
        with self.transaction() as conn:
            self.dialect.serialize(conn, "phasegate:users")
            if self._shown(conn, name)["role"] == "admin":
                self._not_the_last_admin(conn, name, "removed")
            removed = {"token_hash": None, "removed_by": by, "removed_at": self.clock.now()}
            conn.execute(t.users.update().where(_c.name == name).values(**removed))
            row = conn.execute(sa.select(*_SHOWN).where(_c.name == name)).mappings().one()
        return utc_row(row)

    def user_for_token(self, token: str) -> dict[str, Any] | None:
        """The person (not removed) whose token ``token`` is, else None."""
        return self.user_for_digest(token_digest(token))

    def user_for_digest(self, digest: str) -> dict[str, Any] | None:
        """The person (not removed) whose token has SHA-256 ``digest`` (hex), else
        None: what a session opened with a token looks up on each request, so a
        removed person's or a replaced token's session ends at once."""
        query = sa.select(_c.token_hash, *_SHOWN).where(_c.token_hash == digest, _ACTIVE)
        with self.reading() as conn:
            found = conn.execute(query).mappings().first()
        # The index found it; the comparison that lets it in takes constant time.
        if found is None or not hmac.compare_digest(found["token_hash"], digest):
            return None
        return utc_row({k: v for k, v in found.items() if k != "token_hash"})

    def _shown(self, conn: sa.Connection, name: str) -> dict[str, Any]:
        found = conn.execute(sa.select(*_SHOWN).where(_c.name == name, _ACTIVE)).mappings()
        row = found.first()
        if row is None:
            raise UserNotFound(f"there is no person named {name!r} (`phasegate users list`)")
        return utc_row(row)

    def _not_the_last_admin(self, conn: sa.Connection, name: str, what: str) -> None:
        admins = conn.execute(
            sa.select(sa.func.count()).where(_c.role == "admin", _ACTIVE, _c.name != name)
        ).scalar()
        if not admins:
            raise UserRefused(
                f"{name!r} is the last admin and cannot be {what}: "
                "make another person admin first (`phasegate users role NAME admin`)"
            )
