"""The fake GitHub's REST operations: GitHub's paths, status codes and JSON shapes.

One handler per operation phasegate uses (``support.github_openapi.OPERATIONS``; GitHub's
REST docs name each by its @octokit/openapi operation id, given beside it).
A handler is plain synchronous code run in a worker thread under the
model's lock: it checks the caller's permission the way GitHub does (a
repository the caller cannot see is 404, a write without the permission
403), calls the model, and returns what ``Shapes`` renders. Lists page with
``per_page`` (default 30, at most 100) and ``page``, and say so in a ``Link``
header like GitHub's.

Who may do what (GitHub's rules, simplified to what phasegate meets):
reading anything, filing issues, commenting and opening pull requests need
read; labelling an issue needs triage (labels in a new issue by someone
without it are dropped, as GitHub does); creating a repository label,
merging, and editing someone else's pull request need write; an issue's or
pull request's author may edit its title, body and state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from phasegate.forge.base import PERMISSIONS

from support.github_model import (
    App,
    GitHubError,
    Issue,
    Repo,
    User,
    invalid,
    not_found,
)

if TYPE_CHECKING:
    from starlette.datastructures import URL

    from support.github_server import GitHubServer

__all__ = ["MAX_BODY_CHARS", "ROUTES", "Call", "Route"]

#: What GitHub takes in an issue's, a pull request's or a comment's body.
MAX_BODY_CHARS = 65536


@dataclass
class Call:
    """One request as a handler sees it; handlers add response ``headers`` and
    may change ``status``."""

    gh: GitHubServer
    url: URL
    params: Mapping[str, str]
    query: Mapping[str, str]
    body: Any
    actor: User | None = None  # a token's user
    app: App | None = None  # an App that authenticated with its JWT
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def user(self) -> User:
        assert self.actor is not None
        return self.actor

    def field(self, name: str, default: Any = None) -> Any:
        return self.body.get(name, default) if isinstance(self.body, dict) else default

    def required(self, name: str, resource: str) -> Any:
        value = self.field(name)
        if value is None or value == "":
            raise invalid(resource, name, "missing_field")
        return value

    def text(self, resource: str, required: bool = False) -> str | None:
        """The ``body`` field: GitHub refuses one over 65536 characters (422)."""
        value = self.required("body", resource) if required else self.field("body")
        if value is not None and len(str(value)) > MAX_BODY_CHARS:
            message = f"body is too long (maximum is {MAX_BODY_CHARS} characters)"
            raise invalid(resource, "body", "custom", message)
        return None if value is None else str(value)

    def number(self, name: str) -> int:
        try:
            return int(self.params[name])
        except ValueError:
            raise not_found() from None

    def repo(self, need: str = "read") -> Repo:
        """The path's repository, if the caller may ``need`` it (404 when the
        caller cannot see it, 403 when it sees it without ``need``)."""
        r = self.gh.repo(f"{self.params['owner']}/{self.params['repo']}")
        have = self.gh.permission(r, self.user.login)
        if have == "none":
            raise not_found()
        if PERMISSIONS.index(have) < PERMISSIONS.index(need):
            raise GitHubError(403, f"Must have {need} access to repository")
        return r

    def created(self, location: str) -> None:
        self.status = 201
        self.headers["Location"] = location

    def page(self, items: list[Any]) -> list[Any]:
        """The requested page of ``items``, with GitHub's ``Link`` header."""
        try:
            per = min(100, max(1, int(self.query.get("per_page", 30))))
            at = max(1, int(self.query.get("page", 1)))
        except ValueError:
            raise invalid("Query", "page", "invalid") from None
        last = max(1, math.ceil(len(items) / per))
        rels = []
        if at < last:
            rels += [("next", at + 1), ("last", last)]
        if at > 1:
            rels += [("prev", min(at - 1, last)), ("first", 1)]
        if rels:
            self.headers["Link"] = ", ".join(
                f'<{self.url.include_query_params(page=n, per_page=per)}>; rel="{rel}"'
                for rel, n in rels
            )
        return items[(at - 1) * per : at * per]


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Callable[[Call], Any]
    auth: str = "token"  # token | app (a GitHub App's JWT)


