"""People and roles on the dashboard: a personal token logs in with its person's
role; viewers see and cannot act; approvers decide under their own name; admins
manage people on /people; a removed person's, a re-roled person's and a replaced
token's sessions change at once.

FastAPI's TestClient drives the real app on a real SQLite store and a real
repository whose workflows run with scripted agents (tests/test_web.py's).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from test_web import TOKEN, waiting_workflow, web_repo  # noqa: F401 (a fixture)

from phasegate.cli.web import login_lines
from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.web import Access, create_app, live
from phasegate.web.auth import CSRF_HEADER, Person, Role
from phasegate.web.serve import Dashboard


@pytest.fixture
def app_on(
    web_repo: Path,  # noqa: F811
    engine_for: Callable[..., tuple[Engine, Store]],
) -> Iterator[tuple[Engine, Store, Callable[[], TestClient]]]:
    """The app on ``web_repo``'s store (people in it, and TOKEN as alice, an admin);
    ``client()`` is a new browser."""
    engine, store = engine_for(web_repo)
    app = create_app(engine, Access(token=TOKEN, user="alice", store=store))
    clients: list[TestClient] = []

    def client() -> TestClient:
        made = TestClient(app)
        clients.append(made.__enter__())
        return made

    yield engine, store, client
    for made in clients:
        made.__exit__(None, None, None)


def login(client: TestClient, token: str) -> str:
    """Log ``client`` in with ``token``; the CSRF token its pages carry."""
    response = client.post("/login", data={"token": token})
    assert response.status_code == 200, response.text
    found = re.search(r'name="csrf" value="([^"]+)"', response.text)
    assert found
    return found.group(1)


def posting(page: str) -> list[str]:
    """Where a page's forms and htmx elements would POST, logging out left out (a
    GET form, such as the board's filters, changes nothing)."""
    found = re.findall(r'<form[^>]*method="post"[^>]*action="([^"]+)"', page)
    found += re.findall(r'hx-post="([^"]+)"', page)
    return sorted({a for a in found if a != "/logout"})


def test_a_viewer_sees_every_page_with_no_action_and_a_post_is_403(
    app_on: tuple[Engine, Store, Callable[[], TestClient]],
) -> None:
    engine, store, client = app_on
    workflow_id = waiting_workflow(engine)
    _row, token = store.add_user("vera", "viewer", by="alice")
    viewer = client()
    csrf = login(viewer, token)

    board = viewer.get("/").text
    assert '<span id="user">vera</span>' in board and '<span class="role" id="role">viewer' in board
    assert posting(board) == [] and 'id="start-ticket"' not in board
    page = viewer.get(f"/workflows/{workflow_id}").text
    assert 'id="wf-status" class="status-waiting">waiting' in page
    assert posting(page) == [] and 'id="approve-merge"' not in page
    assert "vera is a viewer: the decisions here (approve_merge" in page
    assert "it waits for an approver to merge it" in page and "approve the merge, or" not in page
    diff = viewer.get(f"/workflows/{workflow_id}/diff").text
    assert "feature.txt" in diff and posting(diff) == []
    assert 'class="comment-on"' not in diff  # a line number picks no line to comment on
    assert 'id="review"' not in diff and "no draft comment" not in diff  # a viewer writes none
    assert 'id="nav-people"' not in page and viewer.get("/people").status_code == 403

    before = store.workflow_row(workflow_id)
    for path in ("approve-merge", "cancel", "feedback", "comments", "review"):
        refused = viewer.post(
            f"/workflows/{workflow_id}/{path}", data={"text": "x"}, headers={CSRF_HEADER: csrf}
        )
        assert refused.status_code == 403, path
        assert refused.json()["detail"] == "vera is a viewer: viewers cannot act"
    assert (
        viewer.post("/tickets", data={"ticket": "x"}, headers={CSRF_HEADER: csrf}).status_code
        == 403
    )
    assert store.workflow_row(workflow_id) == before
    assert len(store.list_workflows()) == 1
    # A browser's plain form and address read a page saying why, with the same status.
    html = {"Accept": "text/html,application/xhtml+xml"}
    form = viewer.post(f"/workflows/{workflow_id}/cancel", data={"csrf": csrf}, headers=html)
    assert form.status_code == 403 and form.headers["content-type"].startswith("text/html")
    assert "vera is a viewer: viewers cannot act" in form.text and 'id="back-to-board"' in form.text
    people = viewer.get("/people", headers=html)
    assert people.status_code == 403 and 'id="error-code">403<' in people.text
    assert store.workflow_row(workflow_id) == before
    # A viewer's bearer token reads and is refused alike.
    bearer = {"Authorization": f"Bearer {token}"}
    assert viewer.get(f"/workflows/{workflow_id}", headers=bearer).status_code == 200
    assert viewer.post(f"/workflows/{workflow_id}/cancel", headers=bearer).status_code == 403
    # Logging out is no decision: a viewer may.
    assert viewer.post("/logout", headers={CSRF_HEADER: csrf}).status_code == 200
    viewer.cookies.clear()
    assert viewer.get("/").status_code == 401


