"""How GitHub's faults become phasegate's: which calls are
tried again, for how long, and the ``ForgeError`` a call that still fails raises.

``RetryPolicy`` is githubkit's ``auto_retry`` decision (githubkit sleeps in the
calling thread between tries; no store transaction is open during a forge call,
the journal commits its ``in_progress`` row first):

- a rate limit (403/429 with ``Retry-After`` or ``x-ratelimit-remaining: 0`` and
  ``x-ratelimit-reset``; a bare 429 waits GitHub's documented minute) is waited
  out while the waits of one call add up to ``forge.max_rate_limit_wait_s`` at
  most; the request was refused, so repeating any request is safe;
- a 5xx, a timeout or a connection failure is tried ``forge.max_retries`` times
  more with a doubling backoff, except a POST that creates something (an issue,
  a comment, a pull request, a repository): its first try may have happened, so
  the forge looks for it before repeating it (``GitHubForge._create``).

``translate`` maps what is left::

    ForgeError
     ├── ForgeUnavailable   5xx, timeouts, no connection, a rate limit past its bound
     ├── ForgeAuthError     401 (names the token variable), 403 (GitHub's message and
     │                      the permission it wants, from x-accepted-github-permissions)
     ├── ForgeNotFound      404 (names the repository)
     └── GitHubRefused      anything else GitHub refused (405/409 merge, 422), with
                            its status and GitHub's own message
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from datetime import timedelta

import httpx
import pydantic
from githubkit.exception import (
    AuthCredentialError,
    AuthExpiredError,
    GitHubException,
    RateLimitExceeded,
    RequestError,
    RequestFailed,
    RequestTimeout,
)
from githubkit.retry import RetryOption

from phasegate.core.redaction import redact
from phasegate.forge.base import ForgeAuthError, ForgeError, ForgeNotFound, ForgeUnavailable
from phasegate.forge.retries import ForgeRetry, report

__all__ = ["BARE_429_WAIT_S", "GitHubRefused", "RetryPolicy", "call_of", "status_of", "translate"]

#: What a 429 without Retry-After or x-ratelimit-reset waits (GitHub: "at least one minute").
BARE_429_WAIT_S = 60.0
#: The longest backoff between two tries of a failing request, seconds.
MAX_BACKOFF_S = 8.0

# POSTs whose repeat would make a second object: never repeated blind.
_CREATES = re.compile(r"/(?:issues|issues/\d+/comments|pulls|user/repos)$")


class GitHubRefused(ForgeError):
    """GitHub refused a call for a reason of its own (``status``: 405, 409, 422 …);
    the message is GitHub's."""

    def __init__(self, message: str, status: int, github_message: str) -> None:
        super().__init__(message)
        self.status = status
        self.github_message = github_message


def _inner(exc: GitHubException) -> GitHubException:
    # githubkit wraps what fails inside an auth flow (an App's token request) in a
    # RequestError around the real RequestFailed.
    while isinstance(exc, RequestError) and isinstance(exc.exc, GitHubException):
        exc = exc.exc
    return exc


def _request_of(exc: GitHubException) -> httpx.Request | None:
    if isinstance(exc, RequestFailed | RequestTimeout):
        return exc.request
    if isinstance(exc, RequestError) and isinstance(exc.exc, httpx.RequestError):
        try:
            return exc.exc.request
        except RuntimeError:  # httpx raises when the error was made without a request
            return None
    return None


def rate_limit_wait(exc: GitHubException) -> float | None:
    """Seconds GitHub asks to wait before trying again, or None when ``exc`` is no
    rate limit."""
    exc = _inner(exc)
    if isinstance(exc, RateLimitExceeded):
        return max(exc.retry_after.total_seconds(), 0.0)
    if isinstance(exc, RequestFailed) and exc.response.status_code == 429:
        return BARE_429_WAIT_S
    return None


def is_transient(exc: GitHubException) -> bool:
    """A 5xx, a timeout, or no connection at all: another try may answer."""
    exc = _inner(exc)
    if isinstance(exc, RequestFailed):
        return exc.response.status_code >= 500
    return isinstance(exc, RequestTimeout) or (
        isinstance(exc, RequestError) and isinstance(exc.exc, httpx.TransportError)
    )


def answered(exc: GitHubException) -> bool:
    """Whether GitHub answered at all (with an error status): it is done with the
    request, so whatever it did is there to be found."""
    return isinstance(_inner(exc), RequestFailed)


def creates(request: httpx.Request | None) -> bool:
    """Whether ``request`` is a POST that makes a new object (see ``_CREATES``)."""
    return (
        request is not None and request.method == "POST" and bool(_CREATES.search(request.url.path))
    )


