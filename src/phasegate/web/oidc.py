"""Single sign-on through OpenID Connect: the provider's round trip that opens a session.

``[dashboard.oidc]`` (``phasegate.config.dashboard``) turns it on; the routes are open
(the guard lets them through) since whoever comes here has no session yet:

    GET /login/oidc           to the provider's authorization endpoint: the authorization
                              code flow with ``state``, ``nonce`` and PKCE (S256); a cookie
                              (HttpOnly, SameSite=Lax, 10 minutes) binds the state to this
                              browser, so a stranger's callback link opens nothing here
    GET /login/oidc/callback  the code exchanged for tokens (with the client's secret), the
                              ID token verified (the signature against the provider's JWKS,
                              the issuer, the audience, the nonce, the times), the person's
                              role read from ``role_claim``; then a session, as ``/login``
                              opens one for the token

A sign-on that fails (a state this browser did not start, the provider down or
saying no, a token that does not verify, a claim that maps to no role) opens no
session: a page says why, and a person may start again from the login page.

Authlib speaks OAuth 2 (``OAuth2Session``: the authorization URL with PKCE, the token
request) and checks the ID token's claims (``CodeIDToken``); joserfc, Authlib's JOSE
library, checks its signature. docs/sign-on.md says how to set a provider up.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import requests
from authlib.common.errors import AuthlibBaseError
from authlib.integrations.requests_client import OAuth2Session
from authlib.oidc.core import CodeIDToken
from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from joserfc import jwt
from joserfc.errors import ClaimError, InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet, KeySetSerialization

from phasegate.config.cartridge import Cartridge, CartridgeError
from phasegate.config.dashboard import OidcSettings
from phasegate.core.contract import PhasegateError
from phasegate.core.inputs import ActionRefused, check_by
from phasegate.web.auth import SESSION_COOKIE, SESSION_COOKIE_FLAGS, Access, Person, Role

__all__ = [
    "CALLBACK_PATH",
    "PATHS",
    "START_PATH",
    "SignOn",
    "SignOnFailed",
    "configured",
    "person_from_claims",
    "router",
    "verify_id_token",
]

log = logging.getLogger(__name__)

START_PATH = "/login/oidc"
CALLBACK_PATH = "/login/oidc/callback"
#: The paths a person without a session may reach.
PATHS = frozenset({START_PATH, CALLBACK_PATH})
#: The cookie that carries the state from the start to the callback.
STATE_COOKIE = "phasegate_sign_on"
#: Seconds a person has to come back from the provider.
PENDING_S = 600
#: Sign-ons under way kept at most: the start is open to anyone, so it is bounded.
MAX_PENDING = 1000
#: Seconds of clock difference with the provider that ``exp`` and ``iat`` allow.
LEEWAY_S = 60
#: Seconds the provider's metadata and keys are kept before they are read again.
METADATA_S = 3600
#: What a request to the provider may raise: no answer, an error status, OAuth's
#: error answer, a body that is no JSON.
_PROVIDER_ERRORS = (requests.RequestException, AuthlibBaseError, ValueError)


class SignOnFailed(PhasegateError):
    """A sign-on that opens no session; the message is the person's to read, and
    ``status`` the page's HTTP status (400 a request not started here, 403 a person
    refused, 502 a provider that failed)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class _Pending:
    nonce: str
    verifier: str
    redirect_uri: str
    started: float