def test_an_approver_decides_under_their_own_name_by_page_and_by_bearer(
    app_on: tuple[Engine, Store, Callable[[], TestClient]],
) -> None:
    engine, store, client = app_on
    _row, token = store.add_user("paul", "approver", by="alice")
    approver = client()
    csrf = login(approver, token)
    page_id = waiting_workflow(engine, "By the page")
    page = approver.get(f"/workflows/{page_id}").text
    assert 'id="approve-merge"' in page and 'id="nav-people"' not in page
    assert approver.get("/people").status_code == 403
    response = approver.post(f"/workflows/{page_id}/approve-merge", headers={CSRF_HEADER: csrf})
    assert response.status_code == 200
    assert store.workflow_row(page_id)["state"]["merge_approved_by"] == "paul"

    script_id = waiting_workflow(engine, "By a script")
    bearer = {"Authorization": f"Bearer {token}"}
    scripted = client().post(f"/workflows/{script_id}/cancel", headers=bearer)
    assert scripted.status_code == 200
    for workflow_id, action in ((page_id, "approve_merge"), (script_id, "cancel")):
        decided = [e["data"] for e in store.events(workflow_id) if e["type"] == "decision"]
        assert decided[-1] == {"action": action, "by": "paul"}
    assert store.workflow_row(script_id)["error"] == "cancelled by paul"


def test_an_admin_adds_a_person_on_the_people_page_whose_token_then_works(
    app_on: tuple[Engine, Store, Callable[[], TestClient]],
) -> None:
    _engine, store, client = app_on
    admin = client()
    csrf = login(admin, TOKEN)  # PHASEGATE_WEB_TOKEN: alice, an admin
    assert 'id="nav-people"' in admin.get("/").text
    assert 'id="no-people"' in admin.get("/people").text

    added = admin.post("/people", data={"name": "nina", "role": "approver", "csrf": csrf})
    assert added.status_code == 200
    token = re.search(r'<code id="new-token-value">([^<]+)</code>', added.text)
    assert token and token.group(1).startswith("pgu_")
    assert admin.get("/people").text.count(token.group(1)) == 0  # shown once
    row = store.user("nina")
    assert (row["role"], row["added_by"]) == ("approver", "alice")
    other = client()
    login(other, token.group(1))
    assert '<span id="user">nina</span>' in other.get("/").text

    refused = admin.post("/people", data={"name": "nina", "role": "viewer", "csrf": csrf})
    assert refused.status_code == 400
    assert "there is already a person named &#39;nina&#39;" in refused.text
    unknown = admin.post("/people", data={"name": "olga", "role": "boss", "csrf": csrf})
    assert unknown.status_code == 400 and "no role &#39;boss&#39;" in unknown.text
    assert [u["name"] for u in store.users()] == ["nina"]
    # Without the CSRF token: 403, nobody added.
    assert admin.post("/people", data={"name": "olga", "role": "viewer"}).status_code == 403
    assert [u["name"] for u in store.users()] == ["nina"]


