"""The fake GitLab's state and what people and phasegate do to it, in Python.

``GitLab`` holds users, tokens and projects (gitlab_model.py) under one lock
and does what GitLab does when asked: open and edit issues and merge
requests, comment (on a line too), label, post commit statuses (each sha
gets an external pipeline, as on GitLab), and merge on the bare repository
with real git, refusing what GitLab refuses. The REST routes
(gitlab_routes.py) call these; tests call them too, as the people around.
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from support.github_git import BareRepo, GitError, Identity
from support.gitlab_hooks import item_payload, note_payload, pipeline_payload
from support.gitlab_model import (
    ACCESS,
    CommitStatus,
    GitLabError,
    Issue,
    Label,
    LabelEvent,
    MergeRequest,
    Note,
    Pipeline,
    Project,
    User,
)

__all__ = ["GitLab", "label_names", "utc_now"]

STATUS_STATES = ("pending", "running", "success", "failed", "canceled", "skipped")


def utc_now() -> datetime:
    return datetime.now(UTC)


class GitLab:
    """Every user, token and project of one fake GitLab, under ``lock``."""

    def __init__(self, root: Path, clock: Callable[[], datetime] = utc_now) -> None:
        self.root = root
        self.clock = clock
        self.lock = threading.RLock()
        self.users: dict[str, User] = {}
        self.projects: dict[int, Project] = {}
        self.tokens: dict[str, User] = {}
        self._ids: dict[str, itertools.count[int]] = {}

    def announce(
        self, project: Project, event: str, render: Callable[[str], dict[str, Any]]
    ) -> None:
        """Told of each hook event (``render(base_url)`` makes its payload); the
        server delivers it to the project's hooks, the bare model drops it."""

    def next_id(self, kind: str) -> int:
        return next(self._ids.setdefault(kind, itertools.count(1)))

    # -- people ---------------------------------------------------------------------------
    def add_user(self, username: str, name: str | None = None) -> User:
        """A user with one personal access token (``user.tokens[0]``)."""
        with self.lock:
            if username in self.users:
                raise ValueError(f"user {username} exists")
            user = User(
                self.next_id("user"), username, name or username.title(),
                f"{username}@example.com", self.clock(),
            )  # fmt: skip
            self.users[username] = user
            self.add_token(user)
            return user

    def add_token(self, user: User) -> str:
        """A new personal access token for ``user`` (``glpat-``, as GitLab's)."""
        with self.lock:
            token = "glpat-" + secrets.token_urlsafe(15)
            user.tokens.append(token)
            self.tokens[token] = user
            return token

    def revoke(self, token: str) -> None:
        with self.lock:
            user = self.tokens.pop(token)
            user.tokens.remove(token)

    def project_token(self, ref: str | int, role: str = "developer") -> tuple[User, str]:
        """A project access token: a bot user, member at ``role``, and its token."""
        with self.lock:
            project = self.project(ref)
            digest = hashlib.sha256(secrets.token_bytes(8)).hexdigest()[:10]
            bot = User(
                self.next_id("user"), f"project_{project.id}_bot_{digest}",
                f"{project.path} bot", f"project{project.id}_bot@noreply.example.com",
                self.clock(), bot=True,
            )  # fmt: skip
            self.users[bot.username] = bot
            project.members[bot.id] = ACCESS[role]
            return bot, self.add_token(bot)

    def token_user(self, token: str | None) -> User | None:
        return self.tokens.get(token or "")

    # -- projects ---------------------------------------------------------------------------
    def create_project(
        self,
        full_path: str,
        owner: str,
        *,
        from_path: Path | None = None,
        default_branch: str = "main",
    ) -> Project:
        """A project at ``group/name`` owned (Owner, 50) by ``owner``; its bare
        repository is seeded from ``from_path`` or gets a first commit."""
        namespace, _, path = full_path.rpartition("/")
        with self.lock:
            user = self.users[owner]
            pid = self.next_id("project")
            author = Identity(user.name, user.email)
            bare = BareRepo.made(
                self.root / f"{full_path}.git", default_branch, from_path, path, author
            )
            project = Project(
                pid, namespace or owner, path, user, bare, self.clock(), default_branch
            )
            project.members[user.id] = ACCESS["owner"]
            self.projects[pid] = project
            return project

    def add_member(self, ref: str | int, username: str, role: str | int) -> None:
        with self.lock:
            level = ACCESS[role] if isinstance(role, str) else role
            self.project(ref).members[self.users[username].id] = level

    def project(self, ref: str | int) -> Project:
        """A project by id or full path (404 ``Project Not Found`` otherwise)."""
        with self.lock:
            if isinstance(ref, int) or str(ref).isdigit():
                found = self.projects.get(int(ref))
            else:
                found = next((p for p in self.projects.values() if p.full_path == ref), None)
            if found is None:
                raise GitLabError(404, "404 Project Not Found")
            return found

    def visible(self, ref: str | int, user: User, at_least: int = ACCESS["guest"]) -> Project:
        """The project ``user`` may act on at ``at_least``: a non-member gets 404
        (a private project is not there for them), too low a role 403. On a
        public or internal project a signed-in non-member reads, opens issues
        and writes notes as a Guest does, as on GitLab."""
        project = self.project(ref)
        level = project.level(user)
        if level == 0 and project.visibility in ("public", "internal"):
            level = ACCESS["guest"]
        if level == 0:
            raise GitLabError(404, "404 Project Not Found")
        if level < at_least:
            raise GitLabError(403, "403 Forbidden")
        return project

    # -- issues -----------------------------------------------------------------------------
    def open_issue(
        self,
        ref: str | int,
        author: str,
        title: str,
        description: str = "",
        labels: list[str] | None = None,
    ) -> Issue:
        with self.lock:
            project, user = self.project(ref), self.users[author]
            now = self.clock()
            issue = Issue(
                self.next_id("issue"), project.next_iid(project.issues), title, description,
                user, now, now,
            )  # fmt: skip
            project.issues[issue.iid] = issue
            self.set_labels(project, issue, labels or [], user)
            self._announce_item(project, issue, user, "open")
            return issue

    def issue(self, project: Project, iid: int) -> Issue:
        found = project.issues.get(iid)
        if found is None:
            raise GitLabError(404, "404 Not found")
        return found

    def set_labels(
        self,
        project: Project,
        item: Issue | MergeRequest,
        names: list[str],
        actor: User | None = None,
    ) -> None:
        """``item``'s labels become ``names``; an unknown label is made, as GitLab
        does. Each label added or removed is a resource label event by ``actor``."""
        for name in names:
            if name not in project.labels:
                project.labels[name] = Label(self.next_id("label"), name, "#6699cc")
        before, after = list(item.labels), list(dict.fromkeys(names))
        item.labels = after
        if actor is None:
            return
        changes = [(n, "add") for n in after if n not in before]
        changes += [(n, "remove") for n in before if n not in after]
        for name, action in changes:
            item.label_events.append(
                LabelEvent(
                    self.next_id("label_event"), actor, self.clock(), project.labels[name], action
                )
            )

    def label(self, ref: str | int, iid: int, name: str, by: str, *, add: bool = True) -> None:
        """``by`` adds (or removes) label ``name`` on issue ``iid``, as in GitLab's UI."""
        with self.lock:
            project = self.project(ref)
            key = "add_labels" if add else "remove_labels"
            self.edit(project, self.issue(project, iid), self.users[by], {key: name})

    def edit(
        self, project: Project, item: Issue | MergeRequest, actor: User, fields: dict[str, Any]
    ) -> None:
        """What ``PUT`` on an issue or merge request does with ``fields``."""
        labels_before = list(item.labels)
        for name in ("title", "description"):
            if fields.get(name) is not None:
                setattr(item, name, str(fields[name]))
        if "labels" in fields:
            self.set_labels(project, item, label_names(fields["labels"]), actor)
        if "add_labels" in fields:
            self.set_labels(project, item, item.labels + label_names(fields["add_labels"]), actor)
        if "remove_labels" in fields:
            gone = set(label_names(fields["remove_labels"]))
            self.set_labels(project, item, [n for n in item.labels if n not in gone], actor)
        if isinstance(item, MergeRequest) and fields.get("target_branch"):
            item.target_branch = str(fields["target_branch"])
        event, action = fields.get("state_event"), "update"
        if event == "close" and item.state == "opened":
            item.state, item.closed_at, item.closed_by = "closed", self.clock(), actor
            action = "close"
        elif event == "reopen" and item.state == "closed":
            item.state, item.closed_at, item.closed_by = "opened", None, None
            action = "reopen"
        item.updated_at = self.clock()
        self._announce_item(project, item, actor, action, labels_before)

    def _announce_item(
        self,
        project: Project,
        item: Issue | MergeRequest,
        actor: User,
        action: str,
        labels_before: list[str] | None = None,
    ) -> None:
        head = self.head_sha(project, item) if isinstance(item, MergeRequest) else None
        event = "Issue Hook" if isinstance(item, Issue) else "Merge Request Hook"
        self.announce(
            project,
            event,
            lambda url: item_payload(project, item, actor, action, head, url, labels_before)[1],
        )

    # -- notes ------------------------------------------------------------------------------
    def comment(
        self,
        item: Issue | MergeRequest,
        author: User,
        body: str,
        *,
        position: dict[str, Any] | None = None,
        discussion_id: str | None = None,
    ) -> Note:
        """A note on ``item``; with ``position``, a diff note (a line comment)."""
        with self.lock:
            kind = "Issue" if isinstance(item, Issue) else "MergeRequest"
            note = Note(
                self.next_id("note"), body, author, self.clock(), kind, item.id, item.iid,
                discussion_id or secrets.token_hex(20), position=position,
            )  # fmt: skip
            item.notes.append(note)
            item.updated_at = note.created_at
            project = self.project_of(item)
            head = self.head_sha(project, item) if isinstance(item, MergeRequest) else None
            self.announce(
                project, "Note Hook", lambda url: note_payload(project, item, note, head, url)
            )
            return note

    def project_of(self, item: Issue | MergeRequest) -> Project:
        """The project holding ``item``."""
        for project in self.projects.values():
            held = project.issues if isinstance(item, Issue) else project.merge_requests
            if held.get(item.iid) is item:
                return project
        raise GitLabError(404, "404 Not found")

    def line_comment(
        self, ref: str | int, iid: int, author: str, path: str, line: int, body: str
    ) -> Note:
        """A person's comment on new-file line ``line`` of ``path`` in merge
        request ``iid``: a diff note whose position names the diff's SHAs."""
        with self.lock:
            project = self.project(ref)
            mr = self.merge_request(project, iid)
            base, head = self.diff_refs(project, mr)
            position = {
                "base_sha": base, "start_sha": base, "head_sha": head,
                "old_path": path, "new_path": path, "position_type": "text",
                "old_line": None, "new_line": line,
                "line_range": None,
            }  # fmt: skip
            return self.comment(mr, self.users[author], body, position=position)

    # -- merge requests ---------------------------------------------------------------------
    def open_merge_request(
        self,
        ref: str | int,
        author: User,
        source: str,
        target: str,
        title: str,
        description: str = "",
        labels: list[str] | None = None,
    ) -> MergeRequest:
        with self.lock:
            project = self.project(ref)
            if project.bare.branch_sha(source) is None:
                raise GitLabError(400, {"source_branch": ["is invalid"]})
            if project.bare.branch_sha(target) is None:
                raise GitLabError(400, {"target_branch": ["is invalid"]})
            if source == target:
                raise GitLabError(
                    400, {"base": ["You can't use same project/branch for source and target"]}
                )
            for other in project.merge_requests.values():
                if other.state == "opened" and (other.source_branch, other.target_branch) == (
                    source,
                    target,
                ):
                    raise GitLabError(
                        409,
                        [
                            "Another open merge request already exists for this source branch: "
                            f"!{other.iid}"
                        ],
                    )
            now = self.clock()
            mr = MergeRequest(
                self.next_id("merge_request"), project.next_iid(project.merge_requests), title,
                description, source, target, author, now, now,
                draft=title.lower().startswith(("draft:", "[draft]", "(draft)")),
            )  # fmt: skip
            project.merge_requests[mr.iid] = mr
            self.set_labels(project, mr, labels or [], author)
            self._announce_item(project, mr, author, "open")
            return mr

    def merge_request(self, project: Project, iid: int) -> MergeRequest:
        found = project.merge_requests.get(iid)
        if found is None:
            raise GitLabError(404, "404 Not found")
        return found

    def head_sha(self, project: Project, mr: MergeRequest) -> str | None:
        if mr.state == "merged" and mr.merged_sha:
            return mr.merged_sha
        return project.bare.branch_sha(mr.source_branch)

    def diff_refs(self, project: Project, mr: MergeRequest) -> tuple[str | None, str | None]:
        """(base, head): the merge base of target and source, and the source's tip."""
        head = self.head_sha(project, mr)
        target = project.bare.branch_sha(mr.target_branch)
        if head is None or target is None:
            return target, head
        base = project.bare.git("merge-base", target, head).strip() or target
        return base, head

    def merge_status(self, project: Project, mr: MergeRequest) -> tuple[str, str, bool]:
        """GitLab's (``merge_status``, ``detailed_merge_status``, ``has_conflicts``)."""
        if mr.state != "opened":
            return ("merged" if mr.state == "merged" else "cannot_be_merged"), "not_open", False
        head, target = self.head_sha(project, mr), project.bare.branch_sha(mr.target_branch)
        if head is None or target is None:
            return "cannot_be_merged", "broken_status", False
        conflicts = project.bare.merge_tree(target, head) is None
        if conflicts:
            return "cannot_be_merged", "conflict", True
        if mr.draft:
            return "can_be_merged", "draft_status", False
        pipeline = project.head_pipeline(head)
        if project.only_allow_merge_if_pipeline_succeeds:
            if pipeline is None or pipeline.status in ("failed", "canceled"):
                return "can_be_merged", "ci_must_pass", False
            if pipeline.status != "success":
                return "can_be_merged", "ci_still_running", False
        return "can_be_merged", "mergeable", False

    def merge(
        self, project: Project, mr: MergeRequest, actor: User, fields: dict[str, Any]
    ) -> None:
        """``PUT .../merge``: 405 while it cannot be merged (closed, draft, its
        pipeline not success where the project demands it), 406 on a conflict,
        409 when ``sha`` is not the head, 401 for a role below the branch's
        merge level; else a merge commit (or squash) on the bare repository."""
        if project.level(actor) < max(
            ACCESS["developer"], self.merge_level(project, mr.target_branch)
        ):
            raise GitLabError(401, "401 Unauthorized")
        _, detailed, conflicts = self.merge_status(project, mr)
        if conflicts:
            raise GitLabError(406, "Branch cannot be merged")
        if detailed != "mergeable":
            raise GitLabError(405, "405 Method Not Allowed")
        head = self.head_sha(project, mr)
        assert head is not None
        if fields.get("sha") and fields["sha"] != head:
            raise GitLabError(409, "SHA does not match HEAD of source branch: " + head)
        squash = bool(fields.get("squash", mr.squash))
        message = fields.get("squash_commit_message" if squash else "merge_commit_message") or (
            f"Merge branch '{mr.source_branch}' into '{mr.target_branch}'\n\n{mr.title}\n\n"
            f"See merge request {project.full_path}!{mr.iid}"
        )
        title, _, rest = str(message).partition("\n")
        try:
            new = project.bare.merge(
                mr.target_branch, head, "squash" if squash else "merge", title, rest.strip(),
                Identity(actor.name, actor.email),
            )  # fmt: skip
        except GitError as failed:
            raise GitLabError(422, f"Merge failed: {failed}") from None
        mr.state, mr.merged_at, mr.merged_by, mr.merged_sha = "merged", self.clock(), actor, head
        mr.updated_at = mr.merged_at
        mr.merge_commit_sha = None if squash else new
        mr.squash_commit_sha = new if squash else None
        mr.squash = squash
        if fields.get("should_remove_source_branch") or mr.should_remove_source_branch:
            project.bare.git("update-ref", "-d", f"refs/heads/{mr.source_branch}")
        self._announce_item(project, mr, actor, "merge")

    def merge_level(self, project: Project, branch: str) -> int:
        """Who may merge into ``branch``: the default branch is protected."""
        return project.merge_level if branch == project.default_branch else ACCESS["developer"]

    # -- statuses and pipelines ---------------------------------------------------------------
    def post_status(
        self,
        project: Project,
        author: User,
        sha: str,
        state: str,
        *,
        ref: str | None = None,
        name: str = "default",
        target_url: str | None = None,
        description: str | None = None,
    ) -> CommitStatus:
        """``POST /statuses/:sha``: the status of job ``name`` in the sha's
        external pipeline (made on first use), replacing its earlier state."""
        if state not in STATUS_STATES:
            raise GitLabError(400, "state does not have a valid value", key="error")
        if project.bare.sha(sha) is None:
            raise GitLabError(404, "404 Commit Not Found")
        ref = ref or self.branch_of(project, sha) or project.default_branch
        pipeline = next(
            (
                p
                for p in reversed(project.pipelines)
                if p.sha == sha and p.ref == ref and p.source == "external"
            ),
            None,
        )
        now = self.clock()
        if pipeline is None:
            pipeline = Pipeline(
                self.next_id("pipeline"),
                len(project.pipelines) + 1,
                sha,
                ref,
                "external",
                now,
                now,
                author,
            )
            project.pipelines.append(pipeline)
        before = pipeline.status if pipeline.jobs else None
        job = next((j for j in pipeline.jobs if j.name == name), None)
        if job is not None and job.status == state:
            raise GitLabError(
                400, f"Cannot transition status via :{_verb(state)} from :{job.status}"
            )
        status = CommitStatus(
            self.next_id("status"), sha, ref, state, name, author, now, pipeline.id,
            target_url, description,
            started_at=now if state != "pending" else None,
            finished_at=now if state in ("success", "failed", "canceled", "skipped") else None,
        )  # fmt: skip
        pipeline.jobs = [j for j in pipeline.jobs if j.name != name] + [status]
        pipeline.updated_at = now
        project.statuses.append(status)
        if pipeline.status != before:
            self._announce_pipeline(project, pipeline)
        return status

    def _announce_pipeline(self, project: Project, pipeline: Pipeline) -> None:
        self.announce(
            project, "Pipeline Hook", lambda url: pipeline_payload(project, pipeline, url)
        )

    def run_pipeline(
        self, ref: str | int, sha: str, status: str, *, branch: str | None = None
    ) -> Pipeline:
        """A CI pipeline (source ``push``) of ``sha`` in state ``status``, as
        a runner would leave it."""
        with self.lock:
            project = self.project(ref)
            now = self.clock()
            pipeline = Pipeline(
                self.next_id("pipeline"), len(project.pipelines) + 1, sha,
                branch or self.branch_of(project, sha) or project.default_branch,
                "push", now, now, project.owner, forced=status,
            )  # fmt: skip
            project.pipelines.append(pipeline)
            self._announce_pipeline(project, pipeline)
            return pipeline

    def branch_of(self, project: Project, sha: str) -> str | None:
        for branch in project.bare.branches():
            if project.bare.branch_sha(branch) == sha:
                return branch
        return None

    def delete_branch(self, project: Project, actor: User, branch: str) -> None:
        if project.bare.branch_sha(branch) is None:
            raise GitLabError(404, "404 Branch Not Found")
        if branch == project.default_branch:
            raise GitLabError(400, "Cannot remove the default branch")
        if project.level(actor) < ACCESS["developer"]:
            raise GitLabError(403, "403 Forbidden")
        project.bare.git("update-ref", "-d", f"refs/heads/{branch}")


def label_names(value: Any) -> list[str]:
    """Labels as GitLab takes them: a comma-separated string or a list."""
    items = value if isinstance(value, list) else str(value or "").split(",")
    return [str(n).strip() for n in items if str(n).strip()]


def _verb(state: str) -> str:
    return {"pending": "enqueue", "running": "run", "success": "succeed", "failed": "drop",
            "canceled": "cancel", "skipped": "skip"}[state]  # fmt: skip
