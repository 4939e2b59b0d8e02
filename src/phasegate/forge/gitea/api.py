"""The Gitea forge's transport: one httpx client per forge on ``/api/v1``, its
retries, every failure a ForgeError, creating calls looked up before a repeat,
lists read page by page, and the texts phasegate sends made safe.

``GiteaForge`` (forge.py) says what each Forge call means on Gitea; this says
how a call reaches it. Forgejo speaks the same API v1.

Retries (each wait reported: ``phasegate.forge.retries.report``, a log line and a
``forge_retry`` event, as GitHub's are):

- a rate limit (429, or 403 with ``Retry-After``; a bare 429 waits a minute) is
  waited out while the waits of one call add up to ``forge.max_rate_limit_wait_s``
  at most, then ForgeUnavailable with the forge's wait as ``retry_after_s``; the
  request was refused, so repeating any request is safe;
- a 5xx, a timeout or no connection is tried ``forge.max_retries`` times more with
  a doubling backoff, except a POST that creates something (``_create``): its
  first try may have happened, so the forge looks for it before a repeat.

What is left becomes::

    ForgeError
     ├── ForgeUnavailable   5xx, timeouts, no connection, a rate limit past its bound
     ├── ForgeAuthError     401 (names the token variable); GiteaForbidden: 403
     │                      (Gitea's message)
     ├── ForgeNotFound      404 (names the repository)
     └── GiteaRefused       anything else Gitea refused (405, 409, 422), with its
                            status and Gitea's own message
"""

from __future__ import annotations

import email.utils
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from phasegate.config.forge import ForgeSettings
from phasegate.core.closing import defuse_closing
from phasegate.core.redaction import redact
from phasegate.forge.base import ForgeAuthError, ForgeError, ForgeNotFound, ForgeUnavailable
from phasegate.forge.git_remote import FetchedBranches, GitDialect, GitRemote
from phasegate.forge.gitea.auth import GiteaAuth, instance_url
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
    "BARE_429_WAIT_S",
    "BODY_LIMIT",
    "CHECK_OUTPUT_BYTES",
    "MAX_BACKOFF_S",
    "PAGE",
    "GiteaAPI",
    "GiteaForbidden",
    "GiteaRefused",
    "GiteaUnavailable",
    "cap",
    "fit",
    "labels_of",
    "login_of",
    "marker_comment",
    "neutralize_closing",
    "timestamp",
]

log = logging.getLogger(__name__)

#: Gitea's git over HTTPS: the token is the password, whatever the user name.
GITEA_GIT = GitDialect(
    "Gitea",
    "phasegate",
    "the repository's git URL",
    url_hint=" (set forge.base_url to the instance's https URL)",
)

#: The most characters phasegate sends in an issue's, comment's or pull request's body.
BODY_LIMIT = 65536
#: Items asked for per page of a list (Gitea's default MAX_RESPONSE_ITEMS).
PAGE = 50
#: What a 429 without Retry-After waits, seconds.
BARE_429_WAIT_S = 60.0
#: The longest backoff between two tries of a failing request, seconds.
MAX_BACKOFF_S = 8.0
#: Conditional GETs: how many answers are kept, and the largest kept (bytes).
MAX_KEPT = 256
MAX_KEPT_BYTES = 1024 * 1024


def neutralize_closing(text: str) -> str:
    """``text`` with every closing keyword before an issue reference replaced by
    ``Implements``: ``Fixes #3`` → ``Implements #3``."""
    return defuse_closing(text, "Implements")


def fit(text: str, suffix: str = "") -> str:
    """``text`` then ``suffix`` within Gitea's BODY_LIMIT (``texts.fit_body``)."""
    return fit_body(text, suffix, BODY_LIMIT, "phasegate sends")


class GiteaRefused(ForgeError):
    """Gitea refused a call for a reason of its own (``status``: 405, 409, 422 …);
    ``gitea_message`` is Gitea's."""

    def __init__(self, message: str, status: int, gitea_message: str) -> None:
        super().__init__(message)
        self.status = status
        self.gitea_message = gitea_message


class GiteaForbidden(ForgeAuthError):
    """Gitea's 403: the token is good, but its account (or its scopes) may not do
    this call."""


