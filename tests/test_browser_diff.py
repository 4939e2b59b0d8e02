"""The diff page in a real Chromium: an added line is tinted across its whole row
(the code cell too, not only the gutter) with its + marker, a file folds by its
summary without script, and the page's script folds them all.

``phasegate serve``'s own machinery (``Dashboard``) on a free port of 127.0.0.1, a
real repository, scripted agents. Missing Chromium or Playwright fails this under
CI, skips it elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.web import Access
from phasegate.web.serve import Dashboard

from conftest import HAPPY_ANSWERS, git, make_repo, scripted_cartridge

pytest_plugins = ("support.browser",)

TOKEN = "browser-token-for-diff-tests-0123456789"
ADDED_TINT = "rgb(230, 255, 236)"  # #e6ffec, the diff page's added row


def test_an_added_line_is_tinted_across_its_row_and_files_fold(
    chromium_browser: Any, tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    (repo / "phasegate.toml").write_text(scripted_cartridge(auto_merge=False))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    engine, _store = engine_for(repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    assert engine.advance(workflow_id)["status"] == "waiting"
    dashboard = Dashboard(engine, Access(token=TOKEN, user="alice"), port=0, poll_s=0.2)
    url = dashboard.start()
    context = chromium_browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{url}/login?token={TOKEN}")
        page.goto(f"{url}/workflows/{workflow_id}/diff")
        row = page.locator('tr.diff-add[data-path="feature.txt"]').first
        tints = row.locator("td").evaluate_all(
            "cells => cells.map(c => getComputedStyle(c).backgroundColor)"
        )
        code, marker = tints[-1], row.locator("td.marker").text_content()
        assert code == ADDED_TINT, tints
        assert marker == "+"
        table = page.locator('details.diff-file[data-path="feature.txt"] table.diff')
        assert table.is_visible()
        page.locator('details.diff-file[data-path="feature.txt"] > summary').click()
        assert not table.is_visible()  # folded by <details>, no script of ours
        page.click("#diff-expand-all")  # the page's script: shown once it runs
        assert table.is_visible()
        page.click("#diff-collapse-all")
        assert page.locator("details.diff-file[open]").count() == 0
    finally:
        context.close()
        dashboard.stop()
    assert dashboard.errors == []