class SignOn:
    """The provider of ``settings``, its client, and the sign-ons under way.

    The client's secret is read from the environment (``environ``, default
    ``os.environ``) now: raises CartridgeError naming
    ``dashboard.oidc.client_secret_env`` when the variable is unset or empty. The
    provider is first asked (its discovery document) at the first sign-on, so a
    provider that is down does not keep ``serve`` from starting. ``timeout_s``:
    seconds for each request to the provider.
    """

    def __init__(
        self,
        settings: OidcSettings,
        environ: Mapping[str, str] | None = None,
        *,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        source = os.environ if environ is None else environ
        self.settings = settings
        self.secret: str | None = None
        if settings.client_secret_env is not None:
            self.secret = source.get(settings.client_secret_env) or None
            if self.secret is None:
                raise CartridgeError(
                    f"dashboard.oidc.client_secret_env: the environment variable "
                    f"{settings.client_secret_env} is unset or empty; set it to the "
                    "client's secret the provider gave"
                )
        self.timeout_s = timeout_s
        self._clock = clock
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self._lock = threading.Lock()
        self._metadata: dict[str, Any] | None = None
        self._metadata_at = 0.0
        self._keys: KeySetSerialization | None = None

    @property
    def label(self) -> str:
        return self.settings.shown_label

    # -- the round trip ----------------------------------------------------------

    def start(self, redirect_uri: str) -> tuple[str, str]:
        """The provider's authorization URL for a new sign-on coming back to
        ``redirect_uri``, and its state. Raises SignOnFailed (502) when the provider's
        metadata cannot be read."""
        authorize = self._metadata_value("authorization_endpoint")
        state, nonce, verifier = (secrets.token_urlsafe(32) for _ in range(3))
        with self._client(redirect_uri) as client:
            url, _ = client.create_authorization_url(
                authorize, state=state, nonce=nonce, code_verifier=verifier
            )
        with self._lock:
            self._forget_stale()
            self._pending[state] = _Pending(nonce, verifier, redirect_uri, self._clock())
            while len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)
        return url, state

    def finish(self, params: Mapping[str, str], browser_state: str | None) -> Person:
        """The person the provider's answer (the callback's query ``params``) proves,
        for the browser whose state cookie is ``browser_state``. Each state is used
        once. Raises SignOnFailed."""
        state = params.get("state", "")
        # The browser's cookie first: a link followed elsewhere spends no one's sign-on.
        ours = bool(state) and secrets.compare_digest(
            state.encode(), (browser_state or "").encode()
        )
        with self._lock:
            self._forget_stale()
            pending = self._pending.pop(state, None) if ours else None
        if pending is None:
            raise SignOnFailed(
                "This sign-on was not started in this browser, took longer than "
                f"{PENDING_S // 60} minutes, or was used already. Start again from the "
                "login page."
            )
        if "error" in params:
            said = params.get("error_description") or params["error"]
            raise SignOnFailed(f"{self.label} did not sign you in: {said}.", 403)
        code = params.get("code")
        if not code:
            raise SignOnFailed(f"{self.label} sent you back without a code.")
        token = self._exchange(code, pending)
        claims = self._verified(token, pending.nonce)
        return person_from_claims(self.settings, self._with_userinfo(claims, token))

    def _exchange(self, code: str, pending: _Pending) -> dict[str, Any]:
        endpoint = self._metadata_value("token_endpoint")
        try:
            with self._client(pending.redirect_uri, for_token=True) as client:
                token = client.fetch_token(
                    endpoint,
                    grant_type="authorization_code",
                    code=code,
                    code_verifier=pending.verifier,
                )
        except _PROVIDER_ERRORS as exc:
            raise SignOnFailed(
                f"{self.label} did not exchange the code for a token: {_said(exc)}", 502
            ) from None
        if not isinstance(token, Mapping) or not token.get("id_token"):
            raise SignOnFailed(f"{self.label} answered the code without an ID token.", 502)
        return dict(token)

    def _verified(self, token: Mapping[str, Any], nonce: str) -> dict[str, Any]:
        algorithms = [
            a
            for a in self._metadata_value("id_token_signing_alg_values_supported", ["RS256"])
            if a != "none"
        ]

        def verified_with(keys: KeySetSerialization) -> dict[str, Any]:
            return verify_id_token(
                token["id_token"],
                KeySet.import_key_set(keys),
                issuer=self.settings.issuer,
                client_id=self.settings.client_id,
                nonce=nonce,
                algorithms=algorithms,
                access_token=token.get("access_token"),
            )

        try:
            return verified_with(self._jwks(fresh=False))
        except SignOnFailed as exc:
            if not isinstance(exc.__cause__, InvalidKeyIdError):
                raise
        # A key id the kept keys lack: the provider has rotated its keys.
        return verified_with(self._jwks(fresh=True))

    def _with_userinfo(self, claims: dict[str, Any], token: Mapping[str, Any]) -> dict[str, Any]:
        """The ID token's claims, with the userinfo endpoint's for the role and name
        claims when the ID token lacks them (many providers put only ``sub`` in it)."""
        wanted = (self.settings.role_claim, self.settings.name_claim)
        endpoint = self._metadata_value("userinfo_endpoint", "")
        if all(_claim(claims, name) is not None for name in wanted) or not endpoint:
            return claims
        try:
            with self._client(None) as client:
                client.token = dict(token)
                answer = client.get(endpoint)
                answer.raise_for_status()
                info = answer.json()
        except _PROVIDER_ERRORS as exc:
            raise SignOnFailed(
                f"{self.label}'s userinfo could not be read: {_said(exc)}", 502
            ) from None
        if not isinstance(info, dict) or info.get("sub") != claims.get("sub"):
            # OpenID Connect Core 5.3.2: another subject's answer must not be used.
            raise SignOnFailed(f"{self.label}'s userinfo is not the signed-in person's.", 502)
        return {**info, **claims}

    def _forget_stale(self) -> None:
        oldest = self._clock() - PENDING_S
        for state in [s for s, p in self._pending.items() if p.started < oldest]:
            del self._pending[state]

    # -- the provider --------------------------------------------------------------

    def _client(self, redirect_uri: str | None, *, for_token: bool = False) -> Any:
        """Authlib's client; ``for_token``: authenticated as the provider allows
        (HTTP Basic, the default of OpenID Connect Discovery, else form fields)."""
        method = "client_secret_basic"
        if self.secret is None:
            method = "none"
        elif for_token:
            supported = self._metadata_value(
                "token_endpoint_auth_methods_supported", ["client_secret_basic"]
            )
            if method not in supported:
                method = "client_secret_post"
        return OAuth2Session(
            client_id=self.settings.client_id,
            client_secret=self.secret,
            token_endpoint_auth_method=method,
            scope=" ".join(self.settings.scopes),
            redirect_uri=redirect_uri,
            code_challenge_method="S256",
            default_timeout=self.timeout_s,
        )

    def _metadata_value(self, key: str, default: Any = None) -> Any:
        """``key`` of the provider's discovery document, read once an hour. Raises
        SignOnFailed (502) when it cannot be read, names another issuer, or lacks
        ``key`` and no ``default`` is given."""
        metadata = self._metadata_now()
        value = metadata.get(key, default)
        if value is None:
            raise SignOnFailed(f"{self.label}'s configuration has no {key}.", 502)
        return value

    def _metadata_now(self) -> dict[str, Any]:
        with self._lock:
            if self._metadata is not None and self._clock() - self._metadata_at < METADATA_S:
                return self._metadata
        url = self.settings.issuer.rstrip("/") + "/.well-known/openid-configuration"
        metadata = self._get_json(url, "configuration")
        if metadata.get("issuer") != self.settings.issuer:
            # OpenID Connect Discovery 4.3: the issuer must be the one configured.
            raise SignOnFailed(
                f"{url} names the issuer {metadata.get('issuer')!r}, not "
                f"{self.settings.issuer!r} (dashboard.oidc.issuer): give the issuer exactly "
                "as the provider names itself.",
                502,
            )
        with self._lock:
            self._metadata, self._metadata_at, self._keys = metadata, self._clock(), None
        return metadata

    def _jwks(self, fresh: bool) -> KeySetSerialization:
        """The provider's keys (its JWKS); ``fresh``: read again, not the ones kept."""
        with self._lock:
            if self._keys is not None and not fresh:
                return self._keys
        found = self._get_json(self._metadata_value("jwks_uri"), "keys")
        if not isinstance(found.get("keys"), list):
            raise SignOnFailed(f"{self.label}'s keys are not a JWK set.", 502)
        keys = cast(KeySetSerialization, found)
        with self._lock:
            self._keys = keys
        return keys

    def _get_json(self, url: str, what: str) -> dict[str, Any]:
        with self._client(None) as client:
            try:
                answer = client.get(url, withhold_token=True)
                answer.raise_for_status()
                found = answer.json()
            except _PROVIDER_ERRORS as exc:
                log.warning("sign-on: %s: %s", url, exc)
                raise SignOnFailed(
                    f"{self.label} could not be reached for its {what} ({url}): {_said(exc)}",
                    502,
                ) from None
        if not isinstance(found, dict):
            raise SignOnFailed(f"{self.label}'s {what} at {url} is not a JSON object.", 502)
        return found


