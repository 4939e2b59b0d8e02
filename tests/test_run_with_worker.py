"""``phasegate run`` beside a running worker (found in a fresh user's trial).

A worker woken by the new ticket may claim its workflow before ``run`` does:
that is no error, ``run`` exits 0 and says the workflow goes on there, naming
the worker (``host:pid``); in ``--json`` too. Which of the two wins a real race
is not up to the test: the first test files tickets beside a real worker (each
``run`` must exit 0 whichever wins, every workflow completes once); the second
makes the worker's win certain, a live holder's lease taken before ``run``'s
drive, and checks what is said.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from test_concurrent_worker import _settle, _stop, _worker
from test_flaky_git import distinct_builds_repo

from phasegate.cli.render import drive_unless_taken
from phasegate.config.cartridge import load_cartridge
from phasegate.proc.host import host_name
from phasegate.runtime.engine import Engine
from phasegate.store import open_store

from conftest import git, phasegate_cli

#: Tickets filed at most (fewer once the worker won a text and a --json one).
TRIES = 6

TAKEN = re.compile(r"was taken on by a worker \(([^)\s]+):(\d+)\) meanwhile and goes on there")


def test_run_exits_0_and_names_the_worker_that_took_the_workflow_on(tmp_path: Path) -> None:
    happy_repo = distinct_builds_repo(tmp_path / "repo")
    log = tmp_path / "worker.log"
    worker = _worker(happy_repo, log, concurrency=4, poll=0.5)
    ids: list[str] = []
    taken: dict[str, bool] = {}  # workflow -> run --json
    try:
        for n in range(TRIES):
            as_json = n % 2 == 1
            args = ["run", "--repo", str(happy_repo), f"Ticket {n}"]
            done = phasegate_cli(*args, *(["--json"] if as_json else []), timeout=300)
            assert done.returncode == 0, done.stdout + done.stderr
            if as_json:
                summary = json.loads(done.stdout)
                ids.append(summary["id"])
                if summary.get("taken_by_worker"):
                    _host, pid = str(summary["worker"]).split(":")[:2]
                    assert int(pid) == worker.pid, summary
                    taken[summary["id"]] = True
            else:
                [wf] = re.findall(r"workflow (\w+) filed", done.stdout)
                ids.append(wf)
                found = TAKEN.search(done.stdout)
                if found:
                    assert int(found.group(2)) == worker.pid, done.stdout
                    assert "is being advanced by another worker" not in done.stdout
                    taken[wf] = False
            if False in taken.values() and True in taken.values():
                break
        repo_store = open_store(load_cartridge(happy_repo).store_url(happy_repo))
        try:
            _settle(repo_store, ids, [log])
            merges = [repo_store.workflow_row(i)["merge_sha"] for i in ids]
        finally:
            repo_store.close()
    finally:
        _stop(worker)
    on_main = git(happy_repo, "rev-list", "--merges", "--first-parent", "main").split()
    assert sorted(on_main) == sorted(merges), "each workflow merged once"


def test_a_workflow_a_live_worker_holds_is_said_to_go_on_there_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = distinct_builds_repo(tmp_path / "repo")
    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    try:
        engine = Engine(repo, cartridge, store)
        workflow_id = engine.start("t", "a ticket")
        holder = f"{host_name()}:{os.getpid()}:worker"  # alive: this very process
        assert store.claim(workflow_id, holder, 60) is not None
        drive_unless_taken(engine, workflow_id, as_json=False)
        said = capsys.readouterr().out
        assert f"was taken on by a worker ({host_name()}:{os.getpid()}) meanwhile" in said
        drive_unless_taken(engine, workflow_id, as_json=True)
        summary = json.loads(capsys.readouterr().out)
        assert summary["taken_by_worker"] is True
        assert str(summary["worker"]).startswith(f"{host_name()}:{os.getpid()}")
        row = store.workflow_row(workflow_id)
        assert (row["version"], row["lease_owner"]) == (0, holder), "run changed nothing"
    finally:
        store.close()
