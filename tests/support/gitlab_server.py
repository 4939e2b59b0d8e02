"""A stateful fake GitLab on 127.0.0.1: REST v4 with GitLab's shapes, git over smart HTTP.

``GitLabServer`` is a ``GitLab`` (gitlab_state.py) served by FastAPI under
uvicorn in a background thread, on a free port::

    with GitLabServer() as gl:                       # gl.url: http://127.0.0.1:PORT
        alice = gl.add_user("alice")                 # alice.tokens[0] authenticates her
        project = gl.create_project("acme/app", "alice", from_path=checkout)
        gl.add_member("acme/app", "bot", "developer")
        bot, token = gl.project_token("acme/app", "maintainer")
        project.only_allow_merge_if_pipeline_succeeds = True
        gl.fail("PUT", r"/merge$", 429, times=1, headers={"Retry-After": "1"})
        ...                                          # python-gitlab at gl.url

A person starts one from tests/ with ``python -m support.gitlab_server
[--port 8124] [--repo-dir D] [--project GROUP/NAME]``: the project is public,
with ``maintainer`` its Owner, ``phasegate-bot``, ``dev`` Developers,
``reporter`` a Reporter, ``guest`` a Guest and ``stranger`` no member; it
prints the URL, each person's token and the clone URL, and serves until
Ctrl-C. ``POST /projects/:id/hooks`` adds a webhook over REST.

- REST under ``/api/v4`` (gitlab_routes.py): ``PRIVATE-TOKEN: T`` or
  ``Authorization: Bearer T``; none or an unknown one is 401
  ``{"message": "401 Unauthorized"}``. A project is named by id or by its
  URL-encoded path (``acme%2Fapp``), a branch may hold an encoded ``/``.
  Errors are GitLab's JSON: ``{"message": ...}``, Grape's ``{"error": ...}``.
- Git: ``{url}/GROUP/NAME.git`` through ``git http-backend``, HTTP basic
  auth with a token as password (``oauth2:TOKEN`` as GitLab documents, any
  user name) and 401 ``WWW-Authenticate: Basic realm="GitLab"`` otherwise;
  fetching needs Reporter, pushing Developer (branch protection is not
  modelled on push).
- Faults on demand: ``fail(method, path_regex, status, times=N, headers=…,
  body=…)`` answers instead of GitLab; ``delay(method, path_regex, seconds)``
  holds a request first and then handles it.
- Webhooks (gitlab_hooks.py): ``hooks.add(project, url, token, events)``;
  issues, notes, merge requests and pipelines are delivered with
  ``X-Gitlab-Event``, ``X-Gitlab-Token`` and ``X-Gitlab-Event-UUID``.
- What tests look at: ``requests`` (method, path, query, status, username,
  body; never a credential) and the model (``project(...).merge_requests``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: ``support`` is a package of tests/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastapi import FastAPI, Request, Response  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from starlette.concurrency import run_in_threadpool  # noqa: E402
from starlette.exceptions import HTTPException as StarletteHTTPException  # noqa: E402
from starlette.types import ASGIApp, Message, Receive, Scope, Send  # noqa: E402

from support.fake_http import (  # noqa: E402
    Fault,
    ServedForge,
    basic_password,
    buffered,
    plain,
    serve_git,
    wait_for_signal,
)
from support.gitlab_hooks import GitLabHooks  # noqa: E402
from support.gitlab_json import Shapes  # noqa: E402
from support.gitlab_model import ACCESS, GitLabError, Project, User  # noqa: E402
from support.gitlab_routes import ROUTES, Call, Route  # noqa: E402
from support.gitlab_state import GitLab, utc_now  # noqa: E402

__all__ = ["Fault", "GitLabServer", "Recorded", "main"]

DEFAULT_PORT = 8124
#: The people a fake started by hand holds beside its owner and the bot, with their role.
PEOPLE = {"dev": "developer", "reporter": "reporter", "guest": "guest", "stranger": ""}
_REASONS = {
    400: "400 Bad request", 401: "401 Unauthorized", 403: "403 Forbidden", 404: "404 Not Found",
    405: "405 Method Not Allowed", 409: "409 Conflict", 422: "422 Unprocessable Entity",
    429: "429 Too Many Requests", 500: "500 Internal Server Error", 502: "502 Bad Gateway",
    503: "503 Service Unavailable",
}  # fmt: skip


@dataclass(frozen=True)
class Recorded:
    """One request answered: ``username`` is who its token named (None if none)."""

    method: str
    path: str
    query: str
    status: int
    username: str | None = None
    body: Any = None


class GitLabServer(ServedForge, GitLab):
    """The fake GitLab, served. ``start()`` returns ``url``; ``stop()`` ends it."""

    title = "fake GitLab"

    def __init__(self, root: Path | None = None, clock: Callable[[], datetime] = utc_now) -> None:
        super().__init__(self.serving_root(root, "fake-gitlab-"), clock)
        self.hooks = GitLabHooks(self)
        self.requests: list[Recorded] = []
        self.shapes = Shapes("http://127.0.0.1", self)

    def asgi_app(self) -> ASGIApp:
        return _Observe(build_app(self), self)

    def served_at(self, url: str) -> None:
        self.shapes = Shapes(url, self)

    def announce(
        self, project: Project, event: str, render: Callable[[str], dict[str, Any]]
    ) -> None:
        self.hooks.announce(project, event, render(self.url))

    def clone_url(self, ref: str | int, token: str | None = None) -> str:
        """The project's HTTP clone URL, with ``oauth2:TOKEN@`` when given."""
        project = self.project(ref)
        netloc = self.url.removeprefix("http://")
        auth = f"oauth2:{token}@" if token else ""
        return f"http://{auth}{netloc}/{project.full_path}.git"

    # -- callers --------------------------------------------------------------------------
    def header_user(self, headers: dict[str, str]) -> User | None:
        """The user of ``PRIVATE-TOKEN`` or ``Authorization: Bearer`` (lower-case names)."""
        if "private-token" in headers:
            return self.token_user(headers["private-token"])
        scheme, _, token = headers.get("authorization", "").partition(" ")
        return self.token_user(token.strip()) if scheme.lower() == "bearer" else None

    def basic_user(self, authorization: str | None) -> User | None:
        return self.token_user(basic_password(authorization))


