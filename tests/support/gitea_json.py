"""The fake Gitea's JSON: each model object in the shape Gitea's API v1 answers.

``Shapes(url, gitea)`` renders users, repositories, labels, issues, pull
requests, comments, timeline entries, reviews and their comments, commit
statuses and branch protections with the fields Gitea's ``modules/structs``
carry (what ``services/convert`` fills), so a client reading any of them
finds it where Gitea puts it.
"""

from __future__ import annotations

from typing import Any

from support.gitea_model import (
    Comment,
    Event,
    Issue,
    Label,
    Protection,
    Repo,
    Review,
    ReviewComment,
    Status,
    User,
    iso,
)
from support.gitea_state import Gitea

__all__ = ["Shapes"]

_EPOCH = "1970-01-01T00:00:00Z"


class Shapes:
    """Renders the model at base URL ``url`` (web URLs, API URLs, clone URLs)."""

    def __init__(self, url: str, gitea: Gitea) -> None:
        self.url, self.gitea = url, gitea

    @property
    def api(self) -> str:
        return f"{self.url}/api/v1"

    def user(self, user: User | None) -> dict[str, Any] | None:
        if user is None:
            return None
        return {
            "id": user.id, "login": user.login, "login_name": "", "source_id": 0,
            "full_name": user.full_name, "email": user.email,
            "avatar_url": f"{self.url}/avatars/{user.id:032x}",
            "html_url": f"{self.url}/{user.login}", "language": "",
            "is_admin": user.is_admin, "last_login": _EPOCH, "created": iso(user.created),
            "restricted": False, "active": True, "prohibit_login": False,
            "location": "", "website": "", "description": "", "visibility": "public",
            "followers_count": 0, "following_count": 0, "starred_repos_count": 0,
            # Gitea adds GitHub's name for the login (structs.User.MarshalJSON).
            "username": user.login,
        }  # fmt: skip

    def repository(self, repo: Repo, viewer: User | None = None) -> dict[str, Any]:
        web = f"{self.url}/{repo.full_name}"
        open_issues = sum(i.state == "open" and i.pull is None for i in repo.issues.values())
        open_pulls = sum(i.state == "open" and i.pull is not None for i in repo.issues.values())
        return {
            "id": repo.id, "owner": self.user(repo.owner), "name": repo.name,
            "full_name": repo.full_name, "description": "", "empty": False,
            "private": repo.private, "fork": False, "template": False, "mirror": False,
            "size": 0, "language": "",
            "languages_url": f"{self.api}/repos/{repo.full_name}/languages",
            "html_url": web, "url": f"{self.api}/repos/{repo.full_name}", "link": "",
            "ssh_url": f"git@127.0.0.1:{repo.full_name}.git", "clone_url": f"{web}.git",
            "original_url": "", "website": "", "stars_count": 0, "forks_count": 0,
            "watchers_count": 1, "open_issues_count": open_issues, "open_pr_counter": open_pulls,
            "release_counter": 0, "default_branch": repo.default_branch,
            "default_target_branch": repo.default_branch,
            "archived": False, "created_at": iso(repo.created_at),
            "updated_at": iso(repo.created_at), "archived_at": _EPOCH,
            "permissions": {
                "admin": repo.can(viewer, "admin"), "push": repo.can(viewer, "write"),
                "pull": repo.can(viewer, "read") or not repo.private,
            },
            "has_code": True, "has_issues": True,
            "internal_tracker": {
                "enable_time_tracker": True, "allow_only_contributors_to_track_time": True,
                "enable_issue_dependencies": True,
            },
            "has_wiki": True, "has_pull_requests": True, "has_projects": True,
            "projects_mode": "all", "has_releases": True, "has_packages": True,
            "has_actions": True, "ignore_whitespace_conflicts": False,
            "allow_merge_commits": True, "allow_rebase": True, "allow_rebase_explicit": True,
            "allow_squash_merge": True, "allow_fast_forward_only_merge": True,
            "allow_rebase_update": True, "allow_manual_merge": False,
            "autodetect_manual_merge": False, "default_delete_branch_after_merge": False,
            "default_merge_style": "merge", "default_allow_maintainer_edit": False,
            "default_update_style": "merge", "allow_merge_update": True,
            "avatar_url": "", "internal": False, "mirror_interval": "",
            "object_format_name": "sha1", "mirror_updated": _EPOCH, "topics": [],
            "licenses": [], "repo_transfer": None,
        }  # fmt: skip

    def repository_meta(self, repo: Repo) -> dict[str, Any]:
        return {
            "id": repo.id,
            "name": repo.name,
            "owner": repo.owner.login,
            "full_name": repo.full_name,
        }

    def label(self, repo: Repo, label: Label) -> dict[str, Any]:
        return {
            "id": label.id, "name": label.name, "exclusive": label.exclusive,
            "is_archived": False, "color": label.color, "description": label.description,
            "url": f"{self.api}/repos/{repo.full_name}/labels/{label.id}",
        }  # fmt: skip

    def issue(self, repo: Repo, issue: Issue) -> dict[str, Any]:
        kind = "pulls" if issue.pull else "issues"
        shaped: dict[str, Any] = {
            "id": issue.id, "url": f"{self.api}/repos/{repo.full_name}/issues/{issue.number}",
            "html_url": f"{self.url}/{repo.full_name}/{kind}/{issue.number}",
            "number": issue.number, "user": self.user(issue.user),
            "original_author": "", "original_author_id": 0,
            "title": issue.title, "body": issue.body, "ref": "", "assets": [],
            "labels": [self.label(repo, repo.labels[i]) for i in issue.labels],
            "milestone": None, "assignee": None, "assignees": None,
            "state": issue.state, "is_locked": False, "comments": len(issue.comments),
            "created_at": iso(issue.created_at), "updated_at": iso(issue.updated_at),
            "closed_at": iso(issue.closed_at), "due_date": None, "time_estimate": 0,
            "pull_request": None, "repository": self.repository_meta(repo), "pin_order": 0,
        }  # fmt: skip
        if issue.pull is not None:
            shaped["pull_request"] = {
                "merged": issue.pull.merged, "merged_at": iso(issue.pull.merged_at),
                "draft": issue.draft,
                "html_url": f"{self.url}/{repo.full_name}/pulls/{issue.number}",
            }  # fmt: skip
        return shaped

    def _branch(self, repo: Repo, ref: str, sha: str | None) -> dict[str, Any]:
        return {
            "label": ref,
            "ref": ref,
            "sha": sha or "",
            "repo_id": repo.id,
            "repo": self.repository(repo),
        }

    def pull(self, repo: Repo, issue: Issue, viewer: User | None = None) -> dict[str, Any]:
        pull = issue.pull
        assert pull is not None
        head = self.gitea.head_sha(repo, issue)
        base_sha = pull.merged_base if pull.merged else repo.bare.branch_sha(pull.base)
        web = f"{self.url}/{repo.full_name}/pulls/{issue.number}"
        counted = {"additions": 0, "deletions": 0, "changed_files": 0}
        if head and base_sha:
            for line in repo.bare.git("diff", "--numstat", f"{base_sha}...{head}").splitlines():
                added, deleted, _ = line.split("\t", 2)
                counted["changed_files"] += 1
                # Binary files count as changed with no lines.
                counted["additions"] += int(added) if added != "-" else 0
                counted["deletions"] += int(deleted) if deleted != "-" else 0
        return {
            "id": issue.id, "url": web, "number": issue.number, "user": self.user(issue.user),
            "title": issue.title, "body": issue.body,
            "labels": [self.label(repo, repo.labels[i]) for i in issue.labels],
            "milestone": None, "assignee": None, "assignees": None,
            "requested_reviewers": [], "requested_reviewers_teams": [],
            "state": issue.state, "draft": issue.draft, "is_locked": False,
            "comments": len(issue.comments),
            "review_comments": sum(len(r.comments) for r in pull.reviews),
            **counted,
            "html_url": web, "diff_url": f"{web}.diff", "patch_url": f"{web}.patch",
            "mergeable": self.gitea.mergeable(repo, issue), "merged": pull.merged,
            "merged_at": iso(pull.merged_at), "merge_commit_sha": pull.merge_commit_sha,
            "merged_by": self.user(pull.merged_by), "allow_maintainer_edit": False,
            "base": self._branch(repo, pull.base, base_sha),
            "head": self._branch(repo, pull.head, head),
            "merge_base": self.gitea.merge_base(repo, issue) or "",
            "due_date": None, "created_at": iso(issue.created_at),
            "updated_at": iso(issue.updated_at), "closed_at": iso(issue.closed_at),
            "pin_order": 0,
        }  # fmt: skip

    def comment(self, repo: Repo, issue: Issue, comment: Comment) -> dict[str, Any]:
        kind = "pulls" if issue.pull else "issues"
        web = f"{self.url}/{repo.full_name}/{kind}/{issue.number}"
        return {
            "id": comment.id,
            "html_url": f"{web}#issuecomment-{comment.id}",
            "pull_request_url": (
                f"{self.url}/{repo.full_name}/pulls/{issue.number}" if issue.pull else ""
            ),
            "issue_url": "" if issue.pull else f"{self.url}/{repo.full_name}/issues/{issue.number}",
            "user": self.user(comment.user), "original_author": "", "original_author_id": 0,
            "body": comment.body, "assets": [],
            "created_at": iso(comment.created_at), "updated_at": iso(comment.updated_at),
        }  # fmt: skip

    def timeline(self, repo: Repo, issue: Issue, entry: Comment | Event) -> dict[str, Any]:
        """One ``TimelineComment``: a comment (``type`` comment) or an event
        (label: ``body`` "1" when added, "" when removed, as Gitea stores it)."""
        kind = "pulls" if issue.pull else "issues"
        web = f"{self.url}/{repo.full_name}/{kind}/{issue.number}"
        is_comment = isinstance(entry, Comment)
        label = entry.label if isinstance(entry, Event) else None
        return {
            "id": entry.id, "type": "comment" if is_comment else entry.type,  # type: ignore[union-attr]
            "html_url": f"{web}#issuecomment-{entry.id}",
            "pull_request_url": web if issue.pull else "",
            "issue_url": "" if issue.pull else web,
            "user": self.user(entry.user), "body": entry.body,
            "created_at": iso(entry.created_at),
            "updated_at": iso(entry.updated_at if isinstance(entry, Comment) else entry.created_at),
            "old_project_id": 0, "project_id": 0, "old_milestone": None, "milestone": None,
            "tracked_time": None, "old_title": "", "new_title": "", "old_ref": "", "new_ref": "",
            "ref_issue": None, "ref_comment": None, "ref_action": "", "ref_commit_sha": "",
            "review_id": 0, "label": self.label(repo, label) if label else None,
            "assignee": None, "assignee_team": None, "removed_assignee": False,
            "resolve_doer": None, "dependent_issue": None,
        }  # fmt: skip

    def review(self, repo: Repo, issue: Issue, review: Review) -> dict[str, Any]:
        web = f"{self.url}/{repo.full_name}/pulls/{issue.number}"
        return {
            "id": review.id, "user": self.user(review.user), "team": None,
            "state": review.state, "body": review.body, "commit_id": review.commit_id,
            "stale": review.stale, "official": review.official, "dismissed": review.dismissed,
            "comments_count": len(review.comments), "submitted_at": iso(review.submitted_at),
            "updated_at": iso(review.submitted_at),
            "html_url": f"{web}#issuecomment-{review.id}", "pull_request_url": web,
        }  # fmt: skip

    def review_comment(self, repo: Repo, issue: Issue, c: ReviewComment) -> dict[str, Any]:
        web = f"{self.url}/{repo.full_name}/pulls/{issue.number}"
        return {
            "id": c.id, "body": c.body, "user": self.user(c.user), "resolver": None,
            "pull_request_review_id": c.review_id,
            "created_at": iso(c.created_at), "updated_at": iso(c.created_at),
            "path": c.path, "commit_id": c.commit_id, "original_commit_id": c.commit_id,
            "diff_hunk": c.diff_hunk, "position": c.position,
            "original_position": c.old_position,
            "html_url": f"{web}/files#issuecomment-{c.id}", "pull_request_url": web,
        }  # fmt: skip

    def status(self, repo: Repo, status: Status) -> dict[str, Any]:
        return {
            "id": status.id, "status": status.state, "target_url": status.target_url,
            "description": status.description,
            "url": f"{self.api}/repos/{repo.full_name}/statuses/{status.sha}",
            "context": status.context, "creator": self.user(status.creator),
            "created_at": iso(status.created_at), "updated_at": iso(status.created_at),
        }  # fmt: skip

    def combined(self, repo: Repo, sha: str, viewer: User | None) -> dict[str, Any]:
        latest = self.gitea.latest_statuses(repo, sha)
        if not latest:  # Gitea answers its zero value then
            return {"state": "", "sha": "", "total_count": 0, "statuses": None,
                    "repository": None, "commit_url": "", "url": ""}  # fmt: skip
        return {
            "state": self.gitea.combined_state(latest), "sha": sha,
            "total_count": len(latest), "statuses": [self.status(repo, s) for s in latest],
            "repository": self.repository(repo, viewer),
            "commit_url": f"{self.api}/repos/{repo.full_name}/git/commits/{sha}",
            "url": f"{self.api}/repos/{repo.full_name}/commits/{sha}/status",
        }  # fmt: skip

    def protection(self, rule: Protection) -> dict[str, Any]:
        o = rule.options

        def names(key: str) -> list[Any]:
            return list(o.get(key) or [])

        return {
            "branch_name": rule.rule_name, "rule_name": rule.rule_name,
            "priority": int(o.get("priority") or 0),
            "enable_push": rule.enable_push,
            "enable_push_whitelist": bool(o.get("enable_push_whitelist", False)),
            "push_whitelist_usernames": names("push_whitelist_usernames"),
            "push_whitelist_teams": names("push_whitelist_teams"),
            "push_whitelist_deploy_keys": bool(o.get("push_whitelist_deploy_keys", False)),
            "enable_force_push": bool(o.get("enable_force_push", False)),
            "enable_force_push_allowlist": bool(o.get("enable_force_push_allowlist", False)),
            "force_push_allowlist_usernames": names("force_push_allowlist_usernames"),
            "force_push_allowlist_teams": names("force_push_allowlist_teams"),
            "force_push_allowlist_deploy_keys": bool(
                o.get("force_push_allowlist_deploy_keys", False)
            ),
            "enable_merge_whitelist": bool(o.get("enable_merge_whitelist", False)),
            "merge_whitelist_usernames": names("merge_whitelist_usernames"),
            "merge_whitelist_teams": names("merge_whitelist_teams"),
            "enable_status_check": rule.enable_status_check,
            "status_check_contexts": list(rule.status_check_contexts),
            "required_approvals": rule.required_approvals,
            "enable_approvals_whitelist": bool(o.get("enable_approvals_whitelist", False)),
            "approvals_whitelist_username": names("approvals_whitelist_username"),
            "approvals_whitelist_teams": names("approvals_whitelist_teams"),
            "block_on_rejected_reviews": rule.block_on_rejected_reviews,
            "block_on_official_review_requests": bool(
                o.get("block_on_official_review_requests", False)
            ),
            "block_on_outdated_branch": bool(o.get("block_on_outdated_branch", False)),
            "dismiss_stale_approvals": bool(o.get("dismiss_stale_approvals", False)),
            "ignore_stale_approvals": bool(o.get("ignore_stale_approvals", False)),
            "require_signed_commits": bool(o.get("require_signed_commits", False)),
            "protected_file_patterns": str(o.get("protected_file_patterns") or ""),
            "unprotected_file_patterns": str(o.get("unprotected_file_patterns") or ""),
            "block_admin_merge_override": rule.block_admin_merge_override,
            "enable_bypass_allowlist": bool(o.get("enable_bypass_allowlist", False)),
            "bypass_allowlist_usernames": names("bypass_allowlist_usernames"),
            "bypass_allowlist_teams": names("bypass_allowlist_teams"),
            "created_at": iso(rule.created_at), "updated_at": iso(rule.updated_at),
        }  # fmt: skip

    def permission(self, repo: Repo, user: User) -> dict[str, Any]:
        mode = repo.mode(user)
        return {"permission": mode, "role_name": mode, "user": self.user(user)}
