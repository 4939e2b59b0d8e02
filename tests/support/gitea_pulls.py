"""The fake Gitea's pull request, review, status, protection and branch operations.

Registered into gitea_routes.ROUTES (imported for that by the server) with
the same ``Call``: pulls opened, listed, found by base and head, edited and
merged; reviews with line comments; commit statuses one by one and combined;
branch protections (admin only, as on Gitea) enforced at merge; branches
deleted. ``/pulls/{base}/{head}`` is registered last: a head branch may hold
``/``, and the more specific pull routes must match first.
"""

from __future__ import annotations

from typing import Any

from support.gitea_model import GiteaError, not_found
from support.gitea_routes import REPO, Call, route

__all__: list[str] = []


@route("GET", REPO + "/pulls")
def list_pulls(c: Call) -> Any:
    repo = c.repo()
    state = c.query.get("state") or "open"
    found = [
        i for i in repo.issues.values()
        if i.pull is not None and (state == "all" or i.state == state)
        and (not c.query.get("base_branch") or i.pull.base == c.query["base_branch"])
        and (not c.query.get("poster") or i.user.login == c.query["poster"])
    ]  # fmt: skip
    wanted = [n.strip() for n in (c.query.get("labels") or "").split(",") if n.strip()]
    if wanted:  # Gitea's pulls filter by label ids
        found = [i for i in found if all(int(n) in i.labels for n in wanted if n.isdigit())]
    found.sort(key=lambda i: i.id, reverse=True)
    return [c.gitea.shapes.pull(repo, i, c.actor) for i in c.page(found)]


@route("POST", REPO + "/pulls")
def create_pull(c: Call) -> Any:
    repo = c.repo()
    head, base = str(c.field("head") or ""), str(c.field("base") or repo.default_branch)
    _, _, head = head.rpartition(":")  # owner:branch names a branch here too
    labels = list(c.field("labels") or []) if repo.can(c.actor, "write") else []
    issue = c.gitea.open_pull(
        repo.full_name, c.me().login, head, base, str(c.required("title")),
        str(c.field("body") or ""), labels,
    )  # fmt: skip
    c.status = 201
    return c.gitea.shapes.pull(repo, issue, c.actor)


@route("GET", REPO + "/pulls/{index}")
def get_pull(c: Call) -> Any:
    repo = c.repo()
    return c.gitea.shapes.pull(repo, c.gitea.pull(repo, c.number()), c.actor)


@route("PATCH", REPO + "/pulls/{index}")
def edit_pull(c: Call) -> Any:
    repo = c.repo()
    issue = c.gitea.pull(repo, c.number())
    me = c.me()
    if not repo.can(me, "write") and issue.user.id != me.id:
        raise GiteaError(403, "user should have permission to edit pull request")
    c.gitea.edit(repo, issue, me, dict(c.body or {}))
    c.status = 201
    return c.gitea.shapes.pull(repo, issue, c.actor)


@route("GET", REPO + "/pulls/{index}/merge")
def is_merged(c: Call) -> Any:
    repo = c.repo()
    issue = c.gitea.pull(repo, c.number())
    if not issue.pull or not issue.pull.merged:
        raise not_found()
    c.status = 204


@route("POST", REPO + "/pulls/{index}/merge")
def merge_pull(c: Call) -> Any:
    repo = c.repo()
    issue = c.gitea.pull(repo, c.number())
    c.gitea.merge(repo, issue, c.me(), dict(c.body or {}))
    c.status = 200


# -- reviews -----------------------------------------------------------------------------------


@route("GET", REPO + "/pulls/{index}/reviews")
def list_reviews(c: Call) -> Any:
    repo = c.repo()
    issue = c.gitea.pull(repo, c.number())
    assert issue.pull is not None
    return [c.gitea.shapes.review(repo, issue, r) for r in c.page(issue.pull.reviews)]


@route("POST", REPO + "/pulls/{index}/reviews")
def create_review(c: Call) -> Any:
    repo = c.repo()
    issue = c.gitea.pull(repo, c.number())
    review = c.gitea.review(
        repo, issue, c.me(), str(c.field("event") or ""), str(c.field("body") or ""),
        list(c.field("comments") or []), c.field("commit_id"),
    )  # fmt: skip
    return c.gitea.shapes.review(repo, issue, review)


