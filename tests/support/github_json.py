"""The fake GitHub's objects in GitHub's JSON shapes, one helper per object.

Each helper gives what @octokit/openapi's ``api.github.com`` description marks
required for that object (``simple-user``, ``full-repository``, ``public-user``, ``label``,
``issue``, ``issue-comment``, ``labeled-issue-event``, ``pull-request`` and
``pull-request-simple``, ``pull-request-review``,
``pull-request-review-comment``, ``check-run``, ``combined-commit-status``,
``installation``, ``installation-token``), with the right types, so a
validating proxy over that description passes them; URLs point at the
server (``api``), the repository's ``clone_url`` at its git endpoint.
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any
from urllib.parse import quote

from support.github_git import PullFacts
from support.github_model import (
    App,
    CheckRun,
    CommitStatus,
    Event,
    Issue,
    IssueComment,
    Label,
    Repo,
    Review,
    ReviewComment,
    User,
)

__all__ = ["Shapes", "iso"]

Json = dict[str, Any]

# The integration a check run reports as its app: GitHub Actions' own id and slug.
_ACTIONS_APP_ID = 15368


def iso(at: datetime | None) -> str | None:
    """GitHub's timestamp: ``2026-01-01T00:00:00Z`` (None stays None)."""
    return at.strftime("%Y-%m-%dT%H:%M:%SZ") if at else None


def node_id(kind: str, number: int) -> str:
    return f"{kind}_" + base64.b64encode(f"{kind}{number}".encode()).decode().rstrip("=")


