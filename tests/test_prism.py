"""Prism over GitHub's own OpenAPI description referees what passes through it.

A small stand-in upstream (stdlib http.server) answers what each test
scripts; the real Prism, over the real cut of ``@octokit/openapi``, sits in
front of it. Skipped only where Prism is not installed; in CI (``CI`` or
``PHASEGATE_PRISM`` set, as .ci/run does) a missing Prism fails.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from support.github_openapi import OPERATIONS, cut_description
from support.prism import (
    PrismError,
    PrismProxy,
    cached_cut,
    find_description,
    find_prism,
)

ROOT = Path(__file__).resolve().parent.parent
#: One xdist worker runs this module: its own Prism (``running``) starts once.
pytestmark = pytest.mark.xdist_group("prism-module")
API = "https://api.github.com"
WHEN = "2026-01-01T00:00:00Z"


def _prism_or_skip() -> None:
    try:
        find_prism()
        find_description()
    except PrismError as missing:
        if os.environ.get("CI") or os.environ.get("PHASEGATE_PRISM"):
            pytest.fail(str(missing))
        pytest.skip(str(missing))


# -- a stand-in upstream ---------------------------------------------------------


@dataclass
class Received:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Answer:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json; charset=utf-8"


class Upstream(ThreadingHTTPServer):
    """Answers every request with ``answer``; ``received`` holds what reached it."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer = Answer()
        self.received: list[Received] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else Nagle and a delayed ACK hold each answer 40 ms
    server: Upstream

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.server.received.append(Received(self.command, self.path, headers, body))
        answer = self.server.answer
        self.send_response(answer.status)
        for name, value in answer.headers.items():
            self.send_header(name, value)
        if answer.body is None:
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = answer.body if isinstance(answer.body, bytes) else json.dumps(answer.body).encode()
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        """Quiet."""


def user(login: str = "octocat") -> dict[str, Any]:
    u = f"{API}/users/{login}"
    return {
        "login": login, "id": 1, "node_id": "U_1", "avatar_url": f"{API}/a/{login}",
        "gravatar_id": None, "url": u, "html_url": f"https://github.com/{login}",
        "followers_url": f"{u}/followers", "following_url": f"{u}/following{{/other_user}}",
        "gists_url": f"{u}/gists{{/gist_id}}", "starred_url": f"{u}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{u}/subscriptions", "organizations_url": f"{u}/orgs",
        "repos_url": f"{u}/repos", "events_url": f"{u}/events{{/privacy}}",
        "received_events_url": f"{u}/received_events", "type": "User", "site_admin": False,
    }  # fmt: skip


def issue(number: int = 1, title: str = "Widgets fail") -> dict[str, Any]:
    u = f"{API}/repos/o/r/issues/{number}"
    return {
        "id": number, "node_id": f"I_{number}", "url": u, "repository_url": f"{API}/repos/o/r",
        "labels_url": f"{u}/labels{{/name}}", "comments_url": f"{u}/comments",
        "events_url": f"{u}/events", "html_url": f"https://github.com/o/r/issues/{number}",
        "number": number, "state": "open", "title": title, "body": "b", "user": user(),
        "labels": [], "assignee": None, "assignees": [], "milestone": None, "locked": False,
        "comments": 0, "closed_at": None, "created_at": WHEN, "updated_at": WHEN,
        "author_association": "OWNER",
    }  # fmt: skip


def label(name: str) -> dict[str, Any]:
    return {
        "id": 7, "node_id": "L_7", "url": f"{API}/repos/o/r/labels/{name}", "name": name,
        "description": None, "color": "ededed", "default": False,
    }  # fmt: skip