class GiteaUnavailable(ForgeUnavailable):
    """ForgeUnavailable with what failed: ``call`` (``POST /api/v1/…``), ``status``
    (an HTTP status, or the failure's name when nothing answered), ``answered``
    (Gitea said something: a 5xx, a rate limit), ``transient`` (a 5xx, a timeout,
    no connection: another try may answer)."""

    def __init__(
        self,
        message: str,
        *,
        call: str,
        status: int | str,
        answered: bool,
        transient: bool,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, retry_after_s)
        self.call = call
        self.status = status
        self.answered = answered
        self.transient = transient


def _message_of(response: httpx.Response) -> str:
    """Gitea's own words: ``message`` and any ``errors`` of its JSON error body."""
    try:
        data = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    if not isinstance(data, dict):
        return str(data)[:500]
    message = str(data.get("message") or "") or response.reason_phrase
    errors = data.get("errors")
    if isinstance(errors, list) and errors:
        message += " (" + "; ".join(str(e) for e in errors) + ")"
    return message


def rate_limit_wait(response: httpx.Response) -> float | None:
    """Seconds Gitea (or a proxy before it) asks to wait, or None when ``response``
    is no rate limit: a 429, or a 403 carrying ``Retry-After``."""
    after = response.headers.get("retry-after")
    if response.status_code not in (403, 429) or (response.status_code == 403 and not after):
        return None
    if after is None:
        return BARE_429_WAIT_S
    try:
        return max(float(after), 0.0)
    except ValueError:
        pass
    try:  # an HTTP date
        when = email.utils.parsedate_to_datetime(after)
    except (TypeError, ValueError):
        return BARE_429_WAIT_S
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - datetime.now(UTC)).total_seconds(), 0.0)


