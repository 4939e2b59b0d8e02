"""A running agent's output on the workflow page in a real Chromium:
dashboard.js appends each ``agent_output`` row of the SSE stream to
``<pre id="agent-output">`` as the agent prints, while the rest of the page stays
as it was (no ``changed``: the fragment is not read again), each row once.

Missing Chromium or Playwright fails this under CI, skips it elsewhere
(``support.browser``).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from test_agent_output import (  # noqa: F401
    SECRET,
    _output_of,
    _wait_for,
    advancing,
    gated_build,
)
from test_web import TOKEN, web_repo  # noqa: F401

from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.web import Access
from phasegate.web.serve import Dashboard

pytest_plugins = ("support.browser",)


def test_the_page_appends_a_running_agents_lines_live_each_once_without_a_reload(
    browser_page: Any,
    advancing: tuple[str, Engine, Store, threading.Thread, Path],  # noqa: F811
) -> None:
    workflow_id, engine, store, thread, gate = advancing
    _wait_for(lambda: "first line" in _output_of(store, workflow_id), thread, "first line")
    dashboard = Dashboard(engine, Access(token=TOKEN, user="alice"), port=0, worker=False)
    url = dashboard.start()
    try:
        browser_page.goto(f"{url}/login?token={TOKEN}")
        browser_page.goto(f"{url}/workflows/{workflow_id}")
        output = browser_page.locator("#agent-output")
        assert "first line" in output.text_content()
        # A mark on the fragment: gone if the page's detail is read and swapped again.
        browser_page.evaluate("document.getElementById('wf-title').dataset.mark = 'kept'")
        # Only now does the agent print its last line; then it waits. A stream that
        # opens later still sends it: it starts after the page's last row.
        gate.touch()
        output.filter(has_text="last line").wait_for(timeout=60_000)
        text = output.text_content()
        assert text.count("first line") == 1 and text.count("last line") == 1
        assert "the key is ***" in text and SECRET not in text
        assert text.index("first line") < text.index("last line")
        # Appended by the script: the detail around it is the one first served.
        assert browser_page.evaluate("document.getElementById('wf-title').dataset.mark") == ("kept")
        assert browser_page.locator("#agent-running").count() == 1
    finally:
        dashboard.stop()
