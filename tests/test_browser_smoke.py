"""A real Chromium, driven by Playwright, clicks a button on a page a real local HTTP
server serves: the groundwork of the dashboard's browser tests.
Missing Chromium or Playwright fails this under CI, skips it elsewhere."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest_plugins = ("support.browser",)

PAGE = b"""<!doctype html>
<html><head><title>phasegate smoke</title></head>
<body>
<p id="state">not clicked</p>
<button id="go" onclick="go()">Approve</button>
<script>
async function go() {
  const answer = await fetch("/clicked", {method: "POST", body: "approve"});
  document.getElementById("state").textContent = "server said " + (await answer.text());
}
</script>
</body></html>
"""


class _Site:
    """A real HTTP server on a free port of 127.0.0.1: the page at ``/``, and what the
    page POSTs to ``/clicked`` kept in ``posts``."""

    def __init__(self) -> None:
        self.posts: list[bytes] = []
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                self._answer(200, "text/html", PAGE)

            def do_POST(self) -> None:  # noqa: N802
                site.posts.append(self.rfile.read(int(self.headers["Content-Length"])))
                self._answer(200, "text/plain", b"recorded")

            def _answer(self, code: int, kind: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # the test's output is the assertions'

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def site() -> Iterator[_Site]:
    served = _Site()
    yield served
    served.server.shutdown()
    served.server.server_close()


def test_a_real_chromium_clicks_a_button_and_the_server_gets_the_request(
    browser_page: Any, site: _Site
) -> None:
    browser_page.goto(site.url)
    assert browser_page.title() == "phasegate smoke"
    assert browser_page.locator("#state").text_content() == "not clicked"

    browser_page.get_by_role("button", name="Approve").click()

    browser_page.locator("#state").filter(has_text="server said recorded").wait_for()
    assert site.posts == [b"approve"]


def test_two_pages_are_two_contexts_with_cookies_of_their_own(
    chromium_browser: Any, site: _Site
) -> None:
    first, second = chromium_browser.new_context(), chromium_browser.new_context()
    try:
        first.add_cookies([{"name": "session", "value": "ana", "url": site.url}])
        assert [c["value"] for c in first.cookies(site.url)] == ["ana"]
        assert second.cookies(site.url) == []
    finally:
        first.close()
        second.close()
