"""A workflow page's decision panel: why it needs you, the report rendered in the
viewer's language, the checks with their output, the change's size, the feedback
the round answered, the cost; and the timeline as cycles.

FastAPI's TestClient drives the real app on a real SQLite store and a real
repository whose workflows run with scripted agents and real checks.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_web import TOKEN, logged_in, waiting_workflow

from phasegate import operations
from phasegate.core.contract import PhaseResult
from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.web import Access, create_app
from phasegate.web.decision import headline

from conftest import HAPPY_ANSWERS, git, make_repo, scripted_cartridge

CHECKS = ["echo tests all green", "python3 -c \"print('lint clean')\""]


@pytest.fixture
def dashboard(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> Iterator[tuple[TestClient, Engine, Store]]:
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    second = '[[build]]\ntext = "again"\n[build.files]\n"feature.txt" = "as asked\\n"\n'
    (repo / "answers.toml").write_text(HAPPY_ANSWERS + second)
    (repo / "phasegate.toml").write_text(scripted_cartridge(auto_merge=False, checks=CHECKS))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    engine, store = engine_for(repo)
    with TestClient(create_app(engine, Access(token=TOKEN, user="alice"))) as client:
        yield client, engine, store


def panel(page: str) -> str:
    """The decision panel of a workflow page's HTML."""
    start = page.index('id="decision"')
    return page[start : page.index("</section>\n", page.index("</aside>", start))]


def test_the_panel_shows_why_it_needs_you_the_report_checks_change_and_cost(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, _store = dashboard
    workflow_id = waiting_workflow(engine)
    logged_in(client)

    shown = panel(client.get(f"/workflows/{workflow_id}").text)

    assert 'class="decision needs-you"' in shown
    assert "The report is ready: approve the merge, or send feedback" in shown
    assert '<article id="report" class="markdown" lang="en"><h2>Progress report' in shown
    assert 'id="approve-merge"' in shown and 'id="send-feedback"' in shown
    commands = re.findall(r"<code>([^<]+)</code> <span", shown)
    assert commands == ["echo tests all green", "python3 -c &#34;print(&#39;lint clean&#39;)&#34;"]
    assert "tests all green" in shown and "lint clean" in shown  # their output
    assert re.search(r'id="change-summary"><strong>1</strong> file, <span class="added">\+1', shown)
    assert f'href="/workflows/{workflow_id}/diff" id="full-diff"' in shown
    assert re.search(r'id="decision-cost">\$[\d.]+ · \d+ tokens · [1-9]\d* agent runs', shown)


def test_the_round_a_persons_feedback_started_shows_that_feedback_as_answered(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, _store = dashboard
    workflow_id = waiting_workflow(engine)
    logged_in(client)
    operations.feedback(engine, workflow_id, "Handle empty input too.", by="alice")
    pending = panel(client.get(f"/workflows/{workflow_id}").text)
    assert '<blockquote id="pending-feedback">Handle empty input too.</blockquote>' in pending

    engine.advance(workflow_id)
    answered = panel(client.get(f"/workflows/{workflow_id}").text)
    assert 'id="answered-feedback"><blockquote>Handle empty input too.</blockquote>' in answered
    assert 'id="pending-feedback"' not in answered


def test_the_report_renders_as_html_in_the_viewers_language_and_the_timeline_as_cycles(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, _store = dashboard
    workflow_id = waiting_workflow(engine)
    logged_in(client)

    chinese = client.get(f"/workflows/{workflow_id}", headers={"Accept-Language": "zh-CN,en;q=0.5"})
    report = chinese.text[chinese.text.index('id="report"') :]
    report = report[: report.index("</article>")]
    assert "<h2>进度报告" in report or "<h1>进度报告" in report
    assert report.startswith('id="report" class="markdown" lang="zh">')  # a CJK font for it
    assert "Progress report" not in report
    # A person's choice outlasts the page it was made on, whatever the browser says.
    english = client.get(f"/workflows/{workflow_id}?lang=en")
    assert "Progress report" in english.text and "进度报告" not in english.text
    again = client.get(f"/workflows/{workflow_id}", headers={"Accept-Language": "zh"})
    assert "Progress report" in again.text

    cycles = re.findall(r'class="cycle cycle-(\w+)"', english.text)
    assert cycles == ["first"]
    # A person's feedback sends it back to development: a second cycle, after the first.
    operations.feedback(engine, workflow_id, "Handle empty input too.", by="alice")
    engine.advance(workflow_id)
    later = client.get(f"/workflows/{workflow_id}").text
    assert re.findall(r'class="cycle cycle-(\w+)"', later) == ["first", "feedback"]
    second = later[later.index('class="cycle cycle-feedback"') :]
    assert "build of round 2" in second and "build of round 1" not in second
    assert re.search(
        r'<time datetime="[^"]+" title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC">', english.text
    )


def test_the_banner_names_the_machine_and_words_a_viewers_wait_and_a_merge_names_its_commit(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, store = dashboard
    workflow_id = waiting_workflow(engine)
    logged_in(client)
    # A viewer reads whom it waits for; the approver, what to do.
    assert "approve the merge, or send feedback" in panel(
        client.get(f"/workflows/{workflow_id}").text
    )
    viewing = headline({"status": "waiting", "current_phase": "wait"}, may_decide=False)
    assert viewing == "The report is ready: it waits for an approver to merge it or send feedback."

    # The running banner names the machine, not the lease holder's pid and token.
    assert store.claim(workflow_id, f"build-7:{os.getpid()}:e2bb21", 600) is not None
    running = panel(client.get(f"/workflows/{workflow_id}").text)
    assert "A worker on build-7 is running wait." in running and "e2bb21" not in running
    store.release(workflow_id, f"build-7:{os.getpid()}:e2bb21")

    # Merged: the merge commit and the diff, not the report's figures.
    operations.approve_merge(engine, workflow_id, by="alice")
    row = engine.advance(workflow_id)
    assert row["status"] == "completed" and row["merge_sha"]
    merged = panel(client.get(f"/workflows/{workflow_id}").text)
    assert f'merged as <code id="merged-as">{row["merge_sha"][:12]}</code>' in merged
    assert 'id="full-diff"' in merged and "<strong>1</strong> file" not in merged


def test_a_paused_workflows_error_is_said_once_in_the_headline(
    dashboard: tuple[TestClient, Engine, Store],
) -> None:
    client, engine, _store = dashboard
    workflow_id = engine.start("Paused one", "Write feature.txt")
    engine.decide(workflow_id, lambda _ctx: PhaseResult("pause", reason="the checks never pass"))
    logged_in(client)
    page = client.get(f"/workflows/{workflow_id}").text
    assert "Paused: the checks never pass" in panel(page)
    assert page.count("the checks never pass") == 1 and 'id="wf-error"' not in page
