"""The dashboard in a real Chromium: a person
logs in with the token, starts a ticket from the board, watches it move live to
waiting, reloads mid-run without a gap or a repeat in the live stream, comments
on a diff line and sees the next round's build prompt carry it and the page's
decision panel show it answered beside the report, checks and change, approves the
merge and sees it complete; a second person's browser sees the same events; an
action without the session or without the CSRF token is refused, nothing done; a
viewer's page offers no action and its POST is refused; an approver an admin
added on the people page approves a merge.

``phasegate serve``'s own machinery (``Dashboard``: uvicorn and the worker on
threads) on a free port of 127.0.0.1, a real repository and SQLite store, the
build agent a real subprocess (the ``command`` runner) that keeps its prompts.
Missing Chromium or Playwright fails these under CI, skips them elsewhere.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.web import Access
from phasegate.web.serve import Dashboard

from conftest import HAPPY_ANSWERS, git, make_repo, phasegate_cli, scripted_cartridge

pytest_plugins = ("support.browser",)

TOKEN = "browser-token-for-tests-0123456789"
#: Seconds Playwright waits for what the page must come to show (a worker's rounds).
SHOWN_S = 60

#: Before any page script: every event the page's live streams receive, kept in
#: ``window.__received`` as ``[url, id, type]`` (the types a workflow's rows have;
#: the first test fails when a row of a type not listed here was sent).
RECORDED_TYPES = (
    "phase_change",
    "milestone_updated",
    "agent_started",
    "agent_finished",
    "decision",
    "violation",
    "notified",
    "notify_failed",
    "taken_over",
    "branch_recreated",
    "needs_you",
    "reversion",
    "child_ended",
    "branch_fetched",
    "git_repaired",
    "paused_by_shutdown",
    "self_fenced",
    "reconciled",
    "worktree_healed",
    "agent_output",
    "review_comment",
    "review_sent",
)
RECORD_EVENTS = """
window.__received = [];
const Native = window.EventSource;
window.EventSource = function (url, options) {
  const source = new Native(url, options);
  for (const type of TYPES) {
    source.addEventListener(type, (e) => window.__received.push([url, e.lastEventId, type]));
  }
  return source;
};
window.EventSource.prototype = Native.prototype;
""".replace("TYPES", json.dumps(list(RECORDED_TYPES)))


@dataclass
class Served:
    url: str
    engine: Engine
    store: Store
    prompts: Path
    gate: Path  # the first build waits until this file exists


@pytest.fixture
def served(tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]) -> Iterator[Served]:
    """A dashboard with its worker on a repository whose build agent keeps each
    prompt, waits for ``gate`` and adds a line to feature.txt every round."""
    prompts, gate = tmp_path / "prompts", tmp_path / "gate"
    prompts.mkdir()
    build = (
        'runner = "command"\n'
        f"command = 'cat > {prompts}/build-$PHASEGATE_CALL_INDEX.txt; "
        f"while [ ! -e {gate} ]; do sleep 0.05; done; "
        'echo "round $PHASEGATE_CALL_INDEX" >> feature.txt; echo built\'\n'
        "timeout = 120\n"
    )
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    (repo / "phasegate.toml").write_text(
        scripted_cartridge(
            auto_merge=False, role_overrides={"build": build}, checks=["echo all tests green"]
        )
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    engine, store = engine_for(repo)
    access = Access(token=TOKEN, user="alice", store=store)
    dashboard = Dashboard(engine, access, port=0, poll_s=0.2)
    url = dashboard.start()
    try:
        yield Served(url, engine, store, prompts, gate)
    finally:
        dashboard.stop()
    assert dashboard.errors == []


@pytest.fixture
def expect() -> Any:
    from playwright.sync_api import expect as playwright_expect

    playwright_expect.set_options(timeout=SHOWN_S * 1000)
    return playwright_expect


def received(page: Any) -> list[int]:
    """The ids of the workflow rows the page's live stream has received so far."""
    return [int(i) for url, i, _type in page.evaluate("window.__received") if "/workflows/" in url]


def streamed_from(page: Any) -> int:
    """Where the page's workflow stream starts: the last row the page was rendered with."""
    connect = page.locator("#workflow").get_attribute("sse-connect")
    found = re.search(r"after=(\d+)", connect or "")
    assert found, connect
    return int(found.group(1))


def group_of_card(page: Any, workflow_id: str) -> str:
    return (
        page.locator(f"#card-{workflow_id}")
        .locator("xpath=ancestor::section")
        .get_attribute("data-group")
    )


