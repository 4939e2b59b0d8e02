"""The GitHub forge's transport: one githubkit client per forge, GitHub's REST
version fixed, every githubkit error a ForgeError, creating calls looked up
before a repeat, and the texts phasegate sends made safe.

``GitHubForge`` (github.py) says what each Forge call means on GitHub; this
says how a call reaches it. The REST version is ``2022-11-28``: the one GitHub
Enterprise Server speaks, and the one GitHub's OpenAPI description (that the
tests validate against) describes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from githubkit import GitHub
from githubkit.exception import GitHubException

from phasegate.config.forge import ForgeSettings
from phasegate.core.closing import defuse_closing
from phasegate.core.redaction import redact
from phasegate.forge.base import ForgeError, ForgeNotFound, ForgeUnavailable
from phasegate.forge.git_remote import FetchedBranches, GitDialect, GitRemote
from phasegate.forge.github.auth import API_VERSION, ForgeAuth, github_client
from phasegate.forge.github.faults import (
    MAX_BACKOFF_S,
    RetryPolicy,
    answered,
    call_of,
    is_transient,
    status_of,
    translate,
)
from phasegate.forge.retries import ForgeRetry, report
from phasegate.forge.texts import (
    CHECK_OUTPUT_BYTES,
    cap,
    fit_body,
    labels_of,
    login_of,
    marker_comment,
    timestamp,
)
from phasegate.git.workspace import Workspace

__all__ = [
    "API_VERSION",
    "BODY_LIMIT",
    "CHECK_OUTPUT_BYTES",
    "PAGE",
    "GitHubAPI",
    "cap",
    "fit",
    "timestamp",
    "labels_of",
    "login_of",
    "marker_comment",
    "neutralize_closing",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: GitHub's git over HTTPS: the token is the password of the user x-access-token.
GITHUB_GIT = GitDialect("GitHub", "x-access-token", "the repository's clone_url")

#: The most characters GitHub takes in an issue's, comment's or pull request's body.
BODY_LIMIT = 65536
#: Items asked for per page of a list (GitHub's most).
PAGE = 100


def neutralize_closing(text: str) -> str:
    """``text`` with every GitHub closing keyword before an issue reference replaced
    by ``Implements``: ``Fixes #3`` → ``Implements #3``."""
    return defuse_closing(text, "Implements")


def fit(text: str, suffix: str = "") -> str:
    """``text`` then ``suffix`` within GitHub's BODY_LIMIT (``texts.fit_body``)."""
    return fit_body(text, suffix, BODY_LIMIT, "GitHub")


