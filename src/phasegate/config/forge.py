"""The cartridge's ``[forge]`` table: which forge, and how phasegate reaches it.

``kind = "local"`` (the default) keeps issues and pull requests in the store.
``kind = "github"`` drives a GitHub repository: ``repository``
(``owner/name``, else read from the ``origin`` remote), ``base_url`` for GitHub
Enterprise (its API root, ``https://HOST/api/v3``), and either a token in the
environment variable ``token_env`` names or a GitHub App (``app_id``,
``private_key_file``, ``installation_id``). ``kind = "gitlab"`` drives a GitLab
project (``group/…/name``; ``base_url`` the instance, ``https://gitlab.com``
unset) and ``kind = "gitea"`` a Gitea or Forgejo repository (``base_url``
required: there is no one public instance), each with a token. The token itself
never appears in the cartridge: it would end up in git.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["ForgeSettings", "is_loopback"]

_REPOSITORY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$")
# GitLab nests groups: group/subgroup/…/project, each part a path segment.
_GITLAB_PROJECT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)+$")
#: The token's variable when the cartridge names none, by forge.
DEFAULT_TOKEN_ENV = {"github": "GITHUB_TOKEN", "gitlab": "GITLAB_TOKEN", "gitea": "GITEA_TOKEN"}
_LABEL = re.compile(r"^[^,\s][^,]{0,49}$")


class ForgeSettings(BaseModel):
    """``[forge]``. Keys other than ``kind`` are about a remote forge; given with
    ``kind = "local"`` they are an error, so a half-switched cartridge is noticed."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    kind: Literal["local", "github", "gitlab", "gitea"] = "local"
    """local: issues and pull requests in the store; github, gitlab, gitea (Gitea or
    Forgejo): a repository on that forge."""
    repository: str | None = None  # owner/name (GitLab: group/…/name); None: the origin's
    base_url: str | None = None
    """GitHub: the API root (unset: https://api.github.com); GitLab: the instance,
    not its /api/v4 (unset: https://gitlab.com); Gitea: the instance, not its
    /api/v1, required. https; plain http only to this machine (a test server)."""
    # the default is set by kind (_token_by_kind); the reference says so, not GitHub's
    token_env: str = Field(default="GITHUB_TOKEN", json_schema_extra={"shown_default": "by kind"})
    """The environment variable holding the forge's token; unset, by kind: GITHUB_TOKEN,
    GITLAB_TOKEN or GITEA_TOKEN. The token is never in the cartridge."""
    app_id: int | None = None
    """A GitHub App's id: phasegate then acts as the App (with ``private_key_file``)."""
    private_key_file: str | None = None  # PEM, relative to the repository
    installation_id: int | None = None
    """The App's installation; unset: the repository's, asked of GitHub."""
    merge_method: Literal["merge", "squash", "rebase"] = "merge"
    """How the forge merges the pull request (GitLab's merge request): a merge
    commit, one squashed commit, or rebased (GitLab: the project's own method)."""
    trigger_label: str = "phasegate"
    """The label whose setting by a trusted person starts a workflow for an issue."""
    watch_in_worker: bool = False  # `phasegate worker` also does what `watch` does
    delete_merged_branches: bool = True
    """After a merge, delete the workflow's own branch on the forge (never the base)."""
    poll_s: float = Field(default=30.0, gt=0, le=3600)  # how often wait and CI look again
    max_ci_repairs: int = Field(default=2, ge=0, le=20)  # CI-repair rounds before a stop
    # Checks that must report and pass: until one has reported on a head it is pending
    # (CI registers its runs a while after a push; without these, none yet is no CI).
    required_checks: list[str] = Field(default_factory=list)
    max_rate_limit_wait_s: float = Field(default=300.0, ge=0, le=3600)
    """Seconds a rate limit is waited out at most before the workflow pauses."""
    webhook_secret_env: str = "PHASEGATE_WEBHOOK_SECRET"
    """The environment variable holding the webhook's secret (``phasegate serve``'s
    ``/webhooks/<forge>``); unset, deliveries are refused and polling alone goes on."""
    webhook_poll_s: float = Field(default=300.0, gt=0, le=86400)
    """Seconds between two looks at a waiting workflow while webhooks arrive (one
    came within the last hour): polling is then only the fallback."""
    max_retries: int = Field(default=3, ge=0, le=10)  # tries past the first on 5xx/timeouts
    timeout_s: float = Field(default=30.0, gt=0, le=600)  # one HTTP request
    max_auto_resumes: int = Field(default=5, ge=0, le=50)
    """Times in a row the worker resumes a workflow paused forge_unavailable by itself
    (0: never); after that it stays paused for a person."""
    auto_resume_s: float = Field(default=30.0, gt=0, le=3600)
    """Seconds before the first automatic resume; doubled for each next one, 10 minutes
    at most (or this, when longer)."""

    @model_validator(mode="before")
    @classmethod
    def _token_by_kind(cls, data: object) -> object:
        if isinstance(data, dict) and "token_env" not in data:
            default = DEFAULT_TOKEN_ENV.get(str(data.get("kind")))
            if default is not None and default != "GITHUB_TOKEN":
                data = {**data, "token_env": default}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ForgeSettings:
        if self.kind == "local":
            given = sorted(k for k in self.model_fields_set if k != "kind")
            if given:
                raise ValueError(
                    f"forge.{given[0]}: only read when forge.kind is github, gitlab or "
                    "gitea (this cartridge has the local forge)"
                )
            return self
        if self.repository is not None and self.repository.lower().endswith(".git"):
            # GitHub's API knows octo/widgets; octo/widgets.git is a clone URL's tail
            raise ValueError(
                f"forge.repository: {self.repository!r} ends in .git: give owner/name "
                f"without it ({self.repository[:-4]!r})"
            )
        if self.kind == "gitlab":
            if self.repository is not None and not _GITLAB_PROJECT.match(self.repository):
                raise ValueError(
                    f"forge.repository: {self.repository!r} is not a GitLab project path "
                    "(e.g. group/widgets or group/subgroup/widgets)"
                )
        elif self.repository is not None and not _REPOSITORY.match(self.repository):
            raise ValueError(
                f"forge.repository: {self.repository!r} is not owner/name (e.g. octo/widgets)"
            )
        if self.kind == "gitea" and self.base_url is None:
            raise ValueError(
                "forge.base_url: a Gitea or Forgejo forge needs its instance's URL "
                "(e.g. https://git.example.com)"
            )
        if self.base_url is not None:
            _check_base_url(self.kind, self.base_url)
        app = {"app_id": self.app_id, "private_key_file": self.private_key_file}
        app_keys = [
            k
            for k in ("app_id", "private_key_file", "installation_id")
            if getattr(self, k) is not None
        ]
        if app_keys:
            if self.kind != "github":
                raise ValueError(
                    f"forge.{app_keys[0]}: a GitHub App is GitHub's (this forge is {self.kind})"
                )
            missing = [k for k, v in app.items() if v is None]
            if missing:
                raise ValueError(
                    f"forge.{missing[0]}: a GitHub App needs app_id and private_key_file"
                )
        for key in ("token_env", "webhook_secret_env"):
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", getattr(self, key)):
                raise ValueError(f"forge.{key}: {getattr(self, key)!r} is not a variable name")
        if not _LABEL.match(self.trigger_label):
            raise ValueError(f"forge.trigger_label: {self.trigger_label!r} is not a label name")
        return self

    @property
    def uses_app(self) -> bool:
        return self.app_id is not None

    def for_one_look(self) -> ForgeSettings:
        """These settings for one look a person waits for (``phasegate doctor``): one
        try, no rate-limit wait, 10 s a request; it does not ride out an outage."""
        return self.model_copy(
            update={"max_retries": 0, "max_rate_limit_wait_s": 0.0, "timeout_s": 10.0}
        )


