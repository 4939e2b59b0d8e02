"""``phasegate run`` beside a running worker (issue 12: a fresh user's trial).

A worker woken by the new ticket may claim its workflow before ``run`` does:
that is no error, ``run`` exits 0 and says the workflow goes on there, naming
the worker (``host:pid``); in ``--json`` too. Which of the two wins is a race,
so the test files tickets until the worker has taken one on (each ``run``
must exit 0 whichever wins), then checks every workflow completed once.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from test_concurrent_worker import _settle, _stop, _worker
from test_flaky_git import distinct_builds_repo

from phasegate.cartridge import load_cartridge
from phasegate.store import open_store

from conftest import git, phasegate_cli

#: Tickets filed at most: the worker wins about one race in two.
TRIES = 8

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
            if False in taken.values():
                break
        assert False in taken.values(), f"the worker took no workflow in {TRIES} tries"
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
