"""Needs-you notifications: a real HTTP receiver on a free port,
real workflows (scripted agents), a real notify-send on PATH."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from phasegate.config.cartridge import load_cartridge
from phasegate.core import decisions
from phasegate.core.contract import PhaseResult
from phasegate.integrations import notify
from phasegate.integrations.notify import Notifier, attach
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store

from conftest import HAPPY_ANSWERS, git, make_repo, phasegate_cli, scripted_cartridge

#: A second development round writes something new (the scripted runner's last answer
#: repeats), so feedback's round has a change to build.
TWO_ROUNDS = (
    HAPPY_ANSWERS
    + """
[[build]]
text = "wrote feature.txt again"
[build.files]
"feature.txt" = "the feature, as the person asked\\n"
"""
)

SENTINEL = "sentinel-9f3a7c21-do-not-leak"


class Receiver:
    """A webhook receiver: a real HTTP server on a free port of 127.0.0.1 that keeps
    every POST (path, JSON body) and answers with ``codes`` in turn (then 200)."""

    def __init__(self, codes: list[int] | None = None, sleeps: list[float] | None = None) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.codes = list(codes or [])
        self.sleeps = list(sleeps or [])  # seconds before answering, request by request
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.posts.append((self.path, json.loads(body)))
                if receiver.sleeps:
                    time.sleep(receiver.sleeps.pop(0))
                code = receiver.codes.pop(0) if receiver.codes else 200
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return  # the test's output is the assertions'

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def start(codes: list[int] | None = None, sleeps: list[float] | None = None) -> Receiver:
        started.append(Receiver(codes, sleeps))
        return started[-1]

    yield start
    for one in started:
        one.close()


def _repo(tmp_path: Path, notify_toml: str, answers: str = HAPPY_ANSWERS) -> Path:
    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(answers)
    (repo / "phasegate.toml").write_text(
        scripted_cartridge(auto_merge=False, extra=f"[notify]\n{notify_toml}")
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "cartridge")
    return repo


@pytest.fixture
def stores() -> Iterator[Callable[[Path], tuple[Engine, Store]]]:
    opened: list[Store] = []

    def build(repo: Path) -> tuple[Engine, Store]:
        cartridge = load_cartridge(repo)
        store = open_store(cartridge.store_url(repo))
        opened.append(store)
        return Engine(repo, cartridge, store), store

    yield build
    for store in opened:
        store.close()


def _fast(engine: Engine, **kwargs: Any) -> Notifier:
    """A notifier whose webhook retries come 10 ms apart (the tries, not the waits, are
    what a test proves)."""
    return attach(
        engine, Notifier(engine.store, engine.cartridge, retry_delays_s=(0.01,) * 5, **kwargs)
    )


def _types(store: Store, workflow_id: str, type_: str) -> list[dict[str, Any]]:
    return [e["data"] for e in store.events(workflow_id) if e["type"] == type_]


def test_a_receiver_gets_one_post_per_needs_you_transition_not_one_per_poll_or_decision(
    tmp_path: Path, receiver: Callable[..., Receiver], stores: Any
) -> None:
    hook = receiver()
    repo = _repo(tmp_path, f'webhook = "{hook.url}/hooks/team"\ndesktop = false\n', TWO_ROUNDS)
    engine, store = stores(repo)
    _fast(engine)
    wf = engine.start("add the feature", "ticket")

    row = engine.advance(wf)
    assert (row["current_phase"], row["status"]) == ("wait", "waiting"), row["error"]
    first_round = row["dev_round"]
    assert len(hook.posts) == 1
    path, body = hook.posts[0]
    assert path == "/hooks/team"
    assert f"Workflow {wf} (add the feature) waits for you" in body["text"]
    assert f"phasegate approve-merge {wf}" in body["text"]

    # The worker's looks at a waiting workflow find nothing new: no commit, no POST.
    for _ in range(3):
        assert engine.advance(wf)["status"] == "waiting"
    # Feedback keeps it waiting (no transition), then the next round waits again: one more.
    engine.decide(wf, lambda ctx: decisions.feedback(ctx, "say it as the person asked"))
    assert len(hook.posts) == 1
    row = engine.advance(wf)
    assert (row["current_phase"], row["status"], row["dev_round"]) == (
        "wait",
        "waiting",
        first_round + 1,
    )
    assert len(hook.posts) == 2
    # An approval keeps it waiting, the merge and verification complete it: none more.
    engine.decide(wf, lambda ctx: decisions.approve_merge(ctx, "ana"))
    row = engine.advance(wf)
    assert row["status"] == "completed", row["error"]
    assert len(hook.posts) == 2
    entered = _types(store, wf, "needs_you")
    assert [(e["status"], e["from"]) for e in entered] == [
        ("waiting", "reporting"),
        ("waiting", "reporting"),
    ]
    assert [n["channels"] for n in _types(store, wf, notify.NOTIFIED_EVENT)] == [["webhook"]] * 2


def test_a_receiver_answering_500_is_retried_within_bounds_and_the_workflow_goes_on(
    tmp_path: Path, receiver: Callable[..., Receiver], stores: Any
) -> None:
    hook = receiver([500] * 10)
    secret_path = "/services/T000/B000/abcdefghijklmnop"
    repo = _repo(tmp_path, f'webhook = "{hook.url}{secret_path}"\nretries = 2\ndesktop = false\n')
    engine, store = stores(repo)
    _fast(engine)
    wf = engine.start("t", "ticket")

    row = engine.advance(wf)

    assert (row["current_phase"], row["status"]) == ("wait", "waiting"), row["error"]
    assert len(hook.posts) == 3  # the first try and two retries, then given up
    (failed,) = _types(store, wf, notify.NOTIFY_FAILED_EVENT)
    assert (failed["channel"], failed["error"]) == ("webhook", "HTTP 500")
    assert secret_path not in json.dumps([e["data"] for e in store.events(wf)])
    # The workflow is none the worse: the person approves, it completes, nothing re-sent.
    engine.decide(wf, lambda ctx: decisions.approve_merge(ctx, "ana"))
    assert engine.advance(wf)["status"] == "completed"
    assert len(hook.posts) == 3


def test_a_receiver_that_recovers_within_the_retries_gets_the_notification_once(
    tmp_path: Path, receiver: Callable[..., Receiver], stores: Any
) -> None:
    hook = receiver([503, 429])
    repo = _repo(tmp_path, f'webhook = "{hook.url}/h"\nretries = 3\ndesktop = false\n')
    engine, store = stores(repo)
    _fast(engine)
    wf = engine.start("t", "ticket")

    assert engine.advance(wf)["status"] == "waiting"

    assert len(hook.posts) == 3  # 503 and 429 are tried again; the 200 ends it
    assert hook.posts[0] == hook.posts[2]
    assert _types(store, wf, notify.NOTIFY_FAILED_EVENT) == []


def test_a_receiver_that_does_not_answer_in_time_is_given_up_on_and_tried_again(
    tmp_path: Path, receiver: Callable[..., Receiver], stores: Any
) -> None:
    hook = receiver(sleeps=[1.5])  # the first answer comes long after timeout_s
    repo = _repo(tmp_path, f'webhook = "{hook.url}/h"\ntimeout_s = 0.2\ndesktop = false\n')
    engine, store = stores(repo)
    _fast(engine)
    wf = engine.start("t", "ticket")

    assert engine.advance(wf)["status"] == "waiting"

    assert len(hook.posts) == 2
    assert _types(store, wf, notify.NOTIFY_FAILED_EVENT) == []


def test_a_refused_webhook_4xx_is_not_retried(
    tmp_path: Path, receiver: Callable[..., Receiver], stores: Any
) -> None:
    hook = receiver([404])
    repo = _repo(tmp_path, f'webhook = "{hook.url}/gone"\nretries = 3\ndesktop = false\n')
    engine, store = stores(repo)
    _fast(engine)
    wf = engine.start("t", "ticket")

    assert engine.advance(wf)["status"] == "waiting"

    assert len(hook.posts) == 1
    assert [f["error"] for f in _types(store, wf, notify.NOTIFY_FAILED_EVENT)] == ["HTTP 404"]


def test_a_restarted_worker_sends_nothing_twice(
    tmp_path: Path, receiver: Callable[..., Receiver], stores: Any
) -> None:
    hook = receiver()
    repo = _repo(tmp_path, f'webhook = "{hook.url}/h"\ndesktop = false\n')
    engine, store = stores(repo)
    _fast(engine)
    wf = engine.start("t", "ticket")
    engine.run_worker(once=True)
    assert store.workflow_row(wf)["status"] == "waiting"
    assert len(hook.posts) == 1

    restarted, _ = stores(repo)  # a new process's engine, store and notifier
    notifier = _fast(restarted)
    assert notifier.catch_up() == []
    restarted.run_worker(once=True)
    restarted.run_worker(once=True)

    assert len(hook.posts) == 1
    assert store.workflow_row(wf)["status"] == "waiting"


def test_a_notification_a_kill_after_the_commit_left_pending_is_sent_at_the_next_start_once(
    tmp_path: Path, receiver: Callable[..., Receiver], stores: Any
) -> None:
    hook = receiver()
    repo = _repo(tmp_path, f'webhook = "{hook.url}/h"\ndesktop = false\n')
    engine, _ = stores(repo)  # no notifier: as if killed between the commit and the send
    wf = engine.start("t", "ticket")
    assert engine.advance(wf)["status"] == "waiting"
    assert hook.posts == []

    restarted, store = stores(repo)
    assert _fast(restarted).catch_up(repo_path=str(tmp_path / "another-clone")) == []
    (sent,) = notify.catch_up(restarted)
    assert (sent.workflow_id, sent.status) == (wf, "waiting")
    assert len(hook.posts) == 1
    assert _fast(restarted).catch_up() == []
    assert len(hook.posts) == 1
    assert store.workflow_row(wf)["lease_owner"] is None  # catch_up's lease let go


def test_a_transition_the_workflow_has_moved_on_from_is_not_sent_late(
    tmp_path: Path, receiver: Callable[..., Receiver], stores: Any
) -> None:
    hook = receiver()
    repo = _repo(tmp_path, f'webhook = "{hook.url}/h"\ndesktop = false\n')
    engine, store = stores(repo)  # no notifier while it waits and is approved
    wf = engine.start("t", "ticket")
    engine.advance(wf)
    engine.decide(wf, lambda ctx: decisions.approve_merge(ctx, "ana"))
    assert engine.advance(wf)["status"] == "completed"

    assert _fast(stores(repo)[0]).catch_up() == []
    assert hook.posts == []


def test_a_pause_is_one_needs_you_event_and_a_pause_of_a_paused_workflow_none(
    tmp_path: Path, receiver: Callable[..., Receiver], stores: Any
) -> None:
    hook = receiver()
    repo = _repo(tmp_path, f'webhook = "{hook.url}/h"\ndesktop = false\n')
    engine, store = stores(repo)
    _fast(engine)
    wf = engine.start("t", "ticket")

    engine.decide(wf, lambda ctx: PhaseResult("pause", reason="the forge refused"))
    engine.decide(wf, lambda ctx: PhaseResult("pause", reason="the forge refused again"))

    assert [(e["status"], e["from"]) for e in _types(store, wf, "needs_you")] == [
        ("paused", "preparing")
    ]
    (post,) = hook.posts
    assert "is paused and waits for you" in post[1]["text"]
    assert "Reason: the forge refused" in post[1]["text"]


def test_no_secret_reaches_a_notification_an_event_or_the_log(
    tmp_path: Path,
    receiver: Callable[..., Receiver],
    stores: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    hook = receiver([500, 500, 500])
    monkeypatch.setenv("PHASEGATE_SENTINEL_API_KEY", SENTINEL)
    # The webhook's URL from the environment, itself a credential (a Slack webhook's path).
    monkeypatch.setenv("TEAM_HOOK", f"{hook.url}/T1/{SENTINEL}-hook")
    repo = _repo(tmp_path, 'webhook_env = "TEAM_HOOK"\nretries = 1\ndesktop = false\n')
    engine, store = stores(repo)
    _fast(engine)
    # Written past Engine.start's own redaction, as an older row or another front end might.
    wf = store.create_workflow(
        title=f"leak {SENTINEL} here",
        ticket="x",
        repo_path=str(repo),
        base_branch="main",
        auto_merge=False,
        content_language="en",
    )

    engine.decide(wf, lambda ctx: PhaseResult("pause", reason=f"the agent printed {SENTINEL}"))

    assert len(hook.posts) == 2
    assert hook.posts[0][0] == f"/T1/{SENTINEL}-hook"  # the receiver is told its own path
    bodies = json.dumps([body for _, body in hook.posts])
    assert SENTINEL not in bodies and "***" in bodies
    assert SENTINEL not in json.dumps([e["data"] for e in store.events(wf)])
    assert SENTINEL not in caplog.text
    assert "webhook http://127.0.0.1" in caplog.text  # the log names the host, no more


def test_an_ntfy_webhook_gets_a_json_publish_to_the_server_root_with_the_topic(
    tmp_path: Path, receiver: Callable[..., Receiver], stores: Any
) -> None:
    hook = receiver()
    repo = _repo(tmp_path, f'webhook = "{hook.url}/phasegate-team"\nformat = "ntfy"\n')
    engine, store = stores(repo)
    _fast(engine, environ={})  # no display: no desktop channel
    wf = engine.start("add the feature", "ticket")

    engine.decide(wf, lambda ctx: PhaseResult("failed", reason="preparation: boom"))

    ((path, body),) = hook.posts
    assert path == "/"
    assert body["topic"] == "phasegate-team"
    assert body["title"] == "phasegate: add the feature: failed"
    assert body["message"].startswith(f"Workflow {wf} (add the feature) failed")


def test_a_slack_webhook_gets_a_title_s_mentions_and_links_as_plain_text(
    tmp_path: Path, receiver: Callable[..., Receiver], stores: Any
) -> None:
    hook = receiver()
    repo = _repo(tmp_path, f'webhook = "{hook.url}/hook"\n')
    engine, store = stores(repo)
    _fast(engine, environ={})
    title = "fix <!channel> & <https://evil.example|the docs>"
    wf = engine.start(title, "ticket")

    engine.decide(wf, lambda ctx: PhaseResult("failed", reason="preparation: <b> & co"))

    ((_path, body),) = hook.posts
    text = body["text"]
    assert "<" not in text and ">" not in text
    assert "fix &lt;!channel&gt; &amp; &lt;https://evil.example|the docs&gt;" in text
    assert "Reason: preparation: &lt;b&gt; &amp; co" in text


def test_a_workflow_that_merges_on_its_own_sends_no_waits_for_you(
    tmp_path: Path, receiver: Callable[..., Receiver], stores: Any
) -> None:
    hook = receiver()
    repo = _repo(tmp_path, f'webhook = "{hook.url}/hooks/team"\n')
    engine, store = stores(repo)
    _fast(engine, environ={})
    wf = engine.start("add the feature", "ticket", auto_merge=True)
    row = engine.advance(wf)
    assert row["status"] == "completed", row["error"]
    # It passed through wait, but nothing there waited for a person.
    assert "wait" in [e["phase"] for e in _types(store, wf, "phase_change")]
    assert hook.posts == [] and _types(store, wf, "needs_you") == []


def test_a_dashboard_url_ends_each_notification_with_the_workflows_page(
    tmp_path: Path, receiver: Callable[..., Receiver], stores: Any
) -> None:
    hook = receiver()
    repo = _repo(
        tmp_path,
        f'webhook = "{hook.url}/hooks/team"\ndashboard_url = "https://phasegate.example.org/"\n',
    )
    engine, _store = stores(repo)
    _fast(engine, environ={})
    wf = engine.start("add the feature", "ticket")
    engine.advance(wf)
    ((_path, body),) = hook.posts
    assert body["text"].endswith(f"\nhttps://phasegate.example.org/workflows/{wf}")


def test_a_desktop_notification_goes_through_notify_send_where_a_display_is_set(
    tmp_path: Path, stores: Any
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shown = tmp_path / "shown.txt"
    fake = bin_dir / "notify-send"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> "{shown}"\n')
    fake.chmod(0o755)
    repo = _repo(tmp_path, "desktop = true\n")
    engine, store = stores(repo)
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    environ = {"PATH": path, "DISPLAY": ":7"}
    attach(
        engine,
        Notifier(
            store,
            engine.cartridge,
            environ=environ,
            which=lambda name: str(fake) if name == "notify-send" else None,
        ),
    )
    wf = engine.start("add the feature", "ticket")

    assert engine.advance(wf)["status"] == "waiting"

    lines = shown.read_text().splitlines()
    assert lines[:2] == ["--app-name=phasegate", "phasegate: add the feature: waiting"]
    assert lines[2].startswith(f"Workflow {wf} (add the feature) waits for you")
    assert [n["channels"] for n in _types(store, wf, notify.NOTIFIED_EVENT)] == [["desktop"]]


def test_no_display_means_no_desktop_channel_and_no_channel_records_nothing(
    tmp_path: Path, stores: Any
) -> None:
    repo = _repo(tmp_path, "desktop = true\n")
    engine, store = stores(repo)
    notifier = attach(
        engine, Notifier(store, engine.cartridge, environ={}, which=lambda name: "/bin/true")
    )
    wf = engine.start("t", "ticket")

    engine.decide(wf, lambda ctx: PhaseResult("pause", reason="stop"))

    assert [e["status"] for e in _types(store, wf, "needs_you")] == ["paused"]
    assert _types(store, wf, notify.NOTIFIED_EVENT) == []
    assert notifier.pending(wf) is not None  # a channel configured later catches it up


def test_phasegate_worker_notifies_once_and_a_second_worker_run_sends_nothing_again(
    tmp_path: Path, receiver: Callable[..., Receiver], stores: Any
) -> None:
    hook = receiver()
    repo = _repo(tmp_path, f'webhook = "{hook.url}/h"\ndesktop = false\n')
    engine, store = stores(repo)
    wf = engine.start("t", "ticket")

    first = phasegate_cli("worker", "--once", cwd=repo)
    assert first.returncode == 0, first.stderr
    assert store.workflow_row(wf)["status"] == "waiting"
    assert len(hook.posts) == 1
    again = phasegate_cli("worker", "--once", cwd=repo)

    assert again.returncode == 0, again.stderr
    assert len(hook.posts) == 1


def test_phasegate_run_in_the_foreground_notifies_beside_its_progress(
    tmp_path: Path, receiver: Callable[..., Receiver], stores: Any
) -> None:
    hook = receiver()
    repo = _repo(tmp_path, f'webhook = "{hook.url}/h"\ndesktop = false\n')

    done = phasegate_cli("run", "add the feature", cwd=repo)

    assert done.returncode == 0, done.stderr
    _, store = stores(repo)
    (row,) = store.list_workflows()
    assert row["status"] == "waiting"
    ((_, body),) = hook.posts
    assert f"Workflow {row['id']} (add the feature) waits for you" in body["text"]


@pytest.mark.parametrize(
    ("notify_toml", "refusal"),
    [
        ('webhook = "ftp://example.org/x"\n', "notify.webhook"),
        ('webhook = "https://ntfy.sh"\nformat = "ntfy"\n', "https://ntfy.sh/TOPIC"),
        ('webhook = "https://a.example/h"\nwebhook_env = "HOOK"\n', "not both"),
        ("retries = 9\n", "notify.retries"),
    ],
)
def test_a_bad_notify_section_is_refused_naming_the_key(
    tmp_path: Path, notify_toml: str, refusal: str
) -> None:
    from phasegate.config.cartridge import CartridgeError

    repo = _repo(tmp_path, notify_toml)
    with pytest.raises(CartridgeError, match=re.escape(refusal)):
        load_cartridge(repo)


def test_the_commit_path_appends_one_needs_you_event_per_status_change_on_both_databases(
    store_url: str,
) -> None:
    from phasegate.testing import FixedClock

    from conftest import new_workflow

    store = open_store(store_url, FixedClock())
    try:
        wf = new_workflow(store)
        assert store.workflow_row(wf)["version"] == 0

        def commit(result: PhaseResult) -> None:
            store.commit_phase_result(store.load_context(wf), result)

        commit(PhaseResult("retry"))  # preparing → preparing: nothing
        commit(PhaseResult("pause", reason="a"))  # → paused
        commit(PhaseResult("pause", reason="b"))  # paused → paused: no transition
        commit(PhaseResult("retry", status="preparing"))  # a resume: not a person's turn
        commit(PhaseResult("pause", status="planning_timeout", reason="c"))
        commit(PhaseResult("failed", reason="d"))

        entered = [
            (e["data"]["from"], e["data"]["status"], e["data"]["version"])
            for e in store.events(wf)
            if e["type"] == "needs_you"
        ]
        assert entered == [
            ("preparing", "paused", 2),
            ("preparing", "planning_timeout", 5),
            ("planning_timeout", "failed", 6),
        ]
    finally:
        store.close()
