"""Who phasegate is on GitHub, and which repository.

    repository_from_origin(repo, base_url)  # "owner/name" from the origin remote's URL
    forge_auth(settings, repo, repository)   # a token from forge.token_env, or a GitHub App

A token comes from the environment variable ``forge.token_env`` names (default
``GITHUB_TOKEN``), never from the cartridge. A GitHub App signs a JWT with its
private key (``forge.private_key_file``, relative to the repository) and
trades it for an installation token (``POST /app/installations/{id}/access_tokens``,
through githubkit's ``AppInstallationAuthStrategy``); with no
``forge.installation_id`` the installation is the repository's
(``GET /repos/{owner}/{repo}/installation``). git gets an installation token of
its own, minted when it first pushes and renewed five minutes before it expires.

Every token value is withheld from phasegate's other git processes
(``phasegate.git.command.withhold_from_git``) and redacted by the forge.
"""

from __future__ import annotations

import functools
import os
import re
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import httpx
from githubkit import AppAuthStrategy, AppInstallationAuthStrategy, GitHub, TokenAuthStrategy
from githubkit.auth.base import BaseAuthStrategy
from githubkit.cache import MemCacheStrategy
from githubkit.exception import GitHubException

from phasegate.config.forge import ForgeSettings
from phasegate.forge.base import ForgeAuthError, ForgeError
from phasegate.forge.github.etag import ConditionalTransport
from phasegate.forge.github.faults import RetryPolicy, translate
from phasegate.git.command import run_git, withhold_from_git

__all__ = [
    "API_VERSION",
    "ForgeAuth",
    "forge_auth",
    "github_client",
    "repository_from_origin",
]

#: The GitHub REST API version phasegate speaks (githubkit's ``gh.rest(API_VERSION)``):
#: the one GitHub Enterprise Server speaks and GitHub's OpenAPI description describes.
API_VERSION: Final = "2022-11-28"
#: How long before its expiry an installation token is renewed.
RENEW_BEFORE = timedelta(minutes=5)

_REPOSITORY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$")
# https://HOST/owner/name(.git), ssh://git@HOST/owner/name.git, git@HOST:owner/name.git
_REMOTE = re.compile(
    r"[:/](?P<owner>[A-Za-z0-9][A-Za-z0-9-]{0,38})/(?P<name>[A-Za-z0-9._-]+?)(?:\.git)?/?$"
)
_URL = re.compile(r"^(?:[a-z+]+://|[\w.-]+@[\w.-]+:)")


def repository_from_origin(repo: Path, base_url: str | None = None) -> str:
    """``owner/name`` of the ``origin`` remote of ``repo`` (an https, ssh or scp-like
    URL; a local path names none), on the host ``base_url`` (the API root;
    None: github.com) speaks for, so the token is never sent to another host.
    Raises ForgeError naming forge.repository when there is no origin or its URL
    names no GitHub repository, and naming origin's host and forge.base_url when
    origin is on another host than the API's."""
    proc = run_git(["remote", "get-url", "origin"], repo)
    if proc.returncode != 0:
        raise ForgeError(
            f"forge.repository is not set and {repo} has no origin remote: "
            'set forge.repository = "owner/name"'
        )
    url = proc.stdout.strip()
    # A URL, not a path: /srv/git/a/b.git names no owner on a forge.
    found = _REMOTE.search(url) if _URL.match(url) else None
    repository = f"{found['owner']}/{found['name']}" if found else ""
    if not _REPOSITORY.match(repository):
        # the URL itself is not shown: it may hold credentials
        raise ForgeError(
            f"forge.repository is not set and the origin remote of {repo} names no "
            'owner/name: set forge.repository = "owner/name"'
        )
    host = _host_of(url)
    api_host = _host_of(base_url) if base_url else "github.com"
    if host != api_host:
        where = f"forge.base_url ({base_url})" if base_url else "GitHub (github.com)"
        raise ForgeError(
            f"the origin remote of {repo} is on {host}, not on {where}: for GitHub "
            f'Enterprise set forge.base_url = "https://{host}/api/v3"; for another '
            'forge or repository set forge.repository = "owner/name" (and forge.base_url)'
        )
    return repository


def _host_of(url: str) -> str:
    """The host name of a URL, ``ssh://`` or scp-like ``user@host:path``, lower case,
    without port; GitHub's API host ``api.github.com`` is github.com's."""
    scp_like = url.split("@", 1)[-1].split(":", 1)[0]
    host = (urlsplit(url).hostname or "" if "://" in url else scp_like).lower()
    return "github.com" if host == "api.github.com" else host


def github_client(
    auth: BaseAuthStrategy, settings: ForgeSettings, policy: RetryPolicy | None = None
) -> GitHub[Any]:
    """A githubkit client for ``settings`` (base_url, timeout_s), retrying as
    ``policy`` decides (default: the settings' bounds), without githubkit's HTTP
    cache (a lookup after a crash must see GitHub as it is now) but asking each
    GET again with its ETag (``etag.ConditionalTransport``: a 304 costs no rate
    limit), with a token cache of its own."""
    if policy is None:
        policy = RetryPolicy(settings.max_rate_limit_wait_s, settings.max_retries, 0.5)
    return GitHub(
        auth,
        base_url=settings.base_url,
        timeout=settings.timeout_s,
        auto_retry=policy,
        http_cache=False,
        transport=ConditionalTransport(httpx.HTTPTransport(verify=_ssl_context())),
        # githubkit's default cache is one per process, keyed by app and installation
        # only: another host's (or test server's) installation token would be reused
        cache_strategy=MemCacheStrategy(),
        ssl_verify=_ssl_context(),
        user_agent="phasegate",
    )


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # githubkit opens an httpx client per call, and httpx loads the CA bundle anew
    # for each: 40 ms a call, measured; one context, made as httpx makes it, is shared.
    return httpx.create_ssl_context()