class Shapes:
    """Renders the model for a server answering at ``api`` (``http://127.0.0.1:PORT``).

    ``association(repo, user)`` gives GitHub's ``author_association`` (OWNER,
    COLLABORATOR, NONE …) of ``user`` on ``repo``.
    """

    def __init__(self, api: str, association: Any) -> None:
        self.api = api.rstrip("/")
        self.association = association

    # -- people ---------------------------------------------------------------------
    def user(self, u: User) -> Json:
        # GitHub percent-encodes a bot's login in its URLs (…/users/slug%5Bbot%5D):
        # a raw "[bot]" is no valid uri, and the schema says uri
        login = quote(u.login, safe="")
        base = f"{self.api}/users/{login}"
        html = f"{self.api}/apps/{u.login.removesuffix('[bot]')}" if u.type == "Bot" else None
        return {
            "login": u.login,
            "id": u.id,
            "node_id": node_id("U" if u.type == "User" else "BOT", u.id),
            "avatar_url": f"{self.api}/avatars/{u.id}",
            "gravatar_id": "",
            "url": base,
            "html_url": html or f"{self.api}/{login}",
            "followers_url": f"{base}/followers",
            "following_url": f"{base}/following{{/other_user}}",
            "gists_url": f"{base}/gists{{/gist_id}}",
            "starred_url": f"{base}/starred{{/owner}}{{/repo}}",
            "subscriptions_url": f"{base}/subscriptions",
            "organizations_url": f"{base}/orgs",
            "repos_url": f"{base}/repos",
            "events_url": f"{base}/events{{/privacy}}",
            "received_events_url": f"{base}/received_events",
            "type": u.type,
            "site_admin": False,
        }

    def public_user(self, u: User, since: datetime) -> Json:
        """``public-user`` (``GET /user``'s answer for a token without user scopes)."""
        profile = dict.fromkeys(("name", "company", "blog", "location", "email", "bio"))
        counts = dict.fromkeys(("public_repos", "public_gists", "followers", "following"), 0)
        return {**self.user(u), **profile, **counts, "hireable": None,
                "user_view_type": "public", "created_at": iso(since),
                "updated_at": iso(since)}  # fmt: skip

    def collaborator_permission(self, u: User, role: str) -> Json:
        """``repository-collaborator-permission``: GitHub's ``permission`` folds
        maintain into write and triage into read; ``role_name`` is exact."""
        classic = {"maintain": "write", "triage": "read"}.get(role, role)
        rank = ("none", "read", "triage", "write", "maintain", "admin").index(role)
        flags = {"pull": rank >= 1, "triage": rank >= 2, "push": rank >= 3,
                 "maintain": rank >= 4, "admin": rank >= 5}  # fmt: skip
        return {
            "permission": classic,
            "role_name": role,
            "user": {**self.user(u), "permissions": flags, "role_name": role},
        }

    # -- repositories ------------------------------------------------------------------
    def repo(self, r: Repo, permissions: dict[str, bool] | None = None) -> Json:
        """``full-repository`` (which is also a valid ``repository`` and ``minimal-repository``)."""
        api = f"{self.api}/repos/{r.full_name}"
        templates = {
            "archive_url": "/{archive_format}{/ref}", "assignees_url": "/assignees{/user}",
            "blobs_url": "/git/blobs{/sha}", "branches_url": "/branches{/branch}",
            "collaborators_url": "/collaborators{/collaborator}",
            "comments_url": "/comments{/number}", "commits_url": "/commits{/sha}",
            "compare_url": "/compare/{base}...{head}", "contents_url": "/contents/{+path}",
            "contributors_url": "/contributors", "deployments_url": "/deployments",
            "downloads_url": "/downloads", "events_url": "/events", "forks_url": "/forks",
            "git_commits_url": "/git/commits{/sha}", "git_refs_url": "/git/refs{/sha}",
            "git_tags_url": "/git/tags{/sha}", "hooks_url": "/hooks",
            "issue_comment_url": "/issues/comments{/number}",
            "issue_events_url": "/issues/events{/number}", "issues_url": "/issues{/number}",
            "keys_url": "/keys{/key_id}", "labels_url": "/labels{/name}",
            "languages_url": "/languages", "merges_url": "/merges",
            "milestones_url": "/milestones{/number}",
            "notifications_url": "/notifications{?since,all,participating}",
            "pulls_url": "/pulls{/number}", "releases_url": "/releases{/id}",
            "stargazers_url": "/stargazers", "statuses_url": "/statuses/{sha}",
            "subscribers_url": "/subscribers", "subscription_url": "/subscription",
            "tags_url": "/tags", "teams_url": "/teams", "trees_url": "/git/trees{/sha}",
        }  # fmt: skip
        open_issues = sum(1 for i in r.issues.values() if i.state == "open")
        shape: Json = {
            "id": r.id,
            "node_id": node_id("R", r.id),
            "name": r.name,
            "full_name": r.full_name,
            "owner": self.user(r.owner),
            "private": r.private,
            "html_url": f"{self.api}/{r.full_name}",
            "description": r.description,
            "fork": False,
            "url": api,
            **{key: api + tail for key, tail in templates.items()},
            "git_url": f"git://127.0.0.1/{r.full_name}.git",
            "ssh_url": f"git@127.0.0.1:{r.full_name}.git",
            "clone_url": self.clone_url(r),
            "svn_url": f"{self.api}/{r.full_name}",
            "mirror_url": None,
            "homepage": None,
            "language": None,
            "license": None,
            "forks": 0,
            "forks_count": 0,
            "stargazers_count": 0,
            "watchers": 0,
            "watchers_count": 0,
            "network_count": 0,
            "subscribers_count": 0,
            "size": 0,
            "default_branch": r.default_branch,
            "open_issues": open_issues,
            "open_issues_count": open_issues,
            "is_template": False,
            "topics": [],
            "has_issues": True,
            "has_projects": False,
            "has_wiki": False,
            "has_pages": False,
            "has_downloads": False,
            "has_discussions": False,
            "archived": False,
            "disabled": False,
            "visibility": "private" if r.private else "public",
            "pushed_at": iso(r.pushed_at or r.created_at),
            "created_at": iso(r.created_at),
            "updated_at": iso(r.created_at),
            "allow_merge_commit": True,
            "allow_squash_merge": True,
            "allow_rebase_merge": True,
        }
        if permissions is not None:
            shape["permissions"] = permissions
        return shape

    def clone_url(self, r: Repo) -> str:
        """Where git reaches ``r`` over smart HTTP (basic auth, a token as password)."""
        return f"{self.api}/git/{r.full_name}.git"

    def label(self, r: Repo, x: Label) -> Json:
        return {
            "id": x.id,
            "node_id": node_id("LA", x.id),
            "url": f"{self.api}/repos/{r.full_name}/labels/{x.name}",
            "name": x.name,
            "description": x.description,
            "color": x.color,
            "default": False,
            # Required by the 2026-03-10 description githubkit 0.16 parses with.
            "archived_at": None,
            "archived_by": None,
        }

    # -- issues -----------------------------------------------------------------------------
    def issue(self, r: Repo, i: Issue) -> Json:
        """``issue``; a pull request's carries ``pull_request`` (as GitHub lists them)."""
        url = f"{self.api}/repos/{r.full_name}/issues/{i.number}"
        shape: Json = {
            "id": i.id,
            "node_id": node_id("I", i.id),
            "url": url,
            "repository_url": f"{self.api}/repos/{r.full_name}",
            "labels_url": f"{url}/labels{{/name}}",
            "comments_url": f"{url}/comments",
            "events_url": f"{url}/events",
            "html_url": f"{self.api}/{r.full_name}/issues/{i.number}",
            "number": i.number,
            "state": i.state,
            "state_reason": i.state_reason,
            "title": i.title,
            "body": i.body,
            "user": self.user(i.user),
            "labels": [self.label(r, x) for x in i.labels],
            "assignee": None,
            "assignees": [],
            "milestone": None,
            "locked": False,
            "active_lock_reason": None,
            "comments": len(i.comments),
            "closed_at": iso(i.closed_at),
            "closed_by": self.user(i.closed_by) if i.closed_by else None,
            "created_at": iso(i.created_at),
            "updated_at": iso(i.updated_at),
            "author_association": self.association(r, i.user),
        }
        if i.pull is not None:
            pulls = f"{self.api}/{r.full_name}/pull/{i.number}"
            shape["pull_request"] = {
                "url": f"{self.api}/repos/{r.full_name}/pulls/{i.number}",
                "html_url": pulls,
                "diff_url": f"{pulls}.diff",
                "patch_url": f"{pulls}.patch",
                "merged_at": iso(i.pull.merged_at),
            }
            shape["draft"] = i.pull.draft
        return shape

    def comment(self, r: Repo, i: Issue, c: IssueComment) -> Json:
        """``issue-comment``."""
        return {
            "id": c.id,
            "node_id": node_id("IC", c.id),
            "url": f"{self.api}/repos/{r.full_name}/issues/comments/{c.id}",
            "html_url": f"{self.api}/{r.full_name}/issues/{i.number}#issuecomment-{c.id}",
            "issue_url": f"{self.api}/repos/{r.full_name}/issues/{i.number}",
            "body": c.body,
            "user": self.user(c.user),
            "created_at": iso(c.created_at),
            "updated_at": iso(c.updated_at),
            "author_association": self.association(r, c.user),
        }

    def event(self, r: Repo, e: Event) -> Json:
        """An issue event (``labeled-issue-event`` when it has a label)."""
        shape: Json = {
            "id": e.id,
            "node_id": node_id("LE" if e.label else "E", e.id),
            "url": f"{self.api}/repos/{r.full_name}/issues/events/{e.id}",
            "actor": self.user(e.actor),
            "event": e.event,
            "commit_id": e.commit_id,
            "commit_url": (
                f"{self.api}/repos/{r.full_name}/commits/{e.commit_id}" if e.commit_id else None
            ),
            "created_at": iso(e.created_at),
            "performed_via_github_app": None,
        }
        if e.label is not None:
            shape["label"] = {"name": e.label.name, "color": e.label.color}
        return shape

    # -- pull requests ----------------------------------------------------------------------
    def _ref(self, r: Repo, branch: str, sha: str | None) -> Json:
        return {
            "label": f"{r.owner.login}:{branch}",
            "ref": branch,
            "sha": sha or "",
            "user": self.user(r.owner),
            "repo": self.repo(r),
        }

    def pull(self, r: Repo, i: Issue, facts: PullFacts, *, full: bool = True) -> Json:
        """``pull-request`` (``full``) or ``pull-request-simple`` (as lists give them)."""
        p = i.pull
        assert p is not None
        api = f"{self.api}/repos/{r.full_name}"
        url, html = f"{api}/pulls/{i.number}", f"{self.api}/{r.full_name}/pull/{i.number}"
        shape: Json = {
            "url": url,
            "id": p.id,
            "node_id": node_id("PR", p.id),
            "html_url": html,
            "diff_url": f"{html}.diff",
            "patch_url": f"{html}.patch",
            "issue_url": f"{api}/issues/{i.number}",
            "commits_url": f"{url}/commits",
            "review_comments_url": f"{url}/comments",
            "review_comment_url": f"{api}/pulls/comments{{/number}}",
            "comments_url": f"{api}/issues/{i.number}/comments",
            "statuses_url": f"{api}/statuses/{p.head_sha}",
            "number": i.number,
            "state": i.state,
            "locked": False,
            "title": i.title,
            "user": self.user(i.user),
            "body": i.body,
            "labels": [self.label(r, x) for x in i.labels],
            "milestone": None,
            "active_lock_reason": None,
            "created_at": iso(i.created_at),
            "updated_at": iso(i.updated_at),
            "closed_at": iso(i.closed_at),
            "merged_at": iso(p.merged_at),
            "merge_commit_sha": p.merge_commit_sha,
            "assignee": None,
            "assignees": [],
            "requested_reviewers": [],
            "requested_teams": [],
            "head": self._ref(r, p.head, p.head_sha),
            "base": self._ref(r, p.base, p.base_sha),
            "_links": {
                key: {"href": href}
                for key, href in {
                    "self": url,
                    "html": html,
                    "issue": f"{api}/issues/{i.number}",
                    "comments": f"{api}/issues/{i.number}/comments",
                    "review_comments": f"{url}/comments",
                    "review_comment": f"{api}/pulls/comments{{/number}}",
                    "commits": f"{url}/commits",
                    "statuses": f"{api}/statuses/{p.head_sha}",
                }.items()  # fmt: skip
            },
            "author_association": self.association(r, i.user),
            "auto_merge": None,
            "draft": p.draft,
        }
        if not full:
            return shape
        open_now = i.state == "open"
        mergeable = facts.mergeable if open_now else None
        state = "unknown" if mergeable is None else ("clean" if mergeable else "dirty")
        shape.update(
            merged=p.merged_at is not None,
            mergeable=mergeable,
            rebaseable=mergeable,
            mergeable_state=state,
            merged_by=self.user(p.merged_by) if p.merged_by else None,
            comments=len(i.comments),
            review_comments=len(p.review_comments),
            maintainer_can_modify=p.maintainer_can_modify,
            commits=facts.commits,
            additions=facts.additions,
            deletions=facts.deletions,
            changed_files=facts.changed_files,
        )
        return shape

    def review(self, r: Repo, i: Issue, v: Review) -> Json:
        """``pull-request-review``."""
        html = f"{self.api}/{r.full_name}/pull/{i.number}#pullrequestreview-{v.id}"
        pr_url = f"{self.api}/repos/{r.full_name}/pulls/{i.number}"
        return {
            "id": v.id,
            "node_id": node_id("PRR", v.id),
            "user": self.user(v.user),
            "body": v.body,
            "state": v.state,
            "commit_id": v.commit_id,
            "html_url": html,
            "pull_request_url": pr_url,
            "_links": {"html": {"href": html}, "pull_request": {"href": pr_url}},
            "submitted_at": iso(v.submitted_at),
            "author_association": self.association(r, v.user),
        }

    def review_comment(self, r: Repo, i: Issue, c: ReviewComment) -> Json:
        """``pull-request-review-comment`` (a comment on line ``line`` of the head's file)."""
        url = f"{self.api}/repos/{r.full_name}/pulls/comments/{c.id}"
        html = f"{self.api}/{r.full_name}/pull/{i.number}#discussion_r{c.id}"
        pr_url = f"{self.api}/repos/{r.full_name}/pulls/{i.number}"
        return {
            "url": url,
            "id": c.id,
            "node_id": node_id("PRRC", c.id),
            "pull_request_review_id": c.review_id,
            "diff_hunk": c.diff_hunk,
            "path": c.path,
            "commit_id": c.commit_id,
            "original_commit_id": c.commit_id,
            "user": self.user(c.user),
            "body": c.body,
            "created_at": iso(c.created_at),
            "updated_at": iso(c.created_at),
            "html_url": html,
            "pull_request_url": pr_url,
            "author_association": self.association(r, c.user),
            "_links": {
                "self": {"href": url},
                "html": {"href": html},
                "pull_request": {"href": pr_url},
            },
            "line": c.line,
            "original_line": c.line,
            "side": "RIGHT",
            "start_line": None,
            "original_start_line": None,
            "start_side": None,
            "subject_type": "line",
        }

    # -- CI ------------------------------------------------------------------------------------
    def check_run(self, r: Repo, c: CheckRun) -> Json:
        """``check-run``; its app is GitHub Actions."""
        url = f"{self.api}/repos/{r.full_name}/check-runs/{c.id}"
        actions = User(_ACTIONS_APP_ID, "github", "Organization")
        return {
            "id": c.id,
            "node_id": node_id("CR", c.id),
            "head_sha": c.head_sha,
            "external_id": str(c.id),
            "name": c.name,
            "url": url,
            "html_url": f"{self.api}/{r.full_name}/runs/{c.id}",
            "details_url": c.details_url or f"{self.api}/{r.full_name}/runs/{c.id}",
            "status": c.status,
            "conclusion": c.conclusion,
            "started_at": iso(c.started_at),
            "completed_at": iso(c.completed_at),
            "output": {
                "title": c.title,
                "summary": c.summary,
                "text": c.text,
                "annotations_count": 0,
                "annotations_url": f"{url}/annotations",
            },
            "check_suite": {"id": c.id},
            "app": {
                "id": _ACTIONS_APP_ID,
                "slug": "github-actions",
                "node_id": node_id("A", _ACTIONS_APP_ID),
                "owner": self.user(actions),
                "name": "GitHub Actions",
                "description": "Automate your workflow from idea to production",
                "external_url": "https://help.github.com/en/actions",
                "html_url": "https://github.com/apps/github-actions",
                "created_at": "2018-07-30T09:30:17Z",
                "updated_at": "2019-12-10T19:04:12Z",
                "permissions": {"checks": "write", "statuses": "write"},
                "events": ["check_run", "push", "pull_request"],
            },
            "pull_requests": [],
        }

    def status(self, r: Repo, s: CommitStatus) -> Json:
        """``simple-commit-status``."""
        return {
            "id": s.id,
            "node_id": node_id("SC", s.id),
            "url": f"{self.api}/repos/{r.full_name}/statuses/{s.sha}",
            "state": s.state,
            "description": s.description,
            "target_url": s.target_url,
            "context": s.context,
            "avatar_url": f"{self.api}/avatars/{s.creator.id}",
            "created_at": iso(s.created_at),
            "updated_at": iso(s.created_at),
        }

    def combined_status(self, r: Repo, sha: str, latest: list[CommitStatus]) -> Json:
        """``combined-commit-status`` of the latest status per context: failure if
        any failed or errored, pending if any is pending or there is none, else success."""
        states = {s.state for s in latest}
        if states & {"failure", "error"}:
            state = "failure"
        elif "pending" in states or not latest:
            state = "pending"
        else:
            state = "success"
        return {
            "state": state,
            "sha": sha,
            "total_count": len(latest),
            "statuses": [self.status(r, s) for s in latest],
            "repository": self.repo(r),
            "commit_url": f"{self.api}/repos/{r.full_name}/commits/{sha}",
            "url": f"{self.api}/repos/{r.full_name}/commits/{sha}/status",
        }

    # -- GitHub Apps ---------------------------------------------------------------------------
    def installation(self, app: App) -> Json:
        """``installation``."""
        installation = f"{self.api}/app/installations/{app.installation_id}"
        return {
            "id": app.installation_id,
            "app_id": app.id,
            "app_slug": app.slug,
            "client_id": f"Iv1.{app.id:016x}",
            "target_id": app.owner.id,
            "target_type": app.owner.type,
            "account": self.user(app.owner),
            "single_file_name": None,
            "repository_selection": "all" if app.repos is None else "selected",
            "access_tokens_url": f"{installation}/access_tokens",
            "repositories_url": f"{self.api}/installation/repositories",
            "html_url": f"{self.api}/settings/installations/{app.installation_id}",
            "events": [],
            "permissions": APP_PERMISSIONS,
            "created_at": iso(app.created_at),
            "updated_at": iso(app.created_at),
            "suspended_by": None,
            "suspended_at": None,
        }

    def installation_token(self, app: App, token: str, expires_at: datetime) -> Json:
        """``installation-token``."""
        return {
            "token": token,
            "expires_at": iso(expires_at),
            "permissions": APP_PERMISSIONS,
            "repository_selection": "all" if app.repos is None else "selected",
        }


#: What an installed App may do (GitHub's ``app-permissions`` names).
APP_PERMISSIONS = {
    "contents": "write",
    "issues": "write",
    "pull_requests": "write",
    "checks": "read",
    "statuses": "write",
    "metadata": "read",
}
