"""The GitLab forge's transport: one python-gitlab client per forge, its every
request retried as ``faults`` decides, every failure a ForgeError, creating
calls looked up before a repeat, and the texts phasegate sends made safe.

``GitLabForge`` (forge.py) says what each Forge call means on GitLab; this
says how a call reaches it. python-gitlab's own retries are off: its 429 wait
has no bound and its 5xx retry would repeat a POST that made an issue.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import gitlab
import requests
from gitlab.exceptions import GitlabError

from phasegate.config.forge import ForgeSettings
from phasegate.core.closing import defuse_closing
from phasegate.core.redaction import redact
from phasegate.forge.base import ForgeError, ForgeUnavailable
from phasegate.forge.git_remote import FetchedBranches, GitDialect, GitRemote
from phasegate.forge.gitlab.auth import GitLabAuth, instance_url
from phasegate.forge.gitlab.faults import (
    MAX_BACKOFF_S,
    answered,
    creates,
    is_transient,
    rate_limit_wait,
    status_of,
    translate,
)
from phasegate.forge.gitlab.numbers import gitlab_references
from phasegate.forge.retries import ForgeRetry, report
from phasegate.forge.texts import (
    CHECK_OUTPUT_BYTES,
    cap,
    fit_body,
    marker_comment,
    timestamp,
)
from phasegate.git.workspace import Workspace

__all__ = [
    "BODY_LIMIT",
    "CHECK_OUTPUT_BYTES",
    "PAGE",
    "GitLabAPI",
    "GitLabClient",
    "cap",
    "fit",
    "marker_comment",
    "neutralize_closing",
    "timestamp",
    "labels_of",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The role a token's account needs, named when git refuses it or shows it nothing.
ROLE_NEEDED = (
    "its account needs the Developer role on the project or higher (a Guest cannot "
    "fetch its code, a Reporter cannot push)"
)
#: GitLab's git over HTTPS: any user name with the token as the password (``oauth2``
#: is its documentation's); a Guest is told the project does not exist.
GITLAB_GIT = GitDialect(
    "GitLab",
    "oauth2",
    "the project's http_url_to_repo",
    refused_hint=f": it may be wrong, expired or revoked, or {ROLE_NEEDED}",
    hidden=re.compile(r"could not be found|repository '[^']*' not found", re.IGNORECASE),
    hidden_hint=f": {ROLE_NEEDED}",
)

#: The most characters phasegate sends in a description or a note (GitLab takes
#: 1,048,576 in a description, 1,000,000 in a note).
BODY_LIMIT = 1_000_000
#: Items asked for per page of a list (GitLab's most).
PAGE = 100


def neutralize_closing(text: str) -> str:
    """``text`` with every GitLab closing word before an issue reference replaced by
    ``Part of``: ``Implements #3`` → ``Part of #3``."""
    return defuse_closing(text)


def fit(text: str, suffix: str = "") -> str:
    """``text`` then ``suffix`` within GitLab's BODY_LIMIT (``texts.fit_body``)."""
    return fit_body(text, suffix, BODY_LIMIT, "GitLab")


class _Seen(threading.local):
    """Per thread: the last answer's headers, and what the last failed call was."""

    headers: Any = None
    call: str = "a request"
    wait_s: float | None = None


