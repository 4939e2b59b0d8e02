"""GitLab's description: its cut, and Prism refereeing the fake GitLab over it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.gitlab_lab import PROJECT, Lab, served


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    with served(tmp_path) as made:
        yield made


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
