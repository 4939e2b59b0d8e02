"""The fake GitLab's JSON: each model object in the shape GitLab's REST API v4 answers.

``Shapes(url, gl)`` renders users, projects, members, issues, merge
requests, notes, discussions, labels, commit statuses and pipelines with the
fields GitLab's entities carry (``API::Entities::*``), those phasegate reads
and the ones around them a client may look at.
"""

from __future__ import annotations

from typing import Any

from support.gitlab_model import (
    CommitStatus,
    Issue,
    Label,
    LabelEvent,
    MergeRequest,
    Note,
    Pipeline,
    Project,
    User,
    iso,
)
from support.gitlab_state import GitLab

__all__ = ["Shapes"]


class Shapes:
    """Renders the model at base URL ``url`` (web URLs, clone URLs)."""

    def __init__(self, url: str, gl: GitLab) -> None:
        self.url, self.gl = url, gl

    def user(self, user: User | None) -> dict[str, Any] | None:
        return None if user is None else user.basic(self.url)

    def current_user(self, user: User) -> dict[str, Any]:
        return {
            **user.basic(self.url),
            "created_at": iso(user.created_at),
            "bio": "", "location": None, "public_email": None, "bot": user.bot,
            "email": user.email, "commit_email": user.email,
            "is_admin": False, "two_factor_enabled": False, "external": False,
            "can_create_project": not user.bot, "can_create_group": not user.bot,
        }  # fmt: skip

    def member(self, project: Project, user: User) -> dict[str, Any]:
        return {
            **user.basic(self.url),
            "access_level": project.level(user),
            "created_at": iso(project.created_at),
            "expires_at": None,
            "membership_state": "active",
        }

    def project(self, project: Project, viewer: User) -> dict[str, Any]:
        web = f"{self.url}/{project.full_path}"
        return {
            "id": project.id,
            "description": None,
            "name": project.path,
            "name_with_namespace": f"{project.namespace} / {project.path}",
            "path": project.path,
            "path_with_namespace": project.full_path,
            "created_at": iso(project.created_at),
            "default_branch": project.default_branch,
            "tag_list": [], "topics": [],
            "ssh_url_to_repo": f"git@127.0.0.1:{project.full_path}.git",
            "http_url_to_repo": f"{web}.git",
            "web_url": web,
            "readme_url": f"{web}/-/blob/{project.default_branch}/README.md",
            "avatar_url": None, "forks_count": 0, "star_count": 0,
            "last_activity_at": iso(project.created_at),
            "namespace": {
                "id": project.owner.id, "name": project.namespace, "path": project.namespace,
                "kind": "group" if project.namespace != project.owner.username else "user",
                "full_path": project.namespace, "parent_id": None,
                "avatar_url": None, "web_url": f"{self.url}/{project.namespace}",
            },
            "visibility": project.visibility,
            "archived": False, "empty_repo": False,
            "issues_enabled": True, "merge_requests_enabled": True,
            "merge_method": "merge", "squash_option": "default_off",
            "only_allow_merge_if_pipeline_succeeds": project.only_allow_merge_if_pipeline_succeeds,
            "allow_merge_on_skipped_pipeline": False,
            "only_allow_merge_if_all_discussions_are_resolved": False,
            "remove_source_branch_after_merge": True,
            "creator_id": project.owner.id,
            "open_issues_count": sum(i.state == "opened" for i in project.issues.values()),
            "permissions": {
                "project_access": (
                    {"access_level": project.level(viewer), "notification_level": 3}
                    if project.level(viewer) else None
                ),
                "group_access": None,
            },
        }  # fmt: skip

    def label(self, project: Project, label: Label) -> dict[str, Any]:
        return {
            "id": label.id, "name": label.name, "color": label.color,
            "text_color": "#FFFFFF", "description": label.description,
            "description_html": label.description or "",
            "open_issues_count": sum(
                label.name in i.labels and i.state == "opened" for i in project.issues.values()
            ),
            "closed_issues_count": sum(
                label.name in i.labels and i.state == "closed" for i in project.issues.values()
            ),
            "open_merge_requests_count": sum(
                label.name in m.labels and m.state == "opened"
                for m in project.merge_requests.values()
            ),
            "subscribed": False, "priority": None, "is_project_label": True,
        }  # fmt: skip

    def _common(self, project: Project, item: Issue | MergeRequest, sigil: str) -> dict[str, Any]:
        return {
            "id": item.id, "iid": item.iid, "project_id": project.id,
            "title": item.title, "description": item.description, "state": item.state,
            "created_at": iso(item.created_at), "updated_at": iso(item.updated_at),
            "closed_at": iso(item.closed_at), "closed_by": self.user(item.closed_by),
            "labels": list(item.labels), "milestone": None,
            "author": self.user(item.author), "assignees": [], "assignee": None,
            "user_notes_count": sum(not n.system for n in item.notes),
            "upvotes": 0, "downvotes": 0, "discussion_locked": None,
            "references": {
                "short": f"{sigil}{item.iid}", "relative": f"{sigil}{item.iid}",
                "full": f"{project.full_path}{sigil}{item.iid}",
            },
            "time_stats": {"time_estimate": 0, "total_time_spent": 0,
                           "human_time_estimate": None, "human_total_time_spent": None},
            "task_completion_status": {"count": 0, "completed_count": 0},
        }  # fmt: skip

    def issue(self, project: Project, issue: Issue) -> dict[str, Any]:
        web = f"{self.url}/{project.full_path}/-/issues/{issue.iid}"
        api = f"{self.url}/api/v4/projects/{project.id}"
        return {
            **self._common(project, issue, "#"),
            "type": "ISSUE", "issue_type": "issue", "confidential": False,
            "due_date": None, "merge_requests_count": 0, "has_tasks": False,
            "web_url": web, "severity": "UNKNOWN", "moved_to_id": None,
            "_links": {
                "self": f"{api}/issues/{issue.iid}",
                "notes": f"{api}/issues/{issue.iid}/notes",
                "award_emoji": f"{api}/issues/{issue.iid}/award_emoji",
                "project": api,
            },
        }  # fmt: skip

    def pipeline(self, project: Project, pipeline: Pipeline | None) -> dict[str, Any] | None:
        if pipeline is None:
            return None
        return {
            "id": pipeline.id, "iid": pipeline.iid, "project_id": project.id,
            "sha": pipeline.sha, "ref": pipeline.ref, "status": pipeline.status,
            "source": pipeline.source,
            "created_at": iso(pipeline.created_at), "updated_at": iso(pipeline.updated_at),
            "web_url": f"{self.url}/{project.full_path}/-/pipelines/{pipeline.id}",
        }  # fmt: skip

    def merge_request(
        self, project: Project, mr: MergeRequest, viewer: User, *, single: bool = False
    ) -> dict[str, Any]:
        status, detailed, conflicts = self.gl.merge_status(project, mr)
        base, head = self.gl.diff_refs(project, mr)
        shaped = {
            **self._common(project, mr, "!"),
            "merged_by": self.user(mr.merged_by), "merge_user": self.user(mr.merged_by),
            "merged_at": iso(mr.merged_at),
            "target_branch": mr.target_branch, "source_branch": mr.source_branch,
            "source_project_id": project.id, "target_project_id": project.id,
            "reviewers": [], "draft": mr.draft, "work_in_progress": mr.draft,
            "imported": False, "imported_from": "none",
            "merge_when_pipeline_succeeds": False, "merge_after": None,
            "merge_status": status, "detailed_merge_status": detailed,
            "sha": head, "merge_commit_sha": mr.merge_commit_sha,
            "squash_commit_sha": mr.squash_commit_sha,
            "should_remove_source_branch": mr.should_remove_source_branch,
            "force_remove_source_branch": True,
            "prepared_at": iso(mr.created_at),
            "reference": f"!{mr.iid}",
            "web_url": f"{self.url}/{project.full_path}/-/merge_requests/{mr.iid}",
            "squash": mr.squash, "squash_on_merge": mr.squash,
            "has_conflicts": conflicts, "blocking_discussions_resolved": True,
        }  # fmt: skip
        if single:
            pipeline = self.pipeline(project, project.head_pipeline(head))
            shaped.update({
                "subscribed": False, "changes_count": None,
                "latest_build_started_at": None, "latest_build_finished_at": None,
                "first_deployed_to_production_at": None,
                "pipeline": pipeline, "head_pipeline": pipeline,
                "diff_refs": {"base_sha": base, "head_sha": head, "start_sha": base},
                "merge_error": None, "first_contribution": False,
                "user": {"can_merge": project.level(viewer) >= max(
                    30, self.gl.merge_level(project, mr.target_branch))},
            })  # fmt: skip
        return shaped

    def label_event(self, project: Project, issue: Issue, event: LabelEvent) -> dict[str, Any]:
        return {
            "id": event.id, "user": self.user(event.user), "created_at": iso(event.created_at),
            "resource_type": "Issue", "resource_id": issue.id, "action": event.action,
            "label": {
                "id": event.label.id, "name": event.label.name, "color": event.label.color,
                "description": event.label.description,
            },
        }  # fmt: skip

    def note(self, project: Project, note: Note) -> dict[str, Any]:
        shaped: dict[str, Any] = {
            "id": note.id, "type": "DiffNote" if note.position else None,
            "body": note.body, "attachment": None, "author": self.user(note.author),
            "created_at": iso(note.created_at), "updated_at": iso(note.created_at),
            "system": note.system, "noteable_id": note.noteable_id,
            "noteable_type": note.noteable_type, "project_id": project.id,
            "resolvable": note.position is not None, "confidential": False, "internal": False,
            "imported": False, "imported_from": "none",
            "noteable_iid": note.noteable_iid, "commands_changes": {},
        }  # fmt: skip
        if note.position is not None:
            shaped["position"] = dict(note.position)
            shaped["resolved"] = False
            shaped["resolved_by"] = None
            shaped["resolved_at"] = None
        return shaped

    def discussions(self, project: Project, notes: list[Note]) -> list[dict[str, Any]]:
        """Notes grouped by discussion, in the order each discussion began."""
        grouped: dict[str, list[Note]] = {}
        for note in notes:
            grouped.setdefault(note.discussion_id, []).append(note)
        return [
            {
                "id": did,
                "individual_note": len(group) == 1 and group[0].position is None,
                "notes": [self.note(project, n) for n in group],
            }
            for did, group in grouped.items()
        ]

    def status(self, status: CommitStatus) -> dict[str, Any]:
        return {
            "id": status.id, "sha": status.sha, "ref": status.ref, "status": status.status,
            "name": status.name, "target_url": status.target_url,
            "description": status.description, "created_at": iso(status.created_at),
            "started_at": iso(status.started_at), "finished_at": iso(status.finished_at),
            "allow_failure": status.allow_failure, "coverage": None,
            "pipeline_id": status.pipeline_id, "author": self.user(status.author),
        }  # fmt: skip