def call(
    url: str, method: str = "GET", body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP exchange: (status, headers lower-cased, body), errors included.
    ``body`` bytes go as ``text/plain``, anything else as JSON."""
    request = urllib.request.Request(url, method=method, headers=headers or {})
    if isinstance(body, bytes):
        request.data = body
        request.add_header("Content-Type", "text/plain")
    elif body is not None:
        request.data = json.dumps(body).encode()
        request.add_header("Content-Type", "application/json")
    try:
        response = urllib.request.urlopen(request, timeout=30)
    except urllib.error.HTTPError as refused:
        response = refused
    with response:
        return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def running(upstream: Upstream) -> Iterator[PrismProxy]:
    _prism_or_skip()
    proxy = PrismProxy(upstream.url)
    with proxy:
        yield proxy


@pytest.fixture
def proxy(running: PrismProxy, upstream: Upstream) -> PrismProxy:
    running.reset()
    upstream.received.clear()
    upstream.answer = Answer()
    return running


# -- the cut, without Prism --------------------------------------------------------

TINY = {
    "openapi": "3.0.3",
    "info": {"title": "t", "version": "1"},
    "tags": [{"name": "issues"}, {"name": "unused"}],
    "paths": {
        "/a": {
            "get": {
                "tags": ["issues"],
                "responses": {"200": {"$ref": "#/components/responses/ok"}},
            },
            "post": {"responses": {"201": {"description": "made"}}},
        },
        "/b": {"get": {"responses": {"200": {"description": "b"}}}},
    },
    "components": {
        "responses": {
            "ok": {
                "description": "ok",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/x"}}},
            }
        },
        "schemas": {
            "x": {"type": "object", "properties": {"y": {"$ref": "#/components/schemas/y"}}},
            "y": {"nullable": True, "anyOf": [{"type": "string"}, {"type": "integer"}]},
            "unused": {"type": "string"},
        },
    },
}


def test_cut_keeps_listed_operations_and_what_they_reference_transitively() -> None:
    cut = cut_description(TINY, [("GET", "/a")])
    assert cut["paths"] == {"/a": {"get": TINY["paths"]["/a"]["get"]}}
    assert set(cut["components"]["schemas"]) == {"x", "y"}
    assert set(cut["components"]["responses"]) == {"ok"}
    assert cut["tags"] == [{"name": "issues"}]


def test_cut_spells_out_nullable_without_type_so_prism_can_compile_it() -> None:
    y = cut_description(TINY, [("GET", "/a")])["components"]["schemas"]["y"]
    assert y == {"anyOf": [{"anyOf": [{"type": "string"}, {"type": "integer"}]}, {"type": "null"}]}


def test_cut_of_an_operation_the_description_lacks_names_it() -> None:
    with pytest.raises(KeyError, match="DELETE /a"):
        cut_description(TINY, [("DELETE", "/a")])


def test_cut_script_runs_without_phasegate_installed(tmp_path: Path) -> None:
    src, dest = tmp_path / "src.json", tmp_path / "out" / "cut.json"
    tiny: dict[str, Any] = {**TINY, "paths": {}}
    for method, template in OPERATIONS:
        tiny["paths"].setdefault(template, {})[method.lower()] = TINY["paths"]["/a"]["get"]
    src.write_text(json.dumps(tiny))
    # -S: no site-packages, so no phasegate and none of its dependencies.
    done = subprocess.run(
        [sys.executable, "-S", str(ROOT / "scripts" / "cut_openapi.py"), str(src), str(dest)],
        capture_output=True, text=True, env={"PATH": os.environ["PATH"]},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(dest.read_text()) == cut_description(tiny)


def test_missing_prism_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PHASEGATE_PRISM", str(tmp_path / "no-prism"))
    with pytest.raises(PrismError, match="PHASEGATE_PRISM=.*no-prism"):
        PrismProxy("http://127.0.0.1:9").__enter__()


def test_missing_description_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PHASEGATE_GITHUB_OPENAPI", str(tmp_path / "none.json"))
    with pytest.raises(PrismError, match="@octokit/openapi"):
        cached_cut()


# -- the real cut, through the real Prism -----------------------------------------


def test_real_cut_holds_exactly_the_listed_operations_and_resolves_every_reference() -> None:
    _prism_or_skip()
    cut = json.loads(cached_cut().read_text())
    listed = {(m.lower(), p) for p, item in cut["paths"].items() for m in item}
    assert listed == {(m.lower(), p) for m, p in OPERATIONS}
    text = json.dumps(cut)
    for kind, names in cut["components"].items():
        for name in names:
            assert f'"#/components/{kind}/{name}"' in text, f"{kind}/{name} is kept unreferenced"


def test_valid_exchange_passes_through_with_its_headers(
    proxy: PrismProxy, upstream: Upstream
) -> None:
    link = f'<{API}/repos/o/r/labels?page=2>; rel="next"'
    upstream.answer = Answer(
        body=[label("bug"), label("phasegate:planning")], headers={"Link": link}
    )
    status, headers, body = call(
        f"{proxy.url}/repos/o/r/labels?per_page=100", headers={"Authorization": "token sentinel"}
    )
    assert (status, json.loads(body)) == (200, [label("bug"), label("phasegate:planning")])
    assert headers["link"] == link
    assert upstream.received[-1].headers["authorization"] == "token sentinel"
    assert proxy.violations() == []
    proxy.assert_clean()


def _broken(change: str) -> dict[str, Any]:
    body = issue()
    if change == "no title":
        del body["title"]
    elif change == "url not a uri":
        body["url"] = "issues/1"
    else:
        body["id"] = 2**53 + 1
    return body


@pytest.mark.parametrize(
    ("change", "where", "says"),
    [
        ("no title", "response.body", "'title'"),
        ("url not a uri", "response.body.url", '"uri"'),
        ("id over 2**53", "response.body.id", "<= 9007199254740991"),
    ],
)
def test_response_the_schema_rejects_is_a_violation(
    proxy: PrismProxy, upstream: Upstream, change: str, where: str, says: str
) -> None:
    upstream.answer = Answer(body=_broken(change))
    status, headers, _ = call(f"{proxy.url}/repos/o/r/issues/1")
    assert status == 500 and headers["content-type"] == "application/problem+json"
    assert len(upstream.received) == 1, "the request itself was valid: it went upstream"
    [violation] = proxy.violations()
    assert (violation.severity, violation.where) == ("error", where)
    assert says in violation.message
    with pytest.raises(AssertionError, match="GET /repos/o/r/issues/1 -> 500"):
        proxy.assert_clean()


@pytest.mark.parametrize(
    ("method", "path", "body", "where", "says"),
    [
        ("POST", "/repos/o/r/issues", {"body": "no title"}, "request.body", "'title'"),
        ("GET", "/repos/o/r/issues?state=bogus", None, "request.query.state", "open, closed"),
        ("GET", "/repos/o/r/issues?since=yesterday", None, "request.query.since", "date-time"),
        ("POST", "/repos/o/r/issues", b"title=t", "request", "application/json"),
    ],
)
def test_request_the_schema_rejects_is_refused_before_upstream(
    proxy: PrismProxy, upstream: Upstream, method: str, path: str, body: Any, where: str, says: str
) -> None:
    assert call(proxy.url + path, method, body)[0] == 422
    assert upstream.received == []
    [violation] = proxy.violations()
    assert (violation.where, violation.status) == (where, 422)
    assert says in violation.message


def test_valid_create_is_201_with_the_same_body(proxy: PrismProxy, upstream: Upstream) -> None:
    upstream.answer = Answer(status=201, body=issue(5, "t"), headers={"Location": f"{API}/i/5"})
    status, headers, body = call(f"{proxy.url}/repos/o/r/issues", "POST", {"title": "t"})
    assert (status, json.loads(body), headers["location"]) == (201, issue(5, "t"), f"{API}/i/5")
    assert json.loads(upstream.received[-1].body) == {"title": "t"}
    proxy.assert_clean()


def test_operation_outside_the_cut_is_refused_before_upstream(
    proxy: PrismProxy, upstream: Upstream
) -> None:
    status, _, _ = call(f"{proxy.url}/repos/o/r/branches")
    assert status == 404 and upstream.received == []
    assert "NO_PATH_MATCHED_ERROR" in proxy.violations()[0].message


def test_undocumented_error_status_passes_through_as_a_warning(
    proxy: PrismProxy, upstream: Upstream
) -> None:
    limits = {"Retry-After": "1", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "1767225600"}
    upstream.answer = Answer(429, {"message": "slow down"}, limits)
    status, headers, body = call(f"{proxy.url}/repos/o/r/issues/1")
    assert (status, json.loads(body)) == (429, {"message": "slow down"})
    assert {k: headers[k.lower()] for k in limits} == limits
    assert proxy.violations(warnings=False) == []
    assert [v.severity for v in proxy.violations()] == ["warning"]
    proxy.assert_clean()


def test_undocumented_success_status_is_an_error(proxy: PrismProxy, upstream: Upstream) -> None:
    # Removing a label answers 200 and the labels left on GitHub, never 204.
    upstream.answer = Answer(204)
    status, _, _ = call(f"{proxy.url}/repos/o/r/issues/1/labels/phasegate%3Aplanning", "DELETE")
    assert status == 500
    assert proxy.violations()[0].where == "response"


def test_non_json_body_where_json_is_documented_is_an_error(
    proxy: PrismProxy, upstream: Upstream
) -> None:
    upstream.answer = Answer(body=b"<html>", content_type="text/html")
    status, _, _ = call(f"{proxy.url}/repos/o/r/issues/1")
    assert status == 500
    assert any("media type" in v.message for v in proxy.violations())


def test_upstream_501_is_answered_with_prisms_mock_and_reported(
    proxy: PrismProxy, upstream: Upstream
) -> None:
    upstream.answer = Answer(501, {"message": "not here"})
    status, _, body = call(f"{proxy.url}/repos/o/r/labels")
    assert status == 200 and "Hello-World" in body.decode(), "Prism's mock, from the examples"
    assert [(v.where, v.status) for v in proxy.violations()] == [("proxy", 501)]


def test_body_upstream_says_is_json_but_is_empty_is_a_proxy_violation(
    proxy: PrismProxy, upstream: Upstream
) -> None:
    upstream.answer = Answer(body=b"")
    assert call(f"{proxy.url}/repos/o/r/labels")[0] == 500
    [violation] = proxy.violations()
    assert violation.where == "proxy" and "FetchError" in violation.message


def test_gzip_from_upstream_reaches_the_client_decoded(
    proxy: PrismProxy, upstream: Upstream
) -> None:
    labels = [label("bug")]
    packed = gzip.compress(json.dumps(labels).encode())
    upstream.answer = Answer(body=packed, headers={"Content-Encoding": "gzip"})
    status, headers, body = call(f"{proxy.url}/repos/o/r/labels")
    assert (status, json.loads(body), headers.get("content-encoding")) == (200, labels, None)
    proxy.assert_clean()


def test_head_query_reaches_upstream_percent_encoded(proxy: PrismProxy, upstream: Upstream) -> None:
    upstream.answer = Answer(body=[])
    status, _, _ = call(f"{proxy.url}/repos/o/r/pulls?head=o:phasegate/issue-1&state=all")
    assert status == 200
    assert upstream.received[-1].target == "/repos/o/r/pulls?head=o%3Aphasegate%2Fissue-1&state=all"
    proxy.assert_clean()


def test_ref_with_slashes_matches_only_percent_encoded(
    proxy: PrismProxy, upstream: Upstream
) -> None:
    upstream.answer = Answer(body={"total_count": 0, "check_runs": []})
    assert call(f"{proxy.url}/repos/o/r/commits/heads/feature/x/check-runs")[0] == 404
    assert call(f"{proxy.url}/repos/o/r/commits/heads%2Ffeature%2Fx/check-runs")[0] == 200
    assert upstream.received[-1].target == "/repos/o/r/commits/heads%2Ffeature%2Fx/check-runs"


#: A body each listed operation accepts (the request must pass for its response to be judged).
VALID_BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/user/repos"): {"name": "r"},
    ("POST", "/orgs/{org}/repos"): {"name": "r"},
    ("POST", "/repos/{owner}/{repo}/issues"): {"title": "t"},
    ("PATCH", "/repos/{owner}/{repo}/issues/{issue_number}"): {"state": "closed"},
    ("POST", "/repos/{owner}/{repo}/issues/{issue_number}/sub_issues"): {"sub_issue_id": 1},
    ("POST", "/repos/{owner}/{repo}/issues/{issue_number}/labels"): {"labels": ["phasegate"]},
    ("POST", "/repos/{owner}/{repo}/labels"): {"name": "phasegate"},
    ("POST", "/repos/{owner}/{repo}/issues/{issue_number}/comments"): {"body": "b"},
    ("POST", "/repos/{owner}/{repo}/pulls"): {"title": "t", "head": "h", "base": "main"},
    ("PATCH", "/repos/{owner}/{repo}/pulls/{pull_number}"): {"body": "b"},
    ("PUT", "/repos/{owner}/{repo}/pulls/{pull_number}/merge"): {"merge_method": "squash"},
    ("POST", "/app/installations/{installation_id}/access_tokens"): {},
    ("POST", "/repos/{owner}/{repo}/statuses/{sha}"): {"state": "success"},
}


def test_every_listed_operation_has_its_response_judged(
    proxy: PrismProxy, upstream: Upstream
) -> None:
    # A schema Prism cannot compile judges nothing, silently (GitHub's issue
    # schemas did, before the cut spelled out their nullable): a body of the
    # wrong type must be caught on every operation.
    cut = json.loads(cached_cut().read_text())
    upstream.answer = Answer(body=b'"not a GitHub object"')
    unjudged = []
    for method, template in OPERATIONS:
        codes = cut["paths"][template][method.lower()]["responses"]
        success = next(c for c in codes if c.startswith("2"))
        if "content" not in codes[success]:
            continue  # no body (a 204): nothing of it to judge
        upstream.answer.status = int(success)
        path = template.replace("{issue_number}", "1").replace("{pull_number}", "2")
        path = path.replace("{installation_id}", "3").replace("{", "").replace("}", "")
        proxy.reset()
        status, _, _ = call(proxy.url + path, method, VALID_BODIES.get((method, template)))
        found = proxy.violations()
        if status != 500 or not all(v.where.startswith("response") for v in found):
            unjudged.append(f"{method} {template}: {status} {[str(v) for v in found]}")
    assert unjudged == []


def test_exit_stops_prism_and_its_process_group(upstream: Upstream) -> None:
    _prism_or_skip()
    proxy = PrismProxy(upstream.url)
    with proxy as url:
        assert call(f"{url}/repos/o/r/branches")[0] == 404
        pid = proxy.pid
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    with pytest.raises(urllib.error.URLError):
        call(f"{url}/repos/o/r/branches")


def test_one_prism_follows_a_new_upstream(proxy: PrismProxy, upstream: Upstream) -> None:
    other = Upstream()
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        other.answer = Answer(body=[label("elsewhere")])
        proxy.upstream_url = other.url
        status, _, body = call(f"{proxy.url}/repos/o/r/labels")
        assert (status, json.loads(body)) == (200, [label("elsewhere")])
        assert upstream.received == []
        assert other.received[-1].headers["host"] == other.url.removeprefix("http://")
    finally:
        proxy.upstream_url = upstream.url
        other.shutdown()
        other.server_close()
    proxy.assert_clean()


def test_chunked_request_body_reaches_upstream_whole(proxy: PrismProxy, upstream: Upstream) -> None:
    upstream.answer = Answer(201, issue(6, "chunked"))
    host, port = proxy.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        chunks = iter([b'{"title": ', b'"chunked"}'])
        headers = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
        connection.request("POST", "/repos/o/r/issues", chunks, headers, encode_chunked=True)
        assert connection.getresponse().status == 201
    finally:
        connection.close()
    assert json.loads(upstream.received[-1].body) == {"title": "chunked"}
    proxy.assert_clean()
