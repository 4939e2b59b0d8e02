"""The fake GitLab answers like GitLab: shapes, status codes, pagination, roles, real git.

Each operation phasegate's GitLab forge will use is driven with httpx as
python-gitlab sends it (``PRIVATE-TOKEN`` or ``Bearer``, JSON bodies), and
git goes over smart HTTP with ``oauth2:TOKEN`` as GitLab documents; merges
land on the bare repository.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.fake_hooks import receiving_hooks
from support.fake_http import served_by_hand
from support.github_git import git_env
from support.gitlab_lab import PROJECT, Lab, ok, served


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    with served(tmp_path) as made:
        yield made


# -- the caller and the project ----------------------------------------------------------------


def test_tokens_authenticate_and_unknown_ones_get_gitlabs_401(lab: Lab) -> None:
    me = ok(lab.client("dev").get("/user"))
    assert (me["username"], me["bot"], me["email"]) == ("dev", False, "dev@example.com")
    assert ok(lab.client("dev", bearer=True).get("/user"))["id"] == me["id"]
    bare = httpx.get(f"{lab.gl.url}/api/v4/user")
    assert (bare.status_code, bare.json()) == (401, {"message": "401 Unauthorized"})
    wrong = httpx.get(f"{lab.gl.url}/api/v4/user", headers={"PRIVATE-TOKEN": "glpat-nope"})
    assert wrong.status_code == 401


def test_project_by_id_or_encoded_path_and_hidden_from_strangers(lab: Lab) -> None:
    dev = lab.client("dev")
    by_id = ok(dev.get(f"/projects/{lab.project.id}"))
    by_path = ok(dev.get("/projects/acme%2Fapp"))
    assert by_id == by_path
    assert by_id["path_with_namespace"] == PROJECT
    assert by_id["default_branch"] == "main"
    assert by_id["http_url_to_repo"] == f"{lab.gl.url}/acme/app.git"
    assert by_id["permissions"]["project_access"]["access_level"] == 30
    hidden = lab.client("stranger").get(f"/projects/{lab.project.id}")
    assert (hidden.status_code, hidden.json()) == (404, {"message": "404 Project Not Found"})


def test_members_all_gives_each_users_access_level(lab: Lab) -> None:
    dev = lab.client("dev")
    levels = {
        name: ok(dev.get(f"/projects/{lab.project.id}/members/all/{lab.gl.users[name].id}"))[
            "access_level"
        ]
        for name in ("alice", "dev", "guest")
    }
    assert levels == {"alice": 50, "dev": 30, "guest": 10}
    stranger = lab.gl.users["stranger"].id
    missing = dev.get(f"/projects/{lab.project.id}/members/all/{stranger}")
    assert missing.status_code == 404


def test_project_token_is_a_bot_member(lab: Lab) -> None:
    bot, token = lab.gl.project_token(PROJECT, "maintainer")
    client = lab.opened({"PRIVATE-TOKEN": token})
    assert ok(client.get("/user"))["bot"] is True
    member = ok(client.get(f"/projects/{lab.project.id}/members/all/{bot.id}"))
    assert member["access_level"] == 40


# -- issues, notes, labels -----------------------------------------------------------------------


def test_issues_have_per_project_iids_labels_and_close(lab: Lab) -> None:
    dev, pid = lab.client("dev"), lab.project.id
    first = ok(
        dev.post(f"/projects/{pid}/issues", json={"title": "One", "labels": "bug,ready"}), 201
    )
    second = ok(dev.post(f"/projects/{pid}/issues", json={"title": "Two"}), 201)
    assert (first["iid"], second["iid"]) == (1, 2)
    assert first["labels"] == ["bug", "ready"] and first["state"] == "opened"
    assert first["web_url"].endswith("/acme/app/-/issues/1")
    assert first["author"]["username"] == "dev"
    missing = dev.post(f"/projects/{pid}/issues", json={})
    assert (missing.status_code, missing.json()) == (400, {"error": "title is missing"})
    edited = ok(
        dev.put(f"/projects/{pid}/issues/1", json={"add_labels": "doing", "remove_labels": "ready"})
    )
    assert edited["labels"] == ["bug", "doing"]
    closed = ok(dev.put(f"/projects/{pid}/issues/1", json={"state_event": "close"}))
    assert closed["state"] == "closed" and closed["closed_by"]["username"] == "dev"
    opened = ok(dev.get(f"/projects/{pid}/issues", params={"state": "opened"}))
    assert [i["iid"] for i in opened] == [2]
    assert ok(dev.get(f"/projects/{pid}/issues/2"))["title"] == "Two"
    assert dev.get(f"/projects/{pid}/issues/99").status_code == 404


def test_lists_page_with_gitlabs_headers(lab: Lab) -> None:
    dev, pid = lab.client("dev"), lab.project.id
    for n in range(5):
        lab.gl.open_issue(PROJECT, "alice", f"issue {n}")
    page = dev.get(f"/projects/{pid}/issues", params={"per_page": 2, "page": 2})
    assert [i["iid"] for i in ok(page)] == [3, 2]  # newest first, as GitLab lists
    h = page.headers
    assert (h["x-total"], h["x-total-pages"], h["x-per-page"]) == ("5", "3", "2")
    assert (h["x-page"], h["x-next-page"], h["x-prev-page"]) == ("2", "3", "1")
    assert 'rel="next"' in h["link"] and "page=3" in h["link"]
    last = dev.get(f"/projects/{pid}/issues", params={"per_page": 2, "page": 3})
    assert last.headers["x-next-page"] == "" and [i["iid"] for i in ok(last)] == [1]


def test_issue_notes_and_labels(lab: Lab) -> None:
    dev, pid = lab.client("dev"), lab.project.id
    lab.gl.open_issue(PROJECT, "alice", "Needs work")
    note = ok(dev.post(f"/projects/{pid}/issues/1/notes", json={"body": "on it"}), 201)
    assert (note["body"], note["noteable_type"], note["noteable_iid"]) == ("on it", "Issue", 1)
    assert note["system"] is False and note["type"] is None
    assert [n["body"] for n in ok(dev.get(f"/projects/{pid}/issues/1/notes"))] == ["on it"]
    label = ok(dev.post(f"/projects/{pid}/labels", json={"name": "agent", "color": "#ff0000"}), 201)
    assert (label["name"], label["color"]) == ("agent", "#ff0000")
    again = dev.post(f"/projects/{pid}/labels", json={"name": "agent", "color": "#ff0000"})
    assert (again.status_code, again.json()) == (409, {"message": "Label already exists"})
    assert "agent" in [lb["name"] for lb in ok(dev.get(f"/projects/{pid}/labels"))]
    refused = lab.client("guest").post(
        f"/projects/{pid}/labels", json={"name": "x", "color": "#000"}
    )
    assert refused.status_code == 403


# -- merge requests, statuses, pipelines, git ---------------------------------------------------


def test_merge_request_lifecycle_with_pipelines_must_succeed(lab: Lab) -> None:
    dev, pid = lab.client("dev"), lab.project.id
    lab.project.only_allow_merge_if_pipeline_succeeds = True
    lab.gl.open_issue(PROJECT, "alice", "an issue first: iids are per kind")
    head = lab.push_branch("dev", "feature/x", {"app.py": "print('hi')\n"})
    mr = ok(dev.post(f"/projects/{pid}/merge_requests", json={
        "source_branch": "feature/x", "target_branch": "main", "title": "Add app",
        "description": "Closes #1", "labels": "agent",
    }), 201)  # fmt: skip
    assert mr["iid"] == 1 and mr["sha"] == head and mr["labels"] == ["agent"]
    assert mr["diff_refs"]["head_sha"] == head
    found = ok(dev.get(f"/projects/{pid}/merge_requests", params={"source_branch": "feature/x"}))
    assert [m["iid"] for m in found] == [1]
    assert ok(dev.get(f"/projects/{pid}/merge_requests", params={"source_branch": "nope"})) == []
    # A pending status: its external pipeline is pending, the merge is refused.
    status = ok(dev.post(f"/projects/{pid}/statuses/{head}", json={
        "state": "pending", "name": "phasegate/verify", "target_url": "http://ci.example/1",
    }), 201)  # fmt: skip
    assert (status["status"], status["ref"], status["name"]) == (
        "pending", "feature/x", "phasegate/verify",
    )  # fmt: skip
    got = ok(dev.get(f"/projects/{pid}/merge_requests/1"))
    assert got["detailed_merge_status"] == "ci_still_running"
    assert got["head_pipeline"]["status"] == "pending"
    maintainer = lab.client("alice")
    refused = maintainer.put(f"/projects/{pid}/merge_requests/1/merge", json={"sha": head})
    assert (refused.status_code, refused.json()) == (405, {"message": "405 Method Not Allowed"})
    ok(
        dev.post(
            f"/projects/{pid}/statuses/{head}",
            json={"state": "success", "name": "phasegate/verify"},
        ),
        201,
    )
    statuses = ok(dev.get(f"/projects/{pid}/repository/commits/{head}/statuses"))
    assert [s["status"] for s in statuses] == ["success"]
    pipelines = ok(dev.get(f"/projects/{pid}/pipelines", params={"sha": head}))
    assert [(p["status"], p["source"]) for p in pipelines] == [("success", "external")]
    # A developer may not merge into the protected default branch; a stale sha is 409.
    assert dev.put(f"/projects/{pid}/merge_requests/1/merge", json={"sha": head}).status_code == 401
    stale = maintainer.put(f"/projects/{pid}/merge_requests/1/merge", json={"sha": "0" * 40})
    assert stale.status_code == 409
    merged = ok(maintainer.put(f"/projects/{pid}/merge_requests/1/merge", json={
        "sha": head, "should_remove_source_branch": True,
    }))  # fmt: skip
    assert merged["state"] == "merged" and merged["merged_by"]["username"] == "alice"
    tip = lab.project.bare.branch_sha("main")
    assert tip == merged["merge_commit_sha"]
    parents = lab.project.bare.git("rev-list", "--parents", "-n1", tip).split()
    assert parents[2] == head  # a real merge commit, the head its second parent
    assert lab.project.bare.branch_sha("feature/x") is None


def test_conflicts_are_406_and_branches_delete(lab: Lab) -> None:
    dev, pid = lab.client("dev"), lab.project.id
    lab.push_branch("dev", "one", {"README.md": "one\n"})
    lab.push_branch("alice", "two", {"README.md": "two\n"})
    ok(dev.post(f"/projects/{pid}/merge_requests", json={
        "source_branch": "one", "target_branch": "main", "title": "One"}), 201)  # fmt: skip
    ok(dev.post(f"/projects/{pid}/merge_requests", json={
        "source_branch": "two", "target_branch": "main", "title": "Two"}), 201)  # fmt: skip
    alice = lab.client("alice")
    ok(alice.put(f"/projects/{pid}/merge_requests/1/merge"))
    assert ok(dev.get(f"/projects/{pid}/merge_requests/2"))["has_conflicts"] is True
    clash = alice.put(f"/projects/{pid}/merge_requests/2/merge")
    assert (clash.status_code, clash.json()) == (406, {"message": "Branch cannot be merged"})
    closed = ok(dev.put(f"/projects/{pid}/merge_requests/2", json={"state_event": "close"}))
    assert closed["state"] == "closed"
    assert dev.delete(f"/projects/{pid}/repository/branches/two").status_code == 204
    assert dev.delete(f"/projects/{pid}/repository/branches/two").status_code == 404
    assert dev.delete(f"/projects/{pid}/repository/branches/main").status_code == 400


def test_line_comments_come_back_as_diff_notes_in_discussions(lab: Lab) -> None:
    dev, pid = lab.client("dev"), lab.project.id
    head = lab.push_branch("dev", "feat", {"app.py": "a = 1\nb = 2\n"})
    ok(dev.post(f"/projects/{pid}/merge_requests", json={
        "source_branch": "feat", "target_branch": "main", "title": "Feat"}), 201)  # fmt: skip
    lab.gl.line_comment(PROJECT, 1, "alice", "app.py", 2, "b should be 3")
    ok(dev.post(f"/projects/{pid}/merge_requests/1/notes", json={"body": "general"}), 201)
    discussions = ok(dev.get(f"/projects/{pid}/merge_requests/1/discussions"))
    line = discussions[0]["notes"][0]
    assert line["type"] == "DiffNote" and line["body"] == "b should be 3"
    assert line["position"]["new_path"] == "app.py" and line["position"]["new_line"] == 2
    assert line["position"]["head_sha"] == head
    assert discussions[1]["individual_note"] is True
    notes = ok(dev.get(f"/projects/{pid}/merge_requests/1/notes", params={"sort": "asc"}))
    assert [n["body"] for n in notes] == ["b should be 3", "general"]


def test_git_needs_a_token_and_a_role_to_push(lab: Lab) -> None:
    anonymous = subprocess.run(
        ["git", "ls-remote", lab.gl.clone_url(PROJECT)], env=git_env(), capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    assert anonymous.returncode != 0
    guest = subprocess.run(
        ["git", "ls-remote", lab.gl.clone_url(PROJECT, lab.token("guest"))], env=git_env(),
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert guest.returncode != 0  # a Guest cannot read the code of a private project
    listed = lab.git("ls-remote", lab.gl.clone_url(PROJECT, lab.token("dev")))
    assert "refs/heads/main" in listed


# -- faults ---------------------------------------------------------------------------------------


def test_faults_on_demand(lab: Lab) -> None:
    dev = lab.client("dev")
    lab.gl.fail("GET", r"/user$", 429, headers={"Retry-After": "2"})
    limited = dev.get("/user")
    assert limited.status_code == 429 and limited.headers["retry-after"] == "2"
    assert limited.json() == {"message": "429 Too Many Requests"}
    assert dev.get("/user").status_code == 200
    lab.gl.delay("POST", r"/issues$", 0.3)
    started = time.monotonic()
    ok(dev.post(f"/projects/{lab.project.id}/issues", json={"title": "slow"}), 201)
    assert time.monotonic() - started >= 0.3
    assert [r.status for r in lab.gl.requests if r.path.endswith("/user")] == [429, 200]


def test_started_by_hand() -> None:
    """``python -m support.gitlab_server`` serves until told to stop, with its people: a
    Developer labels, a Guest's label is dropped, a stranger notes on the public project,
    and the maintainer adds a webhook over REST."""
    with served_by_hand("support.gitlab_server") as out:
        first = out.readline()
        assert first.startswith("fake GitLab at http://127.0.0.1:")
        url = first.split()[3]
        tokens, roles = {}, {}
        for _ in range(6):
            name, _, rest = out.readline().partition(" token:")
            tokens[name], roles[name] = rest.split()[0], rest.split("(")[1].rstrip(")\n")
        assert roles == {
            "maintainer": "Owner", "phasegate-bot": "GITLAB_TOKEN", "dev": "Developer",
            "reporter": "Reporter", "guest": "Guest", "stranger": "no member",
        }  # fmt: skip
        api = f"{url}/api/v4/projects/acme%2Fapp"

        def as_(name: str) -> dict[str, str]:
            return {"PRIVATE-TOKEN": tokens[name]}

        answer = httpx.get(api, headers=as_("maintainer"))
        assert answer.json()["path_with_namespace"] == "acme/app"
        assert answer.json()["visibility"] == "public"
        ids = {n: httpx.get(f"{url}/api/v4/user", headers=as_(n)).json()["id"] for n in tokens}
        access = {
            n: httpx.get(f"{api}/members/all/{ids[n]}", headers=as_("maintainer")).json()
            .get("access_level", 0)
            for n in ("dev", "reporter", "guest", "stranger")
        }  # fmt: skip
        assert access == {"dev": 30, "reporter": 20, "guest": 10, "stranger": 0}
        made = httpx.post(f"{api}/issues", headers=as_("guest"),
                          json={"title": "From a guest", "labels": "phasegate"})  # fmt: skip
        assert made.status_code == 201 and made.json()["labels"] == []
        note = httpx.post(f"{api}/issues/1/notes", headers=as_("stranger"), json={"body": "hi"})
        assert note.status_code == 201
        edit = {"add_labels": "phasegate", "title": "From a guest, edited"}
        own = httpx.put(f"{api}/issues/1", headers=as_("guest"), json=edit)
        assert own.json()["labels"] == [] and own.json()["title"] == "From a guest, edited"
        labelled = httpx.put(f"{api}/issues/1", headers=as_("dev"),
                             json={"add_labels": "phasegate"})  # fmt: skip
        assert labelled.json()["labels"] == ["phasegate"]
        refused = httpx.post(f"{api}/hooks", headers=as_("dev"), json={"url": "http://h/"})
        assert refused.status_code == 403
        hook = httpx.post(f"{api}/hooks", headers=as_("maintainer"), json={
            "url": "http://127.0.0.1:9/webhooks/gitlab", "token": "s", "note_events": True,
        })  # fmt: skip
        assert hook.status_code == 201 and hook.json()["note_events"] is True
        assert hook.json()["issues_events"] is False
        listed = httpx.get(f"{api}/hooks", headers=as_("maintainer")).json()
        assert [h["url"] for h in listed] == ["http://127.0.0.1:9/webhooks/gitlab"]


# -- python-gitlab, the client the forge will use, reads every answer ----------------------------


@pytest.fixture
def client_lib() -> Any:
    return pytest.importorskip("gitlab", reason="python-gitlab is not installed")


def test_python_gitlab_drives_the_whole_workflow(lab: Lab, client_lib: Any) -> None:
    gitlab = client_lib
    lab.project.only_allow_merge_if_pipeline_succeeds = True
    bot_user, bot_token = lab.gl.project_token(PROJECT, "maintainer")
    gl = gitlab.Gitlab(lab.gl.url, oauth_token=bot_token)  # Bearer, as a project token may
    gl.auth()
    assert gl.user is not None and gl.user.username == bot_user.username
    project = gl.projects.get(PROJECT)
    assert project.default_branch == "main"
    assert project.members_all.get(bot_user.id).access_level == 40
    project.labels.create({"name": "agent", "color": "#336699"})
    assert "agent" in [lb.name for lb in project.labels.list(get_all=True)]
    issue = project.issues.create({"title": "Do it", "labels": ["agent"]})
    for n in range(4):
        project.issues.create({"title": f"filler {n}"})
    assert len(project.issues.list(per_page=2, get_all=True)) == 5  # follows Link: next
    issue.labels = ["agent", "doing"]
    issue.save()
    assert project.issues.get(issue.iid).labels == ["agent", "doing"]
    issue.notes.create({"body": "working on it"})
    assert [n.body for n in issue.notes.list(get_all=True)] == ["working on it"]
    head = lab.push_branch("dev", "agent/1", {"done.txt": "done\n"})
    mr = project.mergerequests.create(
        {"source_branch": "agent/1", "target_branch": "main", "title": "Do it", "labels": ["agent"]}
    )
    assert [m.iid for m in project.mergerequests.list(source_branch="agent/1")] == [mr.iid]
    commit = project.commits.get(head, lazy=True)
    commit.statuses.create({"state": "running", "name": "phasegate"})
    with pytest.raises(gitlab.exceptions.GitlabMRClosedError) as refused:
        mr.merge(sha=head)
    assert refused.value.response_code == 405
    commit.statuses.create({"state": "success", "name": "phasegate"})
    assert [s.status for s in commit.statuses.list(get_all=True)] == ["success"]
    assert [p.status for p in project.pipelines.list(sha=head, get_all=True)] == ["success"]
    lab.gl.line_comment(PROJECT, mr.iid, "alice", "done.txt", 1, "say more")
    mr.notes.create({"body": "general"})
    positions = [
        note["position"]["new_line"]
        for discussion in mr.discussions.list(get_all=True)
        for note in discussion.attributes["notes"]
        if note.get("position")
    ]
    assert positions == [1]
    lab.gl.fail("PUT", r"/merge$", 429, headers={"Retry-After": "1"})
    mr.merge(sha=head, should_remove_source_branch=True)  # python-gitlab waits and retries
    assert project.mergerequests.get(mr.iid).state == "merged"
    assert lab.project.bare.branch_sha("agent/1") is None
    issue.state_event = "close"
    issue.save()
    assert project.issues.get(issue.iid).state == "closed"
    lab.push_branch("dev", "feature/gone", {"x": "x\n"})
    project.branches.delete("feature/gone")
    assert lab.project.bare.branch_sha("feature/gone") is None
    with pytest.raises(gitlab.exceptions.GitlabGetError) as hidden:
        gitlab.Gitlab(lab.gl.url, private_token=lab.token("stranger")).projects.get(PROJECT)
    assert hidden.value.response_code == 404


# -- webhooks ------------------------------------------------------------------------------------


def test_webhooks_deliver_gitlabs_events_with_its_headers(lab: Lab) -> None:

    with receiving_hooks() as (url, got):
        hook = lab.gl.hooks.add(PROJECT, url, "s3cret")
        dev, pid = lab.client("dev"), lab.project.id
        ok(dev.post(f"/projects/{pid}/issues", json={"title": "Hooked"}), 201)
        ok(dev.post(f"/projects/{pid}/issues/1/notes", json={"body": "@bot go"}), 201)
        head = lab.push_branch("dev", "hooked", {"h.txt": "h\n"})
        opened = {"source_branch": "hooked", "target_branch": "main", "title": "Hooked"}
        ok(dev.post(f"/projects/{pid}/merge_requests", json=opened), 201)
        ok(dev.post(f"/projects/{pid}/statuses/{head}", json={"state": "success"}), 201)
        ok(lab.client("alice").put(f"/projects/{pid}/merge_requests/1/merge"))
        delivered = lab.gl.hooks.wait_all()
    received = [(headers, json.loads(body)) for headers, body in got]
    assert [d.status for d in delivered] == [200] * 5
    events = [(h["X-Gitlab-Event"], p["object_kind"], p["object_attributes"].get("action"))
              for h, p in received]  # fmt: skip
    assert events == [
        ("Issue Hook", "issue", "open"),
        ("Note Hook", "note", "create"),
        ("Merge Request Hook", "merge_request", "open"),
        ("Pipeline Hook", "pipeline", None),
        ("Merge Request Hook", "merge_request", "merge"),
    ]
    headers, note = received[1]
    assert headers["X-Gitlab-Token"] == "s3cret"
    assert headers["X-Gitlab-Webhook-UUID"] == hook.uuid
    assert len({h["X-Gitlab-Event-UUID"] for h, _ in received}) == 5
    assert note["object_attributes"]["note"] == "@bot go" and note["issue"]["iid"] == 1
    assert note["user"]["username"] == "dev"
    assert received[3][1]["object_attributes"]["status"] == "success"
    assert received[4][1]["object_attributes"]["last_commit"]["id"] == head
