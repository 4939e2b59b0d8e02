"""The dashboard's HTTP rules: the token, the session
cookie, CSRF, the board's order, a person's decision through a POST, secrets.

FastAPI's TestClient drives the real app on a real SQLite store and a real
repository whose workflows run with scripted agents.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_graph_workflow import ANSWERS, GRAPH_ROLES, graph_repo

from phasegate import operations
from phasegate.config.cartridge import CartridgeError
from phasegate.core.contract import EventWrite, PhasegateError, PhaseResult
from phasegate.proc.host import host_name
from phasegate.runtime.engine import Engine, LeaseHeld
from phasegate.store import Store
from phasegate.web import Access, create_app
from phasegate.web.auth import CSRF_HEADER, SESSION_COOKIE, WeakToken
from phasegate.web.views import describe_event, group_of

from conftest import HAPPY_ANSWERS, git, make_repo, scripted_cartridge

TOKEN = "web-token-for-tests-0123456789"
#: In the environment under a secret-looking name, and in the cartridge's role env.
ENV_SENTINEL = "sk-envsentinel-7c41d09e2b"
CARTRIDGE_SENTINEL = "sk-cartsentinel-5a9e13f7c0"


@pytest.fixture
def web_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PHASEGATE_TEST_API_KEY", ENV_SENTINEL)
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    # feedback's round builds something new (the scripted runner's last answer repeats)
    second = '[[build]]\ntext = "again"\n[build.files]\n"feature.txt" = "as asked\\n"\n'
    (repo / "answers.toml").write_text(HAPPY_ANSWERS + second)
    review = (
        'runner = "scripted"\nscript = "answers.toml"\ntimeout = 30\n'
        f'env = {{ REVIEW_TOKEN = "{CARTRIDGE_SENTINEL}" }}\n'
    )
    cartridge = scripted_cartridge(auto_merge=False, role_overrides={"review": review})
    (repo / "phasegate.toml").write_text(cartridge)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    return repo


@pytest.fixture
def dashboard(
    web_repo: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> Iterator[tuple[TestClient, Engine, Store]]:
    engine, store = engine_for(web_repo)
    app = create_app(engine, Access(token=TOKEN, user="alice"))
    with TestClient(app) as client:
        yield client, engine, store


def logged_in(client: TestClient) -> str:
    """Log ``client`` in with the token; the CSRF token its pages carry."""
    response = client.get(f"/login?token={TOKEN}")
    assert response.status_code == 200  # followed the 303 to the board
    found = re.search(r'name="csrf" value="([^"]+)"', response.text)
    assert found, "the board carries the session's CSRF token"
    return found.group(1)


def waiting_workflow(engine: Engine, title: str = "Add the feature") -> str:
    workflow_id = engine.start(title, "Write feature.txt")
    row = engine.advance(workflow_id)
    assert (row["current_phase"], row["status"]) == ("wait", "waiting")
    return workflow_id


@pytest.mark.parametrize(
    "path", ["/", "/board", "/board/events", "/workflows/x", "/static/htmx.min.js"]
)
def test_every_page_without_a_session_is_401_with_the_login_form(
    dashboard: tuple[TestClient, Engine, Store], path: str
) -> None:
    client, _engine, _store = dashboard
    response = client.get(path)
    assert response.status_code == 401
    assert 'id="login-form"' in response.text


def test_the_style_sheet_alone_is_read_without_a_session_and_styles_the_login_page(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, _engine, _store = dashboard
    style = client.get("/static/dashboard.css")
    assert style.status_code == 200 and style.headers["content-type"].startswith("text/css")
    login = client.get("/login").text
    assert '<link rel="stylesheet" href="/static/dashboard.css">' in login
    assert '<label for="token">' in login
    assert client.get("/static/dashboard.js").status_code == 401


def test_the_token_is_exchanged_once_for_an_httponly_samesite_strict_cookie(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, _engine, _store = dashboard
    wrong = client.get("/login?token=not-the-token", follow_redirects=False)
    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers

    response = client.post("/login", data={"token": TOKEN}, follow_redirects=False)
    assert (response.status_code, response.headers["location"]) == (303, "/")
    cookie = response.headers["set-cookie"].lower()
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    assert "httponly" in cookie and "samesite=strict" in cookie
    # From now on the cookie alone opens the board, and the token is nowhere in it.
    board = client.get("/")
    assert board.status_code == 200 and 'id="board"' in board.text
    assert TOKEN not in board.text
    # Only this server's scripts run, in no one else's frame; the token's URL leaks no Referer.
    policy = board.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert board.headers["referrer-policy"] == "no-referrer"
    assert "<script>" not in board.text  # no inline script the policy would block

    client.post("/logout", headers={CSRF_HEADER: logged_in(client)})
    client.cookies.clear()
    assert client.get("/").status_code == 401


def test_a_post_without_the_sessions_csrf_token_is_403_and_changes_nothing(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, store = dashboard
    workflow_id = waiting_workflow(engine)
    csrf = logged_in(client)
    before = (store.workflow_row(workflow_id), store.events(workflow_id))

    for headers, form in (
        ({}, {"text": "do it"}),
        ({CSRF_HEADER: "forged"}, {"text": "do it"}),
        ({}, {"text": "do it", "csrf": csrf[:-1] + "x"}),
    ):
        response = client.post(f"/workflows/{workflow_id}/feedback", data=form, headers=headers)
        assert response.status_code == 403
        response = client.post(f"/workflows/{workflow_id}/approve-merge", headers=headers)
        assert response.status_code == 403
    assert (store.workflow_row(workflow_id), store.events(workflow_id)) == before

    # Another session's CSRF token is not this one's.
    with TestClient(client.app) as other:
        other_csrf = logged_in(other)
    response = client.post(
        f"/workflows/{workflow_id}/feedback",
        data={"text": "do it"},
        headers={CSRF_HEADER: other_csrf},
    )
    assert response.status_code == 403
    assert store.workflow_row(workflow_id)["version"] == before[0]["version"]


def test_feedback_posted_with_csrf_reaches_the_waiting_workflow_redacted(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, store = dashboard
    workflow_id = waiting_workflow(engine)
    csrf = logged_in(client)
    text = f"Please also handle empty input (key {ENV_SENTINEL})."

    response = client.post(
        f"/workflows/{workflow_id}/feedback",
        data={"text": text, "csrf": csrf},
        follow_redirects=False,
    )
    assert (response.status_code, response.headers["location"]) == (
        303,
        f"/workflows/{workflow_id}",
    )
    stored = store.workflow_row(workflow_id)["user_feedback"]
    assert stored == "Please also handle empty input (key ***)."
    # The worker acts on it as on the CLI's: the next round carries it.
    row = engine.advance(workflow_id)
    assert (row["current_phase"], row["status"], row["dev_round"]) == ("wait", "waiting", 2)


def test_approve_merge_records_the_tokens_user_and_a_refusal_is_409_with_its_reason(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, store = dashboard
    filed = engine.start("Not yet run", "Write feature.txt")  # in preparation
    csrf = logged_in(client)
    refused = client.post(f"/workflows/{filed}/approve-merge", headers={CSRF_HEADER: csrf})
    assert refused.status_code == 409
    assert "not waiting for a merge approval" in refused.json()["detail"]
    assert "merge_approved" not in store.workflow_row(filed)["state"]

    workflow_id = waiting_workflow(engine)
    response = client.post(
        f"/workflows/{workflow_id}/approve-merge",
        headers={CSRF_HEADER: csrf, "HX-Request": "true"},
    )
    assert response.status_code == 200 and 'id="workflow-detail"' in response.text
    state = store.workflow_row(workflow_id)["state"]
    assert (state["merge_approved"], state["merge_approved_by"]) == (True, "alice")


def test_a_script_acts_with_a_bearer_token_and_no_csrf_and_a_wrong_one_is_401(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, store = dashboard
    workflow_id = waiting_workflow(engine)
    wrong = client.post(
        f"/workflows/{workflow_id}/approve-merge",
        headers={"Authorization": "Bearer not-the-token-at-all"},
    )
    assert wrong.status_code == 401
    assert "merge_approved" not in store.workflow_row(workflow_id)["state"]

    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/", headers=bearer).status_code == 200
    response = client.post(
        f"/workflows/{workflow_id}/approve-merge", headers=bearer, follow_redirects=False
    )
    assert response.status_code == 303
    assert store.workflow_row(workflow_id)["state"]["merge_approved_by"] == "alice"
    assert SESSION_COOKIE not in client.cookies  # a script is given no session


def test_resume_through_the_page_lets_a_paused_workflow_go_on(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, store = dashboard
    workflow_id = engine.start("Paused one", "Write feature.txt")
    # Paused through the single commit path, as a phase pauses (a verification given up).
    engine.decide(workflow_id, lambda _ctx: PhaseResult("pause", reason="given up"))
    csrf = logged_in(client)
    assert store.workflow_row(workflow_id)["status"] == "paused"
    assert 'id="resume"' in client.get(f"/workflows/{workflow_id}").text

    response = client.post(
        f"/workflows/{workflow_id}/resume", data={"csrf": csrf}, follow_redirects=False
    )
    assert response.status_code == 303
    row = engine.advance(workflow_id)
    assert (row["current_phase"], row["status"]) == ("wait", "waiting")


def test_a_browser_reads_a_refusal_as_a_page_and_htmx_and_the_api_keep_theirs(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, _engine, _store = dashboard
    logged_in(client)
    html = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}

    page = client.get("/workflows/0badf00d", headers=html)
    assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
    assert 'id="error-code">404<' in page.text and "no workflow 0badf00d" in page.text
    assert '<a href="/" id="back-to-board">' in page.text and "&#34;" not in page.text
    assert client.get("/no/such/page", headers=html).status_code == 404
    # htmx shows the refusal in place (dashboard.js), a script reads JSON: as before.
    htmx = client.get("/workflows/0badf00d", headers={**html, "HX-Request": "true"})
    assert htmx.status_code == 404 and htmx.json() == {"detail": "no workflow 0badf00d"}
    assert client.get("/workflows/0badf00d").json() == {"detail": "no workflow 0badf00d"}
    api = client.get("/api/workflows/0badf00d", headers=html)
    assert api.status_code == 404 and api.json()["error"]["code"] == 404


def test_access_takes_its_token_and_user_from_the_environment_else_makes_a_token() -> None:
    given = Access(environ={"PHASEGATE_WEB_TOKEN": TOKEN, "PHASEGATE_WEB_USER": "carol"})
    assert (given.token, given.user, given.made_token) == (TOKEN, "carol", False)
    with pytest.raises(WeakToken, match="PHASEGATE_WEB_TOKEN has 6 characters"):
        Access(environ={"PHASEGATE_WEB_TOKEN": "secret"})
    with pytest.raises(WeakToken, match="has 0 characters, white space at its ends not counted"):
        Access(environ={"PHASEGATE_WEB_TOKEN": " " * 20})
    made, other = Access(environ={}), Access(environ={})
    assert made.made_token and len(made.token) >= 32 and made.token != other.token
    assert made.login(other.token) is None
    session = made.login(made.token)
    assert session is not None and made.session(session.id) == session
    assert not Access.csrf_ok(session, "") and Access.csrf_ok(session, session.csrf)


def test_a_value_of_the_wrong_type_is_a_400_in_one_line_and_changes_nothing(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, store = dashboard
    csrf = logged_in(client)
    workflow_id = waiting_workflow(engine)
    before = (store.workflow_row(workflow_id), store.events(workflow_id))

    response = client.post(
        f"/workflows/{workflow_id}/comments",
        data={"csrf": csrf, "path": "feature.txt", "line": "abc", "text": "why"},
    )
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert detail.startswith("bad request: line: ") and "integer" in detail
    assert "\n" not in detail and "abc" not in detail  # pydantic's list is not shown
    stream = client.get(f"/workflows/{workflow_id}/events?after=abc")
    assert stream.status_code == 400 and stream.json()["detail"].startswith("bad request: after:")
    assert (store.workflow_row(workflow_id), store.events(workflow_id)) == before


def test_the_board_shows_needs_you_first_then_running_queued_waiting_done_failed(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, _store = dashboard
    queued = engine.start("Queued one", "Write feature.txt")  # runnable, nobody holds it
    waiting = waiting_workflow(engine, "Waits for you")
    logged_in(client)

    page = client.get("/").text
    groups = re.findall(r'<section class="group group-(\w+)"', page)
    assert groups == ["needs_you", "running", "queued", "waiting", "done", "failed"]
    needs_you = page.split('id="group-needs_you"')[1].split("<section")[0]
    queue = page.split('id="group-queued"')[1].split("<section")[0]
    assert f'id="card-{waiting}"' in needs_you and f'id="card-{queued}"' not in needs_you
    assert f'id="card-{queued}"' in queue
    card = needs_you.split(f'id="card-{waiting}"')[1].split("</article>")[0]
    for shown in ("Waits for you", "wait", "waiting", "review", "$0.0100"):
        assert shown in card


def test_a_card_is_running_only_while_a_live_worker_holds_its_lease() -> None:
    summary = {"status": "developing", "worker": None}
    assert group_of(summary) == "queued"
    # Waiting on something a worker cannot hurry: a forge pause, or a conflict child.
    assert group_of({**summary, "children": [{"id": "c1", "status": "developing"}]}) == "waiting"
    assert group_of({**summary, "children": [{"id": "c1", "status": "completed"}]}) == "queued"
    assert group_of({**summary, "worker": "host:12:abc"}) == "running"
    # A person's turn outranks a lease a worker has not released yet.
    assert group_of({"status": "waiting", "worker": "host:12:abc"}) == "needs_you"
    assert group_of({"status": "completed", "worker": None}) == "done"
    assert group_of({"status": "failed", "worker": None}) == "failed"


def test_a_workflow_page_starts_its_live_stream_after_the_last_row_it_shows(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, store = dashboard
    workflow_id = waiting_workflow(engine)
    logged_in(client)
    page = client.get(f"/workflows/{workflow_id}").text
    found = re.search(rf'sse-connect="/workflows/{workflow_id}/events\?after=(\d+)"', page)
    assert found and int(found.group(1)) == store.events(workflow_id)[-1]["id"]
    # Its fragment re-reads on the stream's changed event, and names what it shows.
    assert 'hx-trigger="sse:changed"' in page and 'id="wf-status"' in page
    assert client.get(f"/workflows/{workflow_id}x").status_code == 404


def test_what_a_stream_triggers_is_never_swapped_out_so_a_change_queued_on_it_is_not_lost(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    # htmx queues a trigger that comes while a re-read is in flight on the element
    # itself; were it inside the fragment, the re-read's swap would drop the queued one
    # and the page would stay a change behind (seen in Chromium: a workflow left at
    # reporting while the store said waiting).
    client, engine, _store = dashboard
    workflow_id = waiting_workflow(engine)
    logged_in(client)
    for page, fragment, live in (
        (f"/workflows/{workflow_id}", f"/workflows/{workflow_id}/fragment", "workflow-live"),
        ("/", "/board", "board-live"),
    ):
        text = client.get(page).text
        found = re.search(rf'<div id="{live}" hx-get="{fragment}" ([^>]*)>', text)
        assert found, page
        assert 'hx-trigger="sse:changed"' in found.group(1)
        assert 'hx-swap="innerHTML"' in found.group(1)
        assert "hx-trigger" not in client.get(fragment).text, fragment


def test_no_secret_reaches_a_page_even_when_the_store_holds_one(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, store = dashboard
    workflow_id = waiting_workflow(engine)
    # A record that holds both secrets raw (a path that forgot to redact).
    raw = {"note": f"{ENV_SENTINEL} {CARTRIDGE_SENTINEL}"}
    store.add_event(workflow_id, EventWrite("milestone_updated", raw))
    logged_in(client)
    pages = [client.get(p).text for p in ("/", "/board", f"/workflows/{workflow_id}")]
    pages.append(client.get(f"/workflows/{workflow_id}/fragment").text)
    pages.append(client.get(f"/workflows/{workflow_id}/diff").text)
    assert all(p for p in pages)
    for text in pages:
        assert ENV_SENTINEL not in text and CARTRIDGE_SENTINEL not in text
    assert ENV_SENTINEL in str(store.events(workflow_id)[-1]["data"])  # the test's premise


def _decision_events(store: Store, workflow_id: str) -> list[dict[str, object]]:
    return [e["data"] for e in store.events(workflow_id) if e["type"] == operations.DECISION_EVENT]


def _buttons(page: str) -> set[str]:
    """The actions a workflow page offers, by operations' names."""
    return {name.replace("-", "_") for name in re.findall(r'data-action="([\w-]+)"', page)}


