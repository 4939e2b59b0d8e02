"""The fake GitLab's REST operations: GitLab v4 paths, status codes and JSON shapes.

One handler per operation phasegate's GitLab forge uses (each judged by
python-gitlab's managers: ``support.gitlab_models``), plain synchronous code
run under the model's lock. It checks the caller's role the way GitLab does (a project the
caller is no member of is 404 ``Project Not Found``, too low a role 403),
calls the model, and returns what ``Shapes`` renders. Parameters come from
the query, a JSON body or a form, as Grape takes them; a missing required
one is 400 ``{"error": "title is missing"}``. Lists page with ``page`` and
``per_page`` (default 20, at most 100) and say so in GitLab's headers:
``X-Total``, ``X-Total-Pages``, ``X-Per-Page``, ``X-Page``, ``X-Next-Page``,
``X-Prev-Page`` and ``Link`` (next, prev, first, last).

Roles (GitLab's, simplified to what phasegate meets): reading, filing
issues and commenting need Guest; labelling, creating labels and closing
someone else's issue need Reporter; merge requests, commit statuses and
deleting a branch need Developer; merging into the default branch needs
the project's ``merge_level`` (Maintainer, as GitLab protects it).
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from support.fake_http import Route, routes_under
from support.gitlab_hooks import EVENTS
from support.gitlab_model import ACCESS, GitLabError, Issue, Label, MergeRequest, Project, User
from support.gitlab_state import label_names

if TYPE_CHECKING:
    from support.gitlab_server import GitLabServer

__all__ = ["API", "ROUTES", "Call", "Route"]

API = "/api/v4"


@dataclass
class Call:
    """One request as a handler sees it; handlers set ``status`` and add ``headers``."""

    gl: GitLabServer
    url: str
    params: Mapping[str, str]
    args: dict[str, Any]
    actor: User
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)

    def required(self, name: str) -> Any:
        value = self.args.get(name)
        if value is None or value == "":
            raise GitLabError(400, f"{name} is missing", key="error")
        return value

    def iid(self) -> int:
        try:
            return int(self.params["iid"])
        except ValueError:
            raise GitLabError(404, "404 Not found") from None

    def project(self, at_least: int = ACCESS["guest"]) -> Project:
        return self.gl.visible(self.params["id"], self.actor, at_least)

    def page(self, items: list[Any]) -> list[Any]:
        """The asked page of ``items`` with GitLab's pagination headers."""
        try:
            per_page = min(max(int(self.args.get("per_page", 20)), 1), 100)
            page = max(int(self.args.get("page", 1)), 1)
        except ValueError:
            raise GitLabError(400, "page is invalid", key="error") from None
        total = len(items)
        pages = max(math.ceil(total / per_page), 1)
        self.headers.update({
            "X-Total": str(total), "X-Total-Pages": str(pages), "X-Per-Page": str(per_page),
            "X-Page": str(page), "X-Next-Page": str(page + 1) if page < pages else "",
            "X-Prev-Page": str(page - 1) if page > 1 else "",
        })  # fmt: skip
        split = urllib.parse.urlsplit(self.url)
        query = dict(urllib.parse.parse_qsl(split.query))

        def link(n: int, rel: str) -> str:
            q = urllib.parse.urlencode({**query, "page": n, "per_page": per_page})
            return f'<{urllib.parse.urlunsplit(split._replace(query=q))}>; rel="{rel}"'

        links = [link(page - 1, "prev")] if page > 1 else []
        links += [link(page + 1, "next")] if page < pages else []
        links += [link(1, "first"), link(pages, "last")]
        self.headers["Link"] = ", ".join(links)
        return items[(page - 1) * per_page : page * per_page]


ROUTES: list[Route] = []
route = routes_under(ROUTES, API)


def _filter_state(items: list[Any], state: Any) -> list[Any]:
    if state in (None, "", "all"):
        return items
    return [i for i in items if i.state == state]