@dataclass
class ForgeAuth:
    """How phasegate signs its GitHub calls.

    ``strategy()``: githubkit's auth strategy for REST. ``git_token()``: a token
    git may push with. ``credentials``: how errors name them (``the token in
    GITHUB_TOKEN``). ``login``: phasegate's own login when known (an App's
    ``<slug>[bot]``; a token's is not asked for). ``secrets()``: every token
    value handed out so far.
    """

    credentials: str
    strategy: Callable[[], BaseAuthStrategy]
    git_token: Callable[[], str]
    login: Callable[[], str | None] = field(default=lambda: None)
    secrets: Callable[[], list[str]] = field(default=list)

    @classmethod
    def from_token(cls, token: str, token_env: str) -> ForgeAuth:
        withhold_from_git([token])
        return cls(
            credentials=f"the token in {token_env}",
            strategy=lambda: TokenAuthStrategy(token),
            git_token=lambda: token,
            secrets=lambda: [token],
        )


class _App:
    """A GitHub App's installation: found once, its git tokens minted as needed."""

    def __init__(
        self, settings: ForgeSettings, private_key: str, repository: str, credentials: str
    ) -> None:
        assert settings.app_id is not None
        self.settings = settings
        self.app_id = settings.app_id
        self.key = private_key
        self.repository = repository
        self.credentials = credentials
        self.installation_id = settings.installation_id
        self.slug: str | None = None
        self.token: tuple[str, datetime] | None = None
        self.minted: list[str] = []
        self.lock = threading.Lock()

    def _app_client(self) -> GitHub[Any]:
        return github_client(AppAuthStrategy(self.app_id, self.key), self.settings)

    def _api(self, call: Callable[[GitHub[Any]], Any]) -> Any:
        try:
            return call(self._app_client())
        except GitHubException as exc:
            raise translate(
                exc, repository=self.repository, credentials=self.credentials, secrets=self.minted
            ) from exc

    def _installation(self) -> int:
        with self.lock:
            if self.installation_id is None or self.slug is None:
                owner, name = self.repository.split("/")
                found = self._api(
                    lambda gh: gh.rest(API_VERSION).apps.get_repo_installation(owner, name).json()
                )
                self.installation_id = self.installation_id or int(found["id"])
                self.slug = str(found["app_slug"])
            return self.installation_id

    def strategy(self) -> BaseAuthStrategy:
        if self.installation_id is None:
            self._installation()
        assert self.installation_id is not None
        return AppInstallationAuthStrategy(self.app_id, self.key, self.installation_id)

    def login(self) -> str | None:
        self._installation()
        return f"{self.slug}[bot]"

    def git_token(self) -> str:
        installation = self._installation()
        with self.lock:
            now = datetime.now(UTC)
            if self.token is None or self.token[1] - RENEW_BEFORE <= now:
                made = self._api(
                    lambda gh: (
                        gh.rest(API_VERSION)
                        .apps.create_installation_access_token(installation)
                        .json()
                    )
                )
                token = str(made["token"])
                expires = datetime.fromisoformat(str(made["expires_at"]).replace("Z", "+00:00"))
                self.token = (token, expires)
                self.minted.append(token)
                withhold_from_git([token])
            return self.token[0]


def forge_auth(
    settings: ForgeSettings,
    repo: Path,
    repository: str,
    environ: Mapping[str, str] | None = None,
) -> ForgeAuth:
    """The credentials ``settings`` name for ``repository``: a GitHub App when
    ``forge.app_id`` is set, else the token in ``forge.token_env``.

    Raises ForgeAuthError naming the variable when it is unset or empty, or the
    key file when it cannot be read. Nothing is sent to GitHub yet.
    """
    source = os.environ if environ is None else environ
    if settings.uses_app:
        assert settings.private_key_file is not None
        path = Path(settings.private_key_file)
        path = path if path.is_absolute() else repo / path
        try:
            key = path.read_text()
        except OSError as exc:
            raise ForgeAuthError(
                f"forge.private_key_file: cannot read the GitHub App's key {path}: {exc.strerror}"
            ) from exc
        credentials = f"the GitHub App {settings.app_id} (key {settings.private_key_file})"
        app = _App(settings, key, repository, credentials)
        return ForgeAuth(
            credentials=credentials,
            strategy=app.strategy,
            git_token=app.git_token,
            login=app.login,
            secrets=lambda: list(app.minted),
        )
    token = source.get(settings.token_env, "")
    if not token.strip():
        raise ForgeAuthError(
            f"forge.token_env: {settings.token_env} is not set; export a GitHub token "
            f"in {settings.token_env} (or name another variable in forge.token_env)"
        )
    return ForgeAuth.from_token(token.strip(), settings.token_env)
