"""The fake Gitea's REST operations: Gitea API v1 paths, status codes and JSON shapes.

One handler per operation, plain synchronous code run under the model's
lock. It checks the caller's access the way Gitea does (a private
repository is 404 to whoever cannot read it, too weak an access 403, a merge
refused 405 with Gitea's message), calls the model, and returns what
``Shapes`` renders. Bodies are JSON; query parameters are Gitea's. Lists
page with ``page`` and ``limit`` (default 30, at most 50) and say so in
Gitea's headers: ``X-Total-Count`` and ``Link`` (next, last, first, prev).

Access (Gitea's units, simplified to what phasegate meets): reading and
filing issues and comments need read; labelling, editing someone else's
issue, pulls, statuses, reviews that count, merging and deleting a branch
need write; branch protections and other people's permissions need admin.
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from support.fake_http import Route, routes_under
from support.gitea_model import Comment, Event, GiteaError, Issue, Repo, User, iso, not_found

if TYPE_CHECKING:
    from support.gitea_server import GiteaServer

__all__ = ["API", "REPO", "ROUTES", "Call", "Route", "route"]

API = "/api/v1"
REPO = "/repos/{owner}/{repo}"


@dataclass
class Call:
    """One request as a handler sees it; handlers set ``status`` and add ``headers``."""

    gitea: GiteaServer
    url: str
    params: Mapping[str, str]
    query: Mapping[str, str]
    body: Any
    actor: User | None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)

    def me(self) -> User:
        if self.actor is None:
            raise GiteaError(401, "token is required")
        return self.actor

    def repo(self, mode: str = "read") -> Repo:
        return self.gitea.visible(self.params["owner"], self.params["repo"], self.actor, mode)

    def number(self, name: str = "index") -> int:
        try:
            return int(self.params[name])
        except ValueError:
            raise not_found() from None

    def field(self, name: str, default: Any = None) -> Any:
        return self.body.get(name, default) if isinstance(self.body, dict) else default

    def required(self, name: str) -> Any:
        value = self.field(name)
        if value is None or value == "":
            raise GiteaError(422, f"[{name.title()}]: Required")
        return value

    def page(self, items: list[Any]) -> list[Any]:
        """The asked page of ``items`` with Gitea's ``X-Total-Count`` and ``Link``."""
        try:
            limit = min(max(int(self.query.get("limit") or 30), 1), 50)
            page = max(int(self.query.get("page") or 1), 1)
        except ValueError:
            raise GiteaError(422, "page and limit are numbers") from None
        total = len(items)
        pages = max(math.ceil(total / limit), 1)
        self.headers["X-Total-Count"] = str(total)
        split = urllib.parse.urlsplit(self.url)
        query = dict(urllib.parse.parse_qsl(split.query))

        def link(n: int, rel: str) -> str:
            q = urllib.parse.urlencode({**query, "page": n, "limit": limit})
            return f'<{urllib.parse.urlunsplit(split._replace(query=q))}>; rel="{rel}"'

        links = [link(page + 1, "next"), link(pages, "last")] if page < pages else []
        links += [link(1, "first"), link(page - 1, "prev")] if page > 1 else []
        if links:
            self.headers["Link"] = ",".join(links)
        self.headers["Access-Control-Expose-Headers"] = "X-Total-Count, Link"
        return items[(page - 1) * limit : page * limit]


ROUTES: list[Route] = []
route = routes_under(ROUTES, API)


