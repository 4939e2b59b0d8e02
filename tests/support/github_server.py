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
import hashlib
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jwt
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from support import github_ci, github_people  # noqa: F401  (each registers its routes in ROUTES)
from support.fake_http import (
    Fault,
    Recorded,
    ServedForge,
    basic_password,
    buffered,
    plain,
    serve_git,
)
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


class GitHubServer(ServedForge, GitHub):
    """The fake GitHub, served. ``start()`` returns ``url``; ``stop()`` ends it
    (and removes ``root`` when the server made it). Use as a context manager."""

    title = "fake GitHub"

    def __init__(self, root: Path | None = None, clock: Callable[[], datetime] = utc_now) -> None:
        super().__init__(self.serving_root(root, "fake-github-"), clock)
        self.hooks = HookDeliveries(self)
        self.requests: list[Recorded] = []
        self.shapes = Shapes("http://127.0.0.1", self.association)
        self._used: dict[str, tuple[int, int]] = {}  # login → (window start, requests used)

    # -- lifecycle (fake_http.ServedForge) ----------------------------------------------------
    def asgi_app(self) -> ASGIApp:
        return _Observe(build_app(self), self)

    def served_at(self, url: str) -> None:
        self.shapes = Shapes(url, self.association)

    def announce(
        self, r: Repo, event: str, sender: User, render: Callable[[Shapes], dict[str, Any]]
    ) -> None:
        self.hooks.announce(r, event, sender, render)

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
        password = basic_password(authorization)
        return None if password is None else self.user_for_token(password)

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

        delay = gh.planned(method, path, delays=True)
        if delay is not None:
            # The request is read before the wait and handled after it, whether
            # the client is still there or not: a timeout does not undo the work.
            receive = await buffered(receive)
            await asyncio.sleep(delay.delay_s)
        fault = gh.planned(method, path, delays=False)
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


async def _git(gh: GitHubServer, request: Request) -> Response:
    """Smart HTTP through ``git http-backend``: basic auth, then the CGI, streamed."""
    params = request.path_params
    # Basic (git's askpass) or a token header (``http.extraHeader``).
    authorization = request.headers.get("authorization")
    user = gh.basic_user(authorization) or gh.token_user(authorization)
    if user is None:
        return plain("Authentication failed\n", 401, {"WWW-Authenticate": 'Basic realm="GitHub"'})
    try:
        repo = gh.repo(f"{params['owner']}/{params['name']}")
    except GitHubError:
        return plain("Repository not found.\n", 404)
    push = "git-receive-pack" in (params["rest"] + request.url.query)
    have = gh.permission(repo, user.login)
    if have == "none":
        return plain("Repository not found.\n", 404)
    if push and have not in ("write", "maintain", "admin"):
        message = f"Permission to {repo.full_name}.git denied to {user.login}.\n"
        return plain(message, 403)

    def pushed() -> None:
        with gh.lock:
            repo.pushed_at = gh.clock().replace(microsecond=0)

    path_info = f"/{repo.owner.login}/{repo.name}.git/{params['rest']}"
    return await serve_git(request, gh.root, path_info, user.login, pushed)
