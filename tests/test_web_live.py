"""Live events through a real uvicorn server on a free port:
the SSE stream of a workflow's event rows, resumed with Last-Event-ID, pushed
when another connection commits; ``phasegate events --json`` prints the same
rows; ``phasegate serve`` starts, asks for its token, and stops on SIGINT.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_web import ENV_SENTINEL, TOKEN, waiting_workflow, web_repo  # noqa: F401

from phasegate.config.cartridge import load_cartridge
from phasegate.core.contract import EventWrite
from phasegate.proc.host import host_name
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store
from phasegate.web import Access
from phasegate.web.serve import Dashboard

from conftest import alive, phasegate_cli


@pytest.fixture
def served(
    web_repo: Path,  # noqa: F811
    engine_for: Callable[..., tuple[Engine, Store]],
) -> Iterator[tuple[str, Engine, Store]]:
    """A dashboard on a free port (no worker: the test advances), and its engine."""
    engine, store = engine_for(web_repo)
    dashboard = Dashboard(engine, Access(token=TOKEN, user="alice"), port=0, worker=False)
    url = dashboard.start()
    yield url, engine, store
    dashboard.stop()


@contextmanager
def session(url: str) -> Iterator[httpx.Client]:
    """An HTTP client logged in to the dashboard at ``url``."""
    with httpx.Client(base_url=url, timeout=30.0) as client:
        assert client.get(f"/login?token={TOKEN}", follow_redirects=True).status_code == 200
        yield client


def read_until_changed(lines: Iterator[str]) -> list[dict[str, Any]]:
    """The SSE events up to and without the next ``changed``: ``{"id", "event", "data"}``."""
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    for line in lines:
        if not line:
            if current.get("event") == "changed":
                return events
            if "event" in current:
                events.append(current)
            current = {}
            continue
        name, _, value = line.partition(":")
        current[name] = value[1:] if value.startswith(" ") else value
    raise AssertionError(f"the stream ended before a changed event: {events}")


def test_a_stream_resumed_with_last_event_id_gives_only_the_later_rows_then_new_ones(
    served: tuple[str, Engine, Store],
) -> None:
    url, engine, store = served
    workflow_id = waiting_workflow(engine)
    rows = store.events(workflow_id)
    assert len(rows) > 3
    resume_after = rows[2]["id"]
    with (
        session(url) as client,
        client.stream(
            "GET", f"/workflows/{workflow_id}/events", headers={"Last-Event-ID": str(resume_after)}
        ) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = response.iter_lines()
        first = read_until_changed(lines)
        assert [int(e["id"]) for e in first] == [r["id"] for r in rows[3:]]
        assert [e["event"] for e in first] == [r["type"] for r in rows[3:]]
        assert json.loads(first[0]["data"])["id"] == rows[3]["id"]

        # A row another connection commits is pushed, once, and nothing before it again.
        other = open_store(load_cartridge(engine.repo).store_url(engine.repo))
        try:
            other.add_event(workflow_id, EventWrite("milestone_updated", {"note": "later"}))
        finally:
            other.close()
        pushed = read_until_changed(lines)
        newest = store.events(workflow_id)[-1]
        assert [int(e["id"]) for e in pushed] == [newest["id"]]
        assert json.loads(pushed[0]["data"])["data"] == {"note": "later"}


def test_two_sessions_see_the_same_events_and_no_secret(
    served: tuple[str, Engine, Store],
) -> None:
    url, engine, store = served
    workflow_id = waiting_workflow(engine)
    store.add_event(workflow_id, EventWrite("milestone_updated", {"note": ENV_SENTINEL}))
    seen = []
    for _ in range(2):
        with (
            session(url) as client,
            client.stream("GET", f"/workflows/{workflow_id}/events") as response,
        ):
            events = read_until_changed(response.iter_lines())
            seen.append([(e["id"], e["event"], e["data"]) for e in events])
            body = "\n".join(e["data"] for e in events)
            assert ENV_SENTINEL not in body and "***" in body
    assert seen[0] == seen[1]
    assert [int(i) for i, _, _ in seen[0]] == [r["id"] for r in store.events(workflow_id)]


def test_a_stream_without_a_session_is_refused(served: tuple[str, Engine, Store]) -> None:
    url, engine, _store = served
    workflow_id = engine.start("Filed", "Write feature.txt")
    response = httpx.get(f"{url}/workflows/{workflow_id}/events", timeout=30.0)
    assert response.status_code == 401


def test_events_json_prints_the_workflows_rows_one_a_line(
    web_repo: Path,  # noqa: F811
    engine_for: Callable[..., tuple[Engine, Store]],
) -> None:
    engine, store = engine_for(web_repo)
    workflow_id = engine.start("Filed", "Write feature.txt")
    engine.advance(workflow_id)
    rows = store.events(workflow_id)

    done = phasegate_cli("events", workflow_id, "--json", "--repo", str(web_repo))
    assert done.returncode == 0, done.stderr
    printed = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(p["id"], p["type"]) for p in printed] == [(r["id"], r["type"]) for r in rows]
    assert all(p["workflow_id"] == workflow_id for p in printed)

    later = phasegate_cli(
        "events", workflow_id, "--json", "--after", str(rows[-2]["id"]), "--repo", str(web_repo)
    )
    assert [json.loads(line)["id"] for line in later.stdout.splitlines()] == [rows[-1]["id"]]

    unknown = phasegate_cli("events", "nosuch", "--repo", str(web_repo))
    assert unknown.returncode == 2


def test_serve_prints_a_login_url_refuses_without_it_and_stops_on_sigint(
    web_repo: Path,  # noqa: F811
) -> None:
    repo = web_repo
    env = {k: v for k, v in os.environ.items() if k != "PHASEGATE_WEB_TOKEN"}
    process = subprocess.Popen(
        [sys.executable, "-m", "phasegate.cli", "serve", "--repo", str(repo), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stderr is not None
        login = None
        for line in process.stderr:
            found = re.search(r"log in at (http://127\.0\.0\.1:\d+)/login\?token=(\S+)", line)
            if found:
                login = found
                break
        assert login, "serve prints where to log in"
        base, token = login.group(1), login.group(2)
        assert httpx.get(f"{base}/", timeout=30.0).status_code == 401
        with httpx.Client(base_url=base, timeout=30.0) as client:
            board = client.get(f"/login?token={token}", follow_redirects=True)
            assert board.status_code == 200 and 'id="board-groups"' in board.text
            assert token not in board.text
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 130
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def test_serves_worker_moves_a_filed_workflow_to_needs_you_and_the_board_is_told(
    web_repo: Path,  # noqa: F811
    engine_for: Callable[..., tuple[Engine, Store]],
) -> None:
    engine, _store = engine_for(web_repo)
    dashboard = Dashboard(engine, Access(token=TOKEN, user="alice"), port=0, poll_s=0.2)
    url = dashboard.start()
    try:
        with session(url) as client, client.stream("GET", "/board/events") as response:
            lines = response.iter_lines()
            filer, _ = engine_for(web_repo)  # a person filing it from elsewhere (the CLI)
            workflow_id = filer.start("Add the feature", "Write feature.txt")
            for _ in range(100):  # each changed is one commit the board would show
                read_until_changed(lines)
                board = client.get("/board").text
                if (
                    f'id="card-{workflow_id}"'
                    in board.split('id="group-needs_you"')[1].split("<section")[0]
                ):
                    break
            else:
                raise AssertionError("the board was never told the workflow waits for you")
    finally:
        dashboard.stop()
    assert dashboard.errors == []
    row = engine.store.workflow_row(workflow_id)
    assert (row["current_phase"], row["status"]) == ("wait", "waiting")


def test_stopping_serve_stops_the_running_agent_and_leaves_the_workflow_resumable(
    tmp_path: Path,
    web_repo: Path,  # noqa: F811
    engine_for: Callable[..., tuple[Engine, Store]],
) -> None:
    marker = tmp_path / "build-started"
    build = f'runner = "command"\ncommand = "echo $$ > {marker}; exec sleep 120"\ntimeout = 300\n'
    cartridge = web_repo / "phasegate.toml"
    cartridge.write_text(
        cartridge.read_text().replace(
            '[roles.build]\nrunner = "scripted"\nscript = "answers.toml"\ntimeout = 30\n',
            f"[roles.build]\n{build}",
        )
    )
    engine, store = engine_for(web_repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    dashboard = Dashboard(engine, Access(token=TOKEN, user="alice"), port=0, poll_s=0.2)
    url = dashboard.start()
    try:
        # The build agent runs under the worker's lease, once its pid is written whole.
        while not marker.exists() or not marker.read_text().endswith("\n"):
            assert not engine.shutdown.wait(0.05), dashboard.errors
        # A decision while the worker advances it is refused as the CLI refuses it.
        with session(url) as client:
            csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/").text)
            assert csrf
            refused = client.post(
                f"/workflows/{workflow_id}/resume", headers={"X-CSRF-Token": csrf.group(1)}
            )
        assert refused.status_code == 409
        # named as status names the worker: this process's own, serve's
        assert refused.json()["detail"] == (
            f"workflow {workflow_id} is being advanced by another process "
            f"({host_name()}:{os.getpid()}); wait until it stops (or stop it), then try again"
        )
    finally:
        dashboard.stop()  # what Ctrl-C does: the engine's shutdown
    assert dashboard.errors == []
    assert not alive(int(marker.read_text()))
    # As `phasegate worker` leaves it: in its phase, runnable, nobody holding it.
    row = store.workflow_row(workflow_id)
    assert (row["current_phase"], row["status"]) == ("development", "developing")
    assert not row.get("lease_owner")


def test_events_follow_prints_each_new_row_once_until_sigint(
    web_repo: Path,  # noqa: F811
    engine_for: Callable[..., tuple[Engine, Store]],
) -> None:
    engine, store = engine_for(web_repo)
    workflow_id = engine.start("Filed", "Write feature.txt")
    engine.advance(workflow_id)
    rows = store.events(workflow_id)
    process = subprocess.Popen(
        [sys.executable, "-m", "phasegate.cli", "events", workflow_id, "--follow", "--json"],
        cwd=web_repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        printed = [json.loads(process.stdout.readline())["id"] for _ in rows]
        assert printed == [r["id"] for r in rows]
        store.add_event(workflow_id, EventWrite("milestone_updated", {"note": ENV_SENTINEL}))
        line = json.loads(process.stdout.readline())
        assert line["id"] == store.events(workflow_id)[-1]["id"]
        assert line["data"] == {"note": "***"}
        process.send_signal(signal.SIGINT)
        rest, _errors = process.communicate(timeout=60)
        assert process.returncode == 130
        assert rest == ""  # nothing printed twice on the way out
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_serve_on_a_port_taken_says_so_and_runs_no_worker(
    web_repo: Path,  # noqa: F811
    engine_for: Callable[..., tuple[Engine, Store]],
) -> None:
    engine, store = engine_for(web_repo)
    workflow_id = engine.start("Filed", "Write feature.txt")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = phasegate_cli("serve", "--port", str(port), "--repo", str(web_repo))
    assert done.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert store.workflow_row(workflow_id)["status"] == "preparing"  # no worker ran


def test_the_board_stream_tells_at_once_and_again_when_a_card_changes(
    served: tuple[str, Engine, Store],
) -> None:
    url, engine, store = served
    with session(url) as client, client.stream("GET", "/board/events") as response:
        lines = response.iter_lines()
        # At once: a board that reconnects re-reads what changed while it was away.
        assert [e["event"] for e in read_until_changed(lines)] == ["board"]
        workflow_id = engine.start("Filed", "Write feature.txt")
        assert [e["event"] for e in read_until_changed(lines)] == ["board"]
        assert f'id="card-{workflow_id}"' in client.get("/board").text


def test_a_worker_taking_or_letting_go_of_a_workflow_has_its_page_read_again(
    served: tuple[str, Engine, Store],
) -> None:
    url, engine, store = served
    workflow_id = waiting_workflow(engine)
    with (
        session(url) as client,
        client.stream("GET", f"/workflows/{workflow_id}/events") as response,
    ):
        lines = response.iter_lines()
        read_until_changed(lines)  # the rows so far
        other = open_store(load_cartridge(engine.repo).store_url(engine.repo))
        try:
            assert workflow_id in other.claim_free([workflow_id], "elsewhere:1:a", 60)
            # No row is written, yet the buttons change: the page re-reads its fragment.
            assert [e["event"] for e in read_until_changed(lines)] == ["lease"]
            other.release(workflow_id, "elsewhere:1:a")
            assert [e["event"] for e in read_until_changed(lines)] == ["lease"]
        finally:
            other.close()