class GiteaAPI(FetchedBranches):
    """How a ``GiteaForge`` reaches Gitea: the repository ``repository``
    (owner/name) on the instance ``settings.base_url``, for the local clone ``repo``.

    ``auth`` signs the calls (``Authorization: token …``); ``settings`` is the
    cartridge's ``[forge]`` (timeout_s, merge_method, the retry bounds);
    ``secrets`` are redacted from everything sent. ``retry_backoff_s`` is the first
    wait after a transient failure (doubled per try, 8 s at most); ``transport``
    replaces httpx's own (None: the network).
    """

    def __init__(
        self,
        repository: str,
        auth: GiteaAuth,
        repo: Path,
        workspace: Workspace,
        settings: ForgeSettings,
        secrets: Sequence[str] = (),
        *,
        retry_backoff_s: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        assert settings.base_url is not None, "a Gitea forge's settings name its instance"
        self.repository = repository
        self.owner, self.name = repository.split("/", 1)
        self.auth = auth
        self.repo = repo
        self.workspace = workspace
        self.settings = settings
        self.instance = instance_url(settings.base_url)
        self._secrets = list(secrets)
        self.retry_backoff_s = retry_backoff_s
        self._transport = transport
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None
        self._kept: OrderedDict[str, tuple[str, bytes, dict[str, str]]] = OrderedDict()
        #: Answers Gitea confirmed with a 304 (a conditional GET).
        self.not_modified = 0

    @property
    def secrets(self) -> list[str]:
        """What no text sent may hold: the secrets given and the forge's token."""
        return [*self._secrets, *self.auth.secrets()]

    @property
    def base(self) -> str:
        """The repository's API path: ``/repos/{owner}/{name}``."""
        return f"/repos/{self.owner}/{self.name}"

    def _clean(self, text: str) -> str:
        return redact(text, self.secrets)

    def _pr_text(self, text: str) -> str:
        """A pull request's title or body, a merge's message: redacted, and closing
        no issue (the issue closes only after verification)."""
        return fit(self._clean(neutralize_closing(text)))

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(
                    base_url=f"{self.instance}/api/v1",
                    headers={
                        "Authorization": f"token {self.auth.token}",
                        "Accept": "application/json",
                        "User-Agent": "phasegate",
                    },
                    timeout=self.settings.timeout_s,
                    follow_redirects=False,
                    transport=self._transport,
                )
                # Its connections live as long as the forge: closed when it is collected
                # (the engine never closes its forge), so no socket is left to the GC.
                weakref.finalize(self, self._client.close)
            return self._client

    def close(self) -> None:
        """Close the HTTP connections (a later call opens new ones)."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    # -- one call -------------------------------------------------------------------

    def _once(
        self, method: str, path: str, params: Mapping[str, Any] | None, body: Any
    ) -> httpx.Response:
        """One request; a GET answered before is asked with its ETag, and a 304
        hands back the answer kept (as a 200)."""
        client = self._http()
        request = client.build_request(method, path, params=params, json=body)
        key = str(request.url)
        with self._lock:
            known = self._kept.get(key) if method == "GET" else None
        if known is not None:
            request.headers["If-None-Match"] = known[0]
        response = client.send(request)
        if method != "GET":
            return response
        if response.status_code == 304 and known is not None:
            with self._lock:
                self.not_modified += 1
                self._kept.move_to_end(key)
            return httpx.Response(200, headers=known[2], content=known[1], request=request)
        etag = response.headers.get("etag")
        if response.status_code == 200 and etag and len(response.content) <= MAX_KEPT_BYTES:
            # kept decoded: the encoding and length the wire had no longer apply
            headers = {
                k: v
                for k, v in response.headers.items()
                if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
            }
            with self._lock:
                self._kept[key] = (etag, response.content, headers)
                self._kept.move_to_end(key)
                while len(self._kept) > MAX_KEPT:
                    self._kept.popitem(last=False)
        return response

    def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        repeat: bool = True,
    ) -> httpx.Response:
        """``method path`` (under ``/api/v1``) answered 2xx, with the retries the
        module describes; ``repeat`` False: a 5xx, a timeout or no connection is
        raised at once (GiteaUnavailable), a rate limit is still waited out. Raises
        ForgeError (see the module)."""
        what = f"{method} /api/v1{path}"
        waited, retries, attempt = 0.0, 0, 1
        while True:
            try:
                response = self._once(method, path, params, json)
            except httpx.TransportError as exc:
                name = type(exc).__name__
                if not repeat or retries >= self.settings.max_retries:
                    raise self._unreached(what, exc) from exc
                wait = self._backoff(retries)
                retries, attempt = retries + 1, attempt + 1
                report(ForgeRetry(what, name, wait, attempt, "transient"))
                time.sleep(wait)
                continue
            status = response.status_code
            if status < 400:
                return response
            wait_for = rate_limit_wait(response)
            if wait_for is not None:
                if waited + wait_for > self.settings.max_rate_limit_wait_s:
                    raise GiteaUnavailable(
                        f"Gitea rate limit on {what}: it asks to be left alone "
                        f"{wait_for:.0f} s, longer than forge.max_rate_limit_wait_s",
                        call=what,
                        status=status,
                        answered=True,
                        transient=False,
                        retry_after_s=wait_for,
                    )
                waited += wait_for
                attempt += 1
                report(ForgeRetry(what, status, wait_for, attempt, "rate_limit"))
                time.sleep(max(wait_for, 0.01))
                continue
            if status >= 500 and repeat and retries < self.settings.max_retries:
                wait = self._backoff(retries)
                retries, attempt = retries + 1, attempt + 1
                report(ForgeRetry(what, status, wait, attempt, "transient"))
                time.sleep(wait)
                continue
            raise self._refusal(what, response)

    def _backoff(self, retries: int) -> float:
        return min(self.retry_backoff_s * 2**retries, MAX_BACKOFF_S)

    def _unreached(self, what: str, exc: httpx.TransportError) -> GiteaUnavailable:
        name = type(exc).__name__
        if isinstance(exc, httpx.TimeoutException):
            said = (
                f"Gitea did not answer {what} in time (forge.timeout_s); what it asked for "
                "may still happen, and is looked for before it is asked again"
            )
        else:
            said = self._clean(f"Gitea unreachable for {what}: {name}: {exc}")
        return GiteaUnavailable(said, call=what, status=name, answered=False, transient=True)

    def _refusal(self, what: str, response: httpx.Response) -> ForgeError:
        """The ForgeError for Gitea's 4xx or 5xx answer, redacted of the secrets."""
        status = response.status_code
        message = self._clean(_message_of(response))
        credentials = self.auth.credentials
        if status >= 500:
            return GiteaUnavailable(
                f"Gitea answered {status} to {what}: {message}",
                call=what,
                status=status,
                answered=True,
                transient=True,
            )
        if status == 401:
            return ForgeAuthError(
                f"Gitea refused {credentials} (401 {message}): it is wrong, expired or revoked"
            )
        if status == 403:
            hint = ""
            if "scope" in message.lower():
                hint = "; the token needs the scopes repository and issue: read and write"
            return GiteaForbidden(
                f"Gitea refused {what} on {self.repository} with {credentials} "
                f"(403 {message}){hint}"
            )
        if status == 404:
            if what.rstrip("/").endswith(f"/repos/{self.repository}"):
                return ForgeNotFound(
                    f"Gitea at {self.instance} has no repository {self.repository}, or "
                    f"{credentials} cannot see it (404 {message}): check forge.repository "
                    "and the token's access"
                )
            return ForgeNotFound(f"{what}: not found in {self.repository} (404 {message})")
        return GiteaRefused(f"Gitea refused {what} ({status}): {message}", status, message)

    # -- JSON -------------------------------------------------------------------------

    def get(self, path: str, **params: Any) -> Any:
        """The JSON Gitea answers ``GET path`` with."""
        return self.json_of(self.call("GET", path, params=params or None))

    def json_of(self, response: httpx.Response) -> Any:
        """``response``'s JSON; ForgeError when it is none."""
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError as exc:
            raise ForgeError(
                f"Gitea's answer to {response.request.method} {response.request.url.path} "
                f"is not JSON: {response.text[:200]!r}"
            ) from exc

    def pages(self, path: str, **params: Any) -> list[Any]:
        """Every item of every page of the list ``GET path`` answers, PAGE a page.
        The next page is asked for while Gitea's ``Link`` names one (or, from a
        server that sends no Link, while a page is full); by number, not by the
        link's URL, whose host is Gitea's ROOT_URL and may not be the one reached."""
        found: list[Any] = []
        page = 1
        while True:
            response = self.call("GET", path, params={**params, "page": page, "limit": PAGE})
            items = self.json_of(response) or []
            if not isinstance(items, list):
                raise ForgeError(f"Gitea's answer to GET {path} is not a list")
            found.extend(items)
            more = "next" in response.links if "link" in response.headers else len(items) >= PAGE
            if not items or not more:
                return found
            page += 1

    def _create(self, what: str, post: Callable[[], int], find: Callable[[], int | None]) -> int:
        """Make an object with ``post()`` (which calls with ``repeat=False``). When
        Gitea answers 5xx, look for it with ``find`` (the failed try may have made
        it) before trying again, up to ``forge.max_retries`` times more. A timeout
        or a lost connection is ForgeUnavailable at once: Gitea may still be making
        the object, so only a later look (the journal's, on resume, no sooner than
        twice ``forge.timeout_s``: ``retry_after_s``) can tell. Each wait before
        another try is reported. Returns its number or id."""
        for attempt in range(self.settings.max_retries + 1):
            try:
                return post()
            except GiteaUnavailable as exc:
                if not exc.answered:
                    # Gitea may still be making it: the look on resume must come
                    # after a request held past our timeout has landed.
                    exc.retry_after_s = 2 * self.settings.timeout_s
                    raise
                if not exc.transient or attempt == self.settings.max_retries:
                    raise
                log.info("creating %s failed (%s); looking for it before trying again", what, exc)
                call, status = exc.call, exc.status
            found = find()
            if found is not None:
                return found
            wait = self._backoff(attempt)
            report(ForgeRetry(call, status, wait, attempt + 2, "transient"))
            time.sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def git_remote(self) -> GitRemote:
        """The repository's git remote: ``{instance}/{owner}/{name}.git``."""
        return GitRemote(
            self.repo,
            f"{self.instance}/{self.owner}/{self.name}.git",
            lambda: self.auth.token,
            dialect=GITEA_GIT,
            credentials=self.auth.credentials,
            secrets=self.secrets,
            retries=self.settings.max_retries,
            backoff_s=self.retry_backoff_s,
        )