def configured(cartridge: Cartridge) -> SignOn | None:
    """The sign-on ``[dashboard.oidc]`` sets up, else None. Raises CartridgeError
    (``SignOn``: the client's secret unset)."""
    settings = cartridge.dashboard.oidc
    return None if settings is None else SignOn(settings)


def verify_id_token(
    id_token: str,
    keys: Any,
    *,
    issuer: str,
    client_id: str,
    nonce: str,
    algorithms: list[str],
    access_token: str | None = None,
    now: int | None = None,
) -> dict[str, Any]:
    """The claims of ``id_token`` once verified (OpenID Connect Core 3.1.3.7): signed by
    one of ``keys`` (a joserfc KeySet) with one of ``algorithms``, issued by ``issuer``
    for ``client_id`` (``azp`` too when present), carrying ``nonce``, within its times
    (``now``, seconds since the epoch; default the clock's, with LEEWAY_S either way),
    and ``at_hash`` matching ``access_token`` when both are there. Raises SignOnFailed
    (403) naming what failed; its ``__cause__`` is joserfc's error."""
    try:
        decoded = jwt.decode(id_token, keys, algorithms=algorithms)
    except JoseError as exc:
        raise SignOnFailed(
            f"The ID token's signature does not verify ({_said(exc)}).", 403
        ) from exc
    except ValueError as exc:  # not a JWT at all
        raise SignOnFailed(f"The ID token is not a signed JWT ({_said(exc)}).", 403) from exc
    claims = CodeIDToken(
        decoded.claims,
        decoded.header,
        {
            "iss": {"essential": True, "values": [issuer]},
            "aud": {"essential": True, "values": [client_id]},
        },
        {"nonce": nonce, "client_id": client_id, "access_token": access_token},
    )
    try:
        claims.validate(now=now, leeway=LEEWAY_S)
    except ClaimError as exc:
        raise SignOnFailed(f"The ID token is refused: {_said(exc)}.", 403) from exc
    return dict(claims)


