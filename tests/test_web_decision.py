"""A workflow page's decision panel: why it needs you, the report rendered in the
viewer's language, the checks with their output, the change's size, the feedback
the round answered, the cost; and the timeline as cycles.

FastAPI's TestClient drives the real app on a real SQLite store and a real
repository whose workflows run with scripted agents and real checks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_web import TOKEN, logged_in, waiting_workflow

from phasegate import operations
from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.web import Access, create_app

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
    assert '<article id="report" class="markdown"><h2>Progress report' in shown
    assert 'id="approve-merge"' in shown and 'id="send-feedback"' in shown
    commands = re.findall(r"<code>([^<]+)</code> <span", shown)
    assert commands == ["echo tests all green", "python3 -c &#34;print(&#39;lint clean&#39;)&#34;"]
    assert "tests all green" in shown and "lint clean" in shown  # their output
    assert re.search(
        r'id="change-summary"><strong>1</strong> files, <span class="added">\+1', shown
    )
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