def _review(c: Call) -> Any:
    repo = c.repo()
    issue = c.gitea.pull(repo, c.number())
    assert issue.pull is not None
    found = next((r for r in issue.pull.reviews if r.id == c.number("id")), None)
    if found is None:
        raise not_found(f"review does not exist [id: {c.params['id']}]")
    return repo, issue, found


@route("GET", REPO + "/pulls/{index}/reviews/{id}")
def get_review(c: Call) -> Any:
    repo, issue, review = _review(c)
    return c.gitea.shapes.review(repo, issue, review)


@route("GET", REPO + "/pulls/{index}/reviews/{id}/comments")
def list_review_comments(c: Call) -> Any:
    repo, issue, review = _review(c)
    return [c.gitea.shapes.review_comment(repo, issue, m) for m in review.comments]


# -- statuses ----------------------------------------------------------------------------------


@route("POST", REPO + "/statuses/{sha}")
def create_status(c: Call) -> Any:
    repo = c.repo("write")
    status = c.gitea.post_status(
        repo, c.me(), c.params["sha"], str(c.required("state")),
        str(c.field("context") or "default"), str(c.field("target_url") or ""),
        str(c.field("description") or ""),
    )  # fmt: skip
    c.status = 201
    return c.gitea.shapes.status(repo, status)


def _statuses(c: Call, ref: str) -> Any:
    repo = c.repo()
    sha = repo.bare.sha(ref)
    if sha is None:
        raise not_found(f"object does not exist [id: {ref}, rel_path: ]")
    found = sorted((s for s in repo.statuses if s.sha == sha), key=lambda s: s.id, reverse=True)
    if c.query.get("state"):
        found = [s for s in found if s.state == c.query["state"]]
    return [c.gitea.shapes.status(repo, s) for s in c.page(found)]


@route("GET", REPO + "/statuses/{sha}")
def list_statuses(c: Call) -> Any:
    return _statuses(c, c.params["sha"])


@route("GET", REPO + "/commits/{ref:path}/statuses")
def list_statuses_by_ref(c: Call) -> Any:
    return _statuses(c, c.params["ref"])


@route("GET", REPO + "/commits/{ref:path}/status")
def combined_status(c: Call) -> Any:
    repo = c.repo()
    sha = repo.bare.sha(c.params["ref"])
    if sha is None:
        raise not_found(f"object does not exist [id: {c.params['ref']}, rel_path: ]")
    return c.gitea.shapes.combined(repo, sha, c.actor)


# -- branch protections and branches -----------------------------------------------------------


@route("GET", REPO + "/branch_protections")
def list_protections(c: Call) -> Any:
    repo = c.repo("admin")
    return [c.gitea.shapes.protection(p) for p in repo.protections]


@route("POST", REPO + "/branch_protections")
def create_protection(c: Call) -> Any:
    repo = c.repo("admin")
    name = str(c.field("rule_name") or c.field("branch_name") or "")
    if not name:
        raise GiteaError(422, "[RuleName]: Required")
    rule = c.gitea.protect(repo, name, dict(c.body or {}))
    c.status = 201
    return c.gitea.shapes.protection(rule)


@route("GET", REPO + "/branch_protections/{name}")
def get_protection(c: Call) -> Any:
    repo = c.repo("admin")
    found = next((p for p in repo.protections if p.rule_name == c.params["name"]), None)
    if found is None:
        raise not_found()
    return c.gitea.shapes.protection(found)


@route("DELETE", REPO + "/branches/{branch:path}")
def delete_branch(c: Call) -> Any:
    repo = c.repo()
    c.gitea.delete_branch(repo, c.me(), c.params["branch"])
    c.status = 204


# Last: ``{head}`` may hold slashes and would swallow the routes above.
@route("GET", REPO + "/pulls/{base}/{head:path}")
def get_pull_by_base_head(c: Call) -> Any:
    repo = c.repo()
    base, head = c.params["base"], c.params["head"].rpartition(":")[2]
    found = [
        i for i in repo.issues.values()
        if i.pull is not None and (i.pull.base, i.pull.head) == (base, head)
    ]  # fmt: skip
    if not found:
        raise not_found()
    open_first = sorted(found, key=lambda i: (i.state != "open", -i.id))
    return c.gitea.shapes.pull(repo, open_first[0], c.actor)
