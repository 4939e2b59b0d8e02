"""The judge of the GitLab tests' requests catches what python-gitlab's managers do
not describe: a body without a required key, a key no create or update takes, a
list filter no list takes, a path no manager has."""

from __future__ import annotations

from pathlib import Path

from support.gitlab_lab import served
from support.gitlab_models import all_problems, judge, problems


def test_a_wrong_body_sent_to_the_fake_is_caught(tmp_path: Path) -> None:
    with served(tmp_path) as lab:
        dev, pid = lab.client("dev"), lab.project.id
        dev.post(f"/projects/{pid}/issues", json={"title": "Fine", "description": "ok"})
        dev.post(f"/projects/{pid}/issues", json={"title": "Wrong", "body": "GitHub's key"})
        dev.put(f"/projects/{pid}/issues/1", json={"state": "closed"})
        dev.get(f"/projects/{pid}/issues", params={"creator": "dev"})
        dev.post(f"/projects/{pid}/labels", json={"name": "x"})
        dev.get(f"/projects/{pid}/frobs")
        found = all_problems(lab.gl.requests)
    assert found == [
        f"POST /api/v4/projects/{pid}/issues: ProjectIssueManager takes no ['body']",
        f"PUT /api/v4/projects/{pid}/issues/1: ProjectIssueManager takes no ['state']",
        f"GET /api/v4/projects/{pid}/issues: ProjectIssueManager lists by no ['creator']",
        f"POST /api/v4/projects/{pid}/labels: ProjectLabelManager requires ['color']",
        f"GET /api/v4/projects/{pid}/frobs: no python-gitlab manager has this operation",
    ]


def test_every_operation_the_forge_uses_has_its_manager_or_is_listed() -> None:
    p = "/api/v4/projects/1"
    for method, path, manager in (
        ("GET", "/api/v4/user", "CurrentUserManager"),
        ("GET", p, "ProjectManager"),
        ("GET", f"{p}/members/all", "ProjectMemberAllManager"),
        ("GET", f"{p}/issues/2/resource_label_events", "ProjectIssueResourceLabelEventManager"),
        ("PUT", f"{p}/issues/2", "ProjectIssueManager"),
        ("POST", f"{p}/merge_requests/2/notes", "ProjectMergeRequestNoteManager"),
        ("GET", f"{p}/merge_requests/2/discussions", "ProjectMergeRequestDiscussionManager"),
        ("POST", f"{p}/statuses/{'a' * 40}", "ProjectCommitStatusManager"),
        ("GET", f"{p}/repository/commits/{'a' * 40}/statuses", "ProjectCommitStatusManager"),
        ("GET", f"{p}/pipelines", "ProjectPipelineManager"),
        ("DELETE", f"{p}/repository/branches/phasegate/w-1", "ProjectBranchManager"),
    ):
        judged = judge(method, path)
        assert judged is not None and judged.manager.__name__ == manager, (method, path)
    merge = f"{p}/merge_requests/2/merge"
    assert problems("PUT", merge, "", {"sha": "a", "squash": True}) == []
    assert problems("PUT", merge, "", {"merge_method": "squash"}) == [
        f"PUT {merge}: the merge takes no ['merge_method']"
    ]
