"""Conditional requests: a GET GitHub answered before is asked again with its ETag.

GitHub answers ``304 Not Modified`` to a GET whose ``If-None-Match`` names the
ETag of what it would send, and a 304 does not count against the rate limit
(docs/webhooks.md: polling). ``ConditionalTransport`` sits under githubkit's
client: it keeps the newest answer to each GET by URL and Accept header,
sends its ETag with the next, and hands the kept answer back, as a 200, when
GitHub says nothing changed. Every request still reaches GitHub, so nothing is
read stale: a lookup after a crash sees GitHub as it is now.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import httpx

__all__ = ["MAX_KEPT", "MAX_KEPT_BYTES", "ConditionalTransport"]

#: How many answers are kept (the least recently asked go first).
MAX_KEPT = 512
#: The largest answer kept, in bytes: a bigger one is asked for whole each time.
MAX_KEPT_BYTES = 1024 * 1024


class ConditionalTransport(httpx.BaseTransport):
    """``inner`` (an ``httpx.HTTPTransport``), with conditional GETs.

    githubkit opens and closes a client per call, and each close closes this
    transport: ``inner``'s connections close then, the kept answers stay for the
    forge's next call (an HTTP transport's pool opens new connections after a close)."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner
        self.kept: OrderedDict[tuple[str, str], httpx.Response] = OrderedDict()
        self.not_modified = 0  # answers GitHub confirmed with a 304
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method != "GET":
            return self.inner.handle_request(request)
        key = (str(request.url), request.headers.get("accept", ""))
        with self._lock:
            known = self.kept.get(key)
        if known is not None:
            request.headers["If-None-Match"] = known.headers["etag"]
        response = self.inner.handle_request(request)
        if response.status_code == 304 and known is not None:
            response.close()
            with self._lock:
                self.kept.move_to_end(key)
                self.not_modified += 1
            headers = {**known.headers, **response.headers}
            return httpx.Response(200, headers=headers, content=known.content, request=request)
        if response.status_code != 200 or "etag" not in response.headers:
            return response
        content = response.read()
        if len(content) <= MAX_KEPT_BYTES:
            kept = httpx.Response(200, headers=response.headers, content=content)
            with self._lock:
                self.kept[key] = kept
                self.kept.move_to_end(key)
                while len(self.kept) > MAX_KEPT:
                    self.kept.popitem(last=False)
        return response

    def close(self) -> None:
        self.inner.close()