class GitHubAPI(FetchedBranches):
    """How a ``GitHubForge`` reaches GitHub (see GitHubForge for the arguments)."""

    def __init__(
        self,
        repository: str,
        auth: ForgeAuth,
        repo: Path,
        workspace: Workspace,
        settings: ForgeSettings,
        secrets: Sequence[str] = (),
        *,
        retry_backoff_s: float = 0.5,
    ) -> None:
        self.repository = repository
        self.owner, self.name = repository.split("/", 1)
        self.auth = auth
        self.repo = repo
        self.workspace = workspace
        self.settings = settings
        self._secrets = list(secrets)
        self.retry_backoff_s = retry_backoff_s
        self.policy = RetryPolicy(
            settings.max_rate_limit_wait_s, settings.max_retries, retry_backoff_s
        )
        self._lock = threading.Lock()
        self._client: GitHub[Any] | None = None
        self._clone_url: str | None = None
        self._repo_labels: set[str] | None = None
        self._is_pull: dict[int, bool] = {}

    @property
    def secrets(self) -> list[str]:
        """What no text sent may hold: the secrets given and every token of the forge's."""
        return [*self._secrets, *self.auth.secrets()]

    def _clean(self, text: str) -> str:
        return redact(text, self.secrets)

    def _pr_text(self, text: str) -> str:
        """A pull request's title or body, a merge's message: redacted, and closing
        no issue (the issue closes only after verification)."""
        return fit(self._clean(neutralize_closing(text)))

    def _gh(self) -> GitHub[Any]:
        with self._lock:
            if self._client is None:
                self._client = github_client(self.auth.strategy(), self.settings, self.policy)
            return self._client

    def _error(self, exc: Exception) -> ForgeError:
        return translate(
            exc, repository=self.repository, credentials=self.auth.credentials, secrets=self.secrets
        )

    def _api(self, call: Callable[[Any], T]) -> T:
        """``call(rest)`` with githubkit's REST namespace of API_VERSION; its githubkit
        errors, a body githubkit refuses to send, and an answer that is not the JSON
        it should be (ValueError, KeyError in ``call``) raised as ForgeErrors."""
        try:
            return call(self._gh().rest(API_VERSION))
        except (GitHubException, ValueError, KeyError) as exc:
            raise self._error(exc) from exc

    def _get(self, call: Callable[[Any], Any]) -> Any:
        """The JSON GitHub answered ``call(rest)`` with (see ``_api``)."""
        return self._api(lambda rest: call(rest).json())

    def _list(
        self, pick: Callable[[Any], Any], *args: Any, map_func: Any = None, **kwargs: Any
    ) -> list[Any]:
        """Every item of every page of the list ``pick(rest)`` answers, as JSON
        (githubkit follows GitHub's ``Link: rel="next"``), 100 a page.

        JSON, not githubkit's models: those are drawn from GitHub's newest
        description and refuse an answer missing a field added since (GitHub
        Enterprise Server's, an older api.github.com's); phasegate reads a few
        fields, and a missing one is a KeyError only where it matters."""
        try:
            gh = self._gh()
            pages = gh.rest.paginate(
                pick(gh.rest(API_VERSION)),
                map_func or (lambda response: response.json()),
                *args,
                per_page=PAGE,
                **kwargs,
            )
            return list(pages)
        except (GitHubException, ValueError, KeyError) as exc:
            raise self._error(exc) from exc

    def _create(self, what: str, post: Callable[[Any], int], find: Callable[[], int | None]) -> int:
        """Make an object with ``post(rest)``. When GitHub answers 5xx, look for it
        with ``find`` (the failed try may have made it) before trying again, up to
        ``forge.max_retries`` times more. A timeout or a lost connection is
        ForgeUnavailable at once: GitHub may still be making the object, so only a
        later look (the journal's, on resume, no sooner than twice
        ``forge.timeout_s``: ``retry_after_s``) can tell. Each wait before another try
        is reported (``phasegate.forge.retries.report``). Returns its number or id."""
        for attempt in range(self.settings.max_retries + 1):
            try:
                return post(self._gh().rest(API_VERSION))
            except (GitHubException, ValueError, KeyError) as exc:
                if not isinstance(exc, GitHubException):
                    raise self._error(exc) from exc
                again = is_transient(exc) and answered(exc)
                if not again or attempt == self.settings.max_retries:
                    error = self._error(exc)
                    if isinstance(error, ForgeUnavailable) and not answered(exc):
                        # GitHub may still be making it: the look on resume must come
                        # after a request held past our timeout has landed.
                        error.retry_after_s = 2 * self.settings.timeout_s
                    raise error from exc
                log.info("creating %s failed (%s); looking for it before trying again", what, exc)
                call, status = call_of(exc), status_of(exc)
            found = find()
            if found is not None:
                return found
            wait = min(self.retry_backoff_s * 2**attempt, MAX_BACKOFF_S)
            report(ForgeRetry(call, status, wait, attempt + 2, "transient"))
            time.sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def git_remote(self) -> GitRemote:
        """The repository's git remote at its ``clone_url`` (asked once)."""
        if self._clone_url is None:
            found = self._get(lambda rest: rest.repos.get(self.owner, self.name))
            self._clone_url = str(found["clone_url"])
        return GitRemote(
            self.repo,
            self._clone_url,
            self.auth.git_token,
            dialect=GITHUB_GIT,
            credentials=self.auth.credentials,
            secrets=self.secrets,
            retries=self.settings.max_retries,
            backoff_s=self.retry_backoff_s,
        )

    # -- the repository itself: a new project, made in preparation before its issue --

    def find_repository(self) -> dict[str, Any] | None:
        """GitHub's ``full-repository`` JSON of ``repository`` (``GET /repos/{owner}/{repo}``),
        or None when GitHub has none (or the token cannot see it: 404)."""
        try:
            return self._get(lambda rest: rest.repos.get(self.owner, self.name))
        except ForgeNotFound:
            return None

    def login(self) -> str:
        """The login the forge's token acts as (``GET /user``)."""
        return str(self._get(lambda rest: rest.users.get_authenticated())["login"])

    def create_repository(self, description: str, *, private: bool) -> dict[str, Any]:
        """Create ``repository``, empty (no ``auto_init``: phasegate pushes its own first
        commit), with ``description``: ``POST /user/repos`` when its owner is the
        token's user, else (and always for a GitHub App) ``POST /orgs/{org}/repos``.
        A 5xx is looked up (``find_repository``, a repository carrying
        ``description``) before a repeat.
        Returns its ``full-repository`` JSON. Raises GitHubRefused 422 when the name
        is taken, ForgeAuthError when the token may not create it (403)."""
        fields = {
            "name": self.name,
            "description": self._clean(description),
            "private": private,
            "has_issues": True,
            "auto_init": False,
        }
        made: dict[str, Any] = {}

        def post(rest: Any) -> int:
            # a GitHub App creates only in an organisation (GET /user is no App's)
            if not self.settings.uses_app and self.owner.lower() == self.login().lower():
                answer = rest.repos.create_for_authenticated_user(data=fields)
            else:
                answer = rest.repos.create_in_org(self.owner, data=fields)
            made.update(answer.json())
            return int(made["id"])

        def find() -> int | None:
            found = self.find_repository()
            if found is None or found.get("description") != fields["description"]:
                return None
            made.update(found)
            return int(found["id"])

        self._create(f"repository {self.repository}", post, find)
        self._clone_url = str(made["clone_url"])
        return made