class GitLabClient(gitlab.Gitlab):
    """python-gitlab's client whose every request (a list's pages too) is tried
    as ``faults`` decides: rate limits waited out up to ``max_rate_limit_wait_s``
    a call, 5xx and timeouts tried ``max_retries`` times more (never a creating
    POST), each wait reported (``phasegate.forge.retries.report``)."""

    def __init__(self, settings: ForgeSettings, token: str, backoff_s: float) -> None:
        session = requests.Session()
        session.hooks["response"].append(self._answered)
        super().__init__(
            instance_url(settings),
            private_token=token,
            timeout=settings.timeout_s,
            session=session,
            user_agent="phasegate",
            retry_transient_errors=False,
        )
        self.forge_settings = settings
        self.backoff_s = backoff_s
        self.seen = _Seen()

    def _answered(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        self.seen.headers = response.headers

    def http_request(self, verb: str, path: str, *args: Any, **kwargs: Any) -> requests.Response:
        kwargs.update(obey_rate_limit=False, retry_transient_errors=False, max_retries=0)
        call = f"{verb.upper()} {urlsplit(path).path or path}"
        waited_s, retries, attempt = 0.0, 0, 1
        while True:
            self.seen.headers, self.seen.call, self.seen.wait_s = None, call, None
            try:
                return super().http_request(verb, path, *args, **kwargs)
            except (GitlabError, requests.ConnectionError, requests.Timeout) as exc:
                status = status_of(exc)
                wait = rate_limit_wait(status, self.seen.headers)
                if wait is not None:
                    self.seen.wait_s = wait
                    if waited_s + wait > self.forge_settings.max_rate_limit_wait_s:
                        raise
                    waited_s += wait
                    why = "rate_limit"
                elif is_transient(exc) and not creates(verb, path):
                    if retries >= self.forge_settings.max_retries:
                        raise
                    wait = min(self.backoff_s * 2**retries, MAX_BACKOFF_S)
                    retries += 1
                    why = "transient"
                else:
                    raise
                attempt += 1
                shown = status if status is not None else type(exc).__name__
                report(ForgeRetry(call, shown, wait, attempt, why))  # type: ignore[arg-type]
                time.sleep(wait)


class GitLabAPI(FetchedBranches):
    """How a ``GitLabForge`` reaches GitLab (see GitLabForge for the arguments)."""

    def __init__(
        self,
        repository: str,
        auth: GitLabAuth,
        repo: Path,
        workspace: Workspace,
        settings: ForgeSettings,
        secrets: Sequence[str] = (),
        *,
        retry_backoff_s: float = 0.5,
    ) -> None:
        self.repository = repository
        self.auth = auth
        self.repo = repo
        self.workspace = workspace
        self.settings = settings
        self._secrets = list(secrets)
        self.retry_backoff_s = retry_backoff_s
        self._lock = threading.Lock()
        self._client: GitLabClient | None = None
        self._project_info: dict[str, Any] | None = None

    @property
    def secrets(self) -> list[str]:
        """What no text sent may hold: the secrets given and the forge's token."""
        return [*self._secrets, *self.auth.secrets()]

    def _clean(self, text: str) -> str:
        return gitlab_references(redact(text, self.secrets))

    def _mr_text(self, text: str) -> str:
        """A merge request's title or description, a merge's message: redacted, and
        closing no issue (the issue closes only after verification)."""
        return fit(self._clean(neutralize_closing(text)))

    def _gl(self) -> GitLabClient:
        with self._lock:
            if self._client is None:
                self._client = GitLabClient(self.settings, self.auth.token, self.retry_backoff_s)
            return self._client

    def _project(self) -> Any:
        """python-gitlab's project, not read (``lazy``): its managers make the calls."""
        return self._gl().projects.get(self.repository, lazy=True)

    def _error(self, exc: BaseException) -> ForgeError:
        seen = self._gl().seen
        return translate(
            exc,
            call=seen.call,
            repository=self.repository,
            credentials=self.auth.credentials,
            retry_after_s=seen.wait_s,
            secrets=self.secrets,
        )

    def _call(self, call: Callable[[], T]) -> T:
        """``call()`` with python-gitlab's and requests' errors, and an answer that is
        not the JSON it should be (KeyError, ValueError), raised as ForgeErrors."""
        try:
            return call()
        except (GitlabError, requests.RequestException, ValueError, KeyError) as exc:
            raise self._error(exc) from exc

    def _list(self, manager: Any, **filters: Any) -> list[dict[str, Any]]:
        """Every item of every page of ``manager``'s list with ``filters``, as JSON."""
        return self._call(
            lambda: [x.attributes for x in manager.list(get_all=True, per_page=PAGE, **filters)]
        )

    def _create(self, what: str, post: Callable[[], int], find: Callable[[], int | None]) -> int:
        """Make an object with ``post()``. When GitLab answers 5xx, look for it with
        ``find`` (the failed try may have made it) before trying again, up to
        ``forge.max_retries`` times more. A timeout or a lost connection is
        ForgeUnavailable at once, with ``retry_after_s`` twice ``forge.timeout_s``:
        GitLab may still be making the object, and only a later look (the
        journal's, on resume) can tell. Returns its number or id."""
        for attempt in range(self.settings.max_retries + 1):
            try:
                return post()
            except (GitlabError, requests.RequestException, ValueError, KeyError) as exc:
                again = is_transient(exc) and answered(exc)
                if not again or attempt == self.settings.max_retries:
                    error = self._error(exc)
                    if isinstance(error, ForgeUnavailable) and not answered(exc):
                        # GitLab may still be making it: the look on resume must come
                        # after a request held past our timeout has landed.
                        error.retry_after_s = 2 * self.settings.timeout_s
                    raise error from exc
                log.info("creating %s failed (%s); looking for it before trying again", what, exc)
                call, status = self._gl().seen.call, status_of(exc) or 0
            found = find()
            if found is not None:
                return found
            wait = min(self.retry_backoff_s * 2**attempt, MAX_BACKOFF_S)
            report(ForgeRetry(call, status, wait, attempt + 2, "transient"))
            time.sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def project_info(self) -> dict[str, Any]:
        """The project's JSON (``GET /projects/:id``), read once."""
        if self._project_info is None:
            self._project_info = self._call(
                lambda: self._gl().projects.get(self.repository).attributes
            )
        return self._project_info

    def git_remote(self) -> GitRemote:
        """The project's git remote at its ``http_url_to_repo``."""
        token = self.auth.token
        return GitRemote(
            self.repo,
            str(self.project_info()["http_url_to_repo"]),
            lambda: token,
            dialect=GITLAB_GIT,
            credentials=self.auth.credentials,
            secrets=self.secrets,
            retries=self.settings.max_retries,
            backoff_s=self.retry_backoff_s,
        )

    def login(self) -> str:
        """The username the forge's token acts as (``GET /user``): a project's or
        group's token answers its bot user."""
        gl = self._gl()
        self._call(gl.auth)
        assert gl.user is not None
        return str(gl.user.username)


def labels_of(items: Iterable[Any]) -> tuple[str, ...]:
    """Label names of GitLab's ``labels`` (names, or objects with ``name``/``title``)."""
    names = (
        item if isinstance(item, str) else (item or {}).get("name") or (item or {}).get("title")
        for item in items
    )
    return tuple(str(n) for n in names if n)