def test_a_ticket_from_the_board_to_completed_in_a_real_browser(
    chromium_browser: Any, served: Served, expect: Any
) -> None:
    alice = chromium_browser.new_context()
    bob = chromium_browser.new_context()  # a second person's browser, its own session
    anonymous = chromium_browser.new_context()
    try:
        page = alice.new_page()
        page.add_init_script(RECORD_EVENTS)
        page.goto(f"{served.url}/login?token={TOKEN}")
        expect(page.locator("#user")).to_have_text("alice")
        assert TOKEN not in page.url  # the 303 took the token out of the address bar

        # Start a ticket from the board; the server's worker takes it at once.
        page.fill("#ticket-text", "Write feature.txt\n\nOne line per round.")
        page.click("#start-ticket")
        page.wait_for_url(re.compile(r"/workflows/[^/?]+$"))
        workflow_id = page.locator("#wf-id").text_content()
        assert workflow_id and served.store.workflow_row(workflow_id)["title"] == (
            "Write feature.txt"
        )

        # Mid-run (the build agent waits for the gate): the page moved to development live.
        expect(page.locator("#wf-phase")).to_have_text("development")
        while not (served.prompts / "build-0.txt").exists():
            page.wait_for_timeout(50)
        first_from, first_seen = streamed_from(page), received(page)
        page.reload()
        reloaded_from = streamed_from(page)
        rows_then = [r["id"] for r in served.store.events(workflow_id)]
        assert first_seen == [i for i in rows_then if first_from < i <= reloaded_from]
        rendered = [int(i) for i in page.locator("#activity li").evaluate_all(
            "items => items.map(li => li.dataset.id)"
        )]  # fmt: skip
        assert rendered[-1] == reloaded_from

        bob.add_init_script(RECORD_EVENTS)
        watcher = bob.new_page()
        watcher.goto(f"{served.url}/login?token={TOKEN}")
        watcher.goto(f"{served.url}/workflows/{workflow_id}")
        watcher_from = streamed_from(watcher)

        page.evaluate("window.__stayed = true")  # gone if the page were loaded anew
        served.gate.touch()
        expect(page.locator("#wf-status")).to_have_text("waiting")
        expect(watcher.locator("#wf-status")).to_have_text("waiting")
        assert page.evaluate("window.__stayed") is True  # moved live, not reloaded

        rows = [r["id"] for r in served.store.events(workflow_id)]
        # No gap and no repeat after the reload: every later row once, in order; both
        # people's browsers saw the same rows.
        expect(page.locator("#activity li").last).to_have_attribute("data-id", str(rows[-1]))
        assert received(page) == [i for i in rows if i > reloaded_from]
        assert received(watcher) == [i for i in rows if i > watcher_from]
        assert set(received(watcher)) <= set(received(page)) | set(rendered)
        # The recorder listens for every type this workflow's rows have.
        assert {e["type"] for e in served.store.events(workflow_id)} <= set(RECORDED_TYPES)

        # The board: it waits for a person, and what needs you comes first.
        page.click("#nav-board")
        assert page.locator("section.group").first.get_attribute("data-group") == "needs_you"
        assert group_of_card(page, workflow_id) == "needs_you"

        # Without the session: refused. With it but without the CSRF token: refused.
        # Neither did anything.
        cancel = f"{served.url}/workflows/{workflow_id}/cancel"
        assert anonymous.request.post(cancel).status == 401
        assert alice.request.post(cancel).status == 403
        assert alice.request.post(cancel, headers={"X-CSRF-Token": "forged"}).status == 403
        assert served.store.workflow_row(workflow_id)["status"] == "waiting"

        # A comment on a line of the diff, sent as the review: the next round's feedback.
        page.goto(f"{served.url}/workflows/{workflow_id}")
        page.click("#diff-link")
        page.click('.comment-on[data-path="feature.txt"][data-line="1"]')
        assert page.input_value("#comment-path") == "feature.txt"
        assert page.input_value("#comment-line") == "1"
        page.fill("#comment-text", "Say which round it is in words")
        page.click("#send-comment")
        expect(page.locator("#review-drafts li")).to_have_count(1)
        page.click("#send-review")
        page.goto(f"{served.url}/workflows/{workflow_id}")
        expect(page.locator("#wf-round")).to_have_text("2")
        expect(page.locator("#wf-status")).to_have_text("waiting")
        # The page opens with the decision: the report beside the buttons, the checks
        # with their output, the change's size and the feedback this round answered.
        panel = page.locator("#decision")
        expect(panel.locator("#decision-headline")).to_contain_text("The report is ready")
        expect(panel.locator("#report h2").first).to_contain_text("Progress report")
        expect(panel.locator("#approve-merge")).to_be_visible()
        panel.locator(".check summary").first.click()
        expect(panel.locator(".check-output").first).to_contain_text("all tests green")
        expect(panel.locator("#change-summary")).to_contain_text("1 file, +2")
        expect(panel.locator("#answered-feedback")).to_contain_text("Say which round it is")
        second_prompt = (served.prompts / "build-1.txt").read_text()
        assert "feature.txt line 1" in second_prompt
        assert "Say which round it is in words" in second_prompt
        assert "Say which round" not in (served.prompts / "build-0.txt").read_text()

        # Approve the merge with a click: recorded as the token's person; it completes.
        page.click("#approve-merge")
        expect(page.locator("#wf-status")).to_have_text("completed")
        row = served.store.workflow_row(workflow_id)
        assert row["state"]["merge_approved_by"] == "alice"
        decisions = [e["data"] for e in served.store.events(workflow_id) if e["type"] == "decision"]
        assert {"action": "approve_merge", "by": "alice"} in decisions
        page.click("#nav-board")
        assert group_of_card(page, workflow_id) == "done"
    finally:
        for context in (alice, bob, anonymous):
            context.close()


