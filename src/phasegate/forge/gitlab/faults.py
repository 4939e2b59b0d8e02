"""How GitLab's faults become phasegate's: which requests are tried again, for
how long, and the ``ForgeError`` a request that still fails raises.

``RetryPolicy`` decides for every request python-gitlab sends
(``GitLabClient.http_request``: python-gitlab's own retries are off):

- a rate limit (429, waiting ``Retry-After`` or until ``RateLimit-Reset``; a
  bare 429 waits BARE_429_WAIT_S) is waited out while the waits of one call
  add up to ``forge.max_rate_limit_wait_s`` at most: GitLab refused the
  request, so repeating it is safe;
- a 5xx, a timeout or a lost connection is tried ``forge.max_retries`` times
  more with a doubling backoff, except a POST that creates an issue, a note or
  a merge request: its first try may have happened, so the forge looks for it
  before repeating it (``GitLabAPI.create``).

``translate`` maps what is left::

    ForgeError
     ├── ForgeUnavailable   5xx, timeouts, no connection, a rate limit past its bound
     ├── ForgeAuthError     401 (names the token variable), 403 (GitLab's message)
     ├── ForgeNotFound      404 (names the project)
     └── GitLabRefused      anything else GitLab refused (400, 405/406/409 on a
                            merge, 409 on a label), with its status and message
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import requests
from gitlab.exceptions import GitlabError

from phasegate.core.redaction import redact
from phasegate.forge.base import ForgeAuthError, ForgeError, ForgeNotFound, ForgeUnavailable

__all__ = [
    "BARE_429_WAIT_S",
    "MAX_BACKOFF_S",
    "GitLabRefused",
    "Verdict",
    "creates",
    "is_transient",
    "rate_limit_wait",
    "translate",
]

#: What a 429 without Retry-After or RateLimit-Reset waits, seconds.
BARE_429_WAIT_S = 60.0
#: The longest backoff between two tries of a failing request, seconds.
MAX_BACKOFF_S = 8.0

# POSTs whose repeat would make a second object: never repeated blind.
_CREATES = re.compile(r"/(?:issues|issues/\d+/notes|merge_requests|merge_requests/\d+/notes)$")


class GitLabRefused(ForgeError):
    """GitLab refused a call for a reason of its own (``status``: 400, 405, 406,
    409 …); ``gitlab_message`` is GitLab's own."""

    def __init__(self, message: str, status: int, gitlab_message: str) -> None:
        super().__init__(message)
        self.status = status
        self.gitlab_message = gitlab_message


@dataclass(frozen=True)
class Verdict:
    """What one failed try of a request came to: ``wait_s`` before the next
    (None: no next try), and why (``rate_limit`` or ``transient``)."""

    wait_s: float | None
    why: str = "transient"


def creates(method: str, path: str) -> bool:
    """Whether ``method path`` makes an issue, a note or a merge request."""
    return method.upper() == "POST" and bool(_CREATES.search(path.split("?")[0]))


def status_of(exc: BaseException) -> int | None:
    return exc.response_code if isinstance(exc, GitlabError) else None


def is_transient(exc: BaseException) -> bool:
    """A 5xx, a timeout or a lost connection: worth another try."""
    status = status_of(exc)
    if status is not None:
        return status >= 500
    return isinstance(exc, requests.ConnectionError | requests.Timeout)


def answered(exc: BaseException) -> bool:
    """Whether GitLab answered at all (a status), as opposed to a timeout or no connection."""
    return status_of(exc) is not None


def rate_limit_wait(status: int | None, headers: Mapping[str, str] | None) -> float | None:
    """Seconds a 429 asks to be left alone (None when ``status`` is no 429)."""
    if status != 429:
        return None
    headers = headers or {}
    for name in ("Retry-After", "retry-after"):
        if name in headers:
            try:
                return max(float(headers[name]), 0.0)
            except ValueError:
                break
    reset = headers.get("RateLimit-Reset") or headers.get("ratelimit-reset")
    if reset:
        try:
            return max(float(reset) - time.time(), 0.0)
        except ValueError:
            pass
    return BARE_429_WAIT_S


def _message(exc: GitlabError) -> str:
    said = exc.error_message
    return str(said)[:500] if said else f"{exc.response_code}"


def translate(
    exc: BaseException,
    *,
    call: str,
    repository: str,
    credentials: str,
    retry_after_s: float | None = None,
    secrets: Sequence[str] = (),
) -> ForgeError:
    """The ``ForgeError`` for what python-gitlab or requests raised on ``call``
    (``METHOD /path``): see the module's tree. ``repository`` is named by a
    404; ``credentials`` (``the token in GITLAB_TOKEN``) by a 401. Every message
    is redacted of ``secrets``."""
    error = _translate(exc, call, repository, credentials, retry_after_s)
    cleaned = redact(str(error), secrets)
    if cleaned != str(error):
        error.args = (cleaned,)
    return error


def _translate(
    exc: BaseException, call: str, repository: str, credentials: str, wait: float | None
) -> ForgeError:
    if isinstance(exc, requests.Timeout):
        return ForgeUnavailable(
            f"GitLab did not answer {call} in time (forge.timeout_s); what it asked for "
            "may still happen, and is looked for before it is asked again"
        )
    if isinstance(exc, requests.ConnectionError):
        return ForgeUnavailable(f"GitLab unreachable for {call}: {type(exc).__name__}: {exc}")
    if isinstance(exc, ValueError | KeyError | TypeError):
        return ForgeError(f"GitLab's answer to {call} is not what its API describes: {exc!r}")
    if not isinstance(exc, GitlabError) or exc.response_code is None:
        return ForgeError(f"GitLab call {call} failed: {exc!r}")
    status, message = exc.response_code, _message(exc)
    if status == 429:
        return ForgeUnavailable(
            f"GitLab rate limit on {call}: it asks to be left alone {wait or 0:.0f} s, longer "
            "than forge.max_rate_limit_wait_s",
            retry_after_s=wait,
        )
    if status >= 500:
        return ForgeUnavailable(f"GitLab answered {status} to {call}: {message}")
    if status == 401:
        return ForgeAuthError(
            f"GitLab refused {credentials} (401 {message}): it is wrong, expired or revoked"
        )
    if status == 403:
        return ForgeAuthError(
            f"GitLab refused {call} on {repository} with {credentials} (403 {message}): "
            "the token needs the api scope and at least the Developer role"
        )
    if status == 404:
        if "Project Not Found" in message:
            return ForgeNotFound(
                f"GitLab has no project {repository}, or {credentials} cannot see it "
                f"(404 {message}): check forge.repository and the token's membership"
            )
        return ForgeNotFound(f"{call}: not found in {repository} (404 {message})")
    return GitLabRefused(f"GitLab refused {call} ({status}): {message}", status, message)