class _Observe:
    """ASGI middleware: a project path named by its encoded full path becomes its
    id; planned delays and faults; every request recorded."""

    def __init__(self, app: ASGIApp, gl: GitLabServer) -> None:
        self.app, self.gl = app, gl

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        gl, method = self.gl, scope["method"]
        scope["path"] = path = _routable(gl, scope.get("raw_path") or scope["path"].encode())
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        user = gl.header_user(headers) or gl.basic_user(headers.get("authorization"))
        state = scope.setdefault("state", {})
        state["fake_gitlab_body"] = None
        query = scope.get("query_string", b"").decode("latin-1")

        async def observed(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen = Recorded(
                    method, path, query, message["status"], user.username if user else None,
                    state["fake_gitlab_body"],
                )  # fmt: skip
                with gl.lock:
                    gl.requests.append(seen)
            await send(message)

        delay = gl.planned(method, path, delays=True)
        if delay is not None:
            receive = await buffered(receive)
            await asyncio.sleep(delay.delay_s)
        fault = gl.planned(method, path, delays=False)
        if fault is None:
            await self.app(scope, receive, observed)
            return
        body = (
            fault.body
            if fault.body is not None
            else {"message": _REASONS.get(fault.status, "Error")}
        )
        await JSONResponse(body, fault.status, headers=fault.headers)(scope, receive, observed)


def _routable(gl: GitLabServer, raw: bytes) -> str:
    """The request path with an encoded project path (``acme%2Fapp``) replaced by its id."""
    parts = raw.decode("latin-1").split("?")[0].split("/")
    if parts[1:4] == ["api", "v4", "projects"] and len(parts) > 4:
        name = urllib.parse.unquote(parts[4])
        if not name.isdigit():
            try:
                parts[4] = str(gl.project(name).id)
            except GitLabError:
                parts[4] = "0"
    return "/".join(urllib.parse.unquote(p) for p in parts)


def build_app(gl: GitLabServer) -> FastAPI:
    """The FastAPI app serving ``gl``: every REST route of gitlab_routes.py and git."""
    app = FastAPI(title="fake GitLab", openapi_url=None, docs_url=None, redoc_url=None)

    @app.exception_handler(GitLabError)
    async def refused(request: Request, err: GitLabError) -> JSONResponse:
        return JSONResponse(err.body, err.status, err.headers)

    @app.exception_handler(StarletteHTTPException)
    async def unrouted(request: Request, err: StarletteHTTPException) -> JSONResponse:
        message = (
            "404 Not Found" if err.status_code == 404 else _REASONS.get(err.status_code, "Error")
        )
        return JSONResponse(
            {"error" if err.status_code == 404 else "message": message}, err.status_code
        )

    for r in ROUTES:
        app.add_api_route(r.path, _endpoint(gl, r), methods=[r.method], name=r.handler.__name__)

    @app.api_route("/{project:path}.git/{rest:path}", methods=["GET", "POST"])
    async def git_http(request: Request) -> Response:
        return await _git(gl, request)

    return app


def _endpoint(gl: GitLabServer, r: Route) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        raw = await request.body()
        args: dict[str, Any] = dict(request.query_params)
        kind = request.headers.get("content-type", "")
        if raw.strip() and "json" in kind:
            try:
                parsed = json.loads(raw)
            except ValueError:
                raise GitLabError(400, "400 Bad request - body is not valid JSON") from None
            if isinstance(parsed, dict):
                args.update(parsed)
        elif raw.strip():
            args.update(urllib.parse.parse_qsl(raw.decode(), keep_blank_values=True))
        request.scope["state"]["fake_gitlab_body"] = args or None
        actor = gl.header_user({k.lower(): v for k, v in request.headers.items()})
        if actor is None:
            raise GitLabError(401, "401 Unauthorized")
        call = Call(gl, str(request.url), dict(request.path_params), args, actor)

        def handle() -> Any:
            with gl.lock:
                return r.handler(call)

        result = await run_in_threadpool(handle)
        if call.status == 204:
            return Response(status_code=204, headers=call.headers)
        return JSONResponse(result, call.status, call.headers)

    return endpoint


async def _git(gl: GitLabServer, request: Request) -> Response:
    """Smart HTTP through ``git http-backend``: basic auth with a token, roles, then the CGI."""
    params = request.path_params
    user = gl.basic_user(request.headers.get("authorization"))
    if user is None:
        return plain(
            "HTTP Basic: Access denied\n", 401, {"WWW-Authenticate": 'Basic realm="GitLab"'}
        )
    try:
        project = gl.project(params["project"])
    except GitLabError:
        return plain("The project you were looking for could not be found.\n", 404)
    push = "git-receive-pack" in (params["rest"] + request.url.query)
    level = project.level(user)
    if level < ACCESS["reporter"]:
        return plain("The project you were looking for could not be found.\n", 404)
    if push and level < ACCESS["developer"]:
        return plain("You are not allowed to push code to this project.\n", 403)
    path_info = f"/{project.full_path}.git/{params['rest']}"
    return await serve_git(request, gl.root, path_info, user.username)


def main(argv: list[str] | None = None) -> int:
    """Serve a fake GitLab for a person until Ctrl-C (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--repo-dir", type=Path, help="a checkout whose branches seed the project")
    parser.add_argument("--project", default="acme/app", help="GROUP/NAME")
    args = parser.parse_args(argv)
    gl = GitLabServer()
    gl.start(args.port)
    try:
        for name in ("maintainer", "phasegate-bot", *PEOPLE):
            gl.add_user(name)
        project = gl.create_project(args.project, "maintainer", from_path=args.repo_dir)
        gl.add_member(args.project, "phasegate-bot", "developer")
        for name, role in PEOPLE.items():
            if role:
                gl.add_member(args.project, name, role)
        # public: a signed-in stranger reads it, opens issues and writes notes, as on GitLab
        project.visibility = "public"
        # main's protection lets Developers merge, as docs/gitlab.md sets a project up
        project.merge_level = ACCESS["developer"]
        print(f"fake GitLab at {gl.url}  (API {gl.url}/api/v4)")
        print(f"maintainer token:    {gl.users['maintainer'].tokens[0]}  (Owner)")
        print(f"phasegate-bot token: {gl.users['phasegate-bot'].tokens[0]}  (GITLAB_TOKEN)")
        for name, role in PEOPLE.items():
            said = role.title() if role else "no member"
            print(f"{name + ' token:':<21}{gl.users[name].tokens[0]}  ({said})")
        print(f"clone: git clone {gl.clone_url(args.project, 'TOKEN')}")
        sys.stdout.flush()
        wait_for_signal()
    finally:
        gl.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
