"""The dashboard's JSON API: every action of ``phasegate.operations`` an OpenAPI
operation, a bearer token's person acting, the pages' refusals in one JSON
shape, and a script approving a merge over a real server until it merges.

FastAPI's TestClient drives the real app on a real SQLite store and a real
repository whose workflows run with scripted agents; the script's test runs
a real uvicorn server on a free port (``Dashboard``).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from test_graph_workflow import graph_repo
from test_web import ENV_SENTINEL, TOKEN, logged_in, waiting_workflow, web_repo  # noqa: F401

from phasegate import operations
from phasegate.core.contract import EventWrite
from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.web import Access, create_app
from phasegate.web.auth import CSRF_HEADER, Person, Role
from phasegate.web.serve import Dashboard

from conftest import phasegate_cli

BEARER = {"Authorization": f"Bearer {TOKEN}"}
#: The reads the API offers beside operations' actions, by operationId.
READS = {"board", "workflows", "workflow", "events", "diff", "review_drafts", "proposals", "costs"}


class ViewerAccess(Access):
    """The token stands for a viewer: sees everything, decides nothing."""

    def bearer(self, token: str) -> Person | None:
        person = super().bearer(token)
        return None if person is None else Person(person.name, Role.VIEWER)


@pytest.fixture
def api(
    web_repo: Path,  # noqa: F811
    engine_for: Callable[..., tuple[Engine, Store]],
) -> Iterator[tuple[TestClient, Engine, Store]]:
    engine, store = engine_for(web_repo)
    with TestClient(create_app(engine, Access(token=TOKEN, user="alice"))) as client:
        client.headers.update(BEARER)
        yield client, engine, store


def error_of(response: httpx.Response, code: int) -> dict[str, Any]:
    """The API's one error shape, with ``code`` as the answer's status."""
    assert response.status_code == code, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"code", "kind", "message"} and error["code"] == code
    return error


def operation_actions() -> set[str]:
    """``phasegate.operations``' public actions: its functions that act through an
    Engine (their first parameter)."""
    found = set()
    for name in operations.__all__:
        value = getattr(operations, name)
        if inspect.isfunction(value):
            first = next(iter(inspect.signature(value).parameters), None)
            if first == "engine":
                found.add(name)
    return found


def test_the_openapi_description_lists_every_action_of_operations_and_every_read(
    api: tuple[TestClient, Engine, Store],
) -> None:
    client, _engine, _store = api
    described = client.get("/openapi.json")
    assert described.status_code == 200
    spec = described.json()
    ids = {
        op["operationId"]: (method.upper(), path)
        for path, methods in spec["paths"].items()
        for method, op in methods.items()
    }
    actions = operation_actions()
    assert {"start", "approve_merge", "feedback", "cancel", "approve"} <= actions
    missing = (actions | READS) - set(ids)
    assert not missing, f"operations without an API endpoint: {sorted(missing)}"
    assert all(ids[a][0] == "POST" for a in actions)
    assert all(ids[r][0] == "GET" for r in READS)
    # Only the API, no page; the bearer token its security scheme; request bodies typed.
    assert all(path.startswith("/api/") for path in spec["paths"])
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert "FeedbackBody" in spec["components"]["schemas"]
    # Bad input is answered 400 with the API's error shape, and the description says so.
    responses = [op["responses"] for methods in spec["paths"].values() for op in methods.values()]
    assert all("422" not in r for r in responses)
    feedback = spec["paths"]["/api/workflows/{workflow_id}/feedback"]["post"]["responses"]
    assert feedback["400"]["content"]["application/json"]["schema"]["$ref"].endswith("ErrorAnswer")
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    # Without a token: the API's error, not the login form.
    client.headers.pop("Authorization")
    assert error_of(client.get("/openapi.json"), 401)["kind"] == "Unauthorized"


def test_reads_give_the_clis_shapes(api: tuple[TestClient, Engine, Store]) -> None:
    client, engine, store = api
    workflow_id = waiting_workflow(engine)
    store.add_event(workflow_id, EventWrite("milestone_updated", {"note": ENV_SENTINEL}))

    board = client.get("/api/board").json()
    assert [g["key"] for g in board["groups"]][0] == "needs_you"
    assert [c["id"] for c in board["groups"][0]["cards"]] == [workflow_id]
    listed = client.get("/api/workflows").json()
    assert [w["id"] for w in listed] == [workflow_id]

    detail = client.get(f"/api/workflows/{workflow_id}").json()
    assert detail["workflow"]["current_phase"] == "wait"
    assert "approve_merge" in detail["actions"] and detail["timeline"]
    # The CLI and the API agree, field for field.
    repo = str(engine.repo)
    shown = json.loads(phasegate_cli("show", workflow_id, "--json", "--repo", repo).stdout)
    assert {k: v for k, v in detail.items() if k != "actions"} == shown
    assert listed == json.loads(phasegate_cli("status", "--json", "--repo", repo).stdout)

    rows = store.events(workflow_id)
    events = client.get(f"/api/workflows/{workflow_id}/events").json()
    assert [e["id"] for e in events] == [r["id"] for r in rows]
    later = client.get(f"/api/workflows/{workflow_id}/events?after={rows[2]['id']}").json()
    assert [e["id"] for e in later] == [r["id"] for r in rows[3:]]
    assert ENV_SENTINEL not in str(events) and "***" in str(events)

    diff = client.get(f"/api/workflows/{workflow_id}/diff").json()
    assert diff["missing"] is None
    assert [f["path"] for f in diff["files"]] == ["feature.txt"]
    assert any(line["kind"] == "add" for line in diff["files"][0]["lines"])

    assert error_of(client.get("/api/workflows/nope"), 404)["kind"] == "WorkflowNotFound"
    assert error_of(client.get("/api/workflows/nope/events"), 404)["kind"] == "WorkflowNotFound"
    assert error_of(client.get("/api/proposals/nope"), 404)["kind"] == "ProposalNotFound"
    assert error_of(client.get("/api/no-such-path"), 404)["kind"] == "NotFound"
    assert error_of(client.delete("/api/board"), 405)["kind"] == "MethodNotAllowed"
    bad = error_of(client.get(f"/api/workflows/{workflow_id}/events?after=soon"), 400)
    assert bad["message"].startswith("bad request: after:")
    unknown = error_of(client.get("/api/proposals?status=bogus"), 400)
    assert unknown["kind"] == "BadRequest" and "proposed, approved" in unknown["message"]
    assert client.get("/api/proposals?status=proposed").json() == []


def test_actions_record_the_bearers_person_and_refusals_are_the_pages(
    api: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, store = api
    filed = client.post("/api/workflows", json={"ticket": "Write feature.txt", "title": "T"})
    assert filed.status_code == 201
    new_id = filed.json()["workflow"]["id"]
    assert filed.json()["workflow"]["current_phase"] == "preparation"
    start = store.events(new_id, types=("decision",))[-1]["data"]
    assert start == {"action": "start", "by": "alice"}
    empty = error_of(client.post("/api/workflows", json={"ticket": "  "}), 400)
    assert (empty["kind"], empty["message"]) == ("ActionRefused", "the ticket is empty")

    # Not waiting for a merge approval: operations' refusal, word for word.
    with pytest.raises(operations.PhasegateError) as in_cli:
        operations.approve_merge(engine, new_id, by="alice")
    refused = error_of(client.post(f"/api/workflows/{new_id}/approve-merge"), 409)
    assert (refused["kind"], refused["message"]) == (type(in_cli.value).__name__, str(in_cli.value))

    workflow_id = waiting_workflow(engine)
    said = client.post(f"/api/workflows/{workflow_id}/feedback", json={"text": "say more"})
    assert said.status_code == 200
    assert store.workflow_row(workflow_id)["user_feedback"]
    feedback = store.events(workflow_id, types=("decision",))[-1]["data"]
    assert (feedback["action"], feedback["by"]) == ("feedback", "alice")
    cancelled = client.post(f"/api/workflows/{workflow_id}/cancel").json()
    assert (cancelled["workflow"]["status"], cancelled["actions"]) == ("cancelled", [])

    bad = error_of(client.post(f"/api/workflows/{workflow_id}/feedback", json={}), 400)
    assert bad["kind"] == "BadRequest" and "text" in bad["message"]
    verdict = {"verdict": "maybe"}
    bad = error_of(client.post(f"/api/workflows/{new_id}/verify-override", json=verdict), 400)
    assert "verdict" in bad["message"]
    assert error_of(client.post("/api/workflows/nope/resume"), 404)["kind"] == "WorkflowNotFound"


def test_a_workflows_priority_is_set_from_the_api_and_its_page(
    api: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, store = api
    workflow_id = waiting_workflow(engine)
    raised = client.post(f"/api/workflows/{workflow_id}/priority", json={"priority": "high"})
    assert raised.status_code == 200, raised.text
    assert raised.json()["workflow"]["priority"] == 1
    assert store.workflow_row(workflow_id)["priority"] == 1
    said = store.events(workflow_id, types=("decision",))[-1]["data"]
    assert said == {"action": "priority", "by": "alice", "priority": 1, "was": 0}
    path = f"/api/workflows/{workflow_id}/priority"
    # Bad input is 400 with the CLI's words; a boolean is no priority.
    bad = error_of(client.post(path, json={"priority": "urgent"}), 400)
    assert bad == {
        "code": 400,
        "kind": "ActionRefused",
        "message": "priority 'urgent': give high, normal, low or an integer from -100 to 100 "
        "(larger is claimed first)",
    }
    assert "'101'" in error_of(client.post(path, json={"priority": 101}), 400)["message"]
    assert error_of(client.post(path, json={"priority": True}), 400)["kind"] == "BadRequest"
    assert store.workflow_row(workflow_id)["priority"] == 1
    # A ticket is filed with its priority in one call.
    filed = client.post("/api/workflows", json={"ticket": "Write it", "priority": "high"})
    assert filed.status_code == 201 and filed.json()["workflow"]["priority"] == 1
    unread = error_of(client.post("/api/workflows", json={"ticket": "x", "priority": 500}), 400)
    assert unread["kind"] == "ActionRefused" and "'500'" in unread["message"]

    # The page offers it as a choice, the current one selected; a form post sets it.
    client.headers.pop("Authorization")
    csrf = logged_in(client)
    page = client.get(f"/workflows/{workflow_id}").text
    assert '<option value="high" selected>high</option>' in page
    posted = client.post(
        f"/workflows/{workflow_id}/priority", data={"priority": "low", "csrf": csrf}
    )
    assert posted.status_code == 200  # the 303 to the page, followed
    assert '<option value="low" selected>low</option>' in posted.text
    assert store.workflow_row(workflow_id)["priority"] == -1

    # A finished workflow has no place in the queue: refused, and no form offered.
    client.post(f"/workflows/{workflow_id}/cancel", data={"csrf": csrf})
    assert 'id="priority-form"' not in client.get(f"/workflows/{workflow_id}").text
    client.headers.update(BEARER)
    done = error_of(client.post(path, json={"priority": 1}), 409)
    assert done["kind"] == "ActionRefused" and "cancelled" in done["message"]


def test_a_wrong_bearer_is_401_and_a_viewers_action_403_and_nothing_changes(
    web_repo: Path,  # noqa: F811
    engine_for: Callable[..., tuple[Engine, Store]],
) -> None:
    engine, store = engine_for(web_repo)
    workflow_id = waiting_workflow(engine)
    before = store.events(workflow_id)
    with TestClient(create_app(engine, ViewerAccess(token=TOKEN, user="vera"))) as client:
        wrong = client.post(
            f"/api/workflows/{workflow_id}/approve-merge",
            headers={"Authorization": "Bearer not-the-token-at-all"},
        )
        assert error_of(wrong, 401)["kind"] == "Unauthorized"
        assert error_of(client.get("/api/board"), 401)["kind"] == "Unauthorized"

        client.headers.update(BEARER)
        assert client.get("/api/board").status_code == 200  # a viewer sees
        for action in ("approve-merge", "cancel", "resume"):
            refused = error_of(client.post(f"/api/workflows/{workflow_id}/{action}"), 403)
            assert refused["kind"] == "Forbidden" and "vera is a viewer" in refused["message"]
    assert store.events(workflow_id) == before
    assert "merge_approved" not in store.workflow_row(workflow_id)["state"]


def test_a_session_posts_to_the_api_with_its_csrf_token_only(
    web_repo: Path,  # noqa: F811
    engine_for: Callable[..., tuple[Engine, Store]],
) -> None:
    engine, store = engine_for(web_repo)
    workflow_id = waiting_workflow(engine)
    with TestClient(create_app(engine, Access(token=TOKEN, user="alice"))) as client:
        csrf = logged_in(client)
        path = f"/api/workflows/{workflow_id}/approve-merge"
        assert error_of(client.post(path), 403)["kind"] == "Forbidden"
        assert client.post(path, headers={CSRF_HEADER: csrf}).status_code == 200
    assert store.workflow_row(workflow_id)["state"]["merge_approved_by"] == "alice"


def test_comments_become_one_review_and_proposals_are_decided(
    api: tuple[TestClient, Engine, Store],
    tmp_path: Path,
    engine_for: Callable[..., tuple[Engine, Store]],
) -> None:
    client, engine, store = api
    workflow_id = waiting_workflow(engine)
    base = f"/api/workflows/{workflow_id}"
    off_diff = {"path": "feature.txt", "line": 99, "text": "no"}
    assert error_of(client.post(f"{base}/comments", json=off_diff), 400)["kind"] == "ActionRefused"
    drafts = client.post(f"{base}/comments", json={"path": "feature.txt", "line": 1, "text": "x"})
    assert drafts.status_code == 201
    assert [(d["line"], d["by"]) for d in drafts.json()] == [(1, "alice")]
    assert client.get(f"{base}/drafts").json() == drafts.json()
    sent = client.post(f"{base}/review", json={"text": "see the line"})
    assert sent.status_code == 200
    assert "feature.txt line 1: x" in store.workflow_row(workflow_id)["user_feedback"]
    assert client.get(f"{base}/drafts").json() == []

    graph_engine, graph_store = engine_for(graph_repo(tmp_path, policy="propose"))
    graph_id = graph_engine.start("Add feature.txt", "feature.txt holds 'the feature'")
    assert graph_engine.advance(graph_id)["status"] == "awaiting_approval"
    with TestClient(create_app(graph_engine, Access(token=TOKEN, user="alice"))) as graph:
        graph.headers.update(BEARER)
        [proposal] = graph.get(f"/api/proposals?workflow_id={graph_id}").json()
        rejected = graph.post(f"/api/proposals/{proposal['id']}/reject", json={"reason": ""})
        empty = error_of(rejected, 409)
        assert empty["message"] == "--reason is empty; say why"
        decided = graph.post(f"/api/proposals/{proposal['id']}/approve").json()
    assert decided["proposal"]["status"] == "approved"
    assert (decided["proposal"]["decided_by"], decided["workflow_id"]) == ("alice", graph_id)
    assert graph_engine.advance(graph_id)["status"] == "completed"
    assert graph_store.proposal(proposal["id"])["decided_by"] == "alice"


def test_a_script_approves_a_merge_with_a_bearer_token_and_the_workflow_merges(
    web_repo: Path,  # noqa: F811
    engine_for: Callable[..., tuple[Engine, Store]],
) -> None:
    engine, store = engine_for(web_repo)
    workflow_id = waiting_workflow(engine)
    # serve's worker advances what the script decides: nothing here advances it
    dashboard = Dashboard(engine, Access(token=TOKEN, user="alice"), port=0, poll_s=0.2)
    url = dashboard.start()
    try:
        with httpx.Client(base_url=url, headers=BEARER, timeout=30.0) as script:
            waiting = script.get("/api/board").json()["groups"][0]["cards"]
            assert [c["id"] for c in waiting] == [workflow_id]
            approved = script.post(f"/api/workflows/{workflow_id}/approve-merge")
            assert approved.status_code == 200, approved.text
            assert approved.json()["workflow"]["merge_approved_by"] == "alice"
            last, phases = 0, []
            for _ in range(300):
                for event in script.get(f"/api/workflows/{workflow_id}/events?after={last}").json():
                    last = event["id"]
                    if event["type"] == "phase_change":
                        phases.append(event["data"]["phase"])
                detail = script.get(f"/api/workflows/{workflow_id}").json()
                if detail["workflow"]["status"] in ("completed", "failed", "paused"):
                    break
                engine.shutdown.wait(0.1)
            for event in script.get(f"/api/workflows/{workflow_id}/events?after={last}").json():
                if event["type"] == "phase_change":  # committed after the last look
                    phases.append(event["data"]["phase"])
    finally:
        dashboard.stop()
    assert dashboard.errors == []
    assert detail["workflow"]["status"] == "completed", detail["workflow"]
    assert detail["workflow"]["merge_sha"]
    # what a script following the events sees: the merge's success, then completed
    assert phases[-4:] == ["merge", "completed", "acceptance_verification", "completed"]
    assert store.workflow_row(workflow_id)["merge_sha"] == detail["workflow"]["merge_sha"]