# An API root given where the instance is wanted: phasegate adds it itself.
_API_ROOT = {
    "gitlab": ("/api/v4", "https://gitlab.example.com"),
    "gitea": ("/api/v1", "https://git.example.com"),
}


def _check_base_url(kind: str, base_url: str) -> None:
    """Refuse a base_url that is no http(s) URL, holds credentials, would send the
    token over plain http to another machine, or is GitLab's or Gitea's API root
    rather than the instance. Loopback http stays allowed: a test server."""
    if not re.match(r"^https?://[^\s/]+", base_url):
        raise ValueError(f"forge.base_url: {base_url!r} is not an http(s) URL")
    parts = urlsplit(base_url)
    if parts.username or parts.password:
        raise ValueError("forge.base_url: it holds credentials; give the token in forge.token_env")
    if parts.scheme != "https" and not is_loopback(parts.hostname or ""):
        raise ValueError(
            f"forge.base_url: {base_url!r} is not https: phasegate sends no token over "
            "plain http to another machine"
        )
    if kind in _API_ROOT:
        suffix, example = _API_ROOT[kind]
        if parts.path.rstrip("/").endswith(suffix):
            raise ValueError(
                f"forge.base_url: {base_url!r} is the API root ({suffix}); give the "
                f"instance's URL (e.g. {example}): phasegate adds {suffix} itself"
            )


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine (``localhost`` or a loopback address): the
    one place a token may go over plain http, to a test server."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
