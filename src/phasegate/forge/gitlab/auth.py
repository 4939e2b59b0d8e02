"""Who phasegate is on GitLab, and which project.

    repository_from_origin(repo, base_url)  # "group/…/name" from the origin remote's URL
    gitlab_auth(settings)                   # the token in forge.token_env

A token comes from the environment variable ``forge.token_env`` names (default
``GITLAB_TOKEN``), never from the cartridge: a personal, project or group
access token with the ``api`` scope, its user (a project's or group's token
is a bot member) at least a Developer. The value is withheld from phasegate's
other git processes (``phasegate.git.command.withhold_from_git``) and redacted
by the forge.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from phasegate.config.forge import ForgeSettings
from phasegate.forge.base import ForgeAuthError, ForgeError
from phasegate.git.command import run_git, withhold_from_git

__all__ = ["GITLAB_COM", "GitLabAuth", "gitlab_auth", "instance_url", "repository_from_origin"]

#: The instance when forge.base_url is unset.
GITLAB_COM = "https://gitlab.com"

_SEGMENT = r"[A-Za-z0-9_][A-Za-z0-9._-]*"
_PROJECT = re.compile(rf"^{_SEGMENT}(?:/{_SEGMENT})+$")
_URL = re.compile(r"^(?:[a-z+]+://|[\w.-]+@[\w.-]+:)")


def instance_url(settings: ForgeSettings) -> str:
    """The GitLab instance's URL without a trailing slash (gitlab.com when unset)."""
    return (settings.base_url or GITLAB_COM).rstrip("/")


def _parts(url: str) -> tuple[str, str]:
    """(host, path) of an https, ssh or scp-like ``user@host:path`` URL; host lower case."""
    if "://" in url:
        split = urlsplit(url)
        return (split.hostname or "").lower(), split.path
    host, _, path = url.split("@", 1)[-1].partition(":")
    return host.lower(), "/" + path


def repository_from_origin(repo: Path, base_url: str | None = None) -> str:
    """``group/…/name`` of the ``origin`` remote of ``repo`` (https, ssh or
    scp-like; nested groups kept), on the instance ``base_url`` (None:
    gitlab.com), so the token is never sent to another host. An https remote
    under a GitLab served at a path (``https://host/gitlab/group/app.git``)
    loses that path. Raises ForgeError naming forge.repository when there is no
    origin or it names no project, and naming forge.base_url when origin is on
    another host."""
    proc = run_git(["remote", "get-url", "origin"], repo)
    if proc.returncode != 0:
        raise ForgeError(
            f"forge.repository is not set and {repo} has no origin remote: "
            'set forge.repository = "group/name"'
        )
    url = proc.stdout.strip()
    instance = base_url or GITLAB_COM
    api_host, prefix = _parts(instance.rstrip("/"))
    host, path = _parts(url) if _URL.match(url) else ("", "")
    if host and host != api_host:
        raise ForgeError(
            f"the origin remote of {repo} is on {host}, not on the GitLab at {instance}: "
            f'for a self-hosted GitLab set forge.base_url = "https://{host}"; for another '
            'project set forge.repository = "group/name"'
        )
    if "://" in url and url.startswith(("http://", "https://")) and prefix.strip("/"):
        path = path.removeprefix(prefix.rstrip("/"))
    project = path.strip("/").removesuffix(".git")
    if not _PROJECT.match(project):
        # the URL itself is not shown: it may hold credentials
        raise ForgeError(
            f"forge.repository is not set and the origin remote of {repo} names no GitLab "
            'project: set forge.repository = "group/name"'
        )
    return project


@dataclass(frozen=True)
class GitLabAuth:
    """The token phasegate sends (``token``) and how errors name it (``credentials``:
    ``the token in GITLAB_TOKEN``)."""

    token: str
    credentials: str

    def secrets(self) -> list[str]:
        return [self.token]


def gitlab_auth(settings: ForgeSettings, environ: Mapping[str, str] | None = None) -> GitLabAuth:
    """The token in ``forge.token_env``. Raises ForgeAuthError naming the variable
    when it is unset or empty. Nothing is sent to GitLab yet."""
    source = os.environ if environ is None else environ
    token = source.get(settings.token_env, "").strip()
    if not token:
        raise ForgeAuthError(
            f"forge.token_env: {settings.token_env} is not set; export a GitLab access token "
            f"(scope api, role Developer or higher) in {settings.token_env} (or name another "
            "variable in forge.token_env)"
        )
    withhold_from_git([token])
    return GitLabAuth(token, f"the token in {settings.token_env}")