def test_a_refused_decision_says_the_clis_words_on_the_page(
    chromium_browser: Any, served: Served, expect: Any
) -> None:
    repo = served.engine.repo
    workflow_id = served.engine.start("Filed", "Write feature.txt")
    served.gate.touch()
    context = chromium_browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{served.url}/login?token={TOKEN}")
        page.goto(f"{served.url}/workflows/{workflow_id}")
        expect(page.locator("#wf-status")).to_have_text("waiting")
        # This page goes stale (its live stream cut) while another front end, the
        # CLI, approves the merge first and the worker merges.
        page.route(f"**/workflows/{workflow_id}/events*", lambda route: route.abort())
        page.reload()
        approved = phasegate_cli("approve-merge", workflow_id, "--repo", str(repo))
        assert approved.returncode == 0, approved.stderr
        while served.store.workflow_row(workflow_id)["status"] != "completed":
            page.wait_for_timeout(50)

        page.click("#approve-merge")  # still shown: the page did not hear
        expect(page.locator("#action-error")).not_to_be_empty()
        said = page.locator("#action-error").text_content()
        again = phasegate_cli("approve-merge", workflow_id, "--repo", str(repo))
        assert again.returncode != 0
        assert said and said in again.stderr  # the CLI's words, word for word
        assert "not waiting for a merge approval" in said
        # A live re-read of the page after it (as a change pushed would cause) keeps it.
        page.evaluate(
            "htmx.ajax('GET', location.pathname + '/fragment', "
            "{target: '#workflow-detail', swap: 'outerHTML'})"
        )
        expect(page.locator("#wf-status")).to_have_text("completed")
        page.wait_for_timeout(200)
        assert page.locator("#action-error").text_content() == said

        # An empty ticket from the board: refused with operations' words, nothing filed.
        before = len(served.store.list_workflows())
        page.click("#nav-board")
        page.fill("#ticket-text", "   ")
        page.click("#start-ticket")
        expect(page.locator("#action-error")).to_have_text("the ticket is empty")
        assert len(served.store.list_workflows()) == before
    finally:
        context.close()


