"""``POST /webhooks/<forge>``: a forge's deliveries into ``phasegate serve``.

No session and no CSRF token: a delivery proves itself by the forge's
signature (``phasegate.integrations.webhooks``). The answer is JSON: 202 with
the workflows woken, started and commanded, 200 for a ping or another repository's
delivery, or the refusal's status with ``detail``. Every refusal is logged.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from phasegate.integrations.webhooks import MAX_BODY_BYTES, WebhookRefused, receive
from phasegate.operations import MAX_TICKET_BYTES
from phasegate.runtime.engine import Engine
from phasegate.store import StoreUnavailable

__all__ = ["PREFIX", "router"]

log = logging.getLogger(__name__)

#: Where deliveries arrive; the dashboard's session guard passes these paths by.
PREFIX = "/webhooks/"


def router(engine: Engine) -> APIRouter:
    """The webhook route on ``engine``'s store and cartridge."""
    routes = APIRouter()
    # the labels reported ignored, kept across deliveries: each is logged once
    reported: set[tuple[int, str]] = set()

    @routes.post(PREFIX + "{forge}")
    async def delivery(forge: str, request: Request) -> JSONResponse:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                break  # receive refuses it by its size
        headers = dict(request.headers)
        client = request.client.host if request.client else "?"
        try:
            got = await run_in_threadpool(
                receive, engine, forge, headers, body,
                max_ticket_bytes=MAX_TICKET_BYTES, reported=reported,
            )  # fmt: skip
        except WebhookRefused as exc:
            log.warning(
                "webhook from %s to %s%s refused (%s): %s", client, PREFIX, forge, exc.status, exc
            )
            return JSONResponse({"detail": str(exc)}, exc.status)
        except StoreUnavailable as exc:
            # The forge retries a delivery that failed: it is not lost.
            return JSONResponse({"detail": f"the store is unavailable: {exc}"}, 503)
        said = {
            "event": got.event,
            "woke": got.woke,
            "started": got.started,
            "commanded": got.commanded,
        }
        if got.ignored:
            log.info("webhook %s from %s: %s", got.event, client, got.ignored)
            return JSONResponse({**said, "ignored": got.ignored}, 200)
        log.info("webhook %s from %s woke %s, started %s", got.event, client, got.woke, got.started)
        return JSONResponse(said, 202)

    return routes
