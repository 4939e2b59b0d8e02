"""How a forge's retries are seen: each wait before another try of a call is one
log line and, for whoever watches the calling thread, one ``ForgeRetry``.

A forge knows no workflow: the engine watches the thread that advances one
(``watching``) and writes each ``ForgeRetry`` as that workflow's event. The
forge reports a retry (``report``) from wherever it waits: githubkit's retry
decision (``forge.github.faults.RetryPolicy``), a create looked up before it is
repeated (``GitHubAPI._create``), a push or fetch tried again (``GitRemote``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ForgeRetry", "RetryObserver", "report", "watching"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForgeRetry:
    """One wait before another try of a forge call.

    ``call``: what was asked (``GET /repos/octo/app/issues/3``, ``git push``);
    ``status``: what came back (an HTTP status, or the failure's name when
    nothing did: ``ReadTimeout``, ``ConnectError``); ``wait_s``: seconds waited
    before the next try; ``attempt``: the number of that next try (2 after the
    first failure); ``why``: ``rate_limit`` (the forge asked to wait) or
    ``transient`` (a 5xx, a timeout, no connection).
    """

    call: str
    status: int | str
    wait_s: float
    attempt: int
    why: Literal["rate_limit", "transient"]

    def as_data(self) -> dict[str, Any]:
        """The event's data: ``{call, status, wait_s, attempt, why}``."""
        return {
            "call": self.call,
            "status": self.status,
            "wait_s": round(self.wait_s, 3),
            "attempt": self.attempt,
            "why": self.why,
        }

    def describe(self) -> str:
        """One line: ``GET /x answered 502; try 2 in 0.50 s``."""
        answered = f"answered {self.status}" if isinstance(self.status, int) else self.status
        waits = "rate limit: waiting" if self.why == "rate_limit" else "trying again in"
        return f"{self.call} {answered}; {waits} {self.wait_s:.2f} s (try {self.attempt})"


RetryObserver = Callable[[ForgeRetry], None]

# Per thread (each thread starts with an empty context): a worker advances many
# workflows at once through one forge.
_observer: ContextVar[RetryObserver | None] = ContextVar("forge_retry_observer", default=None)


@contextmanager
def watching(observer: RetryObserver) -> Iterator[None]:
    """Hand every ``ForgeRetry`` reported in this thread to ``observer`` until the
    block ends (an inner ``watching`` takes over until its own end)."""
    token = _observer.set(observer)
    try:
        yield
    finally:
        _observer.reset(token)


def report(retry: ForgeRetry) -> None:
    """Log ``retry`` as a warning (a long wait must never look like a hang) and hand
    it to the thread's observer, if any. An observer's failure is logged, never
    raised: it must not end the call it watches."""
    log.warning("forge retry: %s", retry.describe())
    observer = _observer.get()
    if observer is None:
        return
    try:
        observer(retry)
    except Exception as exc:  # the event is a view of the retry; the call goes on
        log.warning("forge retry not recorded: %s", exc)
