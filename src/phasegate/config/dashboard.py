"""The cartridge's ``[dashboard]`` table: how ``phasegate serve`` lets people in.

``[dashboard.oidc]`` turns on single sign-on through an OpenID Connect
provider (Keycloak, GitLab, Google, Microsoft Entra, Authentik, Dex, …)
beside the token. The provider says who a person is; ``role_claim`` and the
``[dashboard.oidc.roles]`` map say what they may do. The client's secret is
never in the cartridge: ``client_secret_env`` names the environment variable
that holds it. docs/sign-on.md walks through it.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from phasegate.config.forge import is_loopback

__all__ = ["DashboardSettings", "OidcSettings", "PERSON_ROLES"]

#: What a person may be on the dashboard, as ``phasegate.web.auth.Role`` spells it.
PERSON_ROLES = ("viewer", "approver", "admin")
PersonRole = Literal["viewer", "approver", "admin"]
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class OidcSettings(BaseModel):
    """``[dashboard.oidc]``: sign-on through an OpenID Connect provider. The login
    page offers "Sign in with ``label``"; the provider sends the person back to
    ``/login/oidc/callback``, where the ID token is verified (signature by the
    provider's keys, issuer, audience, nonce) and ``role_claim`` decides the role
    through ``roles``, else ``default_role``, else the person is refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    issuer: str
    """The provider's issuer URL, exactly as its /.well-known/openid-configuration
    says it (e.g. https://sso.example.com/realms/team). https; plain http only to
    this machine (a test provider)."""
    client_id: str = Field(min_length=1)
    """The client (application) registered at the provider for this dashboard."""
    client_secret_env: str | None = None
    """The environment variable holding the client's secret; unset: a public client
    (PKCE only). The secret is never in the cartridge."""
    scopes: list[str] = Field(default_factory=lambda: ["openid", "profile", "email"])
    """The scopes asked for; openid is required. Add the one that carries role_claim
    when the provider needs it (e.g. groups)."""
    role_claim: str = Field(default="groups", min_length=1)
    """The claim whose value (a string, or a list of strings) decides the role; a
    dotted name reaches into an object (Keycloak's realm_access.roles)."""
    roles: dict[str, PersonRole] = Field(default_factory=dict)
    """Each value of role_claim and the role it gives (viewer, approver or admin);
    a person with several values gets the highest role."""
    default_role: PersonRole | None = None
    """The role of a person none of whose values is in roles; unset: such a person
    is refused."""
    name_claim: str = Field(default="preferred_username", min_length=1)
    """The claim whose value every action of the person records (e.g. email)."""
    label: str | None = Field(default=None, min_length=1, max_length=60)
    """The provider's name on the login page's button; unset: the issuer's host."""
    redirect_url: str | None = Field(default=None, pattern=r"^https?://[^\s]+$")
    """The callback's URL as registered at the provider, when people reach serve
    through a proxy (https://phasegate.example.com/login/oidc/callback); unset: the
    address the request came to, with /login/oidc/callback."""

    @field_validator("issuer")
    @classmethod
    def _https_issuer(cls, issuer: str) -> str:
        parts = urlsplit(issuer)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{issuer!r} is not an http(s) URL")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise ValueError(f"{issuer!r}: an issuer has no credentials, query or fragment")
        if parts.scheme != "https" and not is_loopback(parts.hostname):
            raise ValueError(
                f"{issuer!r} is not https: tokens and the client's secret go to the "
                "provider, over plain http only to this machine"
            )
        return issuer

    @field_validator("client_secret_env")
    @classmethod
    def _variable_name(cls, name: str | None) -> str | None:
        if name is not None and not _VARIABLE.match(name):
            raise ValueError(
                f"{name!r} is not a variable name: give the NAME of the environment "
                "variable holding the secret, never the secret"
            )
        return name

    @field_validator("scopes")
    @classmethod
    def _openid_scope(cls, scopes: list[str]) -> list[str]:
        if "openid" not in scopes:
            raise ValueError("openid must be one of them: without it there is no ID token")
        if any(not s or any(c.isspace() for c in s) for s in scopes):
            raise ValueError("a scope is one word, without spaces")
        return scopes

    @model_validator(mode="after")
    def _someone_gets_in(self) -> OidcSettings:
        if not self.roles and self.default_role is None:
            raise ValueError(
                "dashboard.oidc.roles: no value of the role claim gives a role and "
                "default_role is unset, so everyone would be refused; map a value "
                '(e.g. "phasegate-admins" = "admin") or set default_role'
            )
        return self

    @property
    def shown_label(self) -> str:
        """What the login page's button names: ``label``, else the issuer's host."""
        return self.label or urlsplit(self.issuer).hostname or self.issuer


class DashboardSettings(BaseModel):
    """``[dashboard]``: ``phasegate serve``'s settings. Unset, the dashboard takes
    the token alone."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    oidc: OidcSettings | None = None
    """Single sign-on through an OpenID Connect provider (docs/sign-on.md)."""