def _labels_match(item: Issue | MergeRequest, labels: Any) -> bool:
    wanted = [n.strip() for n in str(labels or "").split(",") if n.strip()]
    return all(n in item.labels for n in wanted)


def _newest_first(items: list[Any], args: Mapping[str, Any]) -> list[Any]:
    key = "updated_at" if args.get("order_by") == "updated_at" else "created_at"
    ordered = sorted(items, key=lambda i: (getattr(i, key), i.id))
    return ordered if args.get("sort") == "asc" else ordered[::-1]


# -- the caller and the project --------------------------------------------------------------


@route("GET", "/user")
def current_user(c: Call) -> Any:
    return c.gl.shapes.current_user(c.actor)


@route("GET", "/projects/{id}")
def get_project(c: Call) -> Any:
    return c.gl.shapes.project(c.project(), c.actor)


@route("GET", "/projects/{id}/members/all")
def list_members(c: Call) -> Any:
    project = c.project()
    wanted = str(c.args.get("query") or "").lower()
    found = [
        u for u in c.gl.users.values()
        if project.level(u) and wanted in (u.username.lower() + " " + u.name.lower())
    ]  # fmt: skip
    return [c.gl.shapes.member(project, u) for u in c.page(found)]


@route("GET", "/projects/{id}/members/all/{user_id}")
def get_member(c: Call) -> Any:
    project = c.project()
    user = next((u for u in c.gl.users.values() if str(u.id) == c.params["user_id"]), None)
    if user is None or project.level(user) == 0:
        raise GitLabError(404, "404 Member Not Found")
    return c.gl.shapes.member(project, user)


# -- labels ----------------------------------------------------------------------------------


@route("GET", "/projects/{id}/labels")
def list_labels(c: Call) -> Any:
    project = c.project()
    return [c.gl.shapes.label(project, lb) for lb in c.page(list(project.labels.values()))]


@route("POST", "/projects/{id}/labels")
def create_label(c: Call) -> Any:
    project = c.project(ACCESS["reporter"])
    name, color = str(c.required("name")), str(c.required("color"))
    if name in project.labels:
        raise GitLabError(409, "Label already exists")
    label = Label(c.gl.next_id("label"), name, color, c.args.get("description"))
    project.labels[name] = label
    c.status = 201
    return c.gl.shapes.label(project, label)


# -- issues ----------------------------------------------------------------------------------


@route("GET", "/projects/{id}/issues")
def list_issues(c: Call) -> Any:
    project = c.project()
    items = _filter_state(list(project.issues.values()), c.args.get("state"))
    items = [i for i in items if _labels_match(i, c.args.get("labels"))]
    return [c.gl.shapes.issue(project, i) for i in c.page(_newest_first(items, c.args))]


@route("GET", "/projects/{id}/issues/{iid}")
def get_issue(c: Call) -> Any:
    project = c.project()
    return c.gl.shapes.issue(project, c.gl.issue(project, c.iid()))


@route("POST", "/projects/{id}/issues")
def create_issue(c: Call) -> Any:
    project = c.project()
    title = str(c.required("title"))
    labels = c.args.get("labels") if project.level(c.actor) >= ACCESS["reporter"] else None
    issue = c.gl.open_issue(
        project.id,
        c.actor.username,
        title,
        str(c.args.get("description") or ""),
        label_names(labels),
    )
    c.status = 201
    return c.gl.shapes.issue(project, issue)


@route("PUT", "/projects/{id}/issues/{iid}")
def edit_issue(c: Call) -> Any:
    project = c.project()
    issue = c.gl.issue(project, c.iid())
    if issue.author is not c.actor and project.level(c.actor) < ACCESS["reporter"]:
        raise GitLabError(403, "403 Forbidden")
    fields = dict(c.args)
    if project.level(c.actor) < ACCESS["reporter"]:
        # the author Guest edits their issue's text; its labels GitLab leaves alone
        for name in ("labels", "add_labels", "remove_labels"):
            fields.pop(name, None)
    c.gl.edit(project, issue, c.actor, fields)
    return c.gl.shapes.issue(project, issue)