def person_from_claims(settings: OidcSettings, claims: Mapping[str, Any]) -> Person:
    """The person ``claims`` describe: named by ``name_claim``, with the highest role
    a value of ``role_claim`` maps to, else ``default_role``. Raises SignOnFailed
    (403) when no role applies, or the name claim is missing or not a name
    ``core.inputs.check_by`` admits (an action would record it)."""
    name = _claim(claims, settings.name_claim)
    if not isinstance(name, str) or not name.strip():
        raise SignOnFailed(
            f"The provider gave no {settings.name_claim} claim, which names the person "
            "on the dashboard: ask for the scope that carries it, or set "
            "dashboard.oidc.name_claim to a claim it gives (email, sub).",
            403,
        )
    try:
        check_by(name.strip())
    except ActionRefused as exc:  # every action records the name: it must be one
        raise SignOnFailed(
            f"The {settings.name_claim} claim cannot name a person here ({exc}): set "
            "dashboard.oidc.name_claim to a shorter claim (preferred_username, sub).",
            403,
        ) from None
    found = _claim(claims, settings.role_claim)
    values = [found] if isinstance(found, str) else found if isinstance(found, list) else []
    order = list(Role)
    roles = [Role(settings.roles[v]) for v in values if isinstance(v, str) and v in settings.roles]
    if roles:
        return Person(name.strip(), max(roles, key=order.index))
    if settings.default_role is not None:
        return Person(name.strip(), Role(settings.default_role))
    shown = ", ".join(str(v) for v in values) or "none"
    raise SignOnFailed(
        f"{name.strip()} is signed in at the provider, but no value of the "
        f"{settings.role_claim} claim ({shown}) gives a role on this dashboard. "
        "Ask an admin to map one in [dashboard.oidc.roles].",
        403,
    )


def _claim(claims: Mapping[str, Any], name: str) -> Any:
    """``claims[name]``; else, for a dotted name, the path through nested objects."""
    if name in claims:
        return claims[name]
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _said(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "…"


def router(sign_on: SignOn, templates: Jinja2Templates, access: Access) -> APIRouter:
    """``/login/oidc`` and its callback, which opens a session in ``access`` and sets
    its cookie as ``/login`` does."""
    routes = APIRouter()

    def callback_url(request: Request) -> str:
        return sign_on.settings.redirect_url or str(request.base_url).rstrip("/") + CALLBACK_PATH

    def failed(request: Request, exc: SignOnFailed) -> Response:
        context = {"message": str(exc), "label": sign_on.label}
        # The state cookie stays: a tampered link must not end a sign-on under way.
        return templates.TemplateResponse(request, "sign_on_failed.html", context, exc.status)

    @routes.get(START_PATH)
    def start(request: Request) -> Response:
        try:
            url, state = sign_on.start(callback_url(request))
        except SignOnFailed as exc:
            return failed(request, exc)
        response = RedirectResponse(url, 303)
        # Lax, not Strict: the provider sends the person back here from its own site.
        response.set_cookie(
            STATE_COOKIE,
            state,
            max_age=PENDING_S,
            httponly=True,
            samesite="lax",
            secure=request.url.scheme == "https",
            path=START_PATH,
        )
        return response

    @routes.get(CALLBACK_PATH)
    def callback(request: Request) -> Response:
        try:
            person = sign_on.finish(dict(request.query_params), request.cookies.get(STATE_COOKIE))
        except SignOnFailed as exc:
            log.info("sign-on refused: %s", exc)
            return failed(request, exc)
        # A page that moves on by itself, not a redirect: this request came from the
        # provider's site, and a browser keeps the SameSite=Strict session cookie out of
        # the redirect's next request; from this page, the board is same-site.
        response = templates.TemplateResponse(
            request, "signed_on.html", {"name": person.name, "role": person.role.value}
        )
        session = access.open_session(person)
        secure = request.url.scheme == "https"
        response.set_cookie(SESSION_COOKIE, session.id, secure=secure, **SESSION_COOKIE_FLAGS)
        response.delete_cookie(STATE_COOKIE, path=START_PATH)
        return response

    return routes