def _since(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise GiteaError(422, f"since: invalid time {value!r}") from None


def _label_filter(repo: Repo, issue: Issue, labels: str | None) -> bool:
    wanted = [n.strip() for n in (labels or "").split(",") if n.strip()]
    names = {repo.labels[i].name for i in issue.labels}
    return all(n in names for n in wanted)


def _can_write_issue(repo: Repo, issue: Issue, actor: User | None) -> bool:
    return repo.can(actor, "write") or (actor is not None and issue.user.id == actor.id)


# -- the caller and the repository -----------------------------------------------------------


#: The Gitea version the fake answers as (the description's version too).
VERSION = "1.27.3"


@route("GET", "/version")
def version(c: Call) -> Any:
    return {"version": VERSION}


@route("GET", "/user")
def current_user(c: Call) -> Any:
    return c.gitea.shapes.user(c.me())


@route("GET", REPO)
def get_repo(c: Call) -> Any:
    return c.gitea.shapes.repository(c.repo(), c.actor)


@route("GET", REPO + "/collaborators")
def list_collaborators(c: Call) -> Any:
    repo = c.repo()
    people = [u for u in c.gitea.users.values() if u.id in repo.collaborators]
    return [c.gitea.shapes.user(u) for u in c.page(people)]


@route("GET", REPO + "/collaborators/{collaborator}")
def is_collaborator(c: Call) -> Any:
    repo = c.repo()
    user = c.gitea.user(c.params["collaborator"])
    if user.id not in repo.collaborators:
        raise not_found()
    c.status = 204


@route("PUT", REPO + "/collaborators/{collaborator}")
def add_collaborator(c: Call) -> Any:
    repo = c.repo("admin")
    user = c.gitea.user(c.params["collaborator"])
    mode = str(c.field("permission") or "write")
    if mode not in ("read", "write", "admin"):
        raise GiteaError(422, f"invalid permission: {mode}")
    repo.collaborators[user.id] = mode
    c.status = 204


@route("GET", REPO + "/collaborators/{collaborator}/permission")
def collaborator_permission(c: Call) -> Any:
    repo = c.repo()
    name = c.params["collaborator"]
    me = c.me()
    if not me.is_admin and me.login.lower() != name.lower() and not repo.can(me, "admin"):
        raise GiteaError(
            403,
            "Only admins can query all permissions, repo admins can query all repo "
            "permissions, collaborators can query only their own",
        )
    return c.gitea.shapes.permission(repo, c.gitea.user(name))


# -- labels ------------------------------------------------------------------------------------


@route("GET", REPO + "/labels")
def list_labels(c: Call) -> Any:
    repo = c.repo()
    return [c.gitea.shapes.label(repo, lb) for lb in c.page(list(repo.labels.values()))]


@route("POST", REPO + "/labels")
def create_label(c: Call) -> Any:
    repo = c.repo("write")
    label = c.gitea.create_label(
        repo, str(c.required("name")), str(c.required("color")),
        str(c.field("description") or ""), bool(c.field("exclusive", False)),
    )  # fmt: skip
    c.status = 201
    return c.gitea.shapes.label(repo, label)


# -- issues ------------------------------------------------------------------------------------


@route("GET", REPO + "/issues")
def list_issues(c: Call) -> Any:
    repo = c.repo()
    state = c.query.get("state") or "open"
    kind = c.query.get("type") or ""
    since = _since(c.query.get("since"))
    found = [
        i for i in repo.issues.values()
        if (state == "all" or i.state == state)
        and (kind != "issues" or i.pull is None) and (kind != "pulls" or i.pull is not None)
        and (since is None or i.updated_at >= since)
        and _label_filter(repo, i, c.query.get("labels"))
    ]  # fmt: skip
    found.sort(key=lambda i: i.id, reverse=True)
    return [c.gitea.shapes.issue(repo, i) for i in c.page(found)]


@route("POST", REPO + "/issues")
def create_issue(c: Call) -> Any:
    repo = c.repo()
    title = str(c.required("title"))
    labels = c.field("labels") or [] if repo.can(c.actor, "write") else []
    issue = c.gitea.open_issue(
        repo.full_name, c.me().login, title, str(c.field("body") or ""), list(labels)
    )
    if c.field("closed"):
        c.gitea.set_state(repo, issue, c.me(), "closed")
    c.status = 201
    return c.gitea.shapes.issue(repo, issue)


@route("GET", REPO + "/issues/{index}")
def get_issue(c: Call) -> Any:
    repo = c.repo()
    return c.gitea.shapes.issue(repo, c.gitea.issue(repo, c.number()))


@route("PATCH", REPO + "/issues/{index}")
def edit_issue(c: Call) -> Any:
    repo = c.repo()
    issue = c.gitea.issue(repo, c.number())
    if not _can_write_issue(repo, issue, c.me()):
        raise GiteaError(403, "user should have permission to edit issue")
    c.gitea.edit(repo, issue, c.me(), {k: v for k, v in (c.body or {}).items() if k != "labels"})
    c.status = 201
    return c.gitea.shapes.issue(repo, issue)


def _labelling(c: Call) -> tuple[Repo, Issue]:
    repo = c.repo()
    issue = c.gitea.issue(repo, c.number())
    if not repo.can(c.me(), "write"):
        raise GiteaError(403, "user should have a permission to write to a repo")
    return repo, issue


@route("GET", REPO + "/issues/{index}/labels")
def list_issue_labels(c: Call) -> Any:
    repo = c.repo()
    issue = c.gitea.issue(repo, c.number())
    return [c.gitea.shapes.label(repo, repo.labels[i]) for i in issue.labels]


@route("POST", REPO + "/issues/{index}/labels")
def add_issue_labels(c: Call) -> Any:
    repo, issue = _labelling(c)
    added = c.gitea.label_names(repo, list(c.field("labels") or []))
    c.gitea.set_labels(repo, issue, c.me(), [*issue.labels, *added])
    return [c.gitea.shapes.label(repo, repo.labels[i]) for i in issue.labels]


@route("PUT", REPO + "/issues/{index}/labels")
def replace_issue_labels(c: Call) -> Any:
    repo, issue = _labelling(c)
    c.gitea.set_labels(
        repo, issue, c.me(), c.gitea.label_names(repo, list(c.field("labels") or []))
    )
    return [c.gitea.shapes.label(repo, repo.labels[i]) for i in issue.labels]


@route("DELETE", REPO + "/issues/{index}/labels")
def clear_issue_labels(c: Call) -> Any:
    repo, issue = _labelling(c)
    c.gitea.set_labels(repo, issue, c.me(), [])
    c.status = 204


@route("DELETE", REPO + "/issues/{index}/labels/{id}")
def remove_issue_label(c: Call) -> Any:
    repo, issue = _labelling(c)
    gone = c.number("id")
    if gone not in repo.labels:
        raise GiteaError(422, f"label does not exist [label_id: {gone}]")
    c.gitea.set_labels(repo, issue, c.me(), [i for i in issue.labels if i != gone])
    c.status = 204


@route("GET", REPO + "/issues/{index}/comments")
def list_comments(c: Call) -> Any:
    repo = c.repo()
    issue = c.gitea.issue(repo, c.number())
    since = _since(c.query.get("since"))
    found = [m for m in issue.comments if since is None or m.updated_at >= since]
    return [c.gitea.shapes.comment(repo, issue, m) for m in found]


@route("POST", REPO + "/issues/{index}/comments")
def create_comment(c: Call) -> Any:
    repo = c.repo()
    issue = c.gitea.issue(repo, c.number())
    comment = c.gitea.add_comment(repo, issue, c.me(), str(c.required("body")))
    c.status = 201
    return c.gitea.shapes.comment(repo, issue, comment)


@route("GET", REPO + "/issues/{index}/timeline")
def issue_timeline(c: Call) -> Any:
    repo = c.repo()
    issue = c.gitea.issue(repo, c.number())
    since = _since(c.query.get("since"))
    entries: list[Comment | Event] = sorted([*issue.comments, *issue.events], key=lambda e: e.id)
    entries = [e for e in entries if since is None or e.created_at >= since]
    return [c.gitea.shapes.timeline(repo, issue, e) for e in c.page(entries)]


# -- webhooks -----------------------------------------------------------------------------


def _hook(c: Call, hook: Any) -> dict[str, Any]:
    when = c.gitea.clock()
    return {
        "id": hook.id, "type": "gitea", "name": "", "branch_filter": "*",
        "config": {"url": hook.url, "content_type": "json", "http_method": "post"},
        "events": list(hook.chosen), "authorization_header": "", "active": True,
        "updated_at": iso(when), "created_at": iso(when),
    }  # fmt: skip


@route("GET", REPO + "/hooks")
def list_hooks(c: Call) -> Any:
    repo = c.repo("admin")
    return [_hook(c, h) for h in c.gitea.hooks.hooks if h.repo_id == repo.id]


@route("POST", REPO + "/hooks")
def create_hook(c: Call) -> Any:
    """A Gitea (or Forgejo) hook with JSON payloads; its ``events`` as Gitea
    groups them (``issues``, ``issue_comment``, ``pull_request``,
    ``pull_request_review``, ``status``)."""
    repo = c.repo("admin")
    config = c.field("config") or {}
    if str(c.required("type")) not in ("gitea", "forgejo") or not config.get("url"):
        raise GiteaError(422, "Invalid hook: the fake delivers gitea hooks with a config.url")
    try:
        hook = c.gitea.hooks.create(
            repo, str(config["url"]), str(config.get("secret") or ""),
            list(c.field("events") or ["issues", "issue_comment", "pull_request"]),
        )  # fmt: skip
    except ValueError as wrong:
        raise GiteaError(422, str(wrong)) from None
    c.status = 201
    return _hook(c, hook)
