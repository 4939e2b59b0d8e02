"""A stateful fake GitHub on 127.0.0.1: REST with GitHub's shapes, git over smart HTTP.

``GitHubServer`` is a ``GitHub`` (github_state.py: the model and what people
do) served over HTTP by FastAPI under uvicorn, in a background thread, on a
free port::

    with GitHubServer() as gh:                      # gh.url: http://127.0.0.1:PORT
        alice = gh.add_user("alice")                # alice.token authenticates her
        gh.create_repo("alice", "app", from_path=checkout)
        gh.grant("alice/app", "bob", "write")
        gh.fail("POST", r"/pulls$", 429, times=1, headers={"Retry-After": "1"})
        ...                                         # phasegate's GitHubForge at gh.url
        gh.review("alice/app", 2, "bob", "APPROVED")
        assert gh.counts("alice/app")["pulls"] == 1

- REST (github_routes.py): ``Authorization: token T`` or ``Bearer T``; no or
  an unknown token is 401 ``Bad credentials``. Every answer carries
  ``x-ratelimit-*`` headers counting the caller's requests, like GitHub's.
  GitHub's sharp edges are kept: pull requests are listed among issues (with
  ``pull_request``), a ``head`` filter without ``owner:`` is ignored, a body
  over 65536 characters is 422, closing keywords (``Fixes #N``) close the
  issue when the pull request merges into the default branch.
- Git: each repository's ``clone_url`` is ``{url}/git/OWNER/NAME.git``,
  served by ``git http-backend`` (one subprocess per request, bodies
  streamed both ways). It wants HTTP basic auth with a token as password
  (any user name, GitHub's ``x-access-token`` too) and answers 401 with
  ``WWW-Authenticate: Basic realm="GitHub"`` so git asks its askpass
  helper; fetching needs read, pushing write.
- GitHub Apps: ``add_app(app_id, public_key_pem, installation_id)``; the
  App's RS256 JWT (``iss`` its id, at most 10 minutes) is verified on
  ``/app/installations/{id}/access_tokens`` and ``/repos/{o}/{r}/installation``;
  minted installation tokens (an hour) act as ``SLUG[bot]``.
- Faults on demand: ``fail(method, path_regex, status, times=N, headers=…,
  body=…)`` answers instead of GitHub; ``delay(method, path_regex, seconds,
  times=N)`` holds the request that long first and then handles it, so a
  client that timed out may still find its side effect done, as on GitHub.
- What people do, in Python (github_state.py, github_pulls.py): ``add_user``
  (with ``permissions``), ``grant``, ``open_issue``, ``edit_issue``,
  ``label``/``unlabel`` (a labeled event with the actor), ``comment``,
  ``review`` (APPROVED, CHANGES_REQUESTED, COMMENTED; inline ``(path, line,
  body)`` comments get the real diff hunk), ``check_run``/``update_check_run``,
  ``status``, ``merge_by_hand``, ``close_pull``; ``mergeable_unknown_reads``
  makes a pull request's ``mergeable`` null for a few reads after it changes.
- What tests look at: ``requests`` (method, path, query, status, login, JSON
  body; never a credential), ``counts(repo)``, ``bare_path(repo)``, and the
  model itself (``repo(...).issues``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from subprocess import PIPE
from typing import Any

import jwt
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from support import github_ci, github_people  # noqa: F401  (each registers its routes in ROUTES)
from support.github_git import backend_env
from support.github_hooks import HookDeliveries
from support.github_json import Shapes
from support.github_model import App, GitHubError, Repo, User, utc_now
from support.github_routes import ROUTES, Call, Route
from support.github_state import GitHub

__all__ = ["Fault", "GitHubServer", "Recorded"]

DOCS = "https://docs.github.com/rest"
RATE_LIMIT = 5000
#: How long a GitHub App JWT may live (GitHub refuses an ``exp`` further than 10 minutes).
JWT_MAX_S = 600
INSTALLATION_TOKEN_S = 3600


@dataclass(frozen=True)
class Recorded:
    """One request the server answered. ``login`` is who its credential named
    (None if none or a bad one); ``body`` the parsed JSON of a REST request."""

    method: str
    path: str
    query: str
    status: int
    login: str | None = None
    body: Any = None


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


def error_body(
    status: int, message: str, errors: list[dict[str, str] | str] | None = None
) -> dict[str, Any]:
    """GitHub's error JSON (``basic-error``, or ``validation-error`` with ``errors``)."""
    body: dict[str, Any] = {"message": message, "documentation_url": DOCS, "status": str(status)}
    if errors is not None:
        body["errors"] = errors
    return body