@route("GET", "/projects/{id}/issues/{iid}/resource_label_events")
def list_label_events(c: Call) -> Any:
    project = c.project()
    issue = c.gl.issue(project, c.iid())
    return [c.gl.shapes.label_event(project, issue, e) for e in c.page(issue.label_events)]


@route("GET", "/projects/{id}/issues/{iid}/notes")
def list_issue_notes(c: Call) -> Any:
    project = c.project()
    notes = _newest_first(c.gl.issue(project, c.iid()).notes, c.args)
    return [c.gl.shapes.note(project, n) for n in c.page(notes)]


@route("POST", "/projects/{id}/issues/{iid}/notes")
def create_issue_note(c: Call) -> Any:
    project = c.project()
    note = c.gl.comment(c.gl.issue(project, c.iid()), c.actor, str(c.required("body")))
    c.status = 201
    return c.gl.shapes.note(project, note)


# -- merge requests ----------------------------------------------------------------------------


@route("GET", "/projects/{id}/merge_requests")
def list_merge_requests(c: Call) -> Any:
    project = c.project()
    items = _filter_state(list(project.merge_requests.values()), c.args.get("state"))
    for name in ("source_branch", "target_branch"):
        if c.args.get(name):
            items = [m for m in items if getattr(m, name) == c.args[name]]
    items = [m for m in items if _labels_match(m, c.args.get("labels"))]
    return [
        c.gl.shapes.merge_request(project, m, c.actor) for m in c.page(_newest_first(items, c.args))
    ]


@route("GET", "/projects/{id}/merge_requests/{iid}")
def get_merge_request(c: Call) -> Any:
    project = c.project()
    mr = c.gl.merge_request(project, c.iid())
    return c.gl.shapes.merge_request(project, mr, c.actor, single=True)


@route("POST", "/projects/{id}/merge_requests")
def create_merge_request(c: Call) -> Any:
    project = c.project(ACCESS["developer"])
    mr = c.gl.open_merge_request(
        project.id, c.actor, str(c.required("source_branch")), str(c.required("target_branch")),
        str(c.required("title")), str(c.args.get("description") or ""),
        label_names(c.args.get("labels")),
    )  # fmt: skip
    if c.args.get("remove_source_branch") is not None:
        mr.should_remove_source_branch = bool(c.args["remove_source_branch"])
    mr.squash = bool(c.args.get("squash", False))
    c.status = 201
    return c.gl.shapes.merge_request(project, mr, c.actor, single=True)


@route("PUT", "/projects/{id}/merge_requests/{iid}")
def edit_merge_request(c: Call) -> Any:
    project = c.project()
    mr = c.gl.merge_request(project, c.iid())
    if mr.author is not c.actor and project.level(c.actor) < ACCESS["developer"]:
        raise GitLabError(403, "403 Forbidden")
    c.gl.edit(project, mr, c.actor, c.args)
    return c.gl.shapes.merge_request(project, mr, c.actor, single=True)


@route("PUT", "/projects/{id}/merge_requests/{iid}/merge")
def merge_merge_request(c: Call) -> Any:
    project = c.project()
    mr = c.gl.merge_request(project, c.iid())
    c.gl.merge(project, mr, c.actor, c.args)
    return c.gl.shapes.merge_request(project, mr, c.actor, single=True)


@route("GET", "/projects/{id}/merge_requests/{iid}/notes")
def list_mr_notes(c: Call) -> Any:
    project = c.project()
    notes = _newest_first(c.gl.merge_request(project, c.iid()).notes, c.args)
    return [c.gl.shapes.note(project, n) for n in c.page(notes)]


