"""A worker rides out its store's outage (found in a fresh user's trial).

A ``phasegate worker`` is a long-running process: a PostgreSQL server restarted
under it, or a SQLite store locked past its busy timeout, is one warning line
per try and a wait, never the worker's end nor a traceback; the workflows are as
last committed and go on once the store is back.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

from test_concurrent_worker import _settle, _stop, _wait_for, _worker

from phasegate.config.cartridge import load_cartridge
from phasegate.runtime.engine import Engine
from phasegate.store import open_store

from conftest import HAPPY_ANSWERS, git, make_repo, scripted_cartridge, writes_held
from support.postgres import PostgresServer

# The build agent: says it started, then waits while its config says hold.
AGENT = """\
import json, pathlib, sys, time
cfg = pathlib.Path(sys.argv[1])
sys.stdin.read()
here = pathlib.Path.cwd()
(pathlib.Path(json.loads(cfg.read_text())["started"]) / here.name).write_text("")
while json.loads(cfg.read_text())["hold"]:
    time.sleep(0.1)
(here / (here.name + ".txt")).write_text("built\\n")
print("wrote it")
"""


def _held_builds_repo(root: Path, store_url: str | None) -> tuple[Path, Path, Path]:
    """A repository whose build agent waits until its config lets it go; returns the
    repository, the config file and the directory the started agents mark."""
    repo = make_repo(root / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    started = root / "started"
    started.mkdir()
    config = root / "agent.json"
    config.write_text(json.dumps({"started": str(started), "hold": True}))
    agent = root / "agent.py"
    agent.write_text(AGENT)
    command = json.dumps(shlex.join([sys.executable, str(agent), str(config)]))
    build = f'runner = "command"\ncommand = {command}\ntimeout = 900\n'
    extra = f'[store]\nurl = "{store_url}"\n' if store_url else ""
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    (repo / "phasegate.toml").write_text(
        scripted_cartridge(extra=extra, role_overrides={"build": build})
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    return repo, config, started


def _let_go(config: Path) -> None:
    config.write_text(json.dumps({**json.loads(config.read_text()), "hold": False}))


def test_a_worker_outlives_a_postgresql_restart_and_completes_the_workflow(
    tmp_path: Path, own_server: PostgresServer
) -> None:
    repo, config, started = _held_builds_repo(tmp_path, own_server.url)
    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    log = tmp_path / "worker.log"
    worker = None
    try:
        wf = Engine(repo, cartridge, store).start("feature", "ticket")
        worker = _worker(repo, log, concurrency=3, poll=0.5)
        _wait_for(lambda: any(started.iterdir()), "the build agent", [log])
        own_server.stop(remove=False)  # fast: the server shuts down under the worker
        # Several passes (and a heartbeat) meet the stopped server meanwhile.
        _wait_for(lambda: "unavailable" in log.read_text(errors="replace"), "an outage", [log])
        time.sleep(2)
        assert worker.poll() is None, log.read_text(errors="replace")
        own_server.start()
        _let_go(config)
        _settle(store, [wf], [log])
        assert worker.poll() is None, "the worker is still running after the restart"
    finally:
        code = _stop(worker) if worker is not None else None
        store.close()
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text
    assert "trying again in" in text, text
    assert code == 130, text


def test_a_worker_outlives_a_sqlite_store_locked_past_its_busy_timeout(tmp_path: Path) -> None:
    # A busy timeout of 1 s: the worker's writes give up while the lock is held.
    db = tmp_path / "state.db"
    repo, config, started = _held_builds_repo(tmp_path, f"sqlite:///{db}?busy_timeout=1")
    cartridge = load_cartridge(repo)
    url = cartridge.store_url(repo)
    store = open_store(url)
    log = tmp_path / "worker.log"
    worker = None
    try:
        wf = Engine(repo, cartridge, store).start("feature", "ticket")
        worker = _worker(repo, log, concurrency=2, poll=0.5)
        _wait_for(lambda: any(started.iterdir()), "the build agent", [log])
        with writes_held(url):
            _let_go(config)  # the agent ends; its commit meets the locked store
            # Held past the engine's own retries: the advance gives up, to the worker.
            _wait_for(lambda: " s\n" in log.read_text(errors="replace"), "an outage", [log])
            assert worker.poll() is None, log.read_text(errors="replace")
        _settle(store, [wf], [log])
        assert worker.poll() is None, "the worker is still running after the lock"
    finally:
        code = _stop(worker) if worker is not None else None
        store.close()
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text
    assert code == 130, text