_REASONS = {
    401: "Bad credentials",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    422: "Validation Failed",
    429: "API rate limit exceeded",
    500: "Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


class GitHubServer(GitHub):
    """The fake GitHub, served. ``start()`` returns ``url``; ``stop()`` ends it
    (and removes ``root`` when the server made it). Use as a context manager."""

    def __init__(self, root: Path | None = None, clock: Callable[[], datetime] = utc_now) -> None:
        self._own_root = root is None
        super().__init__(
            Path(tempfile.mkdtemp(prefix="fake-github-")) if root is None else root, clock
        )
        self.hooks = HookDeliveries(self)
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []
        self.url = ""
        self.shapes = Shapes("http://127.0.0.1", self.association)
        self._used: dict[str, tuple[int, int]] = {}  # login → (window start, requests used)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, port: int = 0) -> str:
        """Serve on 127.0.0.1 (``port`` 0: a free one); the base URL, once serving."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.shapes = Shapes(self.url, self.association)
        config = uvicorn.Config(
            _Observe(build_app(self), self),
            log_level="warning",
            access_log=False,
            lifespan="off",
            # A delayed request still running must not hold stop() for long.
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="fake-github", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake GitHub did not start")
            time.sleep(0.01)
        return self.url

    def announce(
        self, r: Repo, event: str, sender: User, render: Callable[[Shapes], dict[str, Any]]
    ) -> None:
        self.hooks.announce(r, event, sender, render)

    def stop(self) -> None:
        self.hooks.stop()
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = self._thread = None
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> GitHubServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults -----------------------------------------------------------------------------
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
        """Answer the next ``times`` matching requests with ``status`` (body:
        GitHub's error JSON unless given), handling none of them. E.g. 429 with
        ``{"Retry-After": "1"}``, or 403 with ``{"x-ratelimit-remaining": "0",
        "x-ratelimit-reset": str(epoch)}``."""
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

    def _planned(self, method: str, path: str, delays: bool) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if (fault.delay_s > 0) == delays and fault.matches(method, path):
                    fault.times -= 1
                    return fault
            return None

    # -- callers ------------------------------------------------------------------------------
    def association(self, repo: Repo, user: User) -> str:
        """GitHub's ``author_association`` of ``user`` on ``repo``."""
        if user is repo.owner:
            return "OWNER"
        perm = repo.collaborators.get(user.login)
        return "COLLABORATOR" if perm not in (None, "none") else "NONE"

    def token_user(self, authorization: str | None) -> User | None:
        """Who ``Authorization: token T`` / ``Bearer T`` names; None if nobody."""
        scheme, _, credential = (authorization or "").partition(" ")
        if scheme.lower() not in ("token", "bearer") or not credential.strip():
            return None
        return self.user_for_token(credential.strip())

    def basic_user(self, authorization: str | None) -> User | None:
        """Who HTTP basic auth names: its password is a token (any user name)."""
        scheme, _, encoded = (authorization or "").partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            _, _, password = base64.b64decode(encoded.strip()).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return self.user_for_token(password)

    def app_for_jwt(self, authorization: str | None) -> App:
        """The App whose RS256 JWT ``Authorization: Bearer`` carries; GitHubError 401 if none."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            raise GitHubError(401, "A JSON web token could not be decoded")
        try:
            claims = jwt.decode(token.strip(), options={"verify_signature": False})
            app = self.apps.get(int(claims["iss"]))
        except (jwt.PyJWTError, KeyError, TypeError, ValueError):
            raise GitHubError(401, "A JSON web token could not be decoded") from None
        if app is None:
            raise GitHubError(401, "Integration not found")
        try:
            claims = jwt.decode(
                token.strip(),
                app.public_key_pem,
                algorithms=["RS256"],
                options={"require": ["iat", "exp", "iss"]},
                leeway=60,
            )
        except jwt.ExpiredSignatureError:
            raise GitHubError(401, "'Expiration time' claim ('exp') is in the past") from None
        except jwt.PyJWTError:
            raise GitHubError(401, "A JSON web token could not be decoded") from None
        if int(claims["exp"]) - int(claims["iat"]) > JWT_MAX_S + 60:
            raise GitHubError(401, "'Expiration time' claim ('exp') is too far in the future")
        return app

    def mint_installation_token(self, app: App) -> tuple[str, datetime]:
        """A new installation token of ``app`` and when it expires (an hour)."""
        expires_at = datetime.now(UTC).replace(microsecond=0) + timedelta(
            seconds=INSTALLATION_TOKEN_S
        )
        return self.mint_token(app, expires_at), expires_at

    def rate_headers(self, login: str | None, counted: bool = True) -> dict[str, str]:
        """GitHub's ``x-ratelimit-*`` headers for one more request by ``login``
        (``counted``: it costs one of the hour's requests)."""
        now = int(time.time())
        with self.lock:
            start, used = self._used.get(login or "", (now, 0))
            if now - start >= 3600:
                start, used = now, 0
            used += 1 if counted else 0
            self._used[login or ""] = (start, used)
        return {
            "x-ratelimit-limit": str(RATE_LIMIT),
            "x-ratelimit-remaining": str(max(0, RATE_LIMIT - used)),
            "x-ratelimit-reset": str(start + 3600),
            "x-ratelimit-used": str(used),
            "x-ratelimit-resource": "core",
        }


class _Observe:
    """ASGI middleware: planned delays and faults first, then the app; records
    each request and adds the rate-limit headers to REST answers."""

    def __init__(self, app: ASGIApp, gh: GitHubServer) -> None:
        self.app, self.gh = app, gh

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        gh, method, path = self.gh, scope["method"], scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        user = gh.token_user(headers.get("authorization")) or gh.basic_user(
            headers.get("authorization")
        )
        login = user.login if user else None
        rest = not path.startswith("/git/")
        version = headers.get("x-github-api-version", "2022-11-28")
        state = scope.setdefault("state", {})
        state["fake_github_body"] = None
        query = scope.get("query_string", b"").decode("latin-1")

        def record(status: int) -> None:
            # Before the answer leaves: a test that got its answer finds it recorded.
            recorded = Recorded(method, path, query, status, login, state["fake_github_body"])
            with gh.lock:
                gh.requests.append(recorded)

        async def observed(message: Message) -> None:
            if message["type"] == "http.response.start":
                record(message["status"])
                if rest:
                    counted = message["status"] != 304  # a 304 costs no rate limit
                    extra = gh.rate_headers(login, counted) | {
                        "x-github-api-version-selected": version
                    }
                    present = {k.decode("latin-1").lower() for k, _ in message.get("headers", [])}
                    message["headers"] = list(message.get("headers", [])) + [
                        (k.encode(), v.encode()) for k, v in extra.items() if k not in present
                    ]
            await send(message)

        delay = gh._planned(method, path, delays=True)
        if delay is not None:
            # The request is read before the wait and handled after it, whether
            # the client is still there or not: a timeout does not undo the work.
            receive = await _buffered(receive)
            await asyncio.sleep(delay.delay_s)
        fault = gh._planned(method, path, delays=False)
        if fault is None:
            await self.app(scope, receive, observed)
            return
        reason = _REASONS.get(fault.status, "Error")
        if fault.status == 403 and fault.headers.get("x-ratelimit-remaining") == "0":
            reason = f"API rate limit exceeded for user ID {user.id if user else 0}."
        elif fault.status in (403, 429) and "retry-after" in {k.lower() for k in fault.headers}:
            reason = "You have exceeded a secondary rate limit. Please wait a few minutes."
        body = fault.body if fault.body is not None else error_body(fault.status, reason)
        await JSONResponse(body, fault.status, headers=fault.headers)(scope, receive, observed)


async def _buffered(receive: Receive) -> Receive:
    """``receive`` read to the end of the request body now, replayed later."""
    messages: list[Message] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            break

    async def replay() -> Message:
        if messages:
            return messages.pop(0)
        return await receive()

    return replay


def build_app(gh: GitHubServer) -> FastAPI:
    """The FastAPI app serving ``gh``: every REST route of github_routes.py and git."""
    app = FastAPI(title="fake GitHub", openapi_url=None, docs_url=None, redoc_url=None)

    @app.exception_handler(GitHubError)
    async def refused(request: Request, err: GitHubError) -> JSONResponse:
        return JSONResponse(
            error_body(err.status, err.message, err.errors), err.status, err.headers
        )

    @app.exception_handler(StarletteHTTPException)
    async def unrouted(request: Request, err: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            error_body(err.status_code, _REASONS.get(err.status_code, "Error")), err.status_code
        )

    for r in ROUTES:
        app.add_api_route(r.path, _endpoint(gh, r), methods=[r.method], name=r.handler.__name__)

    @app.api_route("/git/{owner}/{name}.git/{rest:path}", methods=["GET", "POST"])
    async def git_http(request: Request) -> Response:
        return await _git(gh, request)

    return app


def _endpoint(gh: GitHubServer, r: Route) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw.strip() else None
        except ValueError:
            raise GitHubError(400, "Problems parsing JSON") from None
        request.scope["state"]["fake_github_body"] = body
        authorization = request.headers.get("authorization")
        call = Call(gh, request.url, dict(request.path_params), dict(request.query_params), body)
        if r.auth == "app":
            call.app = gh.app_for_jwt(authorization)
        else:
            call.actor = gh.token_user(authorization)
            if call.actor is None:
                message = "Bad credentials" if authorization else "Requires authentication"
                raise GitHubError(401, message)

        def handle() -> Any:
            with gh.lock:
                return r.handler(call)

        result = await run_in_threadpool(handle)
        if call.status == 204:  # No Content: GitHub sends no body at all
            return Response(status_code=204, headers=call.headers)
        response = JSONResponse(result, call.status, call.headers)
        if request.method == "GET" and call.status == 200:
            # GitHub's conditional requests: the same answer again is a 304, uncounted.
            etag = f'W/"{hashlib.sha256(response.body).hexdigest()[:40]}"'
            if request.headers.get("if-none-match") == etag:
                return Response(status_code=304, headers={**call.headers, "ETag": etag})
            response.headers["ETag"] = etag
        return response

    return endpoint


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


async def _git(gh: GitHubServer, request: Request) -> Response:
    """Smart HTTP through ``git http-backend``: basic auth, then the CGI, streamed."""
    params = request.path_params
    # Basic (git's askpass) or a token header (``http.extraHeader``).
    authorization = request.headers.get("authorization")
    user = gh.basic_user(authorization) or gh.token_user(authorization)
    if user is None:
        return Response(
            "Authentication failed\n",
            401,
            {"WWW-Authenticate": 'Basic realm="GitHub"'},
            media_type="text/plain",
        )
    try:
        repo = gh.repo(f"{params['owner']}/{params['name']}")
    except GitHubError:
        return Response("Repository not found.\n", 404, media_type="text/plain")
    push = "git-receive-pack" in (params["rest"] + request.url.query)
    have = gh.permission(repo, user.login)
    if have == "none":
        return Response("Repository not found.\n", 404, media_type="text/plain")
    if push and have not in ("write", "maintain", "admin"):
        message = f"Permission to {repo.full_name}.git denied to {user.login}.\n"
        return Response(message, 403, media_type="text/plain")
    env = backend_env(
        gh.root,
        f"/{repo.owner.login}/{repo.name}.git/{params['rest']}",
        request.method,
        request.url.query,
        {k.lower(): v for k, v in request.headers.items()},
        user.login,
    )
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
            while chunk := await run_in_threadpool(stdout.read1, 65536):
                yield chunk
            await feeding
            await run_in_threadpool(proc.wait)
        finally:
            if proc.poll() is None:  # the client went away mid-answer
                proc.kill()
                await run_in_threadpool(proc.wait)
            stdout.close()
        if push and proc.returncode == 0:
            with gh.lock:
                repo.pushed_at = gh._at(None)

    return _CGIResponse(body(), status, headers)
