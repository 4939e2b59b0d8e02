"""Who phasegate is on Gitea, and which repository.

    gitea_auth(settings, environ)              # the token in forge.token_env (GITEA_TOKEN)
    repository_from_origin(repo, base_url)     # "owner/name" from the origin remote's URL

The token comes from the environment variable ``forge.token_env`` names, never
from the cartridge. Its value is withheld from phasegate's other git processes
(``phasegate.git.command.withhold_from_git``) and redacted by the forge. The
repository, when the cartridge names none, is the ``origin`` remote's on the
instance's host (``forge.base_url``): a token is never sent to another host.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from phasegate.config.forge import ForgeSettings, is_loopback
from phasegate.forge.base import ForgeAuthError, ForgeError
from phasegate.git.command import run_git, withhold_from_git

__all__ = ["GiteaAuth", "gitea_auth", "instance_url", "repository_from_origin"]

# Gitea's user, organisation and repository names: letters, digits, - _ .
_REPOSITORY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$")
_URL = re.compile(r"^(?:[a-z+]+://|[\w.-]+@[\w.-]+:)")


@dataclass(frozen=True)
class GiteaAuth:
    """How phasegate signs its Gitea calls: ``token`` (sent as ``Authorization:
    token …`` and, to git, through askpass), ``credentials`` naming it in errors
    (``the token in GITEA_TOKEN``)."""

    token: str
    credentials: str

    def secrets(self) -> list[str]:
        return [self.token]


def gitea_auth(settings: ForgeSettings, environ: Mapping[str, str] | None = None) -> GiteaAuth:
    """The token in ``forge.token_env``. Raises ForgeAuthError naming the variable
    when it is unset or empty. Nothing is sent to Gitea yet."""
    source = os.environ if environ is None else environ
    token = source.get(settings.token_env, "").strip()
    if not token:
        raise ForgeAuthError(
            f"forge.token_env: {settings.token_env} is not set; export a Gitea (or Forgejo) "
            f"access token in {settings.token_env} (or name another variable in "
            "forge.token_env)"
        )
    withhold_from_git([token])
    return GiteaAuth(token, f"the token in {settings.token_env}")


def instance_url(base_url: str) -> str:
    """The instance's root URL, without a trailing slash or ``/api/v1``: the API is
    under it at ``/api/v1``, git at ``/{owner}/{name}.git``. Raises ForgeError
    naming forge.base_url unless it is https, or http to this machine (a test
    server): the token would otherwise travel in the clear."""
    url = base_url.rstrip("/")
    parts = urlsplit(url)
    if parts.username or parts.password:
        raise ForgeError("forge.base_url holds credentials: give the token in forge.token_env")
    local = is_loopback(parts.hostname or "")
    if not parts.hostname or not (parts.scheme == "https" or (parts.scheme == "http" and local)):
        raise ForgeError(
            f"forge.base_url {base_url!r} is not https: phasegate sends no token over plain "
            "http to another machine"
        )
    return url[: -len("/api/v1")] if url.endswith("/api/v1") else url


def _host_of(url: str) -> str:
    """The host of a URL, ``ssh://`` or scp-like ``user@host:path``, lower case, no port."""
    if "://" in url:
        return (urlsplit(url).hostname or "").lower()
    return url.split("@", 1)[-1].split(":", 1)[0].lower()


def repository_from_origin(repo: Path, base_url: str) -> str:
    """``owner/name`` of the ``origin`` remote of ``repo`` (an https, ssh or scp-like
    URL; a local path names none), which must be on ``base_url``'s host so that the
    token never goes elsewhere. An https URL's path is read after the instance's own
    path (``https://host/gitea/owner/name.git``). Raises ForgeError naming
    forge.repository when there is no origin or it names no repository, and naming
    forge.base_url when origin is on another host."""
    proc = run_git(["remote", "get-url", "origin"], repo)
    if proc.returncode != 0:
        raise ForgeError(
            f"forge.repository is not set and {repo} has no origin remote: "
            'set forge.repository = "owner/name"'
        )
    url = proc.stdout.strip()
    instance = instance_url(base_url)
    host, api_host = _host_of(url), _host_of(instance)
    repository = ""
    if _URL.match(url):
        if "://" in url:
            path = urlsplit(url).path
            prefix = urlsplit(instance).path.rstrip("/")
            if url.startswith(("http://", "https://")) and prefix and path.startswith(prefix + "/"):
                path = path[len(prefix) :]
        else:
            path = url.split(":", 1)[1]
        parts = [p for p in path.strip("/").split("/") if p]
        if len(parts) >= 2:
            name = parts[-1][:-4] if parts[-1].endswith(".git") else parts[-1]
            repository = f"{parts[-2]}/{name}"
    if not _REPOSITORY.match(repository):
        # the URL itself is not shown: it may hold credentials
        raise ForgeError(
            f"forge.repository is not set and the origin remote of {repo} names no "
            'owner/name: set forge.repository = "owner/name"'
        )
    if host != api_host:
        raise ForgeError(
            f"the origin remote of {repo} is on {host}, not on forge.base_url's host "
            f'({api_host}): set forge.repository = "owner/name" for a repository on '
            f"{api_host}, or forge.base_url to the instance origin is on"
        )
    return repository
