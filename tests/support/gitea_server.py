"""A stateful fake Gitea (or Forgejo) on 127.0.0.1: API v1 with Gitea's shapes, git over HTTP.

``GiteaServer`` is a ``Gitea`` (gitea_state.py) served by FastAPI under
uvicorn in a background thread, on a free port::

    with GiteaServer() as gt:                        # gt.url: http://127.0.0.1:PORT
        alice = gt.add_user("alice")                 # alice.tokens[0] authenticates her
        repo = gt.create_repo("alice/app", from_path=checkout)
        gt.add_collaborator("alice/app", "bot", "write")
        gt.fail("POST", r"/merge$", 429, headers={"Retry-After": "1"})
        ...                                          # any Gitea client at gt.url

A person starts one from tests/ with ``python -m support.gitea_server
[--port 8125] [--repo-dir D] [--repo OWNER/NAME] [--bot-permission admin]``:
the repository is public, with ``dev`` a write collaborator, ``guest`` read
and ``stranger`` none; it prints the URL, each person's token and the clone
URL, and serves until Ctrl-C. The bot administers the repository unless told
otherwise: phasegate reads other people's permissions, which Gitea shows
admins only.

- REST under ``/api/v1`` (gitea_routes.py, gitea_pulls.py):
  ``Authorization: token T`` (or ``Bearer T``, or basic auth with the token
  as password); an unknown token is 401, none reads as anonymous (a private
  repository is then 404). Errors are Gitea's JSON:
  ``{"message": ..., "url": ".../api/swagger"}``.
- Git: ``{url}/OWNER/NAME.git`` through ``git http-backend``, HTTP basic
  auth with a token as password (any user name); 401 with
  ``WWW-Authenticate: Basic realm="Gitea"`` without one; fetching needs read,
  pushing write.
- Faults on demand: ``fail(method, path_regex, status, times=N, headers=…,
  body=…)`` answers instead of Gitea; ``delay(method, path_regex, seconds)``
  holds a request first and then handles it.
- Webhooks (gitea_hooks.py): ``hooks.add(repo, url, secret, kinds)``, signed
  with ``X-Gitea-Signature`` and ``X-Forgejo-Signature``.
- ``check``: called with each API exchange (``Exchange``) when set; what it
  raises (``DescriptionError``) is answered instead (422 for a request, 502
  for an answer) and kept in ``violations`` (gitea_description.py sets it).
- What tests look at: ``requests`` (method, path, query, status, login,
  body; never a credential) and the model (``repo(...).issues``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: ``support`` is a package of tests/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastapi import FastAPI, Request, Response  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from starlette.concurrency import run_in_threadpool  # noqa: E402
from starlette.exceptions import HTTPException as StarletteHTTPException  # noqa: E402
from starlette.types import ASGIApp  # noqa: E402

import support.gitea_pulls  # noqa: E402, F401  (registers the pull and status routes)
from support.fake_http import (  # noqa: E402
    Fault,
    ServedForge,
    basic_password,
    plain,
    serve_git,
    wait_for_signal,
)
from support.gitea_hooks import GiteaHooks  # noqa: E402
from support.gitea_json import Shapes  # noqa: E402
from support.gitea_model import GiteaError, Repo, User  # noqa: E402
from support.gitea_observe import Exchange, Observe, Recorded  # noqa: E402
from support.gitea_routes import ROUTES, Call, Route  # noqa: E402
from support.gitea_state import Gitea, utc_now  # noqa: E402

__all__ = ["Exchange", "Fault", "GiteaServer", "Recorded", "main"]

DEFAULT_PORT = 8125
#: The people a fake started by hand holds beside the owner and the bot, with their access.
PEOPLE = {"dev": "write", "guest": "read", "stranger": "none"}


class GiteaServer(ServedForge, Gitea):
    """The fake Gitea, served. ``start()`` returns ``url``; ``stop()`` ends it."""

    title = "fake Gitea"

    def __init__(self, root: Path | None = None, clock: Callable[[], datetime] = utc_now) -> None:
        super().__init__(self.serving_root(root, "fake-gitea-"), clock)
        self.hooks = GiteaHooks(self)
        self.requests: list[Recorded] = []
        self.check: Callable[[Exchange], None] | None = None
        self.violations: list[str] = []
        self.shapes = Shapes("http://127.0.0.1", self)

    def asgi_app(self) -> ASGIApp:
        return Observe(build_app(self), self)

    def served_at(self, url: str) -> None:
        self.shapes = Shapes(url, self)

    def announce(self, repo: Repo, kind: str, render: Callable[[Shapes], dict[str, Any]]) -> None:
        self.hooks.announce(repo, kind, render(self.shapes))

    def clone_url(self, full_name: str, token: str | None = None, login: str = "git") -> str:
        """The repository's HTTP clone URL, with ``login:TOKEN@`` when given."""
        repo = self.repo(full_name)
        netloc = self.url.removeprefix("http://")
        auth = f"{login}:{token}@" if token else ""
        return f"http://{auth}{netloc}/{repo.full_name}.git"

    # -- callers ------------------------------------------------------------------------------
    def caller(self, headers: dict[str, str], query: dict[str, str]) -> tuple[bool, User | None]:
        """(whether credentials were given, whose they are) from ``Authorization``
        (``token``, ``Bearer`` or basic with the token as password) or the
        ``token``/``access_token`` query parameter Gitea still takes."""
        scheme, _, value = headers.get("authorization", "").partition(" ")
        scheme = scheme.lower()
        if scheme in ("token", "bearer"):
            return True, self.token_user(value.strip())
        if scheme == "basic":
            return True, self.basic_user(headers["authorization"])
        for name in ("token", "access_token"):
            if query.get(name):
                return True, self.token_user(query[name])
        return False, None

    def basic_user(self, authorization: str | None) -> User | None:
        return self.token_user(basic_password(authorization))