def test_cancel_through_the_page_records_the_tokens_user_and_a_decision_event(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, store = dashboard
    workflow_id = waiting_workflow(engine)
    csrf = logged_in(client)
    assert 'id="cancel"' in client.get(f"/workflows/{workflow_id}").text

    response = client.post(
        f"/workflows/{workflow_id}/cancel", headers={CSRF_HEADER: csrf, "HX-Request": "true"}
    )
    assert response.status_code == 200 and 'data-status="cancelled"' in response.text
    row = store.workflow_row(workflow_id)
    assert (row["status"], row["error"]) == ("cancelled", "cancelled by alice")
    assert _decision_events(store, workflow_id)[-1] == {"action": "cancel", "by": "alice"}
    # A cancelled workflow offers nothing more.
    assert _buttons(client.get(f"/workflows/{workflow_id}").text) == set()


def test_a_workflow_pages_activity_lists_its_rows_in_order_saying_who_decided(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, store = dashboard
    workflow_id = waiting_workflow(engine)
    csrf = logged_in(client)
    client.post(f"/workflows/{workflow_id}/cancel", headers={CSRF_HEADER: csrf})
    page = client.get(f"/workflows/{workflow_id}").text
    listed = re.findall(r'<li class="event event-(\w+)" data-id="(\d+)"', page)
    assert [(t, int(i)) for t, i in listed] == [
        (e["type"], e["id"]) for e in store.events(workflow_id)
    ]
    assert "entered wait" in page
    assert "cancel by alice" in page
    assert "plan agent (scripted), round 1" in page


def test_a_refused_action_is_409_with_exactly_the_operations_message_and_changes_nothing(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, store = dashboard
    workflow_id = waiting_workflow(engine)
    other = waiting_workflow(engine, "Other")
    csrf = logged_in(client)
    client.post(f"/workflows/{workflow_id}/approve-merge", headers={CSRF_HEADER: csrf})
    row = engine.advance(workflow_id)
    assert row["status"] == "completed"

    def recorded() -> list[tuple[dict[str, object], list[dict[str, object]]]]:
        # A lease taken to decide bumps its fence; what the workflow records is the rest.
        rows = [{**store.workflow_row(w), "fence": None} for w in (workflow_id, other)]
        return [(row, store.events(str(row["id"]))) for row in rows]

    before = recorded()
    with pytest.raises(PhasegateError) as refused_in_cli:
        operations.cancel(engine, workflow_id, by="alice")

    response = client.post(f"/workflows/{workflow_id}/cancel", headers={CSRF_HEADER: csrf})
    assert response.status_code == 409
    assert response.json()["detail"] == str(refused_in_cli.value)
    assert "completed; there is nothing to cancel" in response.json()["detail"]
    empty = client.post(f"/workflows/{other}/revert", data={"reason": "  ", "csrf": csrf})
    assert (empty.status_code, empty.json()["detail"]) == (
        409,
        "the reason is empty; say why the plan must change",
    )
    assert recorded() == before


def test_revert_through_the_page_sends_the_workflow_to_planning_with_the_reason_and_who(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, store = dashboard
    workflow_id = waiting_workflow(engine)
    csrf = logged_in(client)
    assert "revert" in _buttons(client.get(f"/workflows/{workflow_id}").text)

    response = client.post(
        f"/workflows/{workflow_id}/revert",
        data={"reason": f"Wrong approach ({ENV_SENTINEL})", "csrf": csrf},
        follow_redirects=False,
    )
    assert response.status_code == 303
    row = store.workflow_row(workflow_id)
    assert row["current_phase"] == "planning"
    assert row["state"]["decisions"][-1]["reason"] == "Wrong approach (***)"
    assert _decision_events(store, workflow_id)[-1] == {"action": "revert", "by": "alice"}


def test_the_buttons_shown_are_exactly_the_actions_operations_offers(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, store = dashboard
    waiting = waiting_workflow(engine)
    queued = engine.start("Queued one", "Write feature.txt")
    paused = engine.start("Paused one", "Write feature.txt")
    engine.decide(paused, lambda _ctx: PhaseResult("pause", reason="given up"))
    cancelled = engine.start("Cancelled one", "Write feature.txt")
    operations.cancel(engine, cancelled, by="bob")
    logged_in(client)

    seen = {}
    for workflow_id in (waiting, queued, paused, cancelled):
        offered = set(operations.actions(store.load_context(workflow_id)))
        shown = _buttons(client.get(f"/workflows/{workflow_id}").text)
        assert shown == offered - {"cleanup"}, workflow_id  # cleanup: the CLI's only
        seen[workflow_id] = shown
    # The states differ in what they offer, so the match above is not vacuous.
    assert {"approve_merge", "feedback", "revert", "cancel"} <= seen[waiting]
    assert "resume" in seen[paused] and "approve_merge" not in seen[paused]
    assert seen[cancelled] == set()


def test_a_graph_workflows_page_shows_its_plan_competition_attack_and_calls(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    answers = (
        ANSWERS + '[[plan_adversary]]\ntext = "The template may be missing.\\nVERDICT: proceed"\n'
    )
    repo = graph_repo(tmp_path, answers=answers, roles=(*GRAPH_ROLES, "plan_adversary"))
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add feature.txt", "feature.txt holds 'the feature'")
    assert engine.advance(workflow_id)["status"] in ("waiting", "completed")
    [run] = store.runs_of(workflow_id)
    assert run["record"]["plan_competition"] and run["record"]["plan_attack"]
    with TestClient(create_app(engine, Access(token=TOKEN, user="alice"))) as client:
        logged_in(client)
        page = client.get(f"/workflows/{workflow_id}").text
    assert f'data-run="{run["run_id"]}"' in page
    section = page.split('id="graph-runs"')[1]
    competition = section.split('class="plan-competition"')[1].split("</details>")[0]
    attack = section.split('class="plan-attack"')[1].split("</details>")[0]
    assert "second" in competition  # the arbiter's choice
    assert "proceed" in attack  # the adversary's verdict
    roles = re.findall(r'class="graph-call" data-role="(\w+)"', section)
    assert roles == [c["role"] for c in run["record"]["calls"]]
    assert {"plan", "plan_alternative", "plan_arbitrate", "plan_adversary", "build"} <= set(roles)


def test_the_proposal_a_workflow_awaits_is_approved_from_its_page_by_the_tokens_user(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    engine, store = engine_for(graph_repo(tmp_path, policy="propose"))
    workflow_id = engine.start("Add feature.txt", "feature.txt holds 'the feature'")
    assert engine.advance(workflow_id)["status"] == "awaiting_approval"
    [proposal] = store.proposals(workflow_id=workflow_id)
    with TestClient(create_app(engine, Access(token=TOKEN, user="alice"))) as client:
        csrf = logged_in(client)
        page = client.get(f"/workflows/{workflow_id}").text
        assert {"approve", "reject"} <= _buttons(page)
        assert f'/proposals/{proposal["id"]}/approve"' in page
        base = f"/workflows/{workflow_id}/proposals"
        assert client.post(f"{base}/nope/approve", headers={CSRF_HEADER: csrf}).status_code == 404
        empty = client.post(f"{base}/{proposal['id']}/reject", data={"reason": "", "csrf": csrf})
        assert (empty.status_code, empty.json()["detail"]) == (409, "--reason is empty; say why")

        response = client.post(f"{base}/{proposal['id']}/approve", headers={CSRF_HEADER: csrf})
        assert response.status_code == 200  # the redirect to its page, followed
    decided = store.proposal(proposal["id"])
    assert (decided["status"], decided["decided_by"]) == ("approved", "alice")
    assert _decision_events(store, workflow_id)[-1] == {
        "action": "approve",
        "by": "alice",
        "proposal": proposal["id"],
    }
    assert engine.advance(workflow_id)["status"] == "completed"


def test_a_workflow_a_worker_holds_offers_no_button_and_its_actions_are_refused_alike(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, store = dashboard
    workflow_id = waiting_workflow(engine)
    # a live holder: this very process, under another owner's name
    assert store.claim(workflow_id, f"{host_name()}:{os.getpid()}:elsewhere", 600) is not None
    csrf = logged_in(client)
    assert _buttons(client.get(f"/workflows/{workflow_id}").text) == set()
    with pytest.raises(LeaseHeld) as refused_in_cli:
        operations.cancel(engine, workflow_id, by="alice")

    response = client.post(f"/workflows/{workflow_id}/cancel", headers={CSRF_HEADER: csrf})
    assert (response.status_code, response.json()["detail"]) == (409, str(refused_in_cli.value))
    assert store.workflow_row(workflow_id)["status"] == "waiting"


def test_a_persons_acceptance_verdict_from_the_page_is_recorded_with_the_tokens_user(
    web_repo: Path, dashboard: tuple[TestClient, Engine, Store]
) -> None:
    client, engine, store = dashboard
    answers = web_repo / "answers.toml"
    crash = '[[verification]]\ntext = "crash"\nexit_code = 2\n'
    answers.write_text(answers.read_text().split("[[verification]]")[0] + crash)
    git(web_repo, "commit", "-qam", "a verifier that crashes")
    workflow_id = waiting_workflow(engine)
    operations.approve_merge(engine, workflow_id, by="alice")
    row = engine.advance(workflow_id)
    assert (row["current_phase"], row["status"]) == ("acceptance_verification", "paused")
    csrf = logged_in(client)
    assert "verify_override" in _buttons(client.get(f"/workflows/{workflow_id}").text)

    path = f"/workflows/{workflow_id}/verify-override"
    wrong = client.post(path, data={"verdict": "maybe", "csrf": csrf})
    assert (wrong.status_code, wrong.json()["detail"]) == (
        409,
        "verdict must be confirmed or rejected, not 'maybe'",
    )
    assert client.post(path, data={"verdict": "confirmed", "csrf": csrf}).status_code == 200
    assert _decision_events(store, workflow_id)[-1] == {
        "action": "verify_override",
        "by": "alice",
        "verdict": "confirmed",
    }
    summaries = [m.summary for m in store.milestones(workflow_id)]
    assert "Acceptance verification: confirmed by alice" in summaries
    assert engine.advance(workflow_id)["status"] == "completed"


@pytest.mark.parametrize("action", ["cancel", "revert", "verify-override", "proposals/p1/reject"])
def test_each_new_action_without_the_csrf_token_is_403_and_changes_nothing(
    dashboard: tuple[TestClient, Engine, Store], action: str
) -> None:
    client, engine, store = dashboard
    workflow_id = waiting_workflow(engine)
    logged_in(client)
    before = store.events(workflow_id)
    form = {"reason": "because", "verdict": "confirmed"}
    response = client.post(f"/workflows/{workflow_id}/{action}", data=form)
    assert response.status_code == 403
    assert store.workflow_row(workflow_id)["status"] == "waiting"
    assert store.events(workflow_id) == before


def test_a_ticket_started_from_the_board_is_filed_by_the_tokens_user_and_opens_its_page(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, _engine, store = dashboard
    csrf = logged_in(client)
    board = client.get("/").text
    for element in (
        'id="start-form"',
        'id="ticket-text"',
        'id="ticket-title"',
        'id="start-ticket"',
    ):
        assert element in board

    response = client.post(
        "/tickets",
        data={"ticket": "# Add feature.txt\n\nIt holds the feature.", "title": "", "csrf": csrf},
        follow_redirects=False,
    )
    assert response.status_code == 303
    [row] = store.list_workflows()
    assert response.headers["location"] == f"/workflows/{row['id']}"
    # Filed, not advanced: `serve`'s worker takes it from here.
    assert (row["title"], row["current_phase"]) == ("Add feature.txt", "preparation")
    assert _decision_events(store, row["id"]) == [{"action": "start", "by": "alice"}]

    # htmx follows no redirect: it is told where to go.
    titled = client.post(
        "/tickets",
        data={"ticket": f"Write it (key {ENV_SENTINEL})", "title": "Named one"},
        headers={CSRF_HEADER: csrf, "HX-Request": "true"},
    )
    newest = store.list_workflows()[-1]
    assert titled.status_code == 204
    assert titled.headers["hx-redirect"] == f"/workflows/{newest['id']}"
    assert (newest["title"], newest["ticket"]) == ("Named one", "Write it (key ***)")


def test_a_refused_ticket_is_refused_with_operations_message_and_nothing_is_filed(
    web_repo: Path, dashboard: tuple[TestClient, Engine, Store]
) -> None:
    client, engine, store = dashboard
    csrf = logged_in(client)
    too_long = "x" * (operations.MAX_TICKET_BYTES + 1)
    # Nothing that would only fail later in development: a NUL no prompt or program
    # argument can carry, a title too long for a branch and a commit message.
    long_title = "t" * (operations.MAX_TITLE_CHARS + 1)
    for ticket, title in (("  \n", ""), (too_long, ""), ("Write \x00 it", ""), ("x", long_title)):
        with pytest.raises(operations.ActionRefused) as refused_in_cli:
            operations.start(engine, ticket, by="alice", title=title or None)
        response = client.post("/tickets", data={"ticket": ticket, "title": title, "csrf": csrf})
        assert (response.status_code, response.json()["detail"]) == (400, str(refused_in_cli.value))
    assert client.post("/tickets", data={"ticket": "Write it"}).status_code == 403  # no CSRF

    git(web_repo, "branch", "-m", "main", "trunk")  # the cartridge's base_branch is gone
    with pytest.raises(CartridgeError, match="base_branch") as refused_in_cli:
        operations.start(engine, "Write it", by="alice")
    response = client.post("/tickets", data={"ticket": "Write it", "csrf": csrf})
    assert (response.status_code, response.json()["detail"]) == (409, str(refused_in_cli.value))
    assert store.list_workflows() == []


def test_a_pruned_workflows_activity_says_what_was_pruned_in_words(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, store = dashboard
    workflow_id = waiting_workflow(engine)
    operations.cancel(engine, workflow_id, by="alice")
    assert store.prune(store.clock.now() + timedelta(seconds=1)).workflows == [workflow_id]
    logged_in(client)

    page = client.get(f"/workflows/{workflow_id}").text
    [row] = re.findall(r'<li class="event event-events_pruned"[^>]*>(.*?)</li>', page, re.S)
    said = re.sub(r"<[^>]+>", "", row)
    # In words, escaped once: no JSON's quotes to escape at all.
    assert "&#34;" not in row and "&amp;" not in row and "{" not in said
    assert re.search(r"events_pruned \d+ older events pruned \(\d+ agent_finished, ", said), said
    assert said.endswith(f"before {store.clock.now().date().isoformat()}"), said
    assert describe_event({"type": "odd", "data": {"a_b": 1, "c": {"d": "e"}}}) == "a b 1, c (d e)"