def test_a_viewer_only_looks_and_an_approver_the_admin_added_approves_the_merge(
    chromium_browser: Any, served: Served, expect: Any
) -> None:
    workflow_id = served.engine.start("Filed", "Write feature.txt")
    served.gate.touch()
    added = phasegate_cli(
        "users", "add", "vera", "--role", "viewer", "--repo", str(served.engine.repo)
    )
    assert added.returncode == 0, added.stderr
    viewer_token = added.stdout.strip().splitlines()[-1]
    viewer, admin, approver = (chromium_browser.new_context() for _ in range(3))
    try:
        # The viewer: every page, and on the workflow that waits for a person no
        # button or form but logging out.
        looking = viewer.new_page()
        looking.goto(f"{served.url}/login")
        looking.fill("#token", viewer_token)
        looking.click("#login")
        expect(looking.locator("#role")).to_have_text("viewer")
        expect(looking.locator("#user")).to_have_text("vera")
        assert looking.locator("#start-form").count() == 0
        looking.goto(f"{served.url}/workflows/{workflow_id}")
        expect(looking.locator("#wf-status")).to_have_text("waiting")
        expect(looking.locator("#viewer-note")).to_contain_text("approve_merge")
        assert looking.locator("#actions button").count() == 0
        assert looking.locator("form[method=post]:not([action='/logout'])").count() == 0
        # A POST from the viewer's page, with its session and CSRF token: refused.
        status = looking.evaluate(
            """id => fetch(`/workflows/${id}/approve-merge`, {method: "POST", headers:
                JSON.parse(document.body.getAttribute("hx-headers"))}).then(r => r.status)""",
            workflow_id,
        )
        assert status == 403
        assert "merge_approved" not in served.store.workflow_row(workflow_id)["state"]

        # The admin (the environment's token) adds an approver on the people page.
        managing = admin.new_page()
        managing.goto(f"{served.url}/login?token={TOKEN}")
        managing.click("#nav-people")
        managing.fill("#person-name", "paul")
        managing.select_option("#person-role", "approver")
        managing.click("#add-person")
        token = managing.locator("#new-token-value").text_content()
        assert token and token.startswith("pgu_")
        expect(managing.locator('tr.person[data-name="paul"]')).to_have_attribute(
            "data-role", "approver"
        )

        # The approver logs in with it and approves the merge: recorded as paul.
        deciding = approver.new_page()
        deciding.goto(f"{served.url}/login")
        deciding.fill("#token", token)
        deciding.click("#login")
        expect(deciding.locator("#role")).to_have_text("approver")
        deciding.goto(f"{served.url}/workflows/{workflow_id}")
        deciding.click("#approve-merge")
        expect(deciding.locator("#wf-status")).to_have_text("completed")
        assert served.store.workflow_row(workflow_id)["state"]["merge_approved_by"] == "paul"
        decisions = [e["data"] for e in served.store.events(workflow_id) if e["type"] == "decision"]
        assert {"action": "approve_merge", "by": "paul"} in decisions
        # The viewer's page followed live, and still offers nothing.
        expect(looking.locator("#wf-status")).to_have_text("completed")
        assert looking.locator("form[method=post]:not([action='/logout'])").count() == 0
        # Removing a person and a new token ask first: cancelled, nothing is sent
        # (last: a new token ends vera's session, and her page's live updates).
        managing.reload()
        asked: list[str] = []

        def answer(accept: bool) -> Any:
            def on_dialog(dialog: Any) -> None:
                asked.append(dialog.message)
                dialog.accept() if accept else dialog.dismiss()

            return on_dialog

        managing.once("dialog", answer(False))
        managing.click('tr.person[data-name="vera"] .person-remove button')
        managing.wait_for_timeout(200)
        assert asked and asked[-1].startswith("Remove vera?")
        assert served.store.user("vera")["name"] == "vera"  # raises once removed
        managing.once("dialog", answer(True))
        managing.click('tr.person[data-name="vera"] .person-token button')
        expect(managing.locator("#new-token")).to_contain_text("A new token for vera")
        assert asked[-1].startswith("A new token for vera?")
    finally:
        for context in (viewer, admin, approver):
            context.close()


def test_six_columns_fit_1280_px_cards_keep_words_whole_and_the_login_page_is_styled(
    chromium_browser: Any, served: Served, expect: Any
) -> None:
    long_word = "Refactor_the_configuration_loader_and_its_cartridge_tables"
    for title in ("A ticket whose title runs on for a good many words", long_word):
        held = served.engine.start(title, "Write feature.txt")
    # A machine with a long name runs one: its card names the host.
    owner = f"build-runner-{'x' * 30}.example.internal:{os.getpid()}:e2bb21"
    assert served.store.claim(held, owner, 600) is not None
    context = chromium_browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = context.new_page()
        page.goto(f"{served.url}/login")
        # The style sheet reached the login page before any session.
        label = page.locator("label[for=token]")
        assert label.evaluate("e => getComputedStyle(e).fontWeight") == "600"
        page.fill("#token", TOKEN)
        page.click("#login")
        expect(page.locator("#group-failed")).to_be_visible()
        right = page.evaluate(
            "document.getElementById('group-failed').getBoundingClientRect().right"
        )
        assert right <= 1280, right
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280
        # A card's status is one badge on one line: no word broken across two.
        heights = page.locator(".card .wf-status").evaluate_all(
            "els => els.map(e => e.getBoundingClientRect().height)"
        )
        assert heights and max(heights) < 24, heights
    finally:
        context.close()