@route("POST", "/projects/{id}/merge_requests/{iid}/notes")
def create_mr_note(c: Call) -> Any:
    project = c.project()
    mr = c.gl.merge_request(project, c.iid())
    note = c.gl.comment(mr, c.actor, str(c.required("body")))
    c.status = 201
    return c.gl.shapes.note(project, note)


@route("GET", "/projects/{id}/merge_requests/{iid}/discussions")
def list_mr_discussions(c: Call) -> Any:
    project = c.project()
    mr = c.gl.merge_request(project, c.iid())
    return c.page(c.gl.shapes.discussions(project, mr.notes))


# -- statuses, pipelines, branches -------------------------------------------------------------


@route("GET", "/projects/{id}/repository/commits/{sha}/statuses")
def list_statuses(c: Call) -> Any:
    project = c.project()
    sha = project.bare.sha(c.params["sha"])
    if sha is None:
        raise GitLabError(404, "404 Commit Not Found")
    found = [s for s in project.statuses if s.sha == sha]
    if c.args.get("ref"):
        found = [s for s in found if s.ref == c.args["ref"]]
    if c.args.get("name"):
        found = [s for s in found if s.name == c.args["name"]]
    if str(c.args.get("all", "false")).lower() != "true":
        latest = {s.name: s for s in found}
        found = [s for s in found if latest[s.name] is s]
    return [c.gl.shapes.status(s) for s in c.page(found)]


@route("POST", "/projects/{id}/statuses/{sha}")
def create_status(c: Call) -> Any:
    project = c.project(ACCESS["developer"])
    status = c.gl.post_status(
        project, c.actor, c.params["sha"], str(c.required("state")),
        ref=c.args.get("ref"), name=str(c.args.get("name") or c.args.get("context") or "default"),
        target_url=c.args.get("target_url"), description=c.args.get("description"),
    )  # fmt: skip
    c.status = 201
    return c.gl.shapes.status(status)


@route("GET", "/projects/{id}/pipelines")
def list_pipelines(c: Call) -> Any:
    project = c.project()
    found = list(project.pipelines)
    for name in ("sha", "ref", "status", "source"):
        if c.args.get(name):
            found = [p for p in found if getattr(p, name) == c.args[name]]
    found.sort(key=lambda p: p.id, reverse=c.args.get("sort") != "asc")
    return [c.gl.shapes.pipeline(project, p) for p in c.page(found)]


@route("DELETE", "/projects/{id}/repository/branches/{branch:path}")
def delete_branch(c: Call) -> Any:
    project = c.project()
    c.gl.delete_branch(project, c.actor, c.params["branch"])
    c.status = 204
    return None


# -- webhooks --------------------------------------------------------------------------------


def _flag(value: Any) -> bool:
    return str(value).lower() in ("true", "1", "yes")


def _hook(c: Call, hook: Any) -> dict[str, Any]:
    shown: dict[str, Any] = {"id": hook.id, "url": hook.url, "project_id": hook.project_id}
    shown.update({flag: name in hook.events for flag, name in EVENTS.items()})
    shown.update({"push_events": False, "enable_ssl_verification": True})
    return shown


@route("GET", "/projects/{id}/hooks")
def list_hooks(c: Call) -> Any:
    project = c.project(ACCESS["maintainer"])
    return [_hook(c, h) for h in c.gl.hooks.hooks if h.project_id == project.id]


@route("POST", "/projects/{id}/hooks")
def create_hook(c: Call) -> Any:
    """A project hook as GitLab adds one: ``url``, ``token`` and an
    ``*_events`` flag for each event wanted (only the four the fake delivers;
    push events are not delivered)."""
    project = c.project(ACCESS["maintainer"])
    url = str(c.required("url"))
    if not url.startswith(("http://", "https://")):
        raise GitLabError(422, "Invalid url given", key="error")
    wanted = tuple(flag for flag in EVENTS if _flag(c.args.get(flag, False)))
    hook = c.gl.hooks.add(project.id, url, str(c.args.get("token") or ""), wanted)
    c.status = 201
    return _hook(c, hook)