def test_a_changed_role_a_new_token_and_a_removal_reach_open_sessions_at_once(
    app_on: tuple[Engine, Store, Callable[[], TestClient]],
) -> None:
    engine, store, client = app_on
    workflow_id = waiting_workflow(engine)
    admin = client()
    csrf = login(admin, TOKEN)
    _row, token = store.add_user("vera", "viewer", by="alice")
    vera = client()
    vera_csrf = login(vera, token)
    assert 'id="approve-merge"' not in vera.get(f"/workflows/{workflow_id}").text

    moved = admin.post("/people/vera/role", data={"role": "approver", "csrf": csrf})
    assert moved.status_code == 200 and store.user("vera")["changed_by"] == "alice"
    page = vera.get(f"/workflows/{workflow_id}").text  # the same session, its next request
    assert 'id="approve-merge"' in page and '<span class="role" id="role">approver' in page

    renewed = admin.post("/people/vera/token", data={"csrf": csrf})
    new = re.search(r'<code id="new-token-value">([^<]+)</code>', renewed.text)
    assert new and new.group(1) != token
    assert vera.get("/").status_code == 401  # the old token's session ended
    assert client().get("/", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    vera_csrf = login(vera, new.group(1))

    removed = admin.post("/people/vera/remove", data={"csrf": csrf})
    assert removed.status_code == 200 and 'data-name="vera"' not in removed.text
    refused = vera.post(f"/workflows/{workflow_id}/cancel", headers={CSRF_HEADER: vera_csrf})
    assert refused.status_code == 401
    assert store.workflow_row(workflow_id)["status"] == "waiting"
    bearer = {"Authorization": f"Bearer {new.group(1)}"}
    assert client().get("/", headers=bearer).status_code == 401


def test_the_last_admin_is_kept_from_the_people_page_too(
    app_on: tuple[Engine, Store, Callable[[], TestClient]],
) -> None:
    _engine, store, client = app_on
    _row, token = store.add_user("ada", "admin", by="alice")
    ada = client()
    csrf = login(ada, token)
    refused = ada.post("/people/ada/role", data={"role": "viewer", "csrf": csrf})
    assert refused.status_code == 400
    assert "&#39;ada&#39; is the last admin and cannot be made viewer" in refused.text
    gone = ada.post("/people/zed/remove", data={"csrf": csrf})
    assert gone.status_code == 404 and "no person named &#39;zed&#39;" in gone.text
    assert store.user("ada")["role"] == "admin"
    # An admin who removes themselves is logged out by it at once.
    store.add_user("bea", "admin", by="ada")
    assert ada.post("/people/ada/remove", data={"csrf": csrf}).status_code == 401
    assert [(u["name"], u["role"]) for u in store.users()] == [("bea", "admin")]


def test_access_with_people_and_no_token_makes_none_and_serve_says_how_to_log_in(
    app_on: tuple[Engine, Store, Callable[[], TestClient]],
) -> None:
    _engine, store, _client = app_on
    empty = Access(environ={}, store=store)
    assert empty.made_token and empty.token  # nobody yet: a token made and printed
    assert any("/login?token=" in line for line in login_lines(empty, "http://h"))
    _row, token = store.add_user("ada", "admin", by="root")
    access = Access(environ={}, store=store)
    assert (access.token, access.made_token) == (None, False)
    said = login_lines(access, "http://h")
    assert "phasegate users add" in said[0] and not any("token=" in line for line in said)
    assert access.bearer("") is None and access.bearer("pgu_not-anyones") is None
    assert access.login(token[:-2]) is None
    assert access.bearer(token) == Person("ada", Role.ADMIN)
    # The environment's token goes on standing for its user, an admin, beside the people.
    both = Access(environ={"PHASEGATE_WEB_TOKEN": TOKEN, "PHASEGATE_WEB_USER": "eve"}, store=store)
    assert both.bearer(TOKEN) == Person("eve", Role.ADMIN)
    assert both.bearer(token) == Person("ada", Role.ADMIN)


def test_a_removed_persons_open_live_stream_ends(
    web_repo: Path,  # noqa: F811
    engine_for: Callable[..., tuple[Engine, Store]],
) -> None:
    engine, store = engine_for(web_repo)
    workflow_id = waiting_workflow(engine)
    _row, token = store.add_user("vera", "viewer", by="alice")
    dashboard = Dashboard(engine, Access(token=TOKEN, store=store), port=0, worker=False)
    url = dashboard.start()
    try:
        with httpx.Client(base_url=url, timeout=30.0) as client:
            assert client.post("/login", data={"token": token}).status_code == 303
            with client.stream("GET", f"/workflows/{workflow_id}/events") as response:
                assert response.status_code == 200
                lines = response.iter_lines()
                assert any(line == "event: changed" for line in lines)  # the rows so far
                started = time.monotonic()
                store.remove_user("vera", by="alice")
                rest = []
                for line in lines:  # ends: the server closes the stream
                    # (else a ping every 15 seconds would keep it open for ever)
                    assert time.monotonic() - started < live.WAIT_S + 5, "it goes on"
                    rest.append(line)
                assert not any(line.startswith("id:") for line in rest)
            assert client.get("/").status_code == 401
    finally:
        dashboard.stop()
