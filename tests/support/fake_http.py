"""What every fake forge serves alike: faults on demand, buffered bodies, git over smart HTTP.

The fake GitHub, GitLab and Gitea differ in their paths, JSON and rules of
who may do what; under those they share:

- ``Fault`` and ``Faults``: a planned answer (a status, its headers and body)
  or a wait, for the next requests matching a method and a path;
- ``buffered`` (``read_whole``): a request body read whole before a planned wait,
  so the work is done whether the client is still there or not (a timeout does
  not undo it);
- ``serve_git``: ``git http-backend`` as a CGI, its answer streamed, once the
  forge has said who may read or push;
- ``Serving``: uvicorn on a thread of its own, started and stopped;
- ``Recorded``: one request a fake answered, as its tests read it;
- ``Route`` and ``routes_under``: the REST routes a fake registers, by decorator;
- ``ServedForge``: a fake forge's life around it (``start``, ``stop``, ``with``),
  with ``basic_password``, ``plain`` and ``wait_for_signal`` its servers share,
  and ``served_by_hand``: a fake run as a person runs it, for its tests.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from subprocess import PIPE
from typing import IO, Any, Protocol, Self

import uvicorn
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from support.github_git import backend_env

__all__ = [
    "Fault",
    "Faults",
    "Recorded",
    "Route",
    "ServedForge",
    "Serving",
    "basic_password",
    "buffered",
    "plain",
    "read_whole",
    "routes_under",
    "serve_git",
    "served_by_hand",
    "wait_for_signal",
]


@dataclass
class Fault:
    """A planned answer: ``status`` (or, with ``delay_s``, a wait) for the next
    ``times`` requests whose method is ``method`` (``*``: any) and whose path
    matches ``path_regex`` (``re.search``)."""

    method: str
    path_regex: str
    status: int
    times: int
    headers: dict[str, str]
    body: Any
    delay_s: float = 0.0

    def matches(self, method: str, path: str) -> bool:
        return (
            self.times > 0
            and self.method in ("*", method)
            and bool(re.search(self.path_regex, path))
        )


class Faults:
    """The faults planned on a fake forge (mixed into its server: ``lock``, ``faults``)."""

    lock: threading.RLock
    faults: list[Fault]

    def fail(
        self,
        method: str,
        path_regex: str,
        status: int,
        *,
        times: int = 1,
        headers: dict[str, str] | None = None,
        body: Any = None,
    ) -> Fault:
        """Answer the next ``times`` matching requests with ``status`` (body: the
        forge's own error JSON unless given), handling none of them. E.g. 429 with
        ``{"Retry-After": "1"}``."""
        fault = Fault(method.upper(), path_regex, status, times, dict(headers or {}), body)
        with self.lock:
            self.faults.append(fault)
        return fault

    def delay(self, method: str, path_regex: str, seconds: float, *, times: int = 1) -> Fault:
        """Hold the next ``times`` matching requests ``seconds`` before handling them."""
        fault = Fault(method.upper(), path_regex, 0, times, {}, None, delay_s=seconds)
        with self.lock:
            self.faults.append(fault)
        return fault

    def planned(self, method: str, path: str, delays: bool) -> Fault | None:
        """The fault (``delays``: the wait) planned for this request, one of its
        ``times`` spent; None when none is."""
        with self.lock:
            for fault in self.faults:
                if (fault.delay_s > 0) == delays and fault.matches(method, path):
                    fault.times -= 1
                    return fault
            return None


@dataclass(frozen=True)
class Recorded:
    """One request a fake answered. ``login`` is who its credential named (None
    if none or a bad one); ``body`` the parsed JSON of a REST request."""

    method: str
    path: str
    query: str
    status: int
    login: str | None = None
    body: Any = None


@dataclass(frozen=True)
class Route:
    """A REST route of a fake forge: ``handler`` answers ``method`` on ``path``."""

    method: str
    path: str
    handler: Callable[[Any], Any]


def routes_under(
    routes: list[Route], prefix: str
) -> Callable[[str, str], Callable[[Callable[[Any], Any]], Callable[[Any], Any]]]:
    """The ``@route(method, path)`` decorator registering a handler in ``routes``
    for ``prefix + path``."""

    def route(method: str, path: str) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
        def register(handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
            routes.append(Route(method, prefix + path, handler))
            return handler

        return register

    return route


async def buffered(receive: Receive) -> Receive:
    """``receive`` read to the end of the request body now, replayed later."""
    return (await read_whole(receive))[1]


async def read_whole(receive: Receive) -> tuple[bytes, Receive]:
    """The request body read to its end, and a ``receive`` that replays it."""
    messages: list[Message] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            break
    raw = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")

    async def replay() -> Message:
        if messages:
            return messages.pop(0)
        return await receive()

    return raw, replay


class _CGIResponse(Response):
    """A streamed answer that, unlike Starlette's StreamingResponse, never calls
    ``receive`` to watch for a disconnect: that would take request body chunks
    the backend is still reading (git's pushes stream while it answers)."""

    def __init__(self, chunks: AsyncIterator[bytes], status: int, headers: dict[str, str]) -> None:
        self.chunks = chunks
        self.status_code = status
        self.raw_headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()
        ]
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        async for chunk in self.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def serve_git(
    request: Request,
    root: Path,
    path_info: str,
    login: str,
    pushed: Callable[[], None] | None = None,
) -> Response:
    """``git http-backend`` on the bare repositories under ``root`` for
    ``path_info`` (``/owner/name.git/info/refs`` …), as ``login``, its answer
    streamed; ``pushed`` is called once a push succeeded. Who may read or push
    is the caller's to decide first."""
    headers_in: Mapping[str, str] = {k.lower(): v for k, v in request.headers.items()}
    env = backend_env(root, path_info, request.method, request.url.query, headers_in, login)
    push = "git-receive-pack" in (path_info + request.url.query)
    # A plain Popen driven from worker threads: asyncio's child watcher, off the
    # main thread, can lose a child's exit status to other waiters.
    proc = subprocess.Popen(["git", "http-backend"], env=env, stdin=PIPE, stdout=PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    async def feed() -> None:
        # Fed beside reading: a backend that answers before it read everything
        # must not wait on a pipe nobody drains.
        try:
            async for chunk in request.stream():
                await run_in_threadpool(stdin.write, chunk)
        finally:
            await run_in_threadpool(stdin.close)

    feeding = asyncio.create_task(feed())
    status, headers = 200, {}
    while line := (await run_in_threadpool(stdout.readline)).rstrip(b"\r\n"):
        name, _, value = line.decode("latin-1").partition(":")
        if name.lower() == "status":
            status = int(value.split()[0])
        else:
            headers[name] = value.strip()
    if not headers:  # the backend died before it answered
        feeding.cancel()
        code = await run_in_threadpool(proc.wait)
        return Response(f"git http-backend exited {code}\n", 500, media_type="text/plain")

    async def body() -> AsyncIterator[bytes]:
        try:
            while chunk := await run_in_threadpool(stdout.read1, 65536):  # type: ignore[attr-defined]
                yield chunk
            await feeding
            await run_in_threadpool(proc.wait)
        finally:
            if proc.poll() is None:  # the client went away mid-answer
                proc.kill()
                await run_in_threadpool(proc.wait)
            stdout.close()
        if push and proc.returncode == 0 and pushed is not None:
            pushed()

    return _CGIResponse(body(), status, headers)


class Serving:
    """An ASGI app served by uvicorn on 127.0.0.1 (``port`` 0: a free one), on a
    thread of its own: ``url`` is known at once, ``run`` returns once it serves."""

    def __init__(self, port: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    def run(self, app: ASGIApp, name: str) -> None:
        """Serve ``app``; RuntimeError naming ``name`` when it did not start in 10 s."""
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            # A delayed request still running must not hold stop() for long.
            timeout_graceful_shutdown=2,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, name=name, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"the {name} did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        if self.server is not None and self.thread is not None:
            self.server.should_exit = True
            self.thread.join(timeout=10)
            self.server = self.thread = None
        self.sock.close()


class Stoppable(Protocol):
    def stop(self) -> None: ...


class ServedForge(Faults):
    """A fake forge's life on 127.0.0.1, mixed into its server before its model.

    The server calls ``serving_root`` in its ``__init__`` (a temporary root of
    its own when none is given, removed again by ``stop``) and says what it
    serves (``asgi_app``), what it is called (``title``) and what must learn
    its URL once known (``served_at``). ``start`` serves it and returns
    ``url``; ``stop`` ends its webhooks' deliveries and the serving; as a
    context manager it is started and stopped around the block."""

    title = "fake forge"
    root: Path
    hooks: Stoppable

    def serving_root(self, root: Path | None, prefix: str) -> Path:
        """``root``, or a new temporary one (``prefix``) the forge owns; readies the rest."""
        self.owns_root = root is None
        self.faults: list[Fault] = []
        self.url = ""
        self.serving: Serving | None = None
        return Path(tempfile.mkdtemp(prefix=prefix)) if root is None else root

    def asgi_app(self) -> ASGIApp:
        raise NotImplementedError

    def served_at(self, url: str) -> None:
        """Called with the base URL before the first request is served."""

    def start(self, port: int = 0) -> str:
        """Serve on 127.0.0.1 (``port`` 0: a free one); the base URL, once serving."""
        self.serving = Serving(port)
        self.url = self.serving.url
        self.served_at(self.url)
        self.serving.run(self.asgi_app(), self.title)
        return self.url

    def stop(self) -> None:
        self.hooks.stop()
        if self.serving is not None:
            self.serving.stop()
            self.serving = None
        if self.owns_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def basic_password(authorization: str | None) -> str | None:
    """The password of HTTP basic auth (where a fake forge takes a token); None
    when ``authorization`` is not basic or does not decode."""
    scheme, _, encoded = (authorization or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        return base64.b64decode(encoded.strip()).decode().partition(":")[2]
    except (binascii.Error, UnicodeDecodeError):
        return None


def plain(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    """A ``text/plain`` answer, as a forge's git endpoint gives one."""
    return Response(message, status, headers, media_type="text/plain")


def wait_for_signal() -> None:
    """Block until Ctrl-C or SIGTERM: a fake forge served for a person."""
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()


@contextlib.contextmanager
def served_by_hand(module: str) -> Iterator[IO[str]]:
    """``python -m MODULE --port 0`` started from tests/ as a person starts a fake;
    what it prints, read line by line. Terminated after the block."""
    tests = Path(__file__).resolve().parents[1]
    with subprocess.Popen(
        [sys.executable, "-m", module, "--port", "0"], cwd=tests, stdout=PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            yield proc.stdout
        finally:
            proc.terminate()
            proc.wait(10)