ROUTES: list[Route] = []


def route(method: str, path: str, auth: str = "token") -> Callable[[Any], Any]:
    def register(handler: Callable[[Call], Any]) -> Callable[[Call], Any]:
        ROUTES.append(Route(method, path, handler, auth))
        return handler

    return register


def _since(call: Call) -> datetime | None:
    raw = call.query.get("since")
    if not raw:
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise invalid("Query", "since", "invalid") from None


def _order(call: Call, items: list[Any], keys: dict[str, Callable[[Any], Any]]) -> list[Any]:
    sort = call.query.get("sort", "created")
    if sort not in keys:
        raise invalid("Query", "sort", "invalid")
    default = "desc" if sort == "created" or "sort" not in call.query else "asc"
    direction = call.query.get("direction", default)
    return sorted(items, key=keys[sort], reverse=direction == "desc")


def _label_names(value: Any) -> list[str]:
    """GitHub takes labels as names or ``{"name": …}`` objects, in a list or under ``labels``."""
    if isinstance(value, dict):
        value = value.get("labels", [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise invalid("Label", "labels", "invalid")
    return [x["name"] if isinstance(x, dict) else str(x) for x in value]


def _can(call: Call, r: Repo, need: str) -> bool:
    have = call.gh.permission(r, call.user.login)
    return PERMISSIONS.index(have) >= PERMISSIONS.index(need)


def _author_or(call: Call, r: Repo, issue: Issue, need: str) -> None:
    if issue.user is not call.user and not _can(call, r, need):
        raise GitHubError(403, f"Must have {need} access to repository")


# -- users, repositories (repos/get, repos/create-for-authenticated-user, create-in-org,
# users/get-authenticated) --
@route("GET", "/repos/{owner}/{repo}")
def get_repo(call: Call) -> Any:
    r = call.repo()
    role = call.gh.permission(r, call.user.login)
    flags = call.gh.shapes.collaborator_permission(call.user, role)["user"]["permissions"]
    return call.gh.shapes.repo(r, flags)


@route("POST", "/user/repos")
def create_repo(call: Call) -> Any:
    if call.user.type == "Bot":
        raise GitHubError(403, "Resource not accessible by integration")
    r = call.gh.create_repo(
        call.user.login,
        str(call.required("name", "Repository")),
        private=bool(call.field("private", False)),
        description=call.field("description"),
        auto_init=bool(call.field("auto_init", False)),
    )
    call.created(f"{call.gh.url}/repos/{r.full_name}")
    return call.gh.shapes.repo(r)


@route("POST", "/orgs/{org}/repos")
def create_org_repo(call: Call) -> Any:
    # No membership is kept: any person may create in an organisation, a bot only
    # in the one its App is installed on (GitHub: administration write).
    org = call.gh.user(call.params["org"])
    if org.type != "Organization":
        raise not_found()
    if call.user.type == "Bot" and not any(
        a.bot is call.user and a.owner is org for a in call.gh.apps.values()
    ):
        raise GitHubError(403, "Resource not accessible by integration")
    r = call.gh.create_repo(
        org.login,
        str(call.required("name", "Repository")),
        private=bool(call.field("private", False)),
        description=call.field("description"),
        auto_init=bool(call.field("auto_init", False)),
    )
    r.collaborators[call.user.login] = "admin"
    call.created(f"{call.gh.url}/repos/{r.full_name}")
    return call.gh.shapes.repo(r)


@route("GET", "/user")
def get_authenticated(call: Call) -> Any:
    return call.gh.shapes.public_user(call.user, call.gh._at(None))


@route("GET", "/repos/{owner}/{repo}/collaborators/{username}/permission")
def get_permission(call: Call) -> Any:
    r = call.repo()
    who = call.gh.user(call.params["username"])
    return call.gh.shapes.collaborator_permission(who, call.gh.permission(r, who.login))


# -- issues (issues/list-for-repo, create, get, update, list-events) --
@route("GET", "/repos/{owner}/{repo}/issues")
def list_issues(call: Call) -> Any:
    r = call.repo()
    state = call.query.get("state", "open")
    wanted = {x.strip().lower() for x in call.query.get("labels", "").split(",") if x.strip()}
    creator, since = call.query.get("creator"), _since(call)
    found = [
        i
        for i in r.issues.values()
        if state in ("all", i.state)
        and wanted <= {x.name.lower() for x in i.labels}
        and (creator is None or i.user.login.lower() == creator.lower())
        and (since is None or i.updated_at >= since)
    ]
    keys = {
        "created": lambda i: i.number,
        "updated": lambda i: (i.updated_at, i.number),
        "comments": lambda i: (len(i.comments), i.number),
    }
    return [call.gh.shapes.issue(r, i) for i in call.page(_order(call, found, keys))]


@route("POST", "/repos/{owner}/{repo}/issues")
def create_issue(call: Call) -> Any:
    r = call.repo()
    title = str(call.required("title", "Issue"))
    labels = _label_names(call.field("labels", [])) if _can(call, r, "triage") else []
    issue = call.gh.open_issue(
        r.full_name, title, call.text("Issue"), call.user.login, labels=labels
    )
    call.created(f"{call.gh.url}/repos/{r.full_name}/issues/{issue.number}")
    return call.gh.shapes.issue(r, issue)


@route("GET", "/repos/{owner}/{repo}/issues/{issue_number}")
def get_issue(call: Call) -> Any:
    r = call.repo()
    return call.gh.shapes.issue(r, call.gh.issue(r, call.number("issue_number")))


@route("PATCH", "/repos/{owner}/{repo}/issues/{issue_number}")
def update_issue(call: Call) -> Any:
    r = call.repo()
    issue = call.gh.issue(r, call.number("issue_number"))
    _author_or(call, r, issue, "triage")
    login = call.user.login
    call.gh.edit_issue(
        r.full_name,
        issue.number,
        login,
        title=call.field("title"),
        body=call.text("Issue"),
        state=call.field("state"),
        state_reason=call.field("state_reason"),
    )
    if call.field("labels") is not None and _can(call, r, "triage"):
        names = {n.lower() for n in _label_names(call.field("labels"))}
        for gone in [x.name for x in issue.labels if x.name.lower() not in names]:
            call.gh.unlabel(r.full_name, issue.number, gone, login)
        call.gh.add_labels(r.full_name, issue.number, _label_names(call.field("labels")), login)
    return call.gh.shapes.issue(r, issue)


# -- sub-issues (issues/add-sub-issue, get-parent) --
@route("POST", "/repos/{owner}/{repo}/issues/{issue_number}/sub_issues")
def add_sub_issue(call: Call) -> Any:
    r = call.repo("triage")
    parent = call.gh.issue(r, call.number("issue_number"))
    wanted = call.required("sub_issue_id", "Issue")
    child = next((i for i in r.issues.values() if i.id == wanted and i.pull is None), None)
    if child is None:
        raise not_found()
    if child is parent or (child.parent is not None and not call.field("replace_parent")):
        raise invalid("Issue", "sub_issue_id", "invalid")
    child.parent = parent.number
    call.created(f"{call.gh.url}/repos/{r.full_name}/issues/{parent.number}/sub_issues")
    return call.gh.shapes.issue(r, parent)


@route("GET", "/repos/{owner}/{repo}/issues/{issue_number}/parent")
def get_parent(call: Call) -> Any:
    r = call.repo()
    child = call.gh.issue(r, call.number("issue_number"))
    if child.parent is None:
        raise not_found()
    return call.gh.shapes.issue(r, call.gh.issue(r, child.parent))


@route("GET", "/repos/{owner}/{repo}/issues/{issue_number}/events")
def list_events(call: Call) -> Any:
    r = call.repo()
    issue = call.gh.issue(r, call.number("issue_number"))
    return [call.gh.shapes.event(r, e) for e in call.page(list(issue.events))]


# -- labels (issues/add-labels, remove-label, list-labels-for-repo, create-label) --
@route("POST", "/repos/{owner}/{repo}/issues/{issue_number}/labels")
def add_labels(call: Call) -> Any:
    r = call.repo("triage")
    number = call.number("issue_number")
    labels = call.gh.add_labels(r.full_name, number, _label_names(call.body), call.user.login)
    return [call.gh.shapes.label(r, x) for x in labels]


@route("DELETE", "/repos/{owner}/{repo}/issues/{issue_number}/labels/{name:path}")
def remove_label(call: Call) -> Any:
    r = call.repo("triage")
    number, name = call.number("issue_number"), call.params["name"]
    labels = call.gh.unlabel(r.full_name, number, name, call.user.login)
    return [call.gh.shapes.label(r, x) for x in labels]


@route("GET", "/repos/{owner}/{repo}/labels")
def list_labels(call: Call) -> Any:
    r = call.repo()
    return [call.gh.shapes.label(r, x) for x in call.page(list(r.labels.values()))]


@route("POST", "/repos/{owner}/{repo}/labels")
def create_label(call: Call) -> Any:
    r = call.repo("write")
    name = str(call.required("name", "Label"))
    label = call.gh.create_label(
        r.full_name, name, str(call.field("color", "ededed")), call.field("description")
    )
    call.created(f"{call.gh.url}/repos/{r.full_name}/labels/{label.name}")
    return call.gh.shapes.label(r, label)


# -- comments (issues/list-comments, create-comment) --
@route("GET", "/repos/{owner}/{repo}/issues/{issue_number}/comments")
def list_comments(call: Call) -> Any:
    r = call.repo()
    issue, since = call.gh.issue(r, call.number("issue_number")), _since(call)
    said = [c for c in issue.comments if since is None or c.updated_at >= since]
    return [call.gh.shapes.comment(r, issue, c) for c in call.page(said)]


@route("POST", "/repos/{owner}/{repo}/issues/{issue_number}/comments")
def create_comment(call: Call) -> Any:
    r = call.repo()
    number = call.number("issue_number")
    body = call.text("IssueComment", required=True)
    said = call.gh.comment(r.full_name, number, body or "", call.user.login)
    issue = call.gh.issue(r, number)
    call.created(f"{call.gh.url}/repos/{r.full_name}/issues/comments/{said.id}")
    return call.gh.shapes.comment(r, issue, said)


# -- pull requests (pulls/list, create, get, update, merge, list-reviews, list-review-comments) ----
@route("GET", "/repos/{owner}/{repo}/pulls")
def list_pulls(call: Call) -> Any:
    r = call.repo()
    state, head, base = (
        call.query.get("state", "open"),
        call.query.get("head"),
        call.query.get("base"),
    )
    if head and ":" in head:
        owner, branch = head.split(":", 1)
        head = branch if owner.lower() == r.owner.login.lower() else "\0no such head"
    elif head:
        # GitHub ignores a head without its ``owner:``: every pull request comes
        # back, so a lookup by a bare branch name finds the wrong one there too.
        head = None
    found = [
        i
        for i in r.issues.values()
        if i.pull is not None
        and state in ("all", i.state)
        and (head is None or i.pull.head == head)
        and (base is None or i.pull.base == base)
    ]
    keys = {
        "created": lambda i: i.number,
        "updated": lambda i: (i.updated_at, i.number),
        "popularity": lambda i: (len(i.comments), i.number),
        "long-running": lambda i: (i.created_at, i.number),
    }
    shown = call.page(_order(call, found, keys))
    return [call.gh.shapes.pull(r, i, call.gh.pull_facts(r, i), full=False) for i in shown]


@route("POST", "/repos/{owner}/{repo}/pulls")
def create_pull(call: Call) -> Any:
    r = call.repo()
    issue = call.gh.open_pull(
        r.full_name,
        str(call.required("head", "PullRequest")),
        str(call.required("base", "PullRequest")),
        str(call.required("title", "PullRequest")),
        call.text("PullRequest"),
        call.user.login,
        draft=bool(call.field("draft", False)),
        maintainer_can_modify=bool(call.field("maintainer_can_modify", False)),
    )
    call.created(f"{call.gh.url}/repos/{r.full_name}/pulls/{issue.number}")
    return call.gh.shapes.pull(r, issue, call.gh.shown_facts(r, issue))


@route("GET", "/repos/{owner}/{repo}/pulls/{pull_number}")
def get_pull(call: Call) -> Any:
    r = call.repo()
    issue = call.gh.pull(r, call.number("pull_number"))
    return call.gh.shapes.pull(r, issue, call.gh.shown_facts(r, issue))


@route("PATCH", "/repos/{owner}/{repo}/pulls/{pull_number}")
def update_pull(call: Call) -> Any:
    r = call.repo()
    issue = call.gh.pull(r, call.number("pull_number"))
    _author_or(call, r, issue, "write")
    call.gh.edit_pull(
        r.full_name,
        issue.number,
        call.user.login,
        title=call.field("title"),
        body=call.text("PullRequest"),
        state=call.field("state"),
        base=call.field("base"),
    )
    return call.gh.shapes.pull(r, issue, call.gh.shown_facts(r, issue))


@route("PUT", "/repos/{owner}/{repo}/pulls/{pull_number}/merge")
def merge_pull(call: Call) -> Any:
    r = call.repo("write")
    sha = call.gh.merge(
        r.full_name,
        call.number("pull_number"),
        call.user.login,
        method=str(call.field("merge_method", "merge")),
        sha=call.field("sha"),
        commit_title=call.field("commit_title"),
        commit_message=call.field("commit_message"),
    )
    return {"sha": sha, "merged": True, "message": "Pull Request successfully merged"}


@route("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews")
def list_reviews(call: Call) -> Any:
    r = call.repo()
    issue = call.gh.pull(r, call.number("pull_number"))
    reviews = issue.pull.reviews  # type: ignore[union-attr]
    return [call.gh.shapes.review(r, issue, v) for v in call.page(list(reviews))]


@route("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/comments")
def list_review_comments(call: Call) -> Any:
    r = call.repo()
    issue, since = call.gh.pull(r, call.number("pull_number")), _since(call)
    said = [c for c in issue.pull.review_comments if since is None or c.created_at >= since]  # type: ignore[union-attr]
    return [call.gh.shapes.review_comment(r, issue, c) for c in call.page(said)]


# -- GitHub Apps (apps/get-repo-installation, apps/create-installation-access-token) --
@route("GET", "/repos/{owner}/{repo}/installation", auth="app")
def repo_installation(call: Call) -> Any:
    r = call.gh.repo(f"{call.params['owner']}/{call.params['repo']}")
    app = call.app
    if app is None or not call.gh.installed(app, r):
        raise not_found()
    return call.gh.shapes.installation(app)


@route("POST", "/app/installations/{installation_id}/access_tokens", auth="app")
def create_installation_token(call: Call) -> Any:
    app = call.gh.app_for_installation(call.number("installation_id"))
    if app is not call.app:
        raise not_found()
    token, expires_at = call.gh.mint_installation_token(app)
    call.status = 201
    return call.gh.shapes.installation_token(app, token, expires_at)
