"""An agent's output while it runs: ``agents.output.OutputLog`` fed by
the process reader, as ``agent_output`` event rows, redacted and bounded; seen live by
the store, the workflow page, its SSE stream and ``phasegate events --follow``.

No test waits for a time to pass: a real agent waits for a gate file the test
writes only once it has seen the agent's line, so the line came before the end.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_web import ENV_SENTINEL, TOKEN, web_repo  # noqa: F401
from test_web_live import read_until_changed, served, session  # noqa: F401

from phasegate.agents.base import AgentRequest
from phasegate.agents.output import AGENT_OUTPUT, OutputLog
from phasegate.agents.runners.command import CommandRunner
from phasegate.config.cartridge import RoleBinding
from phasegate.core.contract import EventWrite
from phasegate.runtime.engine import Engine
from phasegate.store import Fence, Store, StoreUnavailable
from phasegate.web import Access
from phasegate.web.serve import Dashboard

SECRET = "sk-outputsentinel-93be1f0a77"
#: How long a test looks for what must come at the latest: a guard against a hang, not a
#: measurement (the agents below wait for the test, never the other way round).
PATIENCE_S = 60.0


def collected(**limits: Any) -> tuple[OutputLog, list[EventWrite]]:
    """An OutputLog writing to a list; its thread never wakes (the rows come on close)
    unless ``interval_s`` is given."""
    rows: list[EventWrite] = []
    limits.setdefault("interval_s", 3600.0)
    return OutputLog(rows.append, [SECRET], role="build", phase="development", **limits), rows


def texts(rows: list[EventWrite]) -> str:
    return "".join(r.data["text"] for r in rows)


def test_lines_are_whole_decoded_and_shown_as_a_terminal_would_show_them() -> None:
    log, rows = collected()
    with log:
        log.feed("stdout", b"first li")
        log.feed("stdout", b"ne\nna\xc3")  # "ä" cut between two reads
        log.feed("stdout", b"\xa4ve\r\n")
        log.feed("stderr", b"10%\r50%\r100%\n\x1b[31mred\x1b[0m\n")
        log.feed("stdout", b"no newline at the end")
    assert [r.type for r in rows] == [AGENT_OUTPUT]
    assert rows[0].data == {
        "role": "build",
        "phase": "development",
        "round": 0,
        "text": "first line\nnaäve\n100%\nred\nno newline at the end\n",
    }


def test_a_secret_raw_encoded_cut_between_reads_or_in_an_overlong_line_never_shows() -> None:
    encoded = base64.b64encode(SECRET.encode()).decode()
    log, rows = collected(line_chars=200)
    with log:
        log.feed("stdout", b"key=" + SECRET[:10].encode())
        log.feed("stdout", SECRET[10:].encode() + b" and " + encoded.encode() + b"\n")
        log.feed("stdout", b"x " * 75 + SECRET.encode() + b" y" * 75 + b"\nafter\n")
        log.feed("stdout", b"x " * 75 + SECRET[:10].encode())  # over 200 before its end
        log.feed("stdout", SECRET[10:].encode() + b" y" * 75 + b"\nlast\n")
    text = texts(rows)
    assert SECRET not in text and encoded not in text and SECRET[:10] not in text
    assert text == (
        "key=*** and ***w==\n"  # base64's last characters mix in what follows: not the key's
        "[phasegate: a line over 200 characters not shown]\nafter\n"
        "[phasegate: a line over 200 characters not shown]\nlast\n"
    )


def test_a_run_that_prints_nothing_writes_no_row() -> None:
    log, rows = collected(interval_s=0.0)  # its thread looks as often as it can
    with log:
        log.feed("stdout", b"")
    assert rows == []


def test_a_flood_keeps_few_rows_each_bounded_and_ends_with_its_last_lines() -> None:
    rows: list[EventWrite] = []
    wrote = threading.Event()

    def emit(row: EventWrite) -> None:
        rows.append(row)
        wrote.set()

    log = OutputLog(
        emit,
        [SECRET],
        role="build",
        phase="development",
        interval_s=0.0,
        row_chars=1000,
        run_chars=5000,
        run_rows=50,
    )
    with log:
        for chunk in range(200):
            # Each chunk waits for a row, so a loaded machine whose thread wakes late
            # still sees the cap reached while the flood goes on.
            wrote.clear()
            for i in range(chunk * 100, chunk * 100 + 100):
                log.feed("stdout", f"line {i}\n".encode())
            if "not streamed" not in texts(rows):
                assert wrote.wait(PATIENCE_S)
    assert len(rows) <= 50 + 1  # the cap, and the last lines at the end
    assert all(len(r.data["text"]) <= 1000 + 200 for r in rows)  # its notes aside
    assert sum(len(r.data["text"]) for r in rows) <= 5000 + 2 * (1000 + 200)
    assert "the output is not streamed" in texts(rows[:-1])
    last = rows[-1].data["text"]
    assert last.startswith("[phasegate: ") and "past the cap" in last
    assert last.endswith("line 19999\n")


def test_a_store_that_is_down_loses_the_row_not_the_run() -> None:
    def down(_event: EventWrite) -> None:
        raise StoreUnavailable("state.db", "locked")

    log = OutputLog(down, [], role="plan", phase="planning", interval_s=3600.0)
    with log:
        log.feed("stdout", b"a line\n")
    log.feed("stdout", b"after the end\n")  # ignored: the run is over
    log.close()  # again: nothing more


def test_a_real_process_floods_and_the_rows_stay_bounded_while_the_answer_is_whole(
    tmp_path: Path,
) -> None:
    log, rows = collected(interval_s=0.0, row_chars=4096, run_chars=32 * 1024, run_rows=40)
    flood = "python3 -c \"import sys\nfor i in range(200000): sys.stdout.write(f'row {i}\\n')\""
    runner = CommandRunner(RoleBinding(runner="command", command=flood))
    with log:
        result = runner.run(request(tmp_path, log.feed), threading.Event())
    assert result.ok and result.text.count("\n") == 200_000
    assert len(rows) <= 41
    assert sum(len(r.data["text"]) for r in rows) <= 32 * 1024 + 3 * (4096 + 300)
    assert rows[-1].data["text"].endswith("row 199999\n")


def request(cwd: Path, on_output: Callable[[str, bytes], None]) -> AgentRequest:
    return AgentRequest(
        workflow_id="wf",
        phase="development",
        role="build",
        session_line="main",
        prompt="go",
        cwd=cwd,
        timeout_s=120,
        read_only=False,
        on_output=on_output,
    )


def sse_events(lines: Iterator[str]) -> Iterator[dict[str, str]]:
    """Each server-sent event of ``lines`` as it comes: ``{"event", "data", ...}``."""
    current: dict[str, str] = {}
    for line in lines:
        if not line:
            if "event" in current:
                yield current
            current = {}
            continue
        name, _, value = line.partition(":")
        current[name] = value[1:] if value.startswith(" ") else value


def end_of(gate: Path) -> Path:
    """The file the gated build agent waits for after its last line."""
    return gate.with_name(gate.name + ".end")


def _output_of(store: Store, workflow_id: str) -> str:
    return "".join(r["data"]["text"] for r in store.events(workflow_id, types=(AGENT_OUTPUT,)))


def _wait_for(what: Callable[[], bool], alive: threading.Thread, why: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not what():
        assert alive.is_alive(), f"the workflow stopped before {why}"
        assert time.monotonic() < deadline, f"no {why} in {PATIENCE_S:g}s"
        time.sleep(0.05)


@pytest.fixture
def gated_build(
    tmp_path: Path,
    web_repo: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Path, Path]:
    """web_repo with a build agent (a real process) that prints two lines and a
    secret, waits for the gate file, prints its last line, waits for the gate's
    ``.end`` file and answers."""
    monkeypatch.setenv("OUTPUT_TEST_TOKEN", SECRET)
    gate = tmp_path / "gate"
    script = tmp_path / "build.sh"
    script.write_text(
        "echo 'first line'\n"
        f"echo 'the key is {SECRET}'\n"
        f"while [ ! -e {gate} ]; do sleep 0.05; done\n"
        "echo 'the feature' > feature.txt\n"
        "echo 'last line'\n"
        f"while [ ! -e {gate}.end ]; do sleep 0.05; done\n"
    )
    build = f'runner = "command"\ncommand = "sh {script}"\ntimeout = 300\n'
    cartridge = web_repo / "phasegate.toml"
    cartridge.write_text(
        cartridge.read_text().replace(
            '[roles.build]\nrunner = "scripted"\nscript = "answers.toml"\ntimeout = 30\n',
            f"[roles.build]\n{build}",
        )
    )
    return web_repo, gate


@pytest.fixture
def advancing(
    gated_build: tuple[Path, Path],
    engine_for: Callable[..., tuple[Engine, Store]],
) -> Iterator[tuple[str, Engine, Store, threading.Thread, Path]]:
    """The gated workflow advancing in a thread; the gate opened and the thread
    joined at the end whatever the test did."""
    repo, gate = gated_build
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    thread = threading.Thread(target=engine.advance, args=(workflow_id,), daemon=True)
    thread.start()
    try:
        yield workflow_id, engine, store, thread, gate
    finally:
        gate.touch()
        end_of(gate).touch()
        thread.join(timeout=120)
    assert not thread.is_alive()


def test_a_running_agents_lines_reach_the_store_before_it_ends_and_its_secret_never_does(
    advancing: tuple[str, Engine, Store, threading.Thread, Path],
) -> None:
    workflow_id, _engine, store, thread, gate = advancing
    _wait_for(lambda: "first line" in _output_of(store, workflow_id), thread, "first line")
    # The agent is still waiting for the gate the test has not opened.
    assert not gate.exists()
    running = [e["type"] for e in store.events(workflow_id) if e["type"].startswith("agent_")]
    assert running[-1] in ("agent_started", AGENT_OUTPUT)
    assert "last line" not in _output_of(store, workflow_id)
    gate.touch()
    end_of(gate).touch()
    thread.join(timeout=120)
    output = _output_of(store, workflow_id)
    assert output.index("first line") < output.index("the key is ***") < output.index("last line")
    # The rows of one run: started, its output, then finished.
    kinds = [e["type"] for e in store.events(workflow_id) if e["data"].get("role") == "build"]
    assert kinds[0] == "agent_started" and kinds[-1] == "agent_finished"
    assert set(kinds[1:-1]) == {AGENT_OUTPUT}
    assert SECRET not in json.dumps(store.events(workflow_id), default=str)


def test_the_page_shows_the_running_output_and_its_stream_appends_the_rest(
    advancing: tuple[str, Engine, Store, threading.Thread, Path],
) -> None:
    workflow_id, engine, store, thread, gate = advancing
    _wait_for(lambda: "first line" in _output_of(store, workflow_id), thread, "first line")
    dashboard = Dashboard(engine, Access(token=TOKEN, user="alice"), port=0, worker=False)
    url = dashboard.start()
    try:
        with session(url) as client:
            page = client.get(f"/workflows/{workflow_id}").text
            assert '<pre id="agent-output"' in page and 'id="agent-running"' in page
            assert "first line" in page and "the key is ***" in page and SECRET not in page
            after = int(page.split("events?after=")[1].split('"')[0])
            with client.stream("GET", f"/workflows/{workflow_id}/events?after={after}") as sse:
                gate.touch()  # only now may the agent print its last line
                seen: list[dict[str, str]] = []
                # No `changed` follows output rows: read them one by one.
                for event in sse_events(sse.iter_lines()):
                    seen.append(event)
                    if event["event"] == AGENT_OUTPUT and "last line" in event["data"]:
                        break
            output = [json.loads(e["data"]) for e in seen if e["event"] == AGENT_OUTPUT]
            assert all(row["id"] > after for row in output)
            assert "last line" in "".join(row["data"]["text"] for row in output)
            assert "first line" not in "".join(row["data"]["text"] for row in output)
    finally:
        dashboard.stop()


def test_events_follow_prints_the_running_agents_lines_indented_without_its_secret(
    advancing: tuple[str, Engine, Store, threading.Thread, Path],
    gated_build: tuple[Path, Path],
) -> None:
    workflow_id, _engine, store, thread, gate = advancing
    repo, _gate = gated_build
    _wait_for(lambda: "first line" in _output_of(store, workflow_id), thread, "first line")
    process = subprocess.Popen(
        [sys.executable, "-m", "phasegate.cli", "events", workflow_id, "--follow"],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    watchdog = threading.Timer(PATIENCE_S, process.kill)  # a guard against a hang only
    watchdog.start()
    try:
        assert process.stdout is not None
        printed = []
        while not any("│ first line" in line for line in printed):
            line = process.stdout.readline()
            assert line, f"events ended before the agent's line: {printed}"
            printed.append(line)
        gate.touch()
        while not any("│ last line" in line for line in printed):
            line = process.stdout.readline()
            assert line, f"events ended before the agent's last line: {printed}"
            printed.append(line)
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    finally:
        watchdog.cancel()
        if process.poll() is None:
            process.kill()
            process.communicate()
    heads = [line for line in printed if " agent_output " in line]
    assert heads and all(line.rstrip().endswith("agent_output build") for line in heads)
    assert any("│ the key is ***" in line for line in printed)
    assert not any(SECRET in line for line in printed)


def test_an_output_row_alone_sends_no_changed_so_the_page_is_not_read_again(
    served: tuple[str, Engine, Store],  # noqa: F811
) -> None:
    url, engine, store = served
    workflow_id = engine.start("Filed", "Write feature.txt")
    after = store.last_event_id(workflow_id)
    with (
        session(url) as client,
        client.stream("GET", f"/workflows/{workflow_id}/events?after={after}") as sse,
    ):
        lines = sse.iter_lines()
        store.add_event(workflow_id, EventWrite(AGENT_OUTPUT, {"role": "plan", "text": "x\n"}))
        assert next(sse_events(lines))["event"] == AGENT_OUTPUT
        # A changed sent for the output row would come before this one's.
        store.add_event(workflow_id, EventWrite("milestone_updated", {"note": "next"}))
        after_output = read_until_changed(lines)
    assert [e["event"] for e in after_output] == ["milestone_updated"]


def test_a_scripted_agents_output_is_streamed_like_a_process_s(
    web_repo: Path,  # noqa: F811
    engine_for: Callable[..., tuple[Engine, Store]],
) -> None:
    answers = web_repo / "answers.toml"
    answers.write_text(
        answers.read_text().replace(
            '[[plan]]\ntext = "1. Write feature.txt"\n',
            '[[plan]]\ntext = "1. Write feature.txt"\n'
            f'output = "reading the ticket\\nchecking {ENV_SENTINEL}\\n"\n',
        )
    )
    engine, store = engine_for(web_repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    engine.advance(workflow_id)
    rows = store.events(workflow_id, types=(AGENT_OUTPUT,))
    assert [(r["data"]["role"], r["data"]["text"]) for r in rows] == [
        ("plan", "reading the ticket\nchecking ***\n")
    ]


def test_a_worker_whose_lease_was_taken_over_writes_no_more_output(
    web_repo: Path,  # noqa: F811
    engine_for: Callable[..., tuple[Engine, Store]],
) -> None:
    engine, store = engine_for(web_repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    held = store.claim(workflow_id, "worker-a", 60.0)
    assert held is not None
    engine.fences[workflow_id] = Fence(store, workflow_id, "worker-a", held)

    def run_printing(line: bytes) -> None:
        log = OutputLog(
            lambda event: engine.agents._emit_live(workflow_id, event),
            [],
            role="build",
            phase="development",
            interval_s=3600.0,
        )
        with log:
            log.feed("stdout", line)

    run_printing(b"while it holds the lease\n")
    assert store.claim(workflow_id, "worker-b", 60.0) is None  # held, unexpired
    store.release(workflow_id, "worker-a")
    assert store.claim(workflow_id, "worker-b", 60.0) is not None  # the fence moves on
    run_printing(b"after the takeover\n")
    assert _output_of(store, workflow_id) == "while it holds the lease\n"
    assert engine.fences[workflow_id].lost.is_set()
