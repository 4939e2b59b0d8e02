"""The fake GitLab answers like GitLab: shapes, status codes, pagination, roles, real git.

Each operation phasegate's GitLab forge will use is driven with httpx as
python-gitlab sends it (``PRIVATE-TOKEN`` or ``Bearer``, JSON bodies), and
git goes over smart HTTP with ``oauth2:TOKEN`` as GitLab documents; merges
land on the bare repository.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.github_git import git_env
from support.gitlab_server import GitLabServer

PROJECT = "acme/app"


class Lab:
    """A served fake GitLab with alice (Owner), dev (Developer), guest (Guest)."""

    def __init__(self, gl: GitLabServer, work: Path) -> None:
        self.gl, self.work = gl, work
        self.clients: list[httpx.Client] = []
        for name in ("alice", "dev", "guest", "stranger"):
            gl.add_user(name)
        self.project = gl.create_project(PROJECT, "alice")
        gl.add_member(PROJECT, "dev", "developer")
        gl.add_member(PROJECT, "guest", "guest")

    def token(self, name: str) -> str:
        return self.gl.users[name].tokens[0]

    def client(self, name: str, *, bearer: bool = False) -> httpx.Client:
        token = self.token(name)
        headers = {"Authorization": f"Bearer {token}"} if bearer else {"PRIVATE-TOKEN": token}
        return self.opened(headers)

    def opened(self, headers: dict[str, str]) -> httpx.Client:
        client = httpx.Client(base_url=f"{self.gl.url}/api/v4", headers=headers, timeout=30)
        self.clients.append(client)
        return client

    def git(self, *args: str, cwd: Path | None = None) -> str:
        proc = subprocess.run(
            ["git", *args], cwd=cwd or self.work, env=git_env(), capture_output=True,
            text=True, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    def push_branch(self, name: str, branch: str, files: dict[str, str]) -> str:
        """Clone as ``name`` over HTTP, commit ``files`` on ``branch``, push; its SHA."""
        checkout = self.work / f"{name}-{branch}"
        self.git("clone", "--quiet", self.gl.clone_url(PROJECT, self.token(name)), str(checkout))
        self.git("checkout", "--quiet", "-b", branch, cwd=checkout)
        for path, text in files.items():
            (checkout / path).write_text(text)
        self.git("add", "-A", cwd=checkout)
        self.git("-c", "user.name=Dev", "-c", "user.email=dev@example.com",
                 "commit", "--quiet", "-m", f"change {branch}", cwd=checkout)  # fmt: skip
        self.git("push", "--quiet", "origin", branch, cwd=checkout)
        return self.git("rev-parse", "HEAD", cwd=checkout)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    with GitLabServer(tmp_path / "gl") as gl:
        made = Lab(gl, tmp_path)
        try:
            yield made
        finally:
            for client in made.clients:
                client.close()


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json() if response.content else None


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
    """``python -m support.gitlab_server`` serves until told to stop."""
    tests = Path(__file__).resolve().parent
    with subprocess.Popen(
        [sys.executable, "-m", "support.gitlab_server", "--port", "0"],
        cwd=tests, stdout=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()
            assert first.startswith("fake GitLab at http://127.0.0.1:")
            url = first.split()[3]
            token = proc.stdout.readline().split()[-1]
            answer = httpx.get(
                f"{url}/api/v4/projects/acme%2Fapp", headers={"PRIVATE-TOKEN": token}
            )
            assert answer.json()["path_with_namespace"] == "acme/app"
        finally:
            proc.terminate()
            proc.wait(10)


# -- the description's cut -----------------------------------------------------------------------


def test_cut_keeps_listed_operations_their_components_and_names_the_missing() -> None:
    from support import gitlab_openapi

    item = {"$ref": "#/components/schemas/Label"}
    source = {
        "openapi": "3.0.0",
        "info": {"title": "GitLab", "version": "19.5"},
        "paths": {
            "/api/v4/projects/{id}/labels": {
                "get": {"responses": {"200": {"content": {"application/json": {"schema": item}}}}},
                "delete": {"responses": {"204": {"description": "gone"}}},
            },
            "/api/v4/version": {"get": {"responses": {"200": {"description": "ok"}}}},
        },
        "components": {
            "schemas": {
                "Label": {
                    "type": "object",
                    "properties": {"u": {"$ref": "#/components/schemas/U"}},
                },
                "U": {"nullable": True, "anyOf": [{"type": "object"}]},
                "Unused": {"type": "object"},
            }
        },
    }
    wanted = [("GET", "/api/v4/projects/{id}/labels"), ("GET", "/api/v4/user")]
    cut = gitlab_openapi.cut_description(source, wanted, provenance={"commit": "abc"})
    assert list(cut["paths"]) == ["/api/v4/projects/{id}/labels"]
    assert list(cut["paths"]["/api/v4/projects/{id}/labels"]) == ["get"]
    assert set(cut["components"]["schemas"]) == {"Label", "U"}
    answer = cut["paths"]["/api/v4/projects/{id}/labels"]["get"]["responses"]["200"]
    assert answer["content"]["application/json"]["schema"] == {"type": "array", "items": item}
    header = cut["info"]["x-phasegate-cut"]
    assert header["missing"] == ["GET /api/v4/user"] and header["commit"] == "abc"
    assert "nullable" not in cut["components"]["schemas"]["U"]  # spelled out for Prism


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


# -- Prism referees the fake against GitLab's description ------------------------------------------


def _description(tmp_path: Path) -> Path:
    """The committed cut, else a cut of ``PHASEGATE_GITLAB_OPENAPI`` (the whole file)."""
    from support import gitlab_openapi

    if gitlab_openapi.CUT_PATH.is_file():
        return gitlab_openapi.CUT_PATH
    whole = os.environ.get("PHASEGATE_GITLAB_OPENAPI")
    if not whole:
        pytest.skip(
            "no cut of GitLab's description: run scripts/cut_gitlab_openapi.py on "
            "openapi_v3.yaml and commit tests/data/gitlab-openapi-cut.json"
        )
    dest = tmp_path / "gitlab-openapi-cut.json"
    gitlab_openapi.cut_file(Path(whole), dest, provenance={"source": whole})
    return dest


def _prism_or_skip() -> None:
    from support.prism import PrismError, find_prism

    try:
        find_prism()
    except PrismError as missing:
        pytest.skip(str(missing))


def test_prism_takes_a_gitlab_description_and_its_api_prefix(lab: Lab, tmp_path: Path) -> None:
    """The plumbing, whatever the cut: Prism over a GitLab-style description (paths
    under ``/api/v4``, ``PRIVATE-TOKEN``) passes what fits and reports what does not."""
    _prism_or_skip()
    from support.prism import PrismProxy

    user = {
        "type": "object",
        "required": ["id", "username", "bot"],
        "properties": {"id": {"type": "integer"}, "username": {"type": "string"},
                       "bot": {"type": "boolean"}},
    }  # fmt: skip
    strict = {**user, "required": [*user["required"], "two_factor_enabled_everywhere"]}
    answers = {"200": {"description": "OK", "content": {"application/json": {"schema": user}}}}
    described = {
        "openapi": "3.0.0",
        "info": {"title": "GitLab REST API", "version": "19.5"},
        "servers": [{"url": "https://gitlab.example.com"}],
        "paths": {
            "/api/v4/user": {"get": {"responses": answers}},
            "/api/v4/projects/{id}/members/all/{user_id}": {
                "get": {
                    "parameters": [
                        {"name": "id", "in": "path", "required": True,
                         "schema": {"type": "string"}},
                        {"name": "user_id", "in": "path", "required": True,
                         "schema": {"type": "integer"}},
                    ],
                    "responses": {"200": {"description": "OK", "content": {
                        "application/json": {"schema": strict}}}},
                }
            },
        },
    }  # fmt: skip
    path = tmp_path / "gitlab-mini.json"
    path.write_text(json.dumps(described))
    proxy = PrismProxy(lab.gl.url, description=path)
    with proxy as url:
        with httpx.Client(base_url=url, headers={"PRIVATE-TOKEN": lab.token("dev")}) as client:
            assert client.get("/api/v4/user").json()["username"] == "dev"
            member = f"/api/v4/projects/acme%2Fapp/members/all/{lab.gl.users['dev'].id}"
            assert client.get(member).status_code == 500  # Prism: a required field missing
            assert client.get("/api/v4/projects/1/labels").status_code == 404  # not described
        found = proxy.violations()
    assert {(v.status, v.where) for v in found} == {(500, "response.body"), (404, "request")}
    assert any("two_factor_enabled_everywhere" in v.message for v in found), found


def test_the_fake_keeps_to_gitlabs_description_through_prism(lab: Lab, tmp_path: Path) -> None:
    """Every operation the cut has, driven through Prism; it must see no violation."""
    description = _description(tmp_path)
    _prism_or_skip()
    from support.prism import PrismProxy

    described = set(json.loads(description.read_text())["info"]["x-phasegate-cut"]["operations"])
    pid = lab.project.id
    head = lab.push_branch("dev", "topic", {"t.txt": "t\n"})
    lab.project.merge_level = 30
    proxy = PrismProxy(lab.gl.url, description=description)
    with proxy as url:
        prism = httpx.Client(base_url=url, headers={"PRIVATE-TOKEN": lab.token("dev")}, timeout=60)
        direct = lab.client("dev")

        def call(method: str, template: str, path: str, body: Any = None) -> httpx.Response:
            through = f"{method} {template}" in described
            client = prism if through else direct
            target = path if through else path.removeprefix("/api/v4")
            response = client.request(method, target, json=body)
            assert response.status_code < 300, (method, path, response.text)
            return response

        p = "/api/v4/projects/{id}"
        call("GET", "/api/v4/user", "/api/v4/user")
        call("GET", p, f"/api/v4/projects/{pid}")
        call("GET", p + "/members/all/{user_id}", f"/api/v4/projects/{pid}/members/all/1")
        call(
            "POST", p + "/labels", f"/api/v4/projects/{pid}/labels", {"name": "a", "color": "#fff"}
        )
        call("GET", p + "/labels", f"/api/v4/projects/{pid}/labels")
        call("POST", p + "/issues", f"/api/v4/projects/{pid}/issues", {"title": "t", "labels": "a"})
        call("GET", p + "/issues", f"/api/v4/projects/{pid}/issues")
        call("GET", p + "/issues/{issue_iid}", f"/api/v4/projects/{pid}/issues/1")
        call("PUT", p + "/issues/{issue_iid}", f"/api/v4/projects/{pid}/issues/1",
             {"state_event": "close"})  # fmt: skip
        call("POST", p + "/issues/{noteable_id}/notes", f"/api/v4/projects/{pid}/issues/1/notes",
             {"body": "b"})  # fmt: skip
        call("GET", p + "/issues/{noteable_id}/notes", f"/api/v4/projects/{pid}/issues/1/notes")
        mrs = p + "/merge_requests"
        call("POST", mrs, f"/api/v4/projects/{pid}/merge_requests",
             {"source_branch": "topic", "target_branch": "main", "title": "m"})  # fmt: skip
        call("GET", mrs, f"/api/v4/projects/{pid}/merge_requests?source_branch=topic")
        call("GET", mrs + "/{merge_request_iid}", f"/api/v4/projects/{pid}/merge_requests/1")
        call("PUT", mrs + "/{merge_request_iid}", f"/api/v4/projects/{pid}/merge_requests/1",
             {"labels": "a"})  # fmt: skip
        call("POST", mrs + "/{noteable_id}/notes", f"/api/v4/projects/{pid}/merge_requests/1/notes",
             {"body": "n"})  # fmt: skip
        lab.gl.line_comment(PROJECT, 1, "alice", "t.txt", 1, "line")
        call("GET", mrs + "/{noteable_id}/notes", f"/api/v4/projects/{pid}/merge_requests/1/notes")
        call("GET", mrs + "/{noteable_id}/discussions",
             f"/api/v4/projects/{pid}/merge_requests/1/discussions")  # fmt: skip
        call("POST", p + "/statuses/{sha}", f"/api/v4/projects/{pid}/statuses/{head}",
             {"state": "success", "name": "ci"})  # fmt: skip
        call("GET", p + "/repository/commits/{sha}/statuses",
             f"/api/v4/projects/{pid}/repository/commits/{head}/statuses")  # fmt: skip
        call("GET", p + "/pipelines", f"/api/v4/projects/{pid}/pipelines?sha={head}")
        call("PUT", mrs + "/{merge_request_iid}/merge",
             f"/api/v4/projects/{pid}/merge_requests/1/merge", {"sha": head})  # fmt: skip
        lab.push_branch("dev", "gone", {"g": "g\n"})
        call("DELETE", p + "/repository/branches/{branch}",
             f"/api/v4/projects/{pid}/repository/branches/gone")  # fmt: skip
        prism.close()
        proxy.assert_clean()


# -- webhooks ------------------------------------------------------------------------------------


def test_webhooks_deliver_gitlabs_events_with_its_headers(lab: Lab) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    received: list[tuple[dict[str, str], Any]] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((dict(self.headers.items()), json.loads(body)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            """Silent."""

    with ThreadingHTTPServer(("127.0.0.1", 0), Receiver) as receiver:
        threading.Thread(target=receiver.serve_forever, daemon=True).start()
        hook = lab.gl.hooks.add(PROJECT, f"http://127.0.0.1:{receiver.server_port}/hook", "s3cret")
        dev, pid = lab.client("dev"), lab.project.id
        ok(dev.post(f"/projects/{pid}/issues", json={"title": "Hooked"}), 201)
        ok(dev.post(f"/projects/{pid}/issues/1/notes", json={"body": "@bot go"}), 201)
        head = lab.push_branch("dev", "hooked", {"h.txt": "h\n"})
        opened = {"source_branch": "hooked", "target_branch": "main", "title": "Hooked"}
        ok(dev.post(f"/projects/{pid}/merge_requests", json=opened), 201)
        ok(dev.post(f"/projects/{pid}/statuses/{head}", json={"state": "success"}), 201)
        ok(lab.client("alice").put(f"/projects/{pid}/merge_requests/1/merge"))
        delivered = lab.gl.hooks.wait_all()
        receiver.shutdown()
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