class RetryPolicy:
    """githubkit's ``auto_retry``: ``(exc, retry_count) -> RetryOption``.

    ``max_rate_limit_wait_s``: the rate-limit waits of one call, summed, at most
    (seconds). ``max_retries``: tries past the first on a transient failure.
    ``backoff_s``: the first wait after one (doubled each time, at most 8 s).
    The running totals are per thread: a call's tries all run in its thread.
    Each wait it decides on is reported (``phasegate.forge.retries.report``): a
    log line, and an event on the workflow whose thread makes the call.
    """

    def __init__(self, max_rate_limit_wait_s: float, max_retries: int, backoff_s: float) -> None:
        self.max_rate_limit_wait_s = max_rate_limit_wait_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self._call = threading.local()

    def __call__(self, exc: GitHubException, retry_count: int) -> RetryOption:
        if retry_count == 0:
            self._call.waited_s = 0.0
            self._call.retries = 0
        request = _request_of(_inner(exc)) or _request_of(exc)
        wait = rate_limit_wait(exc)
        if wait is not None:
            if self._call.waited_s + wait > self.max_rate_limit_wait_s:
                return RetryOption(False)
            self._call.waited_s += wait
            report(ForgeRetry(_what(request), status_of(exc), wait, retry_count + 2, "rate_limit"))
            # githubkit reads a zero timedelta as "no advice" and sleeps a minute.
            return RetryOption(True, timedelta(seconds=max(wait, 0.01)))
        if not is_transient(exc) or creates(request) or self._call.retries >= self.max_retries:
            return RetryOption(False)
        delay = min(self.backoff_s * 2**self._call.retries, MAX_BACKOFF_S)
        self._call.retries += 1
        report(ForgeRetry(_what(request), status_of(exc), delay, retry_count + 2, "transient"))
        return RetryOption(True, timedelta(seconds=max(delay, 0.001)))


def _what(request: httpx.Request | None) -> str:
    return f"{request.method} {request.url.path}" if request is not None else "a request"


def call_of(exc: GitHubException) -> str:
    """The call ``exc`` failed, as ``METHOD /path`` (``a request`` when it has none)."""
    return _what(_request_of(_inner(exc)) or _request_of(exc))


def status_of(exc: GitHubException) -> int | str:
    """The HTTP status GitHub answered, or the failure's name when it answered none."""
    exc = _inner(exc)
    if isinstance(exc, RequestFailed):
        return exc.response.status_code
    if isinstance(exc, RequestError):
        return type(exc.exc).__name__
    return type(exc).__name__


def _github_message(response: httpx.Response) -> str:
    """GitHub's own words: ``message`` and any ``errors`` of its JSON error body."""
    try:
        data = response.json()
    except ValueError:
        return response.text[:500]
    if not isinstance(data, dict):
        return str(data)[:500]
    message = str(data.get("message", "")) or response.reason_phrase
    errors = data.get("errors")
    if isinstance(errors, list) and errors:
        details = [
            str(e.get("message") or e.get("code") or e) if isinstance(e, dict) else str(e)
            for e in errors
        ]
        message += " (" + "; ".join(details) + ")"
    return message


def translate(
    exc: Exception,
    *,
    repository: str,
    credentials: str,
    secrets: Sequence[str] = (),
) -> ForgeError:
    """The ``ForgeError`` for what githubkit raised (see the module's tree).

    ``repository`` (owner/name) is named by a 404; ``credentials`` says whose
    credentials a 401 refused (``the token in GITHUB_TOKEN``, ``the GitHub App
    42``). Every message is redacted of ``secrets``.
    """
    error = _translate(exc, repository, credentials)
    cleaned = redact(str(error), secrets)
    if cleaned != str(error):
        error.args = (cleaned,)
    return error


def _translate(exc: Exception, repository: str, credentials: str) -> ForgeError:
    if isinstance(exc, pydantic.ValidationError):
        return ForgeError(f"githubkit refused what phasegate was to send: {exc}")
    if isinstance(exc, AuthCredentialError | AuthExpiredError):
        return ForgeAuthError(f"GitHub credentials unusable ({credentials}): {exc}")
    if isinstance(exc, ValueError | KeyError):
        return ForgeError(f"GitHub's answer is not what its API describes: {exc!r}")
    if not isinstance(exc, GitHubException):
        return ForgeError(f"GitHub call failed: {exc!r}")
    inner = _inner(exc)
    what = _what(_request_of(inner) or _request_of(exc))
    wait = rate_limit_wait(inner)
    if wait is not None:
        return ForgeUnavailable(
            f"GitHub rate limit on {what}: it asks to be left alone {wait:.0f} s, longer "
            "than forge.max_rate_limit_wait_s",
            retry_after_s=wait,
        )
    if isinstance(inner, RequestTimeout):
        return ForgeUnavailable(
            f"GitHub did not answer {what} in time (forge.timeout_s); what it asked for "
            "may still happen, and is looked for before it is asked again"
        )
    if isinstance(inner, RequestError) and not isinstance(inner, RequestFailed):
        return ForgeUnavailable(
            f"GitHub unreachable for {what}: {type(inner.exc).__name__}: {inner.exc}"
        )
    if not isinstance(inner, RequestFailed):
        return ForgeError(f"GitHub call failed: {inner!r}")
    response = inner.response.raw_response
    status = response.status_code
    message = _github_message(response)
    if status >= 500:
        return ForgeUnavailable(f"GitHub answered {status} to {what}: {message}")
    if status == 401:
        return ForgeAuthError(
            f"GitHub refused {credentials} (401 {message}): it is wrong, expired or revoked"
        )
    if status == 403:
        wanted = response.headers.get("x-accepted-github-permissions")
        needs = f"; the call needs the permission {wanted}" if wanted else ""
        return ForgeAuthError(
            f"GitHub refused {what} on {repository} with {credentials} (403 {message}){needs}"
        )
    if status == 404:
        request = _request_of(inner)
        if request is not None and request.url.path.rstrip("/").endswith(f"/repos/{repository}"):
            return ForgeNotFound(
                f"GitHub has no repository {repository}, or {credentials} cannot see it "
                f"(404 {message}): check forge.repository and the token's access"
            )
        return ForgeNotFound(f"{what}: not found in {repository} (404 {message})")
    return GitHubRefused(f"GitHub refused {what} ({status}): {message}", status, message)
