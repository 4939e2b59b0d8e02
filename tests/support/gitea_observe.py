"""What stands in front of the fake Gitea's app: faults, delays, the record, the check.

``Observe`` is ASGI middleware. For each request it waits as a planned
delay says, answers as a planned fault says, records what was asked and
answered (``Recorded``), and, for the API under ``/api/v1`` when the server
has a ``check``, shows the whole exchange (``Exchange``: the request's
JSON body and the answer's) to it before the answer leaves: a request the
check refuses is answered 422 and never handled, an answer it refuses is
replaced by a 502; either way the reason is kept in ``violations``, as a
validating proxy would report it. Git's traffic streams through untouched.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from support.fake_http import Recorded, buffered, read_whole

if TYPE_CHECKING:
    from support.gitea_server import GiteaServer

__all__ = ["REASONS", "Exchange", "Observe", "Recorded"]

REASONS = {
    400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 409: "Conflict", 422: "Unprocessable Entity",
    429: "Too Many Requests", 500: "Internal Server Error", 502: "Bad Gateway",
    503: "Service Unavailable",
}  # fmt: skip


@dataclass(frozen=True)
class Exchange:
    """One API request and its answer, as a description checks them. ``request``
    and ``answer`` are the parsed JSON bodies (None when empty); ``status`` is
    None while only the request is being checked."""

    method: str
    path: str
    query: str
    request: Any
    status: int | None = None
    answer: Any = None


def _json(raw: bytes) -> Any:
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


class Observe:
    """The middleware (see the module docstring) around ``app`` for ``gitea``."""

    def __init__(self, app: ASGIApp, gitea: GiteaServer) -> None:
        self.app, self.gitea = app, gitea

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        gitea, method, path = self.gitea, scope["method"], scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        query = scope.get("query_string", b"").decode("latin-1")
        api = path.startswith("/api/v1/")
        _, user = gitea.caller(headers, {})
        raw = b""
        if api:  # read whole: the check sees the body, the app gets it replayed
            raw, receive = await read_whole(receive)
        asked = _json(raw) if api else None

        def record(status: int) -> None:
            seen = Recorded(method, path, query, status, user.login if user else None, asked)
            with gitea.lock:
                gitea.requests.append(seen)

        delay = gitea.planned(method, path, delays=True)
        if delay is not None:
            if not api:  # the work is done whether the client waited or not
                receive = await buffered(receive)
            await asyncio.sleep(delay.delay_s)
        fault = gitea.planned(method, path, delays=False)
        if fault is not None:
            body = fault.body if fault.body is not None else {
                "message": REASONS.get(fault.status, "Error"), "url": gitea.url + "/api/swagger"
            }  # fmt: skip
            record(fault.status)
            await JSONResponse(body, fault.status, headers=fault.headers)(scope, receive, send)
            return
        check = gitea.check if api else None
        if check is None:

            async def observed(message: Message) -> None:
                if message["type"] == "http.response.start":
                    record(message["status"])
                await send(message)

            await self.app(scope, receive, observed)
            return
        refused = _refusal(check, Exchange(method, path, query, asked))
        if refused is not None:
            gitea.violations.append(f"{method} {path} request: {refused}")
            record(422)
            answer = {"message": f"the request breaks Gitea's description: {refused}"}
            await JSONResponse(answer, 422)(scope, receive, send)
            return
        messages: list[Message] = []

        async def held(message: Message) -> None:
            messages.append(message)

        await self.app(scope, receive, held)
        start = next(m for m in messages if m["type"] == "http.response.start")
        out = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
        status = int(start["status"])
        refused = _refusal(check, Exchange(method, path, query, asked, status, _json(out)))
        if refused is not None:
            gitea.violations.append(f"{method} {path} answer {status}: {refused}")
            record(502)
            answer = {"message": f"the answer breaks Gitea's description: {refused}"}
            await JSONResponse(answer, 502)(scope, receive, send)
            return
        record(status)
        for message in messages:
            await send(message)


def _refusal(check: Any, exchange: Exchange) -> str | None:
    try:
        check(exchange)
    except ValueError as broken:  # DescriptionError is one
        return str(broken)
    return None