def build_app(gitea: GiteaServer) -> FastAPI:
    """The FastAPI app serving ``gitea``: every REST route and git."""
    app = FastAPI(title="fake Gitea", openapi_url=None, docs_url=None, redoc_url=None)

    @app.exception_handler(GiteaError)
    async def refused(request: Request, err: GiteaError) -> JSONResponse:
        return JSONResponse(err.body(gitea.url), err.status, err.headers)

    @app.exception_handler(StarletteHTTPException)
    async def unrouted(request: Request, err: StarletteHTTPException) -> Response:
        if err.status_code == 404:
            return Response("404 page not found\n", 404, media_type="text/plain")
        return JSONResponse({"message": str(err.detail), "url": gitea.url + "/api/swagger"},
                            err.status_code)  # fmt: skip

    for r in ROUTES:
        app.add_api_route(r.path, _endpoint(gitea, r), methods=[r.method], name=r.handler.__name__)

    @app.api_route("/{owner}/{name}.git/{rest:path}", methods=["GET", "POST"])
    async def git_http(request: Request) -> Response:
        return await _git(gitea, request)

    return app


def _endpoint(gitea: GiteaServer, r: Route) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        raw = await request.body()
        body: Any = None
        if raw.strip():
            try:
                body = json.loads(raw)
            except ValueError:
                raise GiteaError(422, "invalid JSON body") from None
        query = dict(request.query_params)
        given, actor = gitea.caller({k.lower(): v for k, v in request.headers.items()}, query)
        if given and actor is None:
            raise GiteaError(401, "invalid username, password or token")
        call = Call(gitea, str(request.url), dict(request.path_params), query, body, actor)

        def handle() -> Any:
            with gitea.lock:
                return r.handler(call)

        result = await run_in_threadpool(handle)
        if result is None and call.status in (200, 201, 204):
            return Response(status_code=call.status, headers=call.headers)
        return JSONResponse(result, call.status, call.headers)

    return endpoint


async def _git(gitea: GiteaServer, request: Request) -> Response:
    """Smart HTTP through ``git http-backend``: basic auth with a token, access, then the CGI."""
    params = request.path_params
    user = gitea.basic_user(request.headers.get("authorization"))
    if user is None:
        return plain("Unauthorized\n", 401, {"WWW-Authenticate": 'Basic realm="Gitea"'})
    try:
        repo = gitea.repo(f"{params['owner']}/{params['name']}")
    except GiteaError:
        return plain("Not found.\n", 404)
    push = "git-receive-pack" in (params["rest"] + request.url.query)
    if repo.private and not repo.can(user, "read"):
        return plain("Not found.\n", 404)
    if push and not repo.can(user, "write"):
        return plain("User permission denied for writing.\n", 403)
    path_info = f"/{repo.full_name}.git/{params['rest']}"
    return await serve_git(request, gitea.root, path_info, user.login)


def main(argv: list[str] | None = None) -> int:
    """Serve a fake Gitea for a person until Ctrl-C (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--repo-dir", type=Path, help="a checkout whose branches seed the repo")
    parser.add_argument("--repo", default="alice/app", help="OWNER/NAME")
    parser.add_argument(
        "--bot-permission", default="admin", choices=("read", "write", "admin"),
        help="phasegate-bot's access (admin: it may read other people's permissions)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    owner = str(args.repo).partition("/")[0]
    gitea = GiteaServer()
    gitea.start(args.port)
    try:
        for name in (owner, "phasegate-bot", *PEOPLE):
            gitea.add_user(name)
        # public: a signed-in stranger reads it, opens issues and comments, as on Gitea
        gitea.create_repo(args.repo, from_path=args.repo_dir, private=False)
        gitea.add_collaborator(args.repo, "phasegate-bot", args.bot_permission)
        for name, mode in PEOPLE.items():
            if mode != "none":
                gitea.add_collaborator(args.repo, name, mode)
        print(f"fake Gitea at {gitea.url}  (API {gitea.url}/api/v1)")
        print(f"{owner} token (owner): {gitea.users[owner].tokens[0]}")
        bot = gitea.users["phasegate-bot"].tokens[0]
        print(f"phasegate-bot token ({args.bot_permission}): {bot}  (GITEA_TOKEN)")
        for name, mode in PEOPLE.items():
            print(f"{name} token ({mode}): {gitea.users[name].tokens[0]}")
        print(f"clone: git clone {gitea.clone_url(args.repo, 'TOKEN')}")
        sys.stdout.flush()
        wait_for_signal()
    finally:
        gitea.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
